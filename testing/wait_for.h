// Polls `condition` every 2 ms until it holds (true) or `timeout_s` has
// passed (false), for unit tests whose code under test works on threads of
// its own. A leaf of the test infrastructure: no dependencies.
//
//   CHECK(testing::WaitFor([&] { return !service.Up("w1"); }, 30));
#ifndef MLFABRIC_TESTING_WAIT_FOR_H_
#define MLFABRIC_TESTING_WAIT_FOR_H_

#include <chrono>
#include <functional>
#include <thread>

namespace mlfabric::testing {

inline bool WaitFor(const std::function<bool()>& condition, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTING_WAIT_FOR_H_
