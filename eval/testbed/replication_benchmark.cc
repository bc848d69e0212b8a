// Bounded-consistency replication against checkpointing on the emulated
// testbed (mlfabric.md §7.3). W workers train
// asynchronously (get, compute, push) against one server; each run is one
// of:
//   none          no fault tolerance (the baseline of the round);
//   replica K     a hot-standby replica on its own host, Div_max = K
//                 updates (every push declares norm 1, momentum 0; K = 0:
//                 no bound), its copies summed at the job's aggregators
//                 (the workers' hosts, as in the paper's §7 setup) as the
//                 scheduler's --replica_aggregation allows;
//   checkpoint K  no replica; every K applied updates the server
//                 application checkpoints its model, holding it meanwhile
//                 (no update is applied during a checkpoint), as a server
//                 that checkpoints a consistent model must. By default
//                 (--checkpoint=remote) the model goes over TCP from the
//                 server's host to a storage host (st1, its own shaped
//                 link), which writes it to a file, fsyncs it and
//                 acknowledges: a checkpoint that outlives the server's
//                 host, as the replica does. --checkpoint=local writes it to
//                 a file on the server's host (fsync) instead.
// Per run it prints the gradients applied per second and, against the
// round's baseline, the training-time overhead (rate_none / rate - 1: the
// extra time to apply the same number of updates). Replica runs also print
// the paper's Fig. 9 figure: updates copied x update size / bytes sent to
// the replica (how much in-network aggregation of the copies saved), and
// how far the replica lagged (at the end, and the most over the measured
// time). --replica_bound=strict passes the scheduler's flag.
//
//   bazel run -c opt //eval/testbed:replication_benchmark --
//       --bounds=1,8,32,128 --worker_link_bps=400e6   (one command line)
// (--replica_aggregation=none|punted passes the scheduler's flag: copies
// direct, or only punted ones summed.)
//
// Runs alternate within a round (none, replica K1, checkpoint K1, replica
// K2, ...): the machine is shared and noisy. Hosts are network namespaces
// with htb-shaped links (root); --mode=loopback runs on 127.0.0.1 with the
// daemons' own pacing instead.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "api/mlfabric.h"
#include "api/registration.h"
#include "api/replica.h"
#include "common/config.h"
#include "launch/cluster.h"
#include "testing/http_client.h"

