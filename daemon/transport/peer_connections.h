// The daemon's outgoing data connections: one TCP connection per peer
// daemon, opened on the first packet for it and kept (DESIGN.md §5).
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
// Thread safety: any thread; the connection map has its own lock, which is
// not held while writing. One writer per peer at a time (the sender loop).
#ifndef MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_
#define MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "absl/status/statusor.h"
#include "daemon/transport/packet_writer.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::transport {

class PeerConnections final : public PacketWriter {
 public:
  // `io` and `watchdog` must outlive this object.
  PeerConnections(boost::asio::io_context& io, SendWatchdog& watchdog, uint32_t payload_bytes);

  absl::Status WriteToPeer(const v1::SendTransfer& send, const PacketHeader& header,
                           const void* payload, uint32_t length,
                           std::optional<uint32_t> crc) override;
  absl::Status WriteToSocket(int fd, const PacketHeader& header, const void* payload,
                             uint32_t length) override;

  // Closes every connection (a blocked write returns with an error).
  void CloseAll();
  // Open connections, for tests.
  size_t open() const;

 private:
  absl::StatusOr<std::shared_ptr<boost::asio::ip::tcp::socket>> Connect(
      const v1::SendTransfer& send);

  boost::asio::io_context& io_;
  SendWatchdog& watchdog_;
  const int lowat_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<boost::asio::ip::tcp::socket>> peers_;  // by address
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PEER_CONNECTIONS_H_
