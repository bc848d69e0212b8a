#include "common/secrets.h"

#include <sys/stat.h>

#include <fstream>
#include <set>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("HMAC-SHA256 matches RFC 4231 test case 2") {
  const std::string mac = HmacSha256("Jefe", "what do ya want for nothing?");
  CHECK(ToHex(mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(mac.size() == kMacBytes);
}

TEST_CASE("random tokens differ and have the asked length") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(RandomHex(16));
  CHECK(seen.size() == 100);
  CHECK(seen.begin()->size() == 32);
  CHECK(RandomBytes(0).empty());
}

TEST_CASE("constant-time comparison") {
  CHECK(ConstantTimeEquals("abc", "abc"));
  CHECK_FALSE(ConstantTimeEquals("abc", "abd"));
  CHECK_FALSE(ConstantTimeEquals("abc", "ab"));
  CHECK(ConstantTimeEquals("", ""));
}

TEST_CASE("secret files: trimmed, and refused when empty, missing or world-readable") {
  const std::string path = "/tmp/mlfabric_secrets_test." + RandomHex(4);
  std::ofstream(path) << "s3cret\n";
  ::chmod(path.c_str(), 0600);
  auto secret = ReadSecretFile(path);
  REQUIRE(secret.ok());
  CHECK(*secret == "s3cret");

  ::chmod(path.c_str(), 0644);
  auto open = ReadSecretFile(path);
  REQUIRE_FALSE(open.ok());
  CHECK(open.status().message().find("chmod 600") != std::string::npos);

  std::ofstream(path) << "\n";
  ::chmod(path.c_str(), 0600);
  auto empty = ReadSecretFile(path);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("is empty") != std::string::npos);
  ::unlink(path.c_str());

  auto missing = ReadSecretFile(path);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find(path) != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
