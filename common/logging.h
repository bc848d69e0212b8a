// Minimal leveled logging to stderr, one line per message:
//
//   2026-11-22 03:10:04.123 I scheduler] batch 42: 7 updates planned in 0.3 ms
//
//   MLF_LOG(INFO) << "listening on " << address;
//   MLF_CHECK(ptr != nullptr) << "broken invariant";   // aborts
//
// The process name comes from SetLogProcessName() (set once in main()).
// Messages below the level from SetMinLogLevel() are dropped cheaply.
// Thread safety: every call is safe from any thread; each line is written
// with a single write(2), so lines from different threads never interleave.
#ifndef MLFABRIC_COMMON_LOGGING_H_
#define MLFABRIC_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace mlfabric {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetLogProcessName(const std::string& name);
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error"; false when unknown.
bool ParseLogLevel(const std::string& text, LogLevel* level);

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream expression when the level is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace mlfabric

#define MLF_LOG_LEVEL_DEBUG ::mlfabric::LogLevel::kDebug
#define MLF_LOG_LEVEL_INFO ::mlfabric::LogLevel::kInfo
#define MLF_LOG_LEVEL_WARNING ::mlfabric::LogLevel::kWarning
#define MLF_LOG_LEVEL_ERROR ::mlfabric::LogLevel::kError
#define MLF_LOG_LEVEL_FATAL ::mlfabric::LogLevel::kFatal

#define MLF_LOG(severity)                                                    \
  (MLF_LOG_LEVEL_##severity < ::mlfabric::MinLogLevel())                     \
      ? (void)0                                                              \
      : ::mlfabric::logging_internal::Voidify() &                            \
            ::mlfabric::logging_internal::LogMessage(MLF_LOG_LEVEL_##severity, \
                                                     __FILE__, __LINE__)     \
                .stream()

#define MLF_CHECK(condition)                                                   \
  (condition) ? (void)0                                                        \
              : ::mlfabric::logging_internal::Voidify() &                      \
                    ::mlfabric::logging_internal::LogMessage(                  \
                        ::mlfabric::LogLevel::kFatal, __FILE__, __LINE__)      \
                            .stream()                                          \
                        << "Check failed: " #condition " "

#endif  // MLFABRIC_COMMON_LOGGING_H_
