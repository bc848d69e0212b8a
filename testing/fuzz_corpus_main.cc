// Runs a libFuzzer entry point (LLVMFuzzerTestOneInput) over every file of
// the corpus directories given as arguments, and over seeded mutations of
// each (bit flips, truncations, splices), so a fuzz target's contract is
// checked by every `bazel test` with gcc, without clang's libFuzzer. A
// violation aborts. Prints how many inputs ran.
//
//   plan_json_fuzzer_smoke_test scheduler/core/testdata/fuzz/plan_json
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/sanitized_build.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Mutations per corpus file. Under the sanitized builds (clang at -O0)
// one input of the heaviest target, a whole scheduler service, costs
// about 40 times its optimised time (20,010 inputs took 81 s under
// ASan against 2 s), and the asan run fuzzes every target with libFuzzer
// as well (//testing/fuzzers:fuzz_test), so a quarter of them is kept.
constexpr int kMutationsPerFile = mlfabric::kSanitizedBuild ? 500 : 2000;

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "fuzz_corpus: no corpus files in the given directories\n");
    return 1;
  }
  const uint32_t seed = 20261124;
  std::mt19937 rng(seed);
  size_t runs = 0;
  for (const std::string& input : corpus) {
    Run(input);
    ++runs;
    for (int i = 0; i < kMutationsPerFile; ++i) {
      std::string mutated = input;
      switch (rng() % 4) {
        case 0:  // flip bits
          for (int flips = 1 + rng() % 4; flips > 0 && !mutated.empty(); --flips) {
            mutated[rng() % mutated.size()] ^= static_cast<char>(1u << (rng() % 8));
          }
          break;
        case 1:  // truncate
          mutated.resize(rng() % (mutated.size() + 1));
          break;
        case 2: {  // splice another corpus file in
          const std::string& other = corpus[rng() % corpus.size()];
          const size_t at = mutated.empty() ? 0 : rng() % mutated.size();
          mutated.insert(at, other.substr(0, rng() % (other.size() + 1)));
          break;
        }
        default:  // replace a digit run with an extreme number
          for (char& c : mutated) {
            if (c >= '0' && c <= '9' && rng() % 8 == 0) c = "9-e.1"[rng() % 5];
          }
      }
      Run(mutated);
      ++runs;
    }
  }
  std::printf("fuzz_corpus: seed %u, %zu corpus files, %zu inputs, no crash\n", seed,
              corpus.size(), runs);
  return 0;
}
