#include "common/logging.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("Disabled log levels do not evaluate their stream") {
  SetMinLogLevel(LogLevel::kWarning);
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  MLF_LOG(INFO) << side_effect();
  CHECK(evaluated == 0);
  MLF_LOG(WARNING) << "visible " << side_effect();
  CHECK(evaluated == 1);
  SetMinLogLevel(LogLevel::kInfo);
}

TEST_CASE("Log levels parse by name") {
  LogLevel level = LogLevel::kInfo;
  CHECK(ParseLogLevel("debug", &level));
  CHECK(level == LogLevel::kDebug);
  CHECK_FALSE(ParseLogLevel("loud", &level));
}

}  // namespace
}  // namespace mlfabric
