"""libFuzzer binaries for the fuzz targets (//testing/fuzzers).

A fuzz target is a cc_library defining LLVMFuzzerTestOneInput (alwayslink),
beside a *_fuzzer_smoke_test that runs it over its corpus with gcc.
mlfabric_fuzzer links it into a binary: with libFuzzer in the asan build
(--config=asan, clang, whose objects carry -fsanitize=fuzzer-no-link), and
with //testing:fuzz_corpus_main everywhere else, so the target still builds
without clang. Fuzzer binaries are tagged manual: `bazel test //...` does not
build them; tools/test and tools/fuzz name them with --config=asan.
"""

def mlfabric_fuzzer(name, target):
    native.cc_binary(
        name = name,
        testonly = True,
        tags = ["manual"],
        linkopts = select({
            "//third_party:asan": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = [target] + select({
            "//third_party:asan": [],
            "//conditions:default": ["//testing:fuzz_corpus_main"],
        }),
    )
