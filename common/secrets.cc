#include "common/secrets.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/str_cat.h"

namespace mlfabric {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::fprintf(stderr, "fatal: the random generator failed (RAND_bytes)\n");
    std::abort();
  }
  return out;
}

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string RandomHex(size_t n) { return ToHex(RandomBytes(n)); }

X25519KeyPair NewX25519KeyPair() {
  X25519KeyPair pair;
  pair.private_key = RandomBytes(kX25519Bytes);
  EVP_PKEY* key = EVP_PKEY_new_raw_private_key(
      EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(pair.private_key.data()),
      kX25519Bytes);
  size_t size = kX25519Bytes;
  pair.public_key.assign(kX25519Bytes, '\0');
  if (key == nullptr ||
      EVP_PKEY_get_raw_public_key(key, reinterpret_cast<unsigned char*>(pair.public_key.data()),
                                  &size) != 1 ||
      size != kX25519Bytes) {
    std::fprintf(stderr, "fatal: X25519 key generation failed in libcrypto\n");
    std::abort();
  }
  EVP_PKEY_free(key);
  return pair;
}

absl::StatusOr<std::string> X25519SharedSecret(const X25519KeyPair& mine,
                                               std::string_view peer_public_key) {
  if (peer_public_key.size() != kX25519Bytes) {
    return absl::InvalidArgumentError(absl::StrCat("X25519 public key has ",
                                                   peer_public_key.size(), " bytes, not 32"));
  }
  EVP_PKEY* own = EVP_PKEY_new_raw_private_key(
      EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(mine.private_key.data()),
      mine.private_key.size());
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(peer_public_key.data()),
      peer_public_key.size());
  EVP_PKEY_CTX* ctx = own != nullptr ? EVP_PKEY_CTX_new(own, nullptr) : nullptr;
  std::string secret(kX25519Bytes, '\0');
  size_t size = secret.size();
  // EVP_PKEY_derive fails for low-order points (the all-zero result).
  const bool ok = ctx != nullptr && peer != nullptr && EVP_PKEY_derive_init(ctx) == 1 &&
                  EVP_PKEY_derive_set_peer(ctx, peer) == 1 &&
                  EVP_PKEY_derive(ctx, reinterpret_cast<unsigned char*>(secret.data()), &size) == 1 &&
                  size == kX25519Bytes;
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  EVP_PKEY_free(own);
  if (!ok) return absl::InvalidArgumentError("X25519: the peer's public key is not usable");
  return secret;
}

std::string HmacSha256(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("secret file ", path, ": cannot read it"));
  }
  if ((info.st_mode & 007) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "secret file ", path, ": others may read it (mode ",
        absl::StrCat(absl::Hex(info.st_mode & 0777)), "); chmod 600 it"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("secret file ", path, ": cannot read it"));
  std::ostringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                             secret.back() == ' ' || secret.back() == '\t')) {
    secret.pop_back();
  }
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("secret file ", path, ": is empty"));
  }
  return secret;
}

}  // namespace mlfabric
