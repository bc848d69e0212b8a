// Where the daemon's sender loop writes its packets (docs/architecture.md §5).
//
// The send scheduler (daemon/engine/send_scheduler.h) decides what leaves
// and when; a PacketWriter puts it on a socket. The daemon's writer is
// PeerConnections (one kept TCP connection per peer daemon, every write
// bounded by the SendWatchdog); unit tests record what would be written.
//
//   PacketHeader header = ...;
//   absl::Status s = writer.WriteToPeer(send, header, payload, length, crc);
//   if (!s.ok()) { every transfer queued for send.dst_address() fails }
//
// Thread safety: implementations may be called from any thread; one
// writer per socket at a time is the caller's business.
#ifndef MLFABRIC_DAEMON_TRANSPORT_PACKET_WRITER_H_
#define MLFABRIC_DAEMON_TRANSPORT_PACKET_WRITER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/transport/packet.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::transport {

// One packet of a coalesced write: its header, and its payload in the
// sender's buffer (not copied).
struct Frame {
  PacketHeader header;
  const void* payload = nullptr;
  uint32_t length = 0;
  std::optional<uint32_t> crc;  // the payload's CRC-32C, if known
};

class PacketWriter {
 public:
  virtual ~PacketWriter() = default;

  // Coalesced writes (docs/architecture.md §5): `frames` (at least one) in order, the
  // first one whole (waiting as WriteToPeer would), then as many of the
  // rest as the connection takes now without waiting, in as few system
  // calls as it can; a frame begun is finished. Returns how many frames
  // were written whole (>= 1); the caller keeps the rest, so an urgent
  // packet released meanwhile waits at most for what the kernel already
  // holds. An error means the connection is gone, as for WriteToPeer.
  // The default writes them all, one by one.
  virtual absl::StatusOr<size_t> WriteFramesToPeer(const v1::SendTransfer& send,
                                                   absl::Span<const Frame> frames) {
    for (const Frame& f : frames) {
      absl::Status s = WriteToPeer(send, f.header, f.payload, f.length, f.crc);
      if (!s.ok()) return s;
    }
    return frames.size();
  }
  // The same on a session's own socket `fd` (a get reply).
  virtual absl::StatusOr<size_t> WriteFramesToSocket(int fd, absl::Span<const Frame> frames) {
    for (const Frame& f : frames) {
      absl::Status s = WriteToSocket(fd, f.header, f.payload, f.length);
      if (!s.ok()) return s;
    }
    return frames.size();
  }

  // One packet to the daemon at `send.dst_address()` (connected on first
  // use). `crc` is the payload's CRC-32C if already known. An error means
  // the connection is gone: it is closed, and the next write reconnects.
  virtual absl::Status WriteToPeer(const v1::SendTransfer& send, const PacketHeader& header,
                                   const void* payload, uint32_t length,
                                   std::optional<uint32_t> crc) = 0;

  // Whether a packet for the daemon at `send.dst_address()` can be written
  // now without waiting for that peer's connection to drain: the sender
  // loop then writes other peers' packets meanwhile, instead of blocking
  // on a peer whose link is slower than planned. True when there is no
  // connection yet. Cheap and never blocks (the caller may hold a lock).
  virtual bool PeerWritable(const v1::SendTransfer& send) { return true; }
  // Waits until one of the peers of `sends` can take a packet
  // (PeerWritable), or `timeout_s` passed. Never called with a lock held.
  virtual void WaitPeerWritable(const std::vector<v1::SendTransfer>& sends, double timeout_s) {}

  // One packet on a session's own socket `fd` (a get reply goes back on the
  // connection its request came on).
  virtual absl::Status WriteToSocket(int fd, const PacketHeader& header, const void* payload,
                                     uint32_t length) = 0;
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PACKET_WRITER_H_
