#include "daemon/transport/peer_connections.h"

#include <netinet/in.h>
#include <cmath>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "daemon/transport/framing.h"

namespace mlfabric::transport {

using boost::asio::ip::tcp;

PeerConnections::PeerConnections(boost::asio::io_context& io, SendWatchdog& watchdog,
                                 uint32_t payload_bytes, const DataKeys* keys,
                                 std::string my_host)
    : io_(io),
      watchdog_(watchdog),
      lowat_bytes_(2 * (static_cast<int>(payload_bytes) + static_cast<int>(kHeaderBytes))),
      keys_(keys),
      my_host_(std::move(my_host)) {}

absl::StatusOr<std::shared_ptr<PeerConnections::Peer>> PeerConnections::Connect(
    const v1::SendTransfer& send) {
  MutexLock lock(&mu_);
  auto& peer = peers_[send.dst_address()];
  if (peer != nullptr && peer->socket->is_open()) return peer;
  auto endpoint = ParseEndpoint(send.dst_address());
  if (!endpoint.ok()) {
    peers_.erase(send.dst_address());
    return endpoint.status();
  }
  auto fresh = std::make_shared<Peer>();
  fresh->socket = std::make_shared<tcp::socket>(io_);
  boost::system::error_code error;
  fresh->socket->connect(*endpoint, error);
  if (error) {
    peers_.erase(send.dst_address());
    return absl::UnavailableError(absl::StrCat("cannot connect to ", send.dst_host(), " at ",
                                               send.dst_address(), ": ", error.message()));
  }
  fresh->socket->set_option(tcp::no_delay(true), error);
  if (keys_ != nullptr) {
    auto auth = InitiatorHandshake(fresh->socket->native_handle(), *keys_, my_host_,
                                   absl::StrCat(send.dst_host(), " at ", send.dst_address()));
    if (!auth.ok()) {
      fresh->socket->close(error);
      peers_.erase(send.dst_address());
      return auth.status();
    }
    fresh->auth = std::move(*auth);
  }
  ::setsockopt(fresh->socket->native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat_bytes_,
               sizeof(lowat_bytes_));
  peer = fresh;
  return peer;
}

bool PeerConnections::PeerWritable(const v1::SendTransfer& send) {
  int fd = -1;
  {
    MutexLock lock(&mu_);
    auto it = peers_.find(send.dst_address());
    if (it == peers_.end()) return true;  // connects on the first write
    fd = it->second->socket->native_handle();
  }
  pollfd p{fd, POLLOUT, 0};
  // An error or hang-up counts as writable: the write then fails and says why.
  return ::poll(&p, 1, 0) != 0;
}

void PeerConnections::WaitPeerWritable(const std::vector<v1::SendTransfer>& sends,
                                       double timeout_s) {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<Peer>> held;  // keeps each socket open while polled
  {
    MutexLock lock(&mu_);
    for (const v1::SendTransfer& send : sends) {
      auto it = peers_.find(send.dst_address());
      if (it == peers_.end()) return;  // gone or not connected yet: look again now
      held.push_back(it->second);
      fds.push_back({it->second->socket->native_handle(), POLLOUT, 0});
    }
  }
  if (fds.empty()) return;
  const int timeout_ms = static_cast<int>(std::ceil(std::max(0.0, timeout_s) * 1000));
  (void)::poll(fds.data(), fds.size(), timeout_ms);
}

absl::Status PeerConnections::WriteToPeer(const v1::SendTransfer& send,
                                          const PacketHeader& header, const void* payload,
                                          uint32_t length, std::optional<uint32_t> crc) {
  Frame frame{header, payload, length, crc};
  absl::StatusOr<size_t> written = WriteFramesToPeer(send, absl::MakeConstSpan(&frame, 1));
  return written.status();
}

absl::StatusOr<size_t> PeerConnections::WriteFramesToPeer(const v1::SendTransfer& send,
                                                          absl::Span<const Frame> frames) {
  auto connected = Connect(send);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<Peer> peer = std::move(*connected);
  const int fd = peer->socket->native_handle();
  absl::StatusOr<size_t> written = size_t{0};
  // Each job's first packet on this connection follows the job's proof.
  for (const Frame& f : frames) {
    if (peer->auth.Allows(f.header.job)) continue;
    absl::StatusOr<std::string> proof = JobProof(peer->auth, *keys_, f.header.job);
    if (!proof.ok()) return proof.status();  // nothing was written: the connection stays
    PacketHeader frame;
    frame.kind = PacketKind::kJobProof;
    frame.job = f.header.job;
    frame.length = static_cast<uint32_t>(proof->size());
    absl::Status status = WritePacket(watchdog_, fd, frame, proof->data(), frame.length);
    if (!status.ok()) {
      written = status;
      break;
    }
    peer->auth.jobs.insert(f.header.job);
  }
  if (written.ok()) written = WriteFrames(watchdog_, fd, frames);
  if (!written.ok()) {
    MutexLock lock(&mu_);
    boost::system::error_code ignored;
    DetachCipher(fd);
    peer->socket->close(ignored);
    if (auto it = peers_.find(send.dst_address()); it != peers_.end() && it->second == peer) {
      peers_.erase(it);
    }
  }
  return written;
}

absl::StatusOr<size_t> PeerConnections::WriteFramesToSocket(int fd,
                                                            absl::Span<const Frame> frames) {
  return WriteFrames(watchdog_, fd, frames);
}

absl::Status PeerConnections::WriteToSocket(int fd, const PacketHeader& header,
                                            const void* payload, uint32_t length) {
  return WritePacket(watchdog_, fd, header, payload, length);
}

void PeerConnections::CloseAll() {
  MutexLock lock(&mu_);
  boost::system::error_code ignored;
  for (auto& [address, peer] : peers_) {
    DetachCipher(peer->socket->native_handle());
    peer->socket->close(ignored);
  }
}

size_t PeerConnections::open() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [address, peer] : peers_) n += peer != nullptr && peer->socket->is_open();
  return n;
}

}  // namespace mlfabric::transport
