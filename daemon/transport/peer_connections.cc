#include "daemon/transport/peer_connections.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "daemon/transport/framing.h"

namespace mlfabric::transport {

using boost::asio::ip::tcp;

PeerConnections::PeerConnections(boost::asio::io_context& io, SendWatchdog& watchdog,
                                 uint32_t payload_bytes)
    : io_(io),
      watchdog_(watchdog),
      lowat_bytes_(2 * (static_cast<int>(payload_bytes) + static_cast<int>(kHeaderBytes))) {}

absl::StatusOr<std::shared_ptr<tcp::socket>> PeerConnections::Connect(
    const v1::SendTransfer& send) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& peer = peers_[send.dst_address()];
  if (peer != nullptr && peer->is_open()) return peer;
  auto endpoint = ParseEndpoint(send.dst_address());
  if (!endpoint.ok()) {
    peers_.erase(send.dst_address());
    return endpoint.status();
  }
  peer = std::make_shared<tcp::socket>(io_);
  boost::system::error_code error;
  peer->connect(*endpoint, error);
  if (error) {
    peers_.erase(send.dst_address());
    return absl::UnavailableError(absl::StrCat("cannot connect to ", send.dst_host(), " at ",
                                               send.dst_address(), ": ", error.message()));
  }
  peer->set_option(tcp::no_delay(true), error);
  ::setsockopt(peer->native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat_bytes_,
               sizeof(lowat_bytes_));
  return peer;
}

absl::Status PeerConnections::WriteToPeer(const v1::SendTransfer& send,
                                          const PacketHeader& header, const void* payload,
                                          uint32_t length, std::optional<uint32_t> crc) {
  auto connected = Connect(send);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<tcp::socket> socket = std::move(*connected);
  absl::Status status = WritePacket(watchdog_, socket->native_handle(), header, payload, length, crc);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    boost::system::error_code ignored;
    socket->close(ignored);
    if (auto it = peers_.find(send.dst_address()); it != peers_.end() && it->second == socket) {
      peers_.erase(it);
    }
  }
  return status;
}

absl::Status PeerConnections::WriteToSocket(int fd, const PacketHeader& header,
                                            const void* payload, uint32_t length) {
  return WritePacket(watchdog_, fd, header, payload, length);
}

void PeerConnections::CloseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  boost::system::error_code ignored;
  for (auto& [address, socket] : peers_) socket->close(ignored);
}

size_t PeerConnections::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [address, socket] : peers_) n += socket != nullptr && socket->is_open();
  return n;
}

}  // namespace mlfabric::transport
