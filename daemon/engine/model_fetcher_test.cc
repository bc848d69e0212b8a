// ModelFetcher across real loopback TCP: a server daemon written here (it
// answers gets, and routes some requesters through a distributor), and two
// or three fetchers, one of which serves as the distributor on its own
// data sessions. The scheduler is the fake client; no daemon process runs.
#include "daemon/engine/model_fetcher.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "common/clock.h"
#include "common/status_macros.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/transport/data_session.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/peer_connections.h"

namespace mlfabric::daemon {
namespace {

using boost::asio::ip::tcp;
using transport::PacketHeader;
using transport::PacketKind;

constexpr uint32_t kPacket = 4096;

std::vector<uint8_t> Model(size_t bytes) {
  std::vector<uint8_t> model(bytes);
  for (size_t i = 0; i < bytes; ++i) model[i] = static_cast<uint8_t>(i * 13 + 5);
  return model;
}

// Accepts data sessions on 127.0.0.1 and runs `handler` on each.
class Listener {
 public:
  explicit Listener(transport::DataSessionHandler* handler)
      : acceptor_(io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this, handler] {
      std::vector<std::thread> sessions;
      for (;;) {
        auto socket = std::make_shared<tcp::socket>(io_);
        boost::system::error_code error;
        acceptor_.accept(*socket, error);
        if (error || stopping_) break;
        sessions.emplace_back([this, socket, handler] {
          transport::DataSession(socket->native_handle(), "test", 1 << 30).Run(*handler, stopping_);
        });
        std::lock_guard<std::mutex> lock(mu_);
        sockets_.push_back(socket);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        boost::system::error_code ignored;
        for (auto& s : sockets_) s->shutdown(tcp::socket::shutdown_both, ignored);
      }
      for (auto& s : sessions) s.join();
    });
  }
  ~Listener() {
    stopping_ = true;
    boost::system::error_code ignored;
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ignored);
    thread_.join();
  }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }

 private:
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::thread thread_;
};

// Only get requests come to these sessions.
class GetsOnly : public transport::DataSessionHandler {
 public:
  using Serve = std::function<absl::Status(int, const PacketHeader&, const v1::DataGetRequest&)>;
  explicit GetsOnly(Serve serve) : serve_(std::move(serve)) {}
  absl::Status Begin(const PacketHeader&) override {
    return absl::InvalidArgumentError("no transfers here");
  }
  std::shared_ptr<SharedBuffer> BufferFor(const PacketHeader&) override { return nullptr; }
  absl::Status Arrived(const PacketHeader&, std::shared_ptr<SharedBuffer>, bool*) override {
    return absl::OkStatus();
  }
  absl::Status GetRequest(int fd, const PacketHeader& h, const v1::DataGetRequest& b) override {
    return serve_(fd, h, b);
  }
  void Aborted(const PacketHeader&, const std::string&) override {}
  void Ended(const std::string&, const std::set<uint64_t>&, const std::string&) override {}

 private:
  Serve serve_;
};

transport::SendWatchdog& Watchdog() {
  static transport::SendWatchdog watchdog(5);
  return watchdog;
}

// One host's fetching side: what the daemon wires around a ModelFetcher.
struct Host {
  Host(const std::string& name, const std::string& server_address, double get_timeout_s)
      : peers(io, Watchdog(), kPacket),
        send({kPacket, 0, JobPriorityPolicy()}, &clock, &peers, nullptr,
             [](uint64_t, const std::string&) {}),
        resolver(&scheduler, &clock, 0),
        client(io, Watchdog()),
        listener_handler([this](int fd, const PacketHeader& h, const v1::DataGetRequest& b) {
          return fetcher->ServeRelay(fd, h, b);
        }),
        listener(&listener_handler) {
    scheduler.resolve_hook = [server_address](const v1::ResolveServerRequest&,
                                              v1::ResolveServerReply* where) {
      where->set_host("s1");
      where->set_data_address(server_address);
      where->set_job_id(1);
      return absl::OkStatus();
    };
    REQUIRE(send.Start().ok());
    fetcher = std::make_unique<ModelFetcher>(
        ModelFetcher::Options{name, listener.address(), get_timeout_s}, &resolver, &client, &send,
        &Watchdog());
  }
  ~Host() {
    fetcher->Stop();
    send.Stop();
  }
  absl::Status Fetch(int64_t* version, std::vector<uint8_t>* bytes) {
    std::shared_ptr<SharedBuffer> model;
    absl::Status status = fetcher->Fetch("job", "ps", -1, 0, version, &model);
    if (status.ok()) bytes->assign(model->data(), model->data() + model->size());
    return status;
  }

  RealClock clock;
  boost::asio::io_context io;
  transport::PeerConnections peers;
  SendScheduler send;
  FakeSchedulerClient scheduler;
  ServerResolver resolver;
  transport::GetClient client;
  std::unique_ptr<ModelFetcher> fetcher;
  GetsOnly listener_handler;
  Listener listener;
};

