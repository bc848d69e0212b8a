// GetClient against a small answering daemon on loopback TCP, written
// here: a model arrives whole with every packet reported, a kept
// connection carries the next get, and each way an answer can go wrong is
// an error that says which.
#include "daemon/transport/get_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "daemon/transport/framing.h"

namespace mlfabric::transport {
namespace {

using boost::asio::ip::tcp;

// Accepts connections on 127.0.0.1 and answers each get request on them
// with `answer(socket fd, request header)`, until the connection closes.
class AnsweringDaemon {
 public:
  using Answer = std::function<void(int fd, const PacketHeader& request)>;

  explicit AnsweringDaemon(Answer answer)
      : acceptor_(io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
        answer_(std::move(answer)) {
    thread_ = std::thread([this] {
      for (;;) {
        tcp::socket socket(io_);
        boost::system::error_code error;
        acceptor_.accept(socket, error);
        if (error || stopping_) return;
        ++connections_;
        FrameReader reader(socket.native_handle());
        for (;;) {
          auto request = reader.ReadHeader();
          if (!request.ok()) break;
          std::string body(request->length, '\0');
          if (!reader.ReadPayload(body.data(), body.size()).ok()) break;
          answer_(socket.native_handle(), *request);
        }
      }
    });
  }
  ~AnsweringDaemon() {
    stopping_ = true;
    boost::system::error_code ignored;
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ignored);
    thread_.join();
  }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  int connections() const { return connections_; }

