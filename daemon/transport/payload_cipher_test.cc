// Sealed data sessions: the cipher alone (tags catch every change, replay
// and reorder), then over a real socket pair after a real handshake, with
// WritePacket and FrameReader as every daemon path uses them.
#include "daemon/transport/payload_cipher.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "daemon/transport/data_auth.h"
#include "daemon/transport/framing.h"

namespace mlfabric::transport {
namespace {

const std::string kKey(32, 'k');

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("sealed payloads open only unchanged, once, and in order") {
  CipherDirection sender(kKey), receiver(kKey);
  const std::string header = "header bytes";
  std::vector<uint8_t> plain(1000), sealed(1000), first_tag(kTagBytes);
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(sender.Seal(header, plain.data(), plain.size(), sealed.data(), first_tag.data()).ok());
  CHECK(sealed != plain);
  std::vector<uint8_t> copy = sealed;
  REQUIRE(receiver.Open(header, copy.data(), copy.size(), first_tag.data()).ok());
  CHECK(copy == plain);

  // The same packet again (a replay) fails: the receiver's counter moved on.
  copy = sealed;
  absl::Status replayed = receiver.Open(header, copy.data(), copy.size(), first_tag.data());
  CHECK(replayed.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(replayed, "sealed packet 1 of the session failed its authentication tag"));

  // A changed payload byte, a changed header byte: each fails.
  for (int change = 0; change < 2; ++change) {
    CipherDirection s(kKey), r(kKey);
    std::vector<uint8_t> out(plain.size()), tag(kTagBytes);
    REQUIRE(s.Seal(header, plain.data(), plain.size(), out.data(), tag.data()).ok());
    std::string aad = header;
    if (change == 0) out[500] ^= 1;
    if (change == 1) aad[0] ^= 1;
    CHECK_FALSE(r.Open(aad, out.data(), out.size(), tag.data()).ok());
  }

  // Two packets read in the wrong order fail; an empty payload still has a tag.
  CipherDirection s(kKey), r(kKey);
  std::vector<uint8_t> a(10, 1), b(10, 2), tag_a(kTagBytes), tag_b(kTagBytes), empty_tag(kTagBytes);
  REQUIRE(s.Seal(header, a.data(), a.size(), a.data(), tag_a.data()).ok());
  REQUIRE(s.Seal(header, b.data(), b.size(), b.data(), tag_b.data()).ok());
  CHECK_FALSE(r.Open(header, b.data(), b.size(), tag_b.data()).ok());
  CipherDirection t(kKey), u(kKey);
  REQUIRE(t.Seal(header, nullptr, 0, nullptr, empty_tag.data()).ok());
  CHECK(u.Open(header, nullptr, 0, empty_tag.data()).ok());
  CHECK(u.packets() == 1);
}

struct Pair {
  int fds[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() {
    for (int fd : fds) {
      if (fd >= 0) {
        DetachCipher(fd);
        ::close(fd);
      }
    }
  }
};

// A real handshake with data_plane_encryption on both ends of `pair`.
void SealedHandshake(Pair& pair) {
  DataKeys keys;
  keys.SetClusterKey("cluster key");
  keys.SetEncryption(true);
  auto acceptor = std::async(std::launch::async,
                             [&] { return AcceptorHandshake(pair.fds[1], keys, "peer"); });
  auto initiator = InitiatorHandshake(pair.fds[0], keys, "w1", "s1");
  REQUIRE(initiator.ok());
  REQUIRE(acceptor.get().ok());
  REQUIRE(CipherOf(pair.fds[0]) != nullptr);
  REQUIRE(CipherOf(pair.fds[1]) != nullptr);
}

TEST_CASE("after a sealed handshake, packets both ways are encrypted on the wire and read back") {
  Pair pair;
  SealedHandshake(pair);
  SendWatchdog watchdog(5);
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t size : {size_t{0}, size_t{1}, size_t{100}, size_t{32 * 1024}, size_t{1 << 20}}) {
    std::vector<uint8_t> payload(size);
    for (size_t i = 0; i < size; ++i) payload[i] = static_cast<uint8_t>('a' + i % 26);
    payloads.push_back(std::move(payload));
  }
  std::thread writer([&] {
    for (size_t i = 0; i < payloads.size(); ++i) {
      PacketHeader header;
      header.transfer = 40 + i;
      header.offset = i;
      header.flags = kFlagSealed;  // a relay's copied header: the socket decides, not it
      CHECK(WritePacket(watchdog, pair.fds[0], header, payloads[i].data(),
                        static_cast<uint32_t>(payloads[i].size()), /*crc=*/1234u)
                .ok());
    }
  });
  FrameReader reader(pair.fds[1]);
  for (size_t i = 0; i < payloads.size(); ++i) {
    auto header = reader.ReadHeader();
    REQUIRE(header.ok());
    CHECK(header->transfer == 40 + i);
    CHECK((header->flags & kFlagSealed) != 0);
    CHECK(header->crc32c == 0);  // a CRC of the plaintext would tell of it
    std::vector<uint8_t> got(header->length);
    if (header->length > 0) REQUIRE(reader.ReadPayload(got.data(), got.size()).ok());
    CHECK(got == payloads[i]);
    CHECK(VerifyPayload(*header, got.data()).ok());
  }
  writer.join();