// The server's daemon: answers every get with version 5 of `model`, batch
// `batch`, unless `route` names a distributor for the requester.
struct ServerDaemon {
  explicit ServerDaemon(std::vector<uint8_t> bytes)
      : model(std::move(bytes)),
        handler([this](int fd, const PacketHeader& request, const v1::DataGetRequest& body) {
          v1::DataGetReply reply;
          reply.set_version(5);
          reply.set_batch(batch);
          std::string via;
          {
            std::lock_guard<std::mutex> lock(mu);
            requests.push_back(body.requester_host() + (body.no_relay() ? " no_relay" : ""));
            if (!body.no_relay() && route.count(body.requester_host())) via = route[body.requester_host()];
          }
          if (!via.empty()) {
            reply.set_relay_host("distributor");
            reply.set_relay_address(via);
            // As the real one: the header says the model's size either way.
            return transport::WriteGetReply(Watchdog(), fd, request, reply,
                                            static_cast<int64_t>(model.size()));
          }
          RETURN_IF_ERROR(transport::WriteGetReply(Watchdog(), fd, request, reply,
                                                   static_cast<int64_t>(model.size())));
          for (uint64_t at = 0; at < model.size(); at += kPacket) {
            PacketHeader data;
            data.kind = PacketKind::kData;
            data.job = request.job;
            data.transfer = request.transfer;
            data.offset = at;
            const uint32_t length =
                static_cast<uint32_t>(std::min<uint64_t>(kPacket, model.size() - at));
            RETURN_IF_ERROR(
                transport::WritePacket(Watchdog(), fd, data, model.data() + at, length));
          }
          return absl::OkStatus();
        }),
        listener(&handler) {}

  std::vector<uint8_t> model;
  uint64_t batch = 9;
  std::mutex mu;
  std::map<std::string, std::string> route;  // requester -> distributor address
  std::vector<std::string> requests;
  GetsOnly handler;
  Listener listener;
};

TEST_CASE("ModelFetcher fetches from the server's daemon and forwards its copy as a distributor") {
  ServerDaemon server(Model(50000));
  Host a("a", server.listener.address(), 5.0);
  Host b("b", server.listener.address(), 5.0);
  int64_t version = 0;
  std::vector<uint8_t> got;
  REQUIRE(a.Fetch(&version, &got).ok());
  CHECK(version == 5);
  CHECK(got == server.model);
  // b is routed through a, which forwards its copy of batch 9.
  {
    std::lock_guard<std::mutex> lock(server.mu);
    server.route["b"] = a.listener.address();
  }
  got.clear();
  absl::Status fetched = b.Fetch(&version, &got);
  INFO(fetched.ToString());
  REQUIRE(fetched.ok());
  CHECK(version == 5);
  CHECK(got == server.model);
  CHECK(a.fetcher->copies_forwarded() == 1);
  std::lock_guard<std::mutex> lock(server.mu);
  CHECK(server.requests == std::vector<std::string>{"a", "b"});  // the model left s1 once
}

TEST_CASE("ModelFetcher: a distributor without the copy sends the get back to the server's daemon") {
  ServerDaemon server(Model(20000));
  Host a("a", server.listener.address(), 0.2);  // waits 0.2 s for its own copy
  Host c("c", server.listener.address(), 5.0);
  {
    std::lock_guard<std::mutex> lock(server.mu);
    server.route["c"] = a.listener.address();  // a never fetched batch 9
  }
  int64_t version = 0;
  std::vector<uint8_t> got;
  absl::Status fetched = c.Fetch(&version, &got);
  INFO(fetched.ToString());
  REQUIRE(fetched.ok());
  CHECK(got == server.model);
  CHECK(a.fetcher->copies_forwarded() == 0);
  std::lock_guard<std::mutex> lock(server.mu);
  CHECK(server.requests == std::vector<std::string>{"c", "c no_relay"});
}

TEST_CASE("ModelFetcher names where a get failed") {
  ServerDaemon server(Model(1000));
  Host a("a", server.listener.address(), 5.0);
  int64_t version = 0;
  std::vector<uint8_t> got;
  SECTION("the scheduler does not know the server") {
    a.scheduler.resolve_hook = [](const v1::ResolveServerRequest&, v1::ResolveServerReply*) {
      return absl::NotFoundError("no server 'ps' in job 'job'");
    };
    absl::Status status = a.Fetch(&version, &got);
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(status.message()).find("get: ") == 0);
    CHECK(std::string(status.message()).find("no server 'ps'") != std::string::npos);
  }
  SECTION("the server's daemon is not there") {
    tcp::endpoint gone;
    {
      boost::asio::io_context io;
      tcp::acceptor closed(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
      gone = closed.local_endpoint();
    }
    a.scheduler.resolve_hook = [gone](const v1::ResolveServerRequest&,
                                      v1::ResolveServerReply* where) {
      where->set_host("s9");
      where->set_data_address("127.0.0.1:" + std::to_string(gone.port()));
      where->set_job_id(1);
      return absl::OkStatus();
    };
    absl::Status status = a.Fetch(&version, &got);
    CHECK(!status.ok());
    CHECK(std::string(status.message()).find("s9") != std::string::npos);
  }
}

}  // namespace
}  // namespace mlfabric::daemon
