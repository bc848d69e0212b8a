// ModelServer with a fake set of server applications and the fake
// scheduler client; each get arrives on one end of a socket pair and its
// reply is read from the other, as the asking daemon would.
#include "daemon/engine/model_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/peer_connections.h"

namespace mlfabric::daemon {
namespace {

using transport::PacketHeader;
using transport::PacketKind;

constexpr uint32_t kPacket = 4096;

class FakeApps final : public ServerApps {
 public:
  bool AwaitServer(const std::string&, double) override { return connected; }
  absl::Status AskSnapshot(const std::string& key, uint64_t request_id,
                           int64_t /*at_version*/) override {
    std::lock_guard<std::mutex> lock(mu);
    asks.push_back(request_id);
    keys.push_back(key);
    cv.notify_all();
    return absl::OkStatus();
  }
  std::string JobOf(const std::string&) override { return "job"; }
  uint64_t AwaitAsk(size_t count = 1) {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return asks.size() >= count; }));
    return asks.back();
  }

  bool connected = true;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> asks;
  std::vector<std::string> keys;
};

struct Fixture {
  explicit Fixture(double get_timeout_s = 30)
      : peers(io, watchdog, kPacket),
        send({kPacket, 0, JobPriorityPolicy()}, &clock, &peers, nullptr,
             [](uint64_t, const std::string&) {}) {
    REQUIRE(send.Start().ok());
    ModelServer::Options options;
    options.host = "h1";
    options.payload_bytes = kPacket;
    options.get_timeout_s = get_timeout_s;
    server = std::make_unique<ModelServer>(options, &apps, &scheduler, &send, &watchdog);
  }
  ~Fixture() {
    server->Stop();
    send.Stop();
  }

  // One get on a socket pair, served on its own thread.
  struct Get {
    int fds[2] = {-1, -1};
    std::thread serving;
    absl::Status served;
    ~Get() {
      if (serving.joinable()) serving.join();
      ::close(fds[0]);
      ::close(fds[1]);
    }
  };
  // fresh_min_version >= 0: a server group's fresh get (DataGetRequest.fresh).
  std::unique_ptr<Get> StartGet(uint64_t id, const std::string& requester,
                                int64_t fresh_min_version = -1) {
    auto get = std::make_unique<Get>();
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, get->fds) == 0);
    PacketHeader request;
    request.kind = PacketKind::kGetRequest;
    request.job = 1;
    request.transfer = id;
    v1::DataGetRequest body;
    body.set_server("ps");
    body.set_requester_host(requester);
    if (fresh_min_version >= 0) {
      body.set_fresh(true);
      body.set_min_version(fresh_min_version);
      body.set_no_relay(true);
    }
    Get* raw = get.get();
    get->serving = std::thread([this, raw, request, body] {
      raw->served = server->Serve(raw->fds[1], request, body);
    });
    return get;
  }
  // Reads the reply (and the model, if one follows) on the asking end.
  static v1::DataGetReply ReadReply(Get& get, std::string* model) {
    transport::FrameReader reader(get.fds[0]);
    auto header = reader.ReadHeader();
    REQUIRE(header.ok());
    REQUIRE(header->kind == PacketKind::kGetReply);
    std::string payload(header->length, '\0');
    REQUIRE(reader.ReadPayload(payload.data(), payload.size()).ok());
    v1::DataGetReply reply;
    REQUIRE(reply.ParseFromString(payload));
    if (!reply.error().empty()) return reply;
    model->assign(header->offset, '\0');
    for (uint64_t got = 0; got < header->offset;) {
      auto data = reader.ReadHeader();
      REQUIRE(data.ok());
      REQUIRE(data->kind == PacketKind::kData);
      REQUIRE(reader.ReadPayload(model->data() + data->offset, data->length).ok());
      got += data->length;
    }
    return reply;
  }

  RealClock clock;
  boost::asio::io_context io;
  transport::SendWatchdog watchdog{5.0};
  transport::PeerConnections peers;
  SendScheduler send;
  FakeApps apps;
  FakeSchedulerClient scheduler;
  std::unique_ptr<ModelServer> server;
};

std::shared_ptr<SharedBuffer> Model(size_t bytes) {
  auto created = SharedBuffer::Create(bytes);
  REQUIRE(created.ok());
  auto model = std::make_shared<SharedBuffer>(std::move(*created));
  for (size_t i = 0; i < bytes; ++i) model->data()[i] = static_cast<uint8_t>(i * 31 + 7);
  return model;
}

