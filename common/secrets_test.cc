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

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST_CASE("X25519 matches RFC 7748 section 6.1, and two fresh pairs agree") {
  X25519KeyPair alice{FromHex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"),
                      ""};
  const std::string bob_public =
      FromHex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  auto shared = X25519SharedSecret(alice, bob_public);
  REQUIRE(shared.ok());
  CHECK(ToHex(*shared) == "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");

  const X25519KeyPair a = NewX25519KeyPair(), b = NewX25519KeyPair();
  CHECK(a.public_key.size() == kX25519Bytes);
  CHECK(a.public_key != b.public_key);
  auto ab = X25519SharedSecret(a, b.public_key);
  auto ba = X25519SharedSecret(b, a.public_key);
  REQUIRE(ab.ok());
  REQUIRE(ba.ok());
  CHECK(*ab == *ba);
  // A low-order point would make the secret all zeros: refused.
  CHECK(!X25519SharedSecret(a, std::string(kX25519Bytes, '\0')).ok());
  CHECK(!X25519SharedSecret(a, "short").ok());
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
