// A daemon's threads grow with what it is doing at once, not with what is
// connected to it (daemon/README.md "Application threads", "Receive
// threads"): 32 applications registered on w1's daemon and 64 silent
// connections to s1's data port add no thread to either, and 100 gets, in
// waves of 10 at once, leave w1 with threads for what was in flight at
// once (a get holds one while it waits for its model), not one per get or
// per application. Thread counts are read from /proc/<pid>/task of the
// real daemon processes.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

constexpr int kApps = 32;
constexpr int kIdleSessions = 64;
constexpr int kGets = 100;
constexpr int kAtOnce = 10;
constexpr size_t kModelBytes = 64 * 1024;

// The process's own threads: those named after it (mlfabricd). gRPC's
// threads (named default-executo, event_engine, ...) are gRPC's to grow
// and are left out.
int Threads(launch::Subprocess& process) {
  const std::string dir = "/proc/" + std::to_string(process.pid()) + "/task";
  DIR* tasks = ::opendir(dir.c_str());
  if (tasks == nullptr) return -1;
  int n = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(dir + "/" + entry->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    n += name == "mlfabricd";
  }
  ::closedir(tasks);
  return n;
}

// "name x count" of a process's threads, by /proc/<pid>/task/*/comm.
std::string ThreadNames(launch::Subprocess& process) {
  const std::string dir = "/proc/" + std::to_string(process.pid()) + "/task";
  std::map<std::string, int> names;
  DIR* tasks = ::opendir(dir.c_str());
  if (tasks == nullptr) return "";
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(dir + "/" + entry->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
  }
  ::closedir(tasks);
  std::string text;
  for (const auto& [name, n] : names) text += name + " x" + std::to_string(n) + "; ";
  return text;
}

// The port of a daemon's data listener, from its "serving: data A:P" line.
int DataPort(launch::Subprocess& daemon) {
  std::smatch match;
  const std::string log = daemon.Log();
  if (!std::regex_search(log, match, std::regex(R"(serving: data [0-9.]+:([0-9]+))"))) return -1;
  return std::stoi(match[1]);
}

// A TCP connection to 127.0.0.1:`port` that sends nothing.
int ConnectSilently(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

std::unique_ptr<Worker> ConnectWorker(launch::Cluster& c, const std::string& name) {
  ClientOptions options;
  options.daemon_socket = c.Socket("w1");
  options.name = name;
  auto worker = Worker::Connect(options);
  REQUIRE(worker.ok());
  return std::move(*worker);
}

TEST_CASE("a daemon's threads follow the work in flight, not the connections") {
  const std::string dir = launch::MakeTempDir("daemon-threads");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"}]})";
  auto started = launch::Cluster::StartLoopback({"s1", "w1"}, {"--config=" + config});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& c = **started;
  testing::InProcessServer server(
      c.Socket("s1"), "ps0", testing::NextVersion, []() -> absl::StatusOr<Server::Snapshot> {
        Server::Snapshot snapshot;
        snapshot.version = 1;
        snapshot.bytes.assign(kModelBytes, 7);
        return snapshot;
      });
  REQUIRE(server.status().ok());

  // One application and one get first: the daemons' fixed threads and
  // pools are up.
  std::vector<std::unique_ptr<Worker>> workers;
  workers.push_back(ConnectWorker(c, "w0"));
  REQUIRE(workers[0]->Get("ps0").ok());
  launch::Subprocess& w1 = c.daemon("w1");
  launch::Subprocess& s1 = c.daemon("s1");
  const int w1_before = Threads(w1), s1_before = Threads(s1);
  REQUIRE(w1_before > 0);
  REQUIRE(s1_before > 0);

  // 31 more applications, registered one after another, and 64 silent
  // data connections: no thread each.
  for (int a = 1; a < kApps; ++a) workers.push_back(ConnectWorker(c, "w" + std::to_string(a)));
  const int port = DataPort(s1);
  REQUIRE(port > 0);
  std::vector<int> idle;
  for (int i = 0; i < kIdleSessions; ++i) {
    const int fd = ConnectSilently(port);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  const int w1_connected = Threads(w1), s1_connected = Threads(s1);
  INFO("w1 threads: " << w1_before << " -> " << w1_connected << "; s1: " << s1_before << " -> "
                      << s1_connected);
  // At most the few handler threads that took the registrations: they
  // come one at a time (each waits for its reply), but a thread may still
  // be finishing one (arming its application's wait again) as the next
  // arrives, and then another starts. One thread per application would be
  // 31 more.
  CHECK(w1_connected <= w1_before + 3);
  CHECK(s1_connected <= s1_before);

  // 100 gets, 10 at a time from 10 applications.
  int w1_most = 0;
  for (int wave = 0; wave < kGets / kAtOnce; ++wave) {
    std::vector<std::future<absl::StatusOr<Model>>> gets;
    for (int g = 0; g < kAtOnce; ++g) {
      Worker* w = workers[(wave * kAtOnce + g) % kApps].get();
      gets.push_back(std::async(std::launch::async, [w] { return w->Get("ps0"); }));
    }
    for (auto& get : gets) {
      absl::StatusOr<Model> model = get.get();
      INFO(model.status().ToString());
      REQUIRE(model.ok());
      CHECK(model->size() == kModelBytes);
    }
    w1_most = std::max(w1_most, Threads(w1));
  }
  INFO("w1 threads: " << w1_before << " at first, at most " << w1_most << " after a wave ("
                      << ThreadNames(w1) << ")");
  // Each get in flight holds a thread while it waits for the model, and
  // each application message being handled one: a wave's 10 gets, and the
  // get and buffer-release messages of its 10 applications (a wave's
  // releases may still be handled as the next wave's gets come). Never
  // 3 x 10 beyond the start, whatever the 100 gets and 32 applications
  // (one thread per application kept 31 more alive before any get).
  CHECK(w1_most <= w1_before + 3 * kAtOnce);
  // s1 serves each wave's 10 gets at once, a thread each while the batch's
  // snapshot is taken and the replies stream, and handles the server
  // application's replies: at most 2 x 10 beyond the start.
  INFO("s1 threads: " << Threads(s1) << " (" << ThreadNames(s1) << ")");
  CHECK(Threads(s1) <= s1_before + 2 * kAtOnce);
  for (int fd : idle) ::close(fd);
  server.Stop();
  std::remove(config.c_str());
}

}  // namespace
}  // namespace mlfabric
