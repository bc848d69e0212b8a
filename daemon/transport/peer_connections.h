// The daemon's outgoing data connections: one TCP connection per peer
// daemon, opened on the first packet for it and kept (docs/architecture.md §5).
//
//   PeerConnections peers(io, watchdog, /*payload_bytes=*/32 << 10);
//   RETURN_IF_ERROR(peers.WriteToPeer(send, header, payload, length, crc));
//   ...
//   peers.CloseAll();  // wakes a write blocked on a dead peer
//
// Every connection has TCP_NODELAY and caps what the kernel holds unsent
// at about two packets (TCP_NOTSENT_LOWAT): priorities act only on packets
// still in the daemon's queue, so an urgent tensor must not wait behind a
// megabyte of socket buffer (daemon/README.md: unpaced preemption 38 ->
// 8.7 packet-times). A failed write closes that connection; the next write
// to the peer connects again.
//
// With `keys` enabled, a new connection first runs the initiator's side of
// the authentication handshake (data_auth.h), and the first packet of each
// job on it is preceded by the job's proof; a host without the job's key
// gets FailedPrecondition and sends nothing.
//
// Thread safety: any thread; the connection map has its own lock, which is
// not held while writing. One writer per peer at a time (the sender loop).
#ifndef MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_
#define MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_

#include <map>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/packet_writer.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::transport {

class PeerConnections final : public PacketWriter {
 public:
  // `io`, `watchdog` and `keys` (may be null: no authentication) must
  // outlive this object; `my_host` is the name the handshake gives.
  PeerConnections(boost::asio::io_context& io, SendWatchdog& watchdog, uint32_t payload_bytes,
                  const DataKeys* keys = nullptr, std::string my_host = "");

  absl::Status WriteToPeer(const v1::SendTransfer& send, const PacketHeader& header,
                           const void* payload, uint32_t length,
                           std::optional<uint32_t> crc) override;
  absl::Status WriteToSocket(int fd, const PacketHeader& header, const void* payload,
                             uint32_t length) override;
  // Coalesced (framing.h WriteFrames): one gather write where the kernel
  // takes it, the rest left to the caller.
  absl::StatusOr<size_t> WriteFramesToPeer(const v1::SendTransfer& send,
                                           absl::Span<const Frame> frames) override;
  absl::StatusOr<size_t> WriteFramesToSocket(int fd, absl::Span<const Frame> frames) override;
  // POLLOUT on the peer's connection: with TCP_NOTSENT_LOWAT, set once the
  // kernel holds less than about two packets unsent for it.
  bool PeerWritable(const v1::SendTransfer& send) override;
  void WaitPeerWritable(const std::vector<v1::SendTransfer>& sends, double timeout_s) override;

  // Closes every connection (a blocked write returns with an error).
  void CloseAll();
  // Open connections, for tests.
  size_t open() const;

 private:
  struct Peer {
    std::shared_ptr<boost::asio::ip::tcp::socket> socket;
    SessionAuth auth;  // its jobs change only in the (one) writer
  };
  absl::StatusOr<std::shared_ptr<Peer>> Connect(const v1::SendTransfer& send)
      ABSL_LOCKS_EXCLUDED(mu_);

  boost::asio::io_context& io_;
  SendWatchdog& watchdog_;
  const int lowat_bytes_;
  const DataKeys* const keys_;
  const std::string my_host_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);  // by address
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_
