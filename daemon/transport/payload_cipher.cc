#include "daemon/transport/payload_cipher.h"

#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>

#include <openssl/evp.h>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"

namespace mlfabric::transport {
namespace {

constexpr size_t kKeyBytes = 32;

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// The fd registry: which socket (device, inode) each descriptor held when
// its cipher was attached.
struct Attached {
  dev_t device;
  ino_t inode;
  std::shared_ptr<SessionCipher> cipher;
};
std::mutex registry_mu;
std::map<int, Attached>& Registry() {
  static auto* registry = new std::map<int, Attached>();
  return *registry;
}
// Lets plaintext clusters skip the lock and the fstat on every packet.
std::atomic<int> registry_size{0};

}  // namespace

CipherDirection::CipherDirection(std::string_view key) : ctx_(EVP_CIPHER_CTX_new()) {
  if (ctx_ == nullptr || key.size() != kKeyBytes ||
      EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, Bytes(key), nullptr, -1) != 1) {
    std::fprintf(stderr, "fatal: AES-256-GCM setup failed in libcrypto\n");
    std::abort();
  }
}

CipherDirection::~CipherDirection() { EVP_CIPHER_CTX_free(ctx_); }

void CipherDirection::NextNonce(uint8_t nonce[12]) {
  for (int i = 0; i < 4; ++i) nonce[i] = 0;
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(counter_ >> (8 * i));
  ++counter_;
}

absl::Status CipherDirection::Seal(std::string_view aad, const void* in, size_t length,
                                   uint8_t* out, uint8_t tag[kTagBytes]) {
  uint8_t nonce[12];
  NextNonce(nonce);
  int n = 0;
  // The key schedule stays in the context; only the nonce changes.
  const bool ok =
      EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, 1) == 1 &&
      EVP_CipherUpdate(ctx_, nullptr, &n, Bytes(aad), static_cast<int>(aad.size())) == 1 &&
      (length == 0 || EVP_CipherUpdate(ctx_, out, &n, static_cast<const unsigned char*>(in),
                                       static_cast<int>(length)) == 1) &&
      EVP_CipherFinal_ex(ctx_, out + length, &n) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
  if (!ok) return absl::InternalError("AES-256-GCM encryption failed in libcrypto");
  return absl::OkStatus();
}

absl::Status CipherDirection::Open(std::string_view aad, uint8_t* data, size_t length,
                                   const uint8_t tag[kTagBytes]) {
  const uint64_t packet = counter_;
  uint8_t nonce[12];
  NextNonce(nonce);
  int n = 0;
  const bool ok =
      EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, 0) == 1 &&
      EVP_CipherUpdate(ctx_, nullptr, &n, Bytes(aad), static_cast<int>(aad.size())) == 1 &&
      (length == 0 || EVP_CipherUpdate(ctx_, data, &n, data, static_cast<int>(length)) == 1) &&
      EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagBytes, const_cast<uint8_t*>(tag)) == 1 &&
      EVP_CipherFinal_ex(ctx_, data + length, &n) == 1;
  if (!ok) {
    return absl::DataLossError(absl::StrCat(
        "sealed packet ", packet, " of the session failed its authentication tag (altered, "
        "replayed, reordered or not from the peer that made the session)"));
  }
  return absl::OkStatus();
}

std::shared_ptr<SessionCipher> SessionCipher::Derive(bool initiator,
                                                     std::string_view shared_secret,
                                                     std::string_view cluster_key,
                                                     std::string_view transcript) {
  auto key = [&](std::string_view label) {
    std::string message = "mlfabric-data-v1 payload key ";
    message.append(label).append("|").append(shared_secret).append("|").append(transcript);
    return HmacSha256(cluster_key, message);
  };
  const std::string i2a = key("i2a"), a2i = key("a2i");
  return std::make_shared<SessionCipher>(initiator ? i2a : a2i, initiator ? a2i : i2a);
}

std::shared_ptr<SessionCipher> CipherOf(int fd) {
  if (registry_size.load(std::memory_order_acquire) == 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0) return nullptr;
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Registry().find(fd);
  if (it == Registry().end() || it->second.device != st.st_dev || it->second.inode != st.st_ino) {
    return nullptr;
  }
  return it->second.cipher;
}

void AttachCipher(int fd, std::shared_ptr<SessionCipher> cipher) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;  // not a socket any more: nothing will be sent on it
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& registry = Registry();
  for (auto it = registry.begin(); it != registry.end();) {
    struct stat now;
    const bool gone = ::fstat(it->first, &now) != 0 || now.st_dev != it->second.device ||
                      now.st_ino != it->second.inode;
    it = gone ? registry.erase(it) : std::next(it);
  }
  registry[fd] = Attached{st.st_dev, st.st_ino, std::move(cipher)};
  registry_size.store(static_cast<int>(registry.size()), std::memory_order_release);
}

void DetachCipher(int fd) {
  if (std::shared_ptr<SessionCipher> cipher = CipherOf(fd)) cipher->closed.store(true);
}

}  // namespace mlfabric::transport