namespace mlfabric {
namespace {

constexpr char kToken[] = "replication-benchmark-token-0123";

using Clock = std::chrono::steady_clock;

struct Flags {
  int workers = 8;
  int64_t model_bytes = 1 << 20;
  double link_bps = 100e6;
  int64_t compute_ms = 100;
  double seconds = 15;
  double warmup_s = 3;
  int rounds = 1;
  int64_t tau_max = 60;
  std::vector<int64_t> bounds = {1, 8, 32, 128};
  std::string mode = "netns";
  std::string checkpoint = "remote";
  std::string replica_aggregation = "all";  // the scheduler's flag
  std::string replica_bound = "plan";       // the scheduler's flag
  std::string admin_dump;  // a directory: the admin views mid-run, per run
  double worker_link_bps = 0;  // 0: link_bps
};

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Runs `fn` on a thread inside network namespace `netns` (empty: this
// one), and waits for it. Sockets it opens stay in that namespace.
template <typename Fn>
absl::Status InNamespace(const std::string& netns, Fn fn) {
  absl::Status status;
  std::thread t([&] {
    if (!netns.empty()) {
      const std::string path = "/var/run/netns/" + netns;
      const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
        status = absl::InternalError(absl::StrCat("cannot enter ", path, ": ", std::strerror(errno)));
        if (ns >= 0) ::close(ns);
        return;
      }
      ::close(ns);
    }
    status = fn();
  });
  t.join();
  return status;
}

// The storage host's side of remote checkpoints: one connection; each
// checkpoint is an 8-byte length and the bytes, written to `path` and
// fsynced before a one-byte acknowledgement.
class CheckpointStore {
 public:
  ~CheckpointStore() {
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    if (conn_fd_ >= 0) ::shutdown(conn_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (conn_fd_ >= 0) ::close(conn_fd_);
  }
  // Listens on `address` inside `netns`; returns the port.
  absl::StatusOr<int> Listen(const std::string& netns, const std::string& address,
                             const std::string& path) {
    path_ = path;
    int port = 0;
    absl::Status s = InNamespace(netns, [&]() -> absl::Status {
      listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
      socklen_t len = sizeof(addr);
      if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
          ::listen(listen_fd_, 1) != 0 ||
          ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        return absl::InternalError(absl::StrCat("checkpoint store on ", address, ": ",
                                                std::strerror(errno)));
      }
      port = ntohs(addr.sin_port);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    thread_ = std::thread([this] { Serve(); });
    return port;
  }

 private:
  void Serve() {
    conn_fd_ = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn_fd_ < 0) return;
    std::vector<char> buffer;
    uint64_t size = 0;
    while (ReadAll(conn_fd_, reinterpret_cast<char*>(&size), sizeof(size))) {
      buffer.resize(size);
      if (!ReadAll(conn_fd_, buffer.data(), size)) return;
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      const char ok = fd >= 0 && WriteAll(fd, buffer.data(), size) && ::fsync(fd) == 0 ? 1 : 0;
      if (fd >= 0) ::close(fd);
      if (!WriteAll(conn_fd_, &ok, 1)) return;
    }
  }

  std::string path_;
  int listen_fd_ = -1;
  int conn_fd_ = -1;
  std::thread thread_;
};

enum class Kind { kNone, kReplica, kCheckpoint };

struct Setting {
  Kind kind = Kind::kNone;
  int64_t k = 0;  // Div_max in updates, or updates per checkpoint
  std::string Name() const {
    switch (kind) {
      case Kind::kNone: return "none";
      case Kind::kReplica: return k == 0 ? "replica, no bound" : absl::StrCat("replica K=", k);
      case Kind::kCheckpoint: return absl::StrCat("checkpoint K=", k);
    }
    return "";
  }
};

// A model that sums float32 updates; `checkpoint_every` > 0 writes it to
// `checkpoint_path` (fsync) every that many applied updates, under its lock.
struct SumModel {
  std::mutex mu;
  std::vector<float> model;
  int64_t version = 0;
  int64_t checkpoint_every = 0;
  std::string checkpoint_path;  // local checkpoints
  int checkpoint_fd = -1;       // remote: a connection to the CheckpointStore
  int64_t checkpoints = 0;
  double checkpoint_s = 0;
  std::string error;

  absl::StatusOr<int64_t> Apply(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu);
    if (u.bytes != model.size() * sizeof(float)) {
      return absl::InvalidArgumentError("update size does not match the model");
    }
    const float* v = reinterpret_cast<const float*>(u.data);
    for (size_t k = 0; k < model.size(); ++k) model[k] += v[k];
    const int64_t before = version;
    version += u.count;
    if (checkpoint_every > 0 && version / checkpoint_every != before / checkpoint_every) {
      WriteCheckpointLocked();
    }
    return version;
  }