 private:
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  Answer answer_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

SendWatchdog& Watchdog() {
  static SendWatchdog watchdog(5);
  return watchdog;
}

void WriteReply(int fd, const PacketHeader& request, const v1::DataGetReply& body,
                uint64_t model_bytes) {
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.transfer = request.transfer;
  reply.offset = model_bytes;
  const std::string payload = body.SerializeAsString();
  REQUIRE(WritePacket(Watchdog(), fd, reply, payload.data(),
                      static_cast<uint32_t>(payload.size()))
              .ok());
}

void WriteModel(int fd, const std::vector<uint8_t>& model, uint32_t packet) {
  for (uint64_t at = 0; at < model.size(); at += packet) {
    PacketHeader data;
    data.kind = PacketKind::kData;
    data.offset = at;
    const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(packet, model.size() - at));
    REQUIRE(WritePacket(Watchdog(), fd, data, model.data() + at, length).ok());
  }
}

std::vector<uint8_t> Model(size_t bytes) {
  std::vector<uint8_t> model(bytes);
  for (size_t i = 0; i < bytes; ++i) model[i] = static_cast<uint8_t>(i * 7 + 3);
  return model;
}

PacketHeader Request(uint64_t id) {
  PacketHeader request;
  request.kind = PacketKind::kGetRequest;
  request.transfer = id;
  return request;
}

TEST_CASE("GetClient: a model arrives whole, packet by packet, and the connection is kept") {
  const std::vector<uint8_t> model = Model(100000);
  AnsweringDaemon server([&](int fd, const PacketHeader& request) {
    v1::DataGetReply reply;
    reply.set_version(7);
    reply.set_batch(3);
    WriteReply(fd, request, reply, model.size());
    WriteModel(fd, model, 32 * 1024);
  });
  boost::asio::io_context io;
  GetClient client(io, Watchdog());
  for (uint64_t get = 1; get <= 2; ++get) {
    GetClient::Connection c;
    REQUIRE(client.Request("s1", server.address(), Request(get), v1::DataGetRequest(), &c).ok());
    CHECK(c.reply.version() == 7);
    CHECK(c.reply.batch() == 3);
    REQUIRE(c.header.offset == model.size());
    auto buffer = SharedBuffer::Create(model.size());
    REQUIRE(buffer.ok());
    std::vector<std::pair<uint64_t, uint64_t>> arrived;
    REQUIRE(client.Receive(c, *buffer, [&](uint64_t b, uint64_t e) { arrived.push_back({b, e}); })
                .ok());
    CHECK(std::equal(model.begin(), model.end(), buffer->data()));
    REQUIRE(arrived.size() == 4);  // 3 x 32 KiB + the rest
    CHECK(arrived.front() == std::make_pair<uint64_t, uint64_t>(0, 32768));
    CHECK(arrived.back().second == model.size());
    client.Keep(c);
    CHECK(client.idle() == 1);
  }
  CHECK(server.connections() == 1);  // the second get reused the first's connection
}

TEST_CASE("GetClient: its connections carry the peer timeout it was given") {
  AnsweringDaemon server([&](int fd, const PacketHeader& request) {
    WriteReply(fd, request, v1::DataGetReply(), 0);
  });
  boost::asio::io_context io;
  auto keepalive = [&](GetClient& client) {
    GetClient::Connection c;
    REQUIRE(client.Request("s1", server.address(), Request(1), v1::DataGetRequest(), &c).ok());
    int on = -1;
    unsigned int user_timeout_ms = 0;
    socklen_t size = sizeof(on);
    REQUIRE(::getsockopt(c.socket->native_handle(), SOL_SOCKET, SO_KEEPALIVE, &on, &size) == 0);
    size = sizeof(user_timeout_ms);
    REQUIRE(::getsockopt(c.socket->native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT,
                         &user_timeout_ms, &size) == 0);
    return std::make_pair(on, user_timeout_ms);
  };
  // A host cut off mid-get (a partition) then fails the get in about 3 s
  // instead of holding it for ever; tests/failover_test cuts one.
  GetClient bounded(io, Watchdog(), 4, uint64_t{1} << 30, nullptr, "w1", 1.0);
  CHECK(keepalive(bounded) == std::make_pair(1, 3000u));
  GetClient unbounded(io, Watchdog());
  CHECK(keepalive(unbounded) == std::make_pair(0, 0u));
}

TEST_CASE("GetClient: errors name what went wrong") {
  boost::asio::io_context io;
  GetClient client(io, Watchdog(), /*max_idle_per_address=*/4, /*max_model_bytes=*/1 << 20);
  // Each section's connection is declared after its daemon, so that it is
  // closed first (the daemon's thread reads from it until then).

  SECTION("nobody listens") {
    std::string address;
    {
      AnsweringDaemon gone([](int, const PacketHeader&) {});
      address = gone.address();
    }
    GetClient::Connection c;
    const absl::Status s = client.Request("s1", address, Request(1), {}, &c);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(s.message()).find("get: cannot reach s1 at " + address) == 0);
  }
  SECTION("the reply's own error") {
    AnsweringDaemon server([](int fd, const PacketHeader& request) {
      v1::DataGetReply reply;
      reply.set_error("server 'ps0' disconnected");
      WriteReply(fd, request, reply, 0);
    });
    GetClient::Connection c;
    const absl::Status s = client.Request("s1", server.address(), Request(1), {}, &c);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(s.message() == "server 'ps0' disconnected");
  }
  SECTION("a reply to another request") {
    AnsweringDaemon server([](int fd, const PacketHeader& request) {
      WriteReply(fd, Request(request.transfer + 1), v1::DataGetReply(), 0);
    });
    GetClient::Connection c;
    const absl::Status s = client.Request("s1", server.address(), Request(1), {}, &c);
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(s.message()).find("malformed reply from s1") != std::string::npos);
  }
  SECTION("a model larger than allowed") {
    AnsweringDaemon server([](int fd, const PacketHeader& request) {
      WriteReply(fd, request, v1::DataGetReply(), 2 << 20);
    });
    GetClient::Connection c;
    const absl::Status s = client.Request("s1", server.address(), Request(1), {}, &c);
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(s.message()).find("out of range") != std::string::npos);
  }
  SECTION("the answering daemon gives up mid-transfer, or cuts it") {
    const std::vector<uint8_t> model = Model(70000);
    for (const bool abort : {true, false}) {
      AnsweringDaemon server([&](int fd, const PacketHeader& request) {
        WriteReply(fd, request, v1::DataGetReply(), model.size());
        WriteModel(fd, std::vector<uint8_t>(model.begin(), model.begin() + 32768), 32768);
        if (abort) {
          PacketHeader stop;
          stop.kind = PacketKind::kAbort;
          const std::string reason = "w4 lost the model mid-forward";
          REQUIRE(WritePacket(Watchdog(), fd, stop, reason.data(),
                              static_cast<uint32_t>(reason.size()))
                      .ok());
        } else {
          ::shutdown(fd, SHUT_RDWR);
        }
      });
      GetClient::Connection got;
      REQUIRE(client.Request("w4", server.address(), Request(1), {}, &got).ok());
      auto buffer = SharedBuffer::Create(model.size());
      REQUIRE(buffer.ok());
      int packets = 0;
      const absl::Status s = client.Receive(got, *buffer, [&](uint64_t, uint64_t) { ++packets; });
      CHECK(packets == 1);
      if (abort) {
        CHECK(s.code() == absl::StatusCode::kAborted);
        CHECK(s.message() == "w4 lost the model mid-forward");
      } else {
        CHECK(s.code() == absl::StatusCode::kUnavailable);
        CHECK(std::string(s.message()).find("model transfer cut") != std::string::npos);
      }
    }
  }
  SECTION("a buffer too small for the model") {
    const std::vector<uint8_t> model = Model(5000);
    AnsweringDaemon server([&](int fd, const PacketHeader& request) {
      WriteReply(fd, request, v1::DataGetReply(), model.size());
    });
    GetClient::Connection c;
    REQUIRE(client.Request("s1", server.address(), Request(1), {}, &c).ok());
    auto small = SharedBuffer::Create(100);
    REQUIRE(small.ok());
    CHECK(client.Receive(c, *small, nullptr).code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("GetClient: Shutdown ends a get waiting on a daemon that does not answer") {
  std::atomic<bool> asked{false};
  std::atomic<bool> release{false};
  AnsweringDaemon silent([&](int, const PacketHeader&) {
    asked = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  boost::asio::io_context io;
  GetClient client(io, Watchdog());
  absl::Status status;
  std::thread get([&] {
    GetClient::Connection c;
    status = client.Request("s1", silent.address(), Request(1), {}, &c);
  });
  while (!asked) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  client.Shutdown();
  get.join();  // returns: the read was woken
  release = true;
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  GetClient::Connection again;
  status = client.Request("s1", silent.address(), Request(2), {}, &again);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(status.message()).find("stopping") != std::string::npos);
  CHECK(client.idle() == 0);
}

}  // namespace
}  // namespace mlfabric::transport
