// Small helpers shared by the cross-process tests.
#ifndef MLFABRIC_TESTS_TEST_UTIL_H_
#define MLFABRIC_TESTS_TEST_UTIL_H_

#include <fstream>
#include <string>
#include <vector>

namespace mlfabric::testing {

// A vector written one value per line (as sum_server and vector_worker do).
inline std::vector<double> ReadVector(const std::string& path) {
  std::vector<double> values;
  std::ifstream in(path);
  double v;
  while (in >> v) values.push_back(v);
  return values;
}

inline int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTS_TEST_UTIL_H_
