// libFuzzer target for one data session's receive side (data_session.h)
// with and without authentication (data_auth.h): whatever bytes a peer
// writes to a daemon's data port end the session exactly once, with every
// transfer it began and did not finish handed back once; payloads land
// only inside the buffers the handler gave; nothing crashes or hangs. The
// first input byte picks the mode: odd = the acceptor's handshake first
// (the fuzzer cannot forge the MACs, so this covers the hello and proof
// parsing), even = no handshake (frames, kJobProof on a session that is
// not authenticated, begins, data, gets, aborts), and of those bit 1 set =
// a sealed session (payload_cipher.h: sealed headers, tags, truncation).
// Build and run with clang: tools/fuzz data_session [seconds];
// data_session_fuzzer_smoke_test runs it over the corpus with gcc.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/data_session.h"

namespace {

using namespace mlfabric;
using namespace mlfabric::transport;

constexpr uint64_t kMaxTransfer = 1 << 20;

// Begins transfers into buffers it owns and checks the session's contract.
class CheckingHandler : public DataSessionHandler {
 public:
  absl::Status Begin(const PacketHeader& header) override {
    if (header.offset == 0 || header.offset > kMaxTransfer) std::abort();  // the session checks
    if (buffers_.count(header.transfer)) {
      return absl::AlreadyExistsError("begun twice");
    }
    auto buffer = SharedBuffer::Create(header.offset);
    if (!buffer.ok()) return buffer.status();
    buffers_[header.transfer] = std::make_shared<SharedBuffer>(std::move(*buffer));
    return absl::OkStatus();
  }
  std::shared_ptr<SharedBuffer> BufferFor(const PacketHeader& header) override {
    auto it = buffers_.find(header.transfer);
    if (it == buffers_.end()) std::abort();  // data only for a transfer begun here
    // Every third transfer is "cancelled" meanwhile: the session skips it.
    return header.transfer % 3 == 0 ? nullptr : it->second;
  }
  absl::Status Arrived(const PacketHeader& header, std::shared_ptr<SharedBuffer> buffer,
                       bool* complete) override {
    if (header.offset + header.length > buffer->size()) std::abort();
    received_[header.transfer] += header.length;
    *complete = received_[header.transfer] >= buffer->size();
    return absl::OkStatus();
  }
  absl::Status GetRequest(int, const PacketHeader&, const v1::DataGetRequest& body) override {
    if (body.server().empty()) std::abort();  // the session refuses those
    return absl::OkStatus();
  }
  void Aborted(const PacketHeader& header, const std::string&) override {
    if (!buffers_.count(header.transfer)) std::abort();
  }
  void Ended(const std::string&, const std::set<uint64_t>& unfinished,
             const std::string&) override {
    if (++ended_ != 1) std::abort();
    for (uint64_t transfer : unfinished) {
      if (!buffers_.count(transfer)) std::abort();
    }
  }
  int ended() const { return ended_; }

 private:
  std::map<uint64_t, std::shared_ptr<SharedBuffer>> buffers_;
  std::map<uint64_t, uint64_t> received_;
  int ended_ = 0;
};

const DataKeys& Keys() {
  static DataKeys* keys = [] {
    auto* k = new DataKeys();
    k->SetClusterKey("fuzz cluster key");
    for (uint32_t job = 0; job < 4; ++job) k->SetJobKey(job, "fuzz job key");
    return k;
  }();
  return *keys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1 << 16)) return 0;  // one socket buffer: no blocking write
  const bool auth = (data[0] & 1) != 0;
  // Bit 1: the session is sealed (a cipher attached as after an encrypted
  // handshake), so the input exercises the sealed frame reader: headers,
  // tags, truncation. Without the keys' tags, nothing gets past it.
  const bool sealed = !auth && (data[0] & 2) != 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  size_t written = 1;
  while (written < size) {
    const ssize_t n = ::write(fds[0], data + written, size - written);
    if (n <= 0) std::abort();
    written += static_cast<size_t>(n);
  }
  ::shutdown(fds[0], SHUT_WR);  // the peer is done: the session ends, it does not hang
  if (sealed) {
    AttachCipher(fds[1], std::make_shared<SessionCipher>(std::string(32, 's'),
                                                         std::string(32, 'r')));
  }
  CheckingHandler handler;
  std::atomic<bool> stopping{false};
  DataSession session(fds[1], "fuzz", kMaxTransfer, auth ? &Keys() : nullptr);
  session.Run(handler, stopping);
  if (handler.ended() != 1) std::abort();
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