  // The other direction has its own key and counter.
  const std::string reply = "the model's header";
  PacketHeader header;
  header.kind = PacketKind::kGetReply;
  REQUIRE(WritePacket(watchdog, pair.fds[1], header, reply.data(),
                      static_cast<uint32_t>(reply.size()))
              .ok());
  // What crossed the wire: the header in clear, the payload not.
  std::vector<uint8_t> wire(kHeaderBytes + reply.size() + kTagBytes);
  REQUIRE(::recv(pair.fds[0], wire.data(), wire.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(wire.size()));
  const std::string text(wire.begin(), wire.end());
  CHECK(text.find("model") == std::string::npos);
  auto parsed = ParseHeader(wire.data(), kHeaderBytes, kMaxPayloadBytes);
  REQUIRE(parsed.ok());
  CHECK(parsed->kind == PacketKind::kGetReply);
  CHECK(parsed->length == reply.size());
}

TEST_CASE("a changed byte on the wire, or plaintext on a sealed session, closes it") {
  SendWatchdog watchdog(5);
  const std::vector<uint8_t> payload(5000, 7);
  for (size_t flip : {size_t{3}, size_t{20}, size_t{kHeaderBytes + 10},
                      size_t{kHeaderBytes + 5000 + 4}}) {
    Pair pair;
    SealedHandshake(pair);
    // Seal on a copy of the sender's socket pair end, flip one byte, forward.
    Pair tap;
    AttachCipher(tap.fds[0], CipherOf(pair.fds[0]));
    PacketHeader header;
    header.transfer = 5;
    REQUIRE(WritePacket(watchdog, tap.fds[0], header, payload.data(), 5000).ok());
    std::vector<uint8_t> wire(kHeaderBytes + 5000 + kTagBytes);
    REQUIRE(::recv(tap.fds[1], wire.data(), wire.size(), MSG_WAITALL) ==
            static_cast<ssize_t>(wire.size()));
    wire[flip] ^= 0x01;
    REQUIRE(::send(pair.fds[0], wire.data(), wire.size(), 0) == static_cast<ssize_t>(wire.size()));
    FrameReader reader(pair.fds[1]);
    auto read = reader.ReadHeader();
    if (!read.ok()) {  // a flipped magic or reserved byte fails the parse itself
      CHECK(read.status().code() == absl::StatusCode::kInvalidArgument);
      continue;
    }
    std::vector<uint8_t> got(read->length);
    absl::Status opened = reader.ReadPayload(got.data(), got.size());
    CHECK(opened.code() == absl::StatusCode::kDataLoss);
  }

  Pair pair;
  SealedHandshake(pair);
  // A plaintext packet (a forger without the session's keys) is refused...
  Pair plain;
  PacketHeader header;
  REQUIRE(WritePacket(watchdog, plain.fds[0], header, payload.data(), 100).ok());
  std::vector<uint8_t> wire(kHeaderBytes + 100);
  REQUIRE(::recv(plain.fds[1], wire.data(), wire.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(wire.size()));
  REQUIRE(::send(pair.fds[0], wire.data(), wire.size(), 0) == static_cast<ssize_t>(wire.size()));
  FrameReader reader(pair.fds[1]);
  auto refused = reader.ReadHeader();
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(refused.status(), "a plaintext packet on an encrypted session"));
  // ...and so is a sealed packet on a plaintext session.
  Pair sealed_only;
  AttachCipher(sealed_only.fds[0], CipherOf(pair.fds[0]));
  REQUIRE(WritePacket(watchdog, sealed_only.fds[0], header, payload.data(), 100).ok());
  FrameReader plain_reader(sealed_only.fds[1]);
  CHECK(Contains(plain_reader.ReadHeader().status(), "a sealed packet on a session that is not"));
}

TEST_CASE("once detached, a sealed socket refuses writes instead of sending in plaintext") {
  Pair pair;
  SealedHandshake(pair);
  SendWatchdog watchdog(5);
  DetachCipher(pair.fds[0]);
  PacketHeader header;
  const std::string secret = "model bytes";
  absl::Status write = WritePacket(watchdog, pair.fds[0], header, secret.data(),
                                   static_cast<uint32_t>(secret.size()));
  CHECK(write.code() == absl::StatusCode::kUnavailable);
  // A new socket that reuses the descriptor number does not inherit it.
  const int number = pair.fds[0];
  ::close(pair.fds[0]);
  pair.fds[0] = -1;
  int fresh[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fresh) == 0);
  if (fresh[0] == number) CHECK(CipherOf(fresh[0]) == nullptr);
  CHECK(CipherOf(fresh[0]) == nullptr);
  CHECK(CipherOf(fresh[1]) == nullptr);
  ::close(fresh[0]);
  ::close(fresh[1]);
}

}  // namespace
}  // namespace mlfabric::transport