  void WriteCheckpointLocked() {
    const auto start = std::chrono::steady_clock::now();
    if (checkpoint_fd >= 0) {
      const uint64_t size = model.size() * sizeof(float);
      char ack = 0;
      if (!WriteAll(checkpoint_fd, reinterpret_cast<const char*>(&size), sizeof(size)) ||
          !WriteAll(checkpoint_fd, reinterpret_cast<const char*>(model.data()), size) ||
          !ReadAll(checkpoint_fd, &ack, 1) || ack != 1) {
        if (error.empty()) error = "remote checkpoint failed";
      }
      ++checkpoints;
      checkpoint_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return;
    }
    const int fd = ::open(checkpoint_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    bool ok = fd >= 0;
    const char* p = reinterpret_cast<const char*>(model.data());
    size_t left = model.size() * sizeof(float);
    while (ok && left > 0) {
      const ssize_t n = ::write(fd, p, left);
      ok = n > 0;
      if (ok) {
        p += n;
        left -= static_cast<size_t>(n);
      }
    }
    ok = ok && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok && error.empty()) error = absl::StrCat("checkpoint to ", checkpoint_path, ": ", std::strerror(errno));
    ++checkpoints;
    checkpoint_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

struct RunResult {
  int64_t applied = 0, dropped = 0, failed = 0;
  double seconds = 0;
  std::string first_error;
  // Replica runs: the scheduler's counters and the replica's state at the end.
  int64_t replica_copies = 0, replica_aggregates = 0, replica_bytes = 0, replica_updates = 0;
  int64_t replica_lag = 0;  // updates the server applied that the replica had not, at the end
  // The most, sampled every 10 ms over the measured time (server version -
  // replica version).
  int64_t replica_lag_max = 0;
  int64_t checkpoints = 0;
  double checkpoint_s = 0;
};

// Run's cluster: s1 (the server), r1 (the replica), st1 (the checkpoint
// store, for remote checkpoints) and the workers, with their links;
// `host_flags` gets each daemon's pacing flags.
launch::ClusterOptions RunCluster(const Flags& flags, bool remote_checkpoint,
                                  const std::vector<std::string>& workers, int run_index,
                                  std::map<std::string, std::vector<std::string>>* host_flags) {
  launch::ClusterOptions options;
  options.topology =
      flags.mode == "netns" ? launch::Topology::kNetns : launch::Topology::kLoopback;
  options.admin = true;
  const std::string rate = absl::StrFormat("%.0f", flags.link_bps);
  options.hosts = {"s1", "r1"};
  if (remote_checkpoint) options.hosts.push_back("st1");
  options.hosts.insert(options.hosts.end(), workers.begin(), workers.end());
  const double worker_bps = flags.worker_link_bps > 0 ? flags.worker_link_bps : flags.link_bps;
  const std::string worker_rate = absl::StrFormat("%.0f", worker_bps);
  for (const std::string& host : options.hosts) {
    const bool worker = host[0] == 'w';
    options.rates[host] = worker ? launch::LinkRate{worker_bps, worker_bps}
                                 : launch::LinkRate{flags.link_bps, flags.link_bps};
    const std::string& r = worker ? worker_rate : rate;
    (*host_flags)[host] = {"--uplink_bps=" + r, "--downlink_bps=" + r};
  }
  options.rate = {flags.link_bps, flags.link_bps};
  // Unique per process and run (a run killed earlier may have left its own).
  options.prefix = absl::StrCat("rb", ::getpid() % 100000, "-", run_index, "-");
  return options;
}

// Starts the run's scheduler (job "demo"; Div_max for a replica setting)
// and daemons.
absl::Status StartRun(launch::Cluster& c, const Flags& flags, const Setting& setting,
                      const std::vector<std::string>& workers,
                      const std::map<std::string, std::vector<std::string>>& host_flags) {
  const std::string config = c.dir() + "/scheduler.json";
  nlohmann::json job = {{"name", "demo"},
                        {"token", kToken},
                        {"tau_max", flags.tau_max},
                        {"momentum", 0.0},
                        {"aggregators", workers}};
  if (setting.kind == Kind::kReplica) job["divergence_max"] = static_cast<double>(setting.k);
  std::ofstream(config) << nlohmann::json{{"jobs", {job}}}.dump();
  return c.Start({"--config=" + config, "--planner=mlfabric",
                  "--replica_aggregation=" + flags.replica_aggregation,
                  "--replica_bound=" + flags.replica_bound},
                 {}, host_flags);
}

ClientOptions ClientFor(launch::Cluster& c, const std::string& host, const std::string& name) {
  ClientOptions client;
  client.daemon_socket = c.Socket(host);
  client.job_token = kToken;
  client.name = name;
  return client;
}

// Remote checkpoints: the store listens on st1, and the server's model
// sends its checkpoints there from s1 (server_model.checkpoint_fd).
absl::Status ConnectCheckpointStore(launch::Cluster& c, CheckpointStore& store,
                                    SumModel& server_model) {
  const bool netns = c.network() != nullptr;
  const std::string store_address = c.HostAddress("st1");
  auto port = store.Listen(netns ? c.network()->layout().HostNamespace("st1") : "",
                           store_address, c.dir() + "/st1-checkpoint.bin");
  if (!port.ok()) return port.status();
  return InNamespace(netns ? c.network()->layout().HostNamespace("s1") : "",
                     [&]() -> absl::Status {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(*port));
    ::inet_pton(AF_INET, store_address.c_str(), &addr.sin_addr);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (fd >= 0) ::close(fd);
      return absl::InternalError(absl::StrCat("cannot reach the checkpoint store at ",
                                              store_address, ": ", std::strerror(errno)));
    }
    server_model.checkpoint_fd = fd;
    return absl::OkStatus();
  });
}

// What a run's workers count, under `mu`: pushes settled between
// measure_from and stop.
struct Tally {
  std::mutex mu;
  RunResult result;
  Clock::time_point measure_from, stop;
};

// Worker w of a run: gets the model, computes, pushes (at most three
// pushes pending) until tally.stop.
void RunWorker(const Flags& flags, const ClientOptions& client, int w, size_t elements,
               Tally& tally) {
  auto worker = Worker::Connect(client);
  if (!worker.ok()) {
    std::lock_guard<std::mutex> lock(tally.mu);
    if (tally.result.first_error.empty()) {
      tally.result.first_error = std::string(worker.status().message());
    }
    return;
  }
  // Integer-valued, so the replica's model can be compared exactly.
  const std::vector<float> update(elements, static_cast<float>(w + 1));
  std::deque<std::future<PushResult>> pending;
  auto settle = [&](PushResult r) {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(tally.mu);
    if (now < tally.measure_from || now >= tally.stop) return;
    RunResult& result = tally.result;
    if (r.outcome == PushOutcome::kApplied) ++result.applied;
    if (r.outcome == PushOutcome::kDropped) ++result.dropped;
    if (r.outcome == PushOutcome::kFailed) {
      ++result.failed;
      if (result.first_error.empty()) result.first_error = r.reason;
    }
  };
  while (Clock::now() < tally.stop) {
    auto model = (*worker)->Get("ps");
    if (!model.ok()) {
      {
        std::lock_guard<std::mutex> lock(tally.mu);
        if (tally.result.first_error.empty()) {
          tally.result.first_error = std::string(model.status().message());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(flags.compute_ms));
    // Norm 1 per update: Div_max counts updates.
    pending.push_back((*worker)->Push("ps", update.data(), update.size() * sizeof(float),
                                      model->version, /*norm=*/1.0));
    while (!pending.empty() &&
           (pending.size() > 2 ||
            pending.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
      settle(pending.front().get());
      pending.pop_front();
    }
  }
  while (!pending.empty()) {
    settle(pending.front().get());
    pending.pop_front();
  }
}

// Mid-run: what the scheduler plans and knows, for a closer look.
void DumpAdminViews(launch::Cluster& c, const Flags& flags, int run_index) {
  for (const char* view : {"batches", "jobs", "transfers", "cluster"}) {
    const testing::HttpResult r = testing::Http(c.admin_port(), "GET", absl::StrCat("/api/v1/", view));
    std::ofstream(absl::StrCat(flags.admin_dump, "/run", run_index, "-", view, ".json")) << r.body;
  }
}

// The replica's lag as the models show it, not as the scheduler
// estimates it: the bound must hold for these. The most, every 10 ms of
// the measured time.
void SampleReplicaLag(SumModel& server_model, SumModel& replica_model, Tally& tally) {
  std::this_thread::sleep_until(tally.measure_from);
  while (Clock::now() < tally.stop) {
    int64_t lag = 0;
    {
      std::lock_guard<std::mutex> s(server_model.mu);
      std::lock_guard<std::mutex> rl(replica_model.mu);
      lag = server_model.version - replica_model.version;
    }
    std::lock_guard<std::mutex> lock(tally.mu);
    tally.result.replica_lag_max = std::max(tally.result.replica_lag_max, lag);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// At the end of a replica run: the scheduler's replica counters and the
// replica's lag.
void ReadReplicaStats(launch::Cluster& c, SumModel& server_model, SumModel& replica_model,
                      RunResult* result) {
  const testing::HttpResult r = testing::Http(c.admin_port(), "GET", "/api/v1/cluster");
  const nlohmann::json stats =
      nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false).value("stats", nlohmann::json());
  if (stats.is_object()) {
    result->replica_copies = stats.value("replica_copies", int64_t{0});
    result->replica_aggregates = stats.value("replica_aggregates", int64_t{0});
    result->replica_bytes = stats.value("replica_bytes", int64_t{0});
    result->replica_updates = stats.value("replica_updates", int64_t{0});
  }
  std::lock_guard<std::mutex> s(server_model.mu);
  std::lock_guard<std::mutex> rl(replica_model.mu);
  result->replica_lag = server_model.version - replica_model.version;
}

// Run's measured part, with the server (and replica) serving: the workers
// push for warmup_s + seconds; the result counts the last `seconds`.
RunResult MeasureRun(launch::Cluster& c, const Flags& flags, const Setting& setting,
                     int run_index, const std::vector<std::string>& workers, size_t elements,
                     SumModel& server_model, SumModel& replica_model) {
  Tally tally;
  tally.measure_from = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(flags.warmup_s));
  tally.stop = tally.measure_from + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(flags.seconds));
  std::vector<std::thread> threads;
  for (int w = 0; w < flags.workers; ++w) {
    threads.emplace_back([&, w] {
      RunWorker(flags, ClientFor(c, workers[w], absl::StrCat("worker", w)), w, elements, tally);
    });
  }
  if (!flags.admin_dump.empty()) {
    std::this_thread::sleep_until(tally.measure_from + (tally.stop - tally.measure_from) / 2);
    DumpAdminViews(c, flags, run_index);
  }
  if (setting.kind == Kind::kReplica) SampleReplicaLag(server_model, replica_model, tally);
  for (std::thread& t : threads) t.join();
  RunResult result = std::move(tally.result);
  result.seconds = flags.seconds;
  if (setting.kind == Kind::kReplica) ReadReplicaStats(c, server_model, replica_model, &result);
  {
    std::lock_guard<std::mutex> lock(server_model.mu);
    result.checkpoints = server_model.checkpoints;
    result.checkpoint_s = server_model.checkpoint_s;
    if (!server_model.error.empty() && result.first_error.empty()) result.first_error = server_model.error;
  }
  return result;
}

absl::StatusOr<RunResult> Run(const Flags& flags, const Setting& setting, int run_index) {
  const bool remote_checkpoint = setting.kind == Kind::kCheckpoint && flags.checkpoint == "remote";
  std::vector<std::string> workers;
  for (int i = 1; i <= flags.workers; ++i) workers.push_back(absl::StrCat("w", i));
  std::map<std::string, std::vector<std::string>> host_flags;
  auto cluster = launch::Cluster::Create(
      RunCluster(flags, remote_checkpoint, workers, run_index, &host_flags));
  if (!cluster.ok()) return cluster.status();
  launch::Cluster& c = **cluster;
  if (absl::Status s = StartRun(c, flags, setting, workers, host_flags); !s.ok()) return s;

  const size_t elements = static_cast<size_t>(flags.model_bytes / 4);
  SumModel server_model, replica_model;
  server_model.model.assign(elements, 0.0f);
  replica_model.model.assign(elements, 0.0f);
  CheckpointStore store;
  if (setting.kind == Kind::kCheckpoint) {
    server_model.checkpoint_every = setting.k;
    server_model.checkpoint_path = c.dir() + "/checkpoint.bin";
  }
  if (remote_checkpoint) {
    if (absl::Status connected = ConnectCheckpointStore(c, store, server_model);
        !connected.ok()) {
      return connected;
    }
  }
  auto server = Server::Connect(ClientFor(c, "s1", "ps"));
  if (!server.ok()) return server.status();
  (*server)->RegisterUpdateCallback([&](const Server::Update& u) { return server_model.Apply(u); });
  (*server)->RegisterRequestCallback([&]() -> absl::StatusOr<Server::Snapshot> {
    std::lock_guard<std::mutex> lock(server_model.mu);
    Server::Snapshot snap;
    snap.version = server_model.version;
    snap.bytes.resize(elements * sizeof(float));
    std::memcpy(snap.bytes.data(), server_model.model.data(), snap.bytes.size());
    return snap;
  });
  std::thread server_thread([&] { (void)(*server)->Serve(); });
  std::unique_ptr<Replica> replica;
  std::thread replica_thread;
  auto stop_apps = [&] {  // the replica first: the server leaving would promote it
    if (replica) replica->Stop();
    if (replica_thread.joinable()) replica_thread.join();
    (*server)->Stop();
    server_thread.join();
  };
  if (setting.kind == Kind::kReplica) {
    RegistrationParams params;
    params.client = ClientFor(c, "r1", "standby");
    auto registered = RegisterAsReplica("ps", params);
    if (!registered.ok()) {
      stop_apps();
      return registered.status();
    }
    replica = std::move(*registered);
    replica->RegisterUpdateCallback([&](const Server::Update& u) { return replica_model.Apply(u); });
    replica_thread = std::thread([&] { (void)replica->Serve(); });
  }
  RunResult result =
      MeasureRun(c, flags, setting, run_index, workers, elements, server_model, replica_model);
  stop_apps();
  if (server_model.checkpoint_fd >= 0) ::close(server_model.checkpoint_fd);
  return result;
}

// main: --workers and the rest into `flags` (its defaults for those not
// given).
absl::Status ReadFlags(ConfigReader& reader, Flags* flags) {
  int64_t workers = flags->workers, rounds = flags->rounds;
  std::string bounds = "1,8,32,128";
  reader.Int("workers", &workers, 1, 64);
  reader.Int("model_bytes", &flags->model_bytes, 4 * 64, int64_t{1} << 30);
  reader.Double("link_bps", &flags->link_bps, 1e6, 1e11);
  reader.Int("compute_ms", &flags->compute_ms, 0, 60000);
  reader.Double("seconds", &flags->seconds, 1, 3600);
  reader.Double("warmup_s", &flags->warmup_s, 0, 600);
  reader.Int("rounds", &rounds, 1, 20);
  reader.Int("tau_max", &flags->tau_max, 0, 1000000);
  reader.String("bounds", &bounds);
  reader.String("mode", &flags->mode);
  reader.Enum("checkpoint", &flags->checkpoint, {"remote", "local"});
  reader.Enum("replica_aggregation", &flags->replica_aggregation, {"all", "punted", "none"});
  reader.Enum("replica_bound", &flags->replica_bound, {"plan", "strict"});
  reader.Double("worker_link_bps", &flags->worker_link_bps, 0, 1e11);
  reader.String("admin_dump", &flags->admin_dump);
  absl::Status status = reader.Finish();
  flags->bounds.clear();
  for (absl::string_view b : absl::StrSplit(bounds, ',', absl::SkipEmpty())) {
    int64_t k = 0;
    if (!absl::SimpleAtoi(b, &k) || k < 0) {
      status = absl::InvalidArgumentError(absl::StrCat("--bounds: '", b, "' is not a whole number >= 0"));
      break;
    }
    flags->bounds.push_back(k);
  }
  if (status.ok() && flags->mode != "netns" && flags->mode != "loopback") {
    status = absl::InvalidArgumentError("--mode must be netns or loopback");
  }
  if (status.ok() && (flags->model_bytes % 4 != 0 || flags->bounds.empty())) {
    status = absl::InvalidArgumentError("--model_bytes must be a multiple of 4 and --bounds non-empty");
  }
  flags->workers = static_cast<int>(workers);
  flags->rounds = static_cast<int>(rounds);
  return status;
}

// main: the run's settings, before the first run.
void PrintHeader(const Flags& flags) {
  std::printf("replication_benchmark: %d workers, model %lld bytes, links %.0f Mbit/s (workers' "
              "%.0f), checkpoints %s, replica aggregation %s, replica bound %s, compute %lld ms, "
              "tau_max %lld, %s; "
              "%.0f s measured after "
              "%.0f s per run; K = %s\n",
              flags.workers, static_cast<long long>(flags.model_bytes), flags.link_bps / 1e6,
              (flags.worker_link_bps > 0 ? flags.worker_link_bps : flags.link_bps) / 1e6,
              flags.checkpoint.c_str(), flags.replica_aggregation.c_str(),
              flags.replica_bound.c_str(), static_cast<long long>(flags.compute_ms), static_cast<long long>(flags.tau_max),
              flags.mode.c_str(), flags.seconds, flags.warmup_s,
              absl::StrJoin(flags.bounds, ",").c_str());
}

// main: what a replica or checkpoint run did besides its pushes ("" for
// none).
std::string RunDetails(const Flags& flags, const Setting& setting, const RunResult& run) {
  std::string extra;
  if (setting.kind == Kind::kReplica) {
    const double reduction =
        run.replica_bytes > 0 ? static_cast<double>(run.replica_updates) * flags.model_bytes /
                                    static_cast<double>(run.replica_bytes)
                              : 0;
    extra = absl::StrFormat(
        "  replica: %lld updates in %lld transfers (%lld aggregates), data reduction %.2fx, "
        "lag at end %lld, most %lld",
        static_cast<long long>(run.replica_updates), static_cast<long long>(run.replica_copies),
        static_cast<long long>(run.replica_aggregates), reduction,
        static_cast<long long>(run.replica_lag), static_cast<long long>(run.replica_lag_max));
  } else if (setting.kind == Kind::kCheckpoint) {
    extra = absl::StrFormat("  %lld checkpoints, %.1f ms each",
                            static_cast<long long>(run.checkpoints),
                            run.checkpoints > 0 ? 1000 * run.checkpoint_s / run.checkpoints : 0.0);
  }
  return extra;
}

}  // namespace
}  // namespace mlfabric

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::fprintf(stderr, "replication_benchmark: %s\n", std::string(cl.status().message()).c_str());
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  Flags flags;
  absl::Status status = ReadFlags(reader, &flags);
  if (!status.ok()) {
    std::fprintf(stderr,
                 "replication_benchmark: %s\nflags: --workers (8) --model_bytes (1 MiB) --link_bps "
                 "(100e6) --compute_ms (100) --seconds (15) --warmup_s (3) --rounds (1) "
                 "--tau_max (60) --bounds=K1,K2,... (1,8,32,128) --mode=netns|loopback "
                 "--checkpoint=remote|local (remote) --worker_link_bps (= link_bps) "
                 "--replica_aggregation=all|punted|none (all) --replica_bound=plan|strict "
                 "(plan) --admin_dump=DIR\n",
                 std::string(status.message()).c_str());
    return 2;
  }
  PrintHeader(flags);
  std::vector<Setting> settings = {{Kind::kNone, 0}};
  for (int64_t k : flags.bounds) {
    settings.push_back({Kind::kReplica, k});
    if (k > 0) settings.push_back({Kind::kCheckpoint, k});  // 0: a replica with no bound
  }
  int run_index = 0;
  bool all_ok = true;
  for (int round = 1; round <= flags.rounds; ++round) {
    double baseline = 0;
    for (const Setting& setting : settings) {
      std::fflush(stdout);
      auto r = Run(flags, setting, run_index++);
      if (!r.ok()) {
        std::fprintf(stderr, "replication_benchmark: %s: %s\n", setting.Name().c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
      const double rate = r->applied / r->seconds;
      if (setting.kind == Kind::kNone) baseline = rate;
      const std::string extra = RunDetails(flags, setting, *r);
      const std::string overhead =
          setting.kind == Kind::kNone || rate <= 0
              ? std::string("     -")
              : absl::StrFormat("%+5.0f%%", 100 * (baseline / rate - 1));
      std::printf("round %d  %-16s applied %6.1f/s  overhead %s  dropped %lld  failed %lld%s%s%s\n",
                  round, setting.Name().c_str(), rate, overhead.c_str(),
                  static_cast<long long>(r->dropped), static_cast<long long>(r->failed),
                  extra.c_str(), r->first_error.empty() ? "" : "  first error: ",
                  r->first_error.c_str());
      all_ok = all_ok && r->applied > 0;
    }
  }
  return all_ok ? 0 : 1;
}
