// PeerConnections on loopback TCP: connects on first use, keeps the
// connection for the next packet, reconnects after the peer went away, and
// names the peer when it cannot connect.
#include "daemon/transport/peer_connections.h"

#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "daemon/transport/framing.h"

namespace mlfabric::transport {
namespace {

using boost::asio::ip::tcp;

v1::SendTransfer To(const tcp::endpoint& endpoint) {
  v1::SendTransfer send;
  send.set_dst_host("peer-1");
  send.set_dst_address(endpoint.address().to_string() + ":" + std::to_string(endpoint.port()));
  return send;
}

PacketHeader Data(uint64_t transfer, uint64_t offset) {
  PacketHeader header;
  header.kind = PacketKind::kData;
  header.job = 1;
  header.transfer = transfer;
  header.offset = offset;
  return header;
}

TEST_CASE("PeerConnections keeps one connection per peer and reconnects after a failure") {
  boost::asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  SendWatchdog watchdog(5.0);
  PeerConnections peers(io, watchdog, 16);
  const v1::SendTransfer send = To(acceptor.local_endpoint());
  const std::string payload = "0123456789abcdef";

  REQUIRE(peers.WriteToPeer(send, Data(1, 0), payload.data(), 16, std::nullopt).ok());
  REQUIRE(peers.WriteToPeer(send, Data(1, 16), payload.data(), 16, std::nullopt).ok());
  CHECK(peers.open() == 1);
  {
    tcp::socket accepted(io);
    acceptor.accept(accepted);
    FrameReader reader(accepted.native_handle());
    for (uint64_t offset : {0, 16}) {  // both packets on the one connection, in order
      auto header = reader.ReadHeader();
      REQUIRE(header.ok());
      CHECK(header->transfer == 1);
      CHECK(header->offset == offset);
      std::string got(16, '\0');
      REQUIRE(reader.ReadPayload(got.data(), got.size()).ok());
      REQUIRE(VerifyPayload(*header, got.data()).ok());
      CHECK(got == payload);
    }
  }  // the peer goes away
  // Writes fail once the kernel learns of it; the next write after the
  // failure connects again.
  absl::Status status;
  for (int i = 0; i < 100 && status.ok(); ++i) {
    status = peers.WriteToPeer(send, Data(2, 0), payload.data(), 16, std::nullopt);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(!status.ok());
  CHECK(peers.open() == 0);
  REQUIRE(peers.WriteToPeer(send, Data(3, 0), payload.data(), 16, std::nullopt).ok());
  tcp::socket again(io);
  acceptor.accept(again);
  FrameReader reader(again.native_handle());
  auto header = reader.ReadHeader();
  REQUIRE(header.ok());
  CHECK(header->transfer == 3);
  peers.CloseAll();
}

TEST_CASE("PeerConnections names the peer it cannot reach") {
  boost::asio::io_context io;
  SendWatchdog watchdog(5.0);
  PeerConnections peers(io, watchdog, 16);
  tcp::endpoint closed;
  {
    tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    closed = acceptor.local_endpoint();
  }  // nothing listens there now
  absl::Status status = peers.WriteToPeer(To(closed), Data(1, 0), nullptr, 0, std::nullopt);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(status.message()).find("peer-1") != std::string::npos);
  v1::SendTransfer bad;
  bad.set_dst_host("peer-2");
  bad.set_dst_address("not an address");
  CHECK(peers.WriteToPeer(bad, Data(1, 0), nullptr, 0, std::nullopt).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(peers.open() == 0);
}

}  // namespace
}  // namespace mlfabric::transport
