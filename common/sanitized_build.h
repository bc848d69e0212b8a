// Whether this translation unit is compiled under a sanitizer (tools/test's
// --config=asan and --config=tsan: clang at -O0, the asan build with
// libFuzzer's coverage instrumentation too). Tests whose reference code
// runs tens of times slower there check fewer random cases under it:
//
//   constexpr int kBatches = kSanitizedBuild ? 100 : 300;
#ifndef MLFABRIC_COMMON_SANITIZED_BUILD_H_
#define MLFABRIC_COMMON_SANITIZED_BUILD_H_

namespace mlfabric {

// clang says so with __has_feature, gcc with __SANITIZE_*__.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MLFABRIC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MLFABRIC_SANITIZED 1
#endif
#endif

#ifdef MLFABRIC_SANITIZED
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_SANITIZED_BUILD_H_