TEST_CASE("ModelServer: gets that come while the snapshot is taken share it") {
  Fixture f;
  auto first = f.StartGet(1, "w1");
  const uint64_t batch = f.apps.AwaitAsk();
  auto second = f.StartGet(2, "w2");
  auto third = f.StartGet(3, "w3");
  // Both have joined the batch once the server counts them.
  for (int i = 0; i < 3000 && f.server->stats().gets < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto model = Model(3 * kPacket + 100);
  f.server->Answer(batch, {42, model, ""});
  const std::string expected(reinterpret_cast<const char*>(model->data()), model->size());
  for (auto* get : {first.get(), second.get(), third.get()}) {
    std::string got;
    const v1::DataGetReply reply = Fixture::ReadReply(*get, &got);
    CHECK(reply.error().empty());
    CHECK(reply.version() == 42);
    CHECK(reply.batch() == batch);
    CHECK(got == expected);
  }
  first.reset();
  second.reset();
  third.reset();
  const ModelServer::Stats stats = f.server->stats();
  CHECK(stats.gets == 3);
  CHECK(stats.snapshots == 1);
  CHECK(stats.copies_sent == 3);
  CHECK(f.apps.asks.size() == 1);
  CHECK(f.apps.keys[0] == "1/ps");
}

TEST_CASE("ModelServer: a fresh get reads one version, kept or asked for until it comes") {
  Fixture f;
  // The snapshots the daemon asked for right after updates 7 and 8.
  const uint64_t at7 = f.server->NewHistoryRequest("1/ps");
  const uint64_t at8 = f.server->NewHistoryRequest("1/ps");
  REQUIRE(at7 != 0);
  f.server->Answer(at7, {7, Model(100), ""});
  f.server->Answer(at8, {8, Model(200), ""});
  auto kept = f.StartGet(1, "w1", /*fresh_min_version=*/7);
  std::string got;
  v1::DataGetReply reply = Fixture::ReadReply(*kept, &got);
  CHECK(reply.error().empty());
  CHECK(reply.version() == 7);
  CHECK(got.size() == 100);
  CHECK(f.apps.asks.empty());  // from what was kept, not the application

  // A version not kept: the application is asked at once (no batch), and
  // again until it has applied the update that makes it.
  auto later = f.StartGet(2, "w1", 10);
  f.server->Answer(f.apps.AwaitAsk(1), {9, Model(300), ""});
  f.server->Answer(f.apps.AwaitAsk(2), {10, Model(300), ""});
  reply = Fixture::ReadReply(*later, &got);
  CHECK(reply.error().empty());
  CHECK(reply.version() == 10);
  CHECK(got.size() == 300);
  CHECK(f.apps.asks.size() == 2);
  // The application went away: its kept snapshots with it.
  f.server->FailServer("1/ps", "server 'ps' disconnected");
  auto gone = f.StartGet(3, "w1", 8);
  f.server->Answer(f.apps.AwaitAsk(3), {0, nullptr, "server 'ps' disconnected"});
  CHECK(Fixture::ReadReply(*gone, &got).error() == "server 'ps' disconnected");
}

TEST_CASE("ModelServer: each way a get fails is its reply's error") {
  SECTION("the server application is not connected") {
    Fixture f;
    f.apps.connected = false;
    auto get = f.StartGet(1, "w1");
    std::string model;
    CHECK(Fixture::ReadReply(*get, &model).error() ==
          "server 'ps' is not connected to h1's daemon");
  }
  SECTION("the server application does not answer") {
    Fixture f(/*get_timeout_s=*/0.2);
    auto get = f.StartGet(1, "w1");
    std::string model;
    CHECK(Fixture::ReadReply(*get, &model).error() == "server 'ps' did not answer within 0.2 s");
  }
  SECTION("the server application goes away") {
    Fixture f;
    auto get = f.StartGet(1, "w1");
    f.apps.AwaitAsk();
    f.server->FailServer("1/ps", "server 'ps' disconnected");
    std::string model;
    CHECK(Fixture::ReadReply(*get, &model).error() == "server 'ps' disconnected");
  }
  SECTION("the server application answers with an error") {
    Fixture f;
    auto get = f.StartGet(1, "w1");
    f.server->Answer(f.apps.AwaitAsk(), {0, nullptr, "callback threw"});
    std::string model;
    CHECK(Fixture::ReadReply(*get, &model).error() == "callback threw");
  }
}

}  // namespace
}  // namespace mlfabric::daemon
