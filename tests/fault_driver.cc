#include "tests/fault_driver.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/mlfabric.h"
#include "api/registration.h"
#include "api/replica.h"
#include "launch/cluster.h"
#include "launch/process.h"

namespace mlfabric::testing {
namespace {

using Clock = std::chrono::steady_clock;
using launch::Cluster;
using launch::ClusterOptions;
using launch::Topology;

// An update: a one-hot part that names the push (coordinate id mod
// kSlots), then integer values, so float sums stay exact.
constexpr size_t kSlots = 2048;
constexpr size_t kDim = kSlots + 2048;  // 16 KiB
constexpr const char* kServers[] = {"ps0", "ps1"};
constexpr double kRecoveryTimeout_s = 60;
constexpr char kJobToken[] = "demo-token-0123456789";

std::vector<float> Update(int64_t id) {
  std::vector<float> v(kDim, 0.0f);
  v[id % kSlots] = 1.0f;
  for (size_t k = kSlots; k < kDim; ++k) v[k] = static_cast<float>(1 + (id * 7 + k) % 5);
  return v;
}

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

ClientOptions Options(const Cluster& c, const std::string& host, const std::string& name) {
  ClientOptions options;
  options.daemon_socket = c.Socket(host);
  options.name = name;
  options.job_token = kJobToken;
  return options;
}

// A model that sums what it is given: a server, or a replica that may
// become one.
struct SumModel {
  std::mutex mu;
  std::vector<double> model = std::vector<double>(kDim, 0.0);
  int64_t version = 0;
  bool promoted = false;
  int64_t installs = 0;  // snapshots installed (a standby registered late)
  int64_t applied_since_install = 0;

  absl::StatusOr<int64_t> Apply(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu);
    if (u.bytes != kDim * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("an update of ", u.bytes, " bytes"));
    }
    const float* v = reinterpret_cast<const float*>(u.data);
    for (size_t k = 0; k < kDim; ++k) model[k] += v[k];
    version += u.count;
    ++applied_since_install;
    return version;
  }
  absl::Status Install(const Replica::Install& snapshot) {
    std::lock_guard<std::mutex> lock(mu);
    if (snapshot.bytes != kDim * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("a snapshot of ", snapshot.bytes, " bytes"));
    }
    const float* v = reinterpret_cast<const float*>(snapshot.data);
    for (size_t k = 0; k < kDim; ++k) model[k] = v[k];
    version = snapshot.version;
    ++installs;
    applied_since_install = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<Server::Snapshot> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    Server::Snapshot s;
    s.version = version;
    const std::vector<float> as_float(model.begin(), model.end());
    s.bytes.resize(kDim * sizeof(float));
    std::memcpy(s.bytes.data(), as_float.data(), s.bytes.size());
    return s;
  }
};

// A server application with its replica, both in this process, and a
// second standby registered after the first one took over.
struct ServerPair {
  std::string name;
  SumModel server_model, replica_model, standby_model;
  std::unique_ptr<Server> server;
  std::unique_ptr<Replica> replica, standby;
  std::thread server_thread, replica_thread, standby_thread;

  ~ServerPair() {
    if (server) server->Stop();
    if (replica) replica->Stop();
    if (standby) standby->Stop();
    if (server_thread.joinable()) server_thread.join();
    if (replica_thread.joinable()) replica_thread.join();
    if (standby_thread.joinable()) standby_thread.join();
  }

  // A new replica on `host` for the promoted one, from a snapshot of it.
  absl::Status StartStandby(const Cluster& c, const std::string& host) {
    RegistrationParams params;
    params.client = Options(c, host, "standby2-" + name);
    params.replica_snapshot = true;
    auto registered = RegisterAsReplica(name, params);
    if (!registered.ok()) return registered.status();
    standby = std::move(*registered);
    standby->RegisterUpdateCallback([this](const Server::Update& u) {
      return standby_model.Apply(u);
    });
    standby->RegisterRequestCallback([this] { return standby_model.Snapshot(); });
    standby->RegisterInstallCallback(
        [this](const Replica::Install& snapshot) { return standby_model.Install(snapshot); });
    standby->RegisterPromotionCallback([this](const Replica::Promotion& p) {
      std::lock_guard<std::mutex> lock(standby_model.mu);
      standby_model.promoted = true;
      standby_model.version = std::max(standby_model.version, p.model_version);
    });
    standby_thread = std::thread([this] { (void)standby->Serve(); });
    return absl::OkStatus();
  }
  // True once the standby installed its snapshot and applied updates after it.
  bool StandbyInSync() {
    std::lock_guard<std::mutex> lock(standby_model.mu);
    return standby_model.installs >= 1 && standby_model.applied_since_install >= 3;
  }

  absl::Status Start(const Cluster& c, const std::string& server_host,
                     const std::string& replica_host) {
    auto connected = Server::Connect(Options(c, server_host, name));
    if (!connected.ok()) return connected.status();
    server = std::move(*connected);
    server->RegisterUpdateCallback([this](const Server::Update& u) {
      return server_model.Apply(u);
    });
    server->RegisterRequestCallback([this] { return server_model.Snapshot(); });
    server_thread = std::thread([this] { (void)server->Serve(); });

    RegistrationParams params;
    params.client = Options(c, replica_host, "standby-" + name);
    auto registered = RegisterAsReplica(name, params);
    if (!registered.ok()) return registered.status();
    replica = std::move(*registered);
    replica->RegisterUpdateCallback([this](const Server::Update& u) {
      return replica_model.Apply(u);
    });
    replica->RegisterRequestCallback([this] { return replica_model.Snapshot(); });
    replica->RegisterPromotionCallback([this](const Replica::Promotion& p) {
      std::lock_guard<std::mutex> lock(replica_model.mu);
      replica_model.promoted = true;
      replica_model.version = std::max(replica_model.version, p.model_version);
    });
    replica_thread = std::thread([this] { (void)replica->Serve(); });
    return absl::OkStatus();
  }

  // The model workers train now: the promoted replica's after a failover,
  // the second standby's after the second.
  SumModel& current() {
    {
      std::lock_guard<std::mutex> lock(standby_model.mu);
      if (standby_model.promoted) return standby_model;
    }
    std::lock_guard<std::mutex> lock(replica_model.mu);
    return replica_model.promoted ? replica_model : server_model;
  }
};

// One push as its worker saw it.
struct PushRecord {
  int64_t id = 0;
  int worker = 0;
  int server = 0;  // index into kServers
  Clock::time_point submitted, ended;
  PushOutcome outcome = PushOutcome::kFailed;
  std::string reason;
};

// What the workers were told, for the model checks.
struct Ledger {
  std::mutex mu;
  std::vector<PushRecord> pushes;  // ended
  std::vector<std::vector<double>> applied_sum =
      std::vector<std::vector<double>>(2, std::vector<double>(kDim, 0.0));
  int64_t submitted = 0, gets = 0, get_errors = 0, failed_without_reason = 0;
  std::map<std::string, int64_t> reasons;
};

// A worker thread: gets and pushes until stopped. Pushes can be paused
// (Pause waits until none is in flight); gets go on meanwhile. When its
// daemon goes away, its Worker connects to the daemon that replaces it
// (ClientOptions::reconnect_s) and learns how the push in flight ended;
// only a Worker that gave up is replaced. No Catch2 assertion in here.
class TrainingWorker {
 public:
  TrainingWorker(const Cluster& c, int index, std::atomic<int64_t>* next_id, Ledger* ledger)
      : cluster_(c), index_(index), host_("w" + std::to_string(index + 1)),
        next_id_(next_id), ledger_(ledger) {
    thread_ = std::thread([this] { Run(); });
  }
  ~TrainingWorker() { Stop(); }

  const std::string& host() const { return host_; }
  void Pause() {
    std::unique_lock<std::mutex> lock(mu_);
    pushing_ = false;
    cv_.wait(lock, [this] { return !in_push_; });
  }
  void Resume() {
    std::lock_guard<std::mutex> lock(mu_);
    pushing_ = true;
  }
  // Waits (up to 10 s) until a push of this worker is under way: its
  // daemon killed now dies with the push in flight.
  void AwaitPushUnderWay() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t seen = pushes_started_;
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return pushes_started_ > seen; });
  }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_ptr<Worker> worker;
    int64_t version = 0;
    for (int64_t i = 0; !stop_.load(); ++i) {
      if (worker == nullptr) {
        auto connected = Worker::Connect(Options(cluster_, host_, host_));
        if (!connected.ok()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        worker = std::move(*connected);
      }
      const int server = static_cast<int>(i % 2);
      bool push;
      bool backoff = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        push = pushing_;
        in_push_ = push;
      }
      if (!push || i % 4 == 0) {
        auto model = worker->Get(kServers[server]);
        std::lock_guard<std::mutex> lock(ledger_->mu);
        ++ledger_->gets;
        if (model.ok()) {
          version = model->version;
        } else {
          ++ledger_->get_errors;
          // The Worker gave up connecting to a successor: a new one.
          if (model.status().message().find("could not connect to the daemon again") !=
              std::string::npos) {
            worker.reset();
          }
        }
      }
      if (push && worker != nullptr) {
        PushRecord record;
        record.id = next_id_->fetch_add(1);
        record.worker = index_;
        record.server = server;
        const std::vector<float> v = Update(record.id);
        {
          std::lock_guard<std::mutex> lock(ledger_->mu);
          ++ledger_->submitted;
        }
        record.submitted = Clock::now();
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++pushes_started_;
        }
        cv_.notify_all();
        const PushResult r = worker
                                 ->Push(kServers[server], v.data(), v.size() * sizeof(float),
                                        version, /*norm=*/1.0)
                                 .get();
        record.ended = Clock::now();
        record.outcome = r.outcome;
        record.reason = r.reason;
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (r.outcome == PushOutcome::kApplied) {
          std::vector<double>& sum = ledger_->applied_sum[server];
          for (size_t k = 0; k < kDim; ++k) sum[k] += v[k];
        } else {
          if (r.reason.empty()) ++ledger_->failed_without_reason;
          // Reasons name transfers and hosts; count them by their start.
          ++ledger_->reasons[absl::StrCat(PushOutcomeName(r.outcome), ": ",
                                          r.reason.substr(0, 90))];
        }
        ledger_->pushes.push_back(record);
        // A push that did not apply (the scheduler unreachable, say):
        // back off a little, as a training loop would, rather than spin.
        if (r.outcome != PushOutcome::kApplied) backoff = true;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        in_push_ = false;
      }
      cv_.notify_all();
      std::this_thread::sleep_for(std::chrono::milliseconds(push && !backoff ? 5 : 50));
    }
  }

  const Cluster& cluster_;
  const int index_;
  const std::string host_;
  std::atomic<int64_t>* next_id_;
  Ledger* ledger_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pushing_ = true;
  bool in_push_ = false;
  int64_t pushes_started_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class Run {
 public:
  explicit Run(const FaultRunOptions& options) : options_(options) {}

  absl::StatusOr<FaultReport> Go() {
    const Clock::time_point began = Clock::now();
    ClusterOptions cluster;
    cluster.topology = Topology::kNetns;
    cluster.hosts = {"s1", "r1", "s2", "r2", "a1", "w1", "w2", "w3"};
    auto created = Cluster::Create(cluster);
    if (!created.ok()) return created.status();
    c_ = std::move(*created);
    const std::string config = c_->dir() + "/scheduler.json";
    // Each push's norm is 1: a bound of 2 makes the planner send replica
    // copies with their pushes (held at the replica for the outcome)
    // rather than punt them to later batches (§5.3).
    std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": ")" << kJobToken
                          << R"(", "tau_max": 100000, "divergence_max": 2, "aggregators": ["a1"]}]})";
    // The servers' daemons pace their downlinks, so that the planner
    // aggregates at a1 (mlfabric.md §5.2) rather than send everything
    // direct.
    const std::map<std::string, std::vector<std::string>> host_flags = {
        {"s1", {"--downlink_bps=1e9"}}, {"s2", {"--downlink_bps=1e9"}}};
    if (absl::Status started =
            c_->Start({"--config=" + config, "--planner=mlfabric"}, {}, host_flags);
        !started.ok()) {
      return started;
    }
    pairs_[0].name = "ps0";
    pairs_[1].name = "ps1";
    if (absl::Status s = pairs_[0].Start(*c_, "s1", "r1"); !s.ok()) return s;
    if (absl::Status s = pairs_[1].Start(*c_, "s2", "r2"); !s.ok()) return s;
    for (int w = 0; w < 3; ++w) {
      workers_.push_back(std::make_unique<TrainingWorker>(*c_, w, &next_id_, &ledger_));
    }
    Progress("training: ps0 on s1 (replica r1), ps1 on s2 (replica r2), workers w1-w3, "
             "aggregator a1; %d faults to come", 4 * options_.cycles + 3);
    WaitApplied(20);

    // The last cycle's scheduler restart comes after the failover: a
    // restart may cost the replica a copy still arriving at that moment
    // (see fault_driver.h), which a failover later would count lost.
    for (int cycle = 0; cycle < options_.cycles; ++cycle) {
      const bool last = cycle + 1 == options_.cycles;
      Inject("aggregator", "a1's daemon killed, started again 1 s later", {0, 1}, -1, [&] {
        Check(c_->KillDaemon("a1"));
        std::this_thread::sleep_for(std::chrono::seconds(1));
        Check(c_->RestartDaemon("a1"));
      });
      Inject("worker", "w1's daemon killed while w1 pushes and gets (it forwards the model), "
             "started again",
             {0, 1}, 0, [&] {
               workers_[0]->AwaitPushUnderWay();
               Check(c_->KillDaemon("w1"));
               Check(c_->RestartDaemon("w1"));
             });
      Inject("link", "w3's link cut until the scheduler marks w3 down, then restored", {0, 1}, 2,
             [&] { CutLink("w3"); });
      if (last) break;
      Inject("scheduler", "the scheduler killed and started again", {0, 1}, -1,
             [&] { Check(c_->RestartScheduler()); });
    }
    Inject("replica", "r2's daemon (ps1's replica) killed; ps1 trains on without one", {1}, -1,
           [&] { Check(c_->KillDaemon("r2")); });
    Inject("server", "s1's daemon (ps0's server) killed: r1 takes over", {0}, -1,
           [&] { Check(c_->KillDaemon("s1")); });
    // A new standby for the promoted ps0 on s1, from a snapshot of r1's
    // model; once in sync, r1 goes too and s1 serves again.
    Check(c_->RestartDaemon("s1"));
    Check(pairs_[0].StartStandby(*c_, "s1"));
    if (!launch::WaitUntil([&] { return pairs_[0].StandbyInSync(); }, kRecoveryTimeout_s)) {
      errors_.push_back("the new standby of ps0 on s1 did not install its snapshot");
    }
    Inject("server", "r1's daemon (ps0's promoted server) killed: the standby on s1, started "
           "from a snapshot, takes over", {0}, -1, [&] { Check(c_->KillDaemon("r1")); });
    Inject("scheduler", "the scheduler killed and started again", {0, 1}, -1,
           [&] { Check(c_->RestartScheduler()); });

    // The job finishes: every worker's pushes apply after the last fault.
    const Clock::time_point last = Clock::now();
    report_.finished = launch::WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(ledger_.mu);
          int done = 0;
          for (int w = 0; w < 3; ++w) {
            int n = 0;
            for (auto it = ledger_.pushes.rbegin(); it != ledger_.pushes.rend() && n < 5; ++it) {
              if (it->worker == w && it->submitted >= last &&
                  it->outcome == PushOutcome::kApplied) {
                ++n;
              }
            }
            done += n >= 5;
          }
          return done == 3;
        },
        kRecoveryTimeout_s);
    for (auto& worker : workers_) worker->Stop();
    const ModelCheck final_check = CheckModels();
    report_.final_exact = final_check.exact;
    report_.lost = final_check.lost;
    report_.extra = final_check.extra;
    report_.culprits = final_check.culprits;

    std::lock_guard<std::mutex> lock(ledger_.mu);
    report_.pushes = ledger_.submitted;
    report_.outcomes = static_cast<int64_t>(ledger_.pushes.size());
    for (const PushRecord& p : ledger_.pushes) {
      if (p.outcome == PushOutcome::kApplied) ++report_.applied;
      if (p.outcome == PushOutcome::kDropped) ++report_.dropped;
      if (p.outcome == PushOutcome::kFailed) ++report_.failed;
    }
    report_.failed_without_reason = ledger_.failed_without_reason;
    report_.gets = ledger_.gets;
    report_.get_errors = ledger_.get_errors;
    for (const auto& [reason, count] : ledger_.reasons) {
      report_.reasons.push_back(absl::StrCat(count, " x ", reason));
    }
    report_.seconds = Seconds(began, Clock::now());
    return report_;
  }

  ~Run() {
    for (auto& worker : workers_) worker->Stop();
  }

 private:
  struct ModelCheck {
    bool exact = false;
    int64_t lost = 0, extra = 0;
    // The pushes whose slots disagree (at most a few): what their workers
    // were told.
    std::string culprits;
  };

  template <typename... Args>
  void Progress(const char* format, Args... args) {
    if (!options_.progress) return;
    std::printf("[fault-injection %6.1f s] ", Seconds(began_, Clock::now()));
    std::printf(format, args...);
    std::printf("\n");
    std::fflush(stdout);
  }

  // A step of a fault that failed (a daemon that would not start again):
  // remembered, and the run goes on to account for what it did.
  void Check(const absl::Status& status) {
    if (!status.ok()) errors_.push_back(std::string(status.message()));
  }

  // Cuts `host`'s link in its namespace until the scheduler marks it down
  // (at most 10 s), then restores it.
  void CutLink(const std::string& host) {
    const Clock::time_point cut = Clock::now();
    const size_t from = c_->scheduler().Log().size();
    auto down = c_->Exec(host, {"ip", "link", "set", "dev", "veth0", "down"});
    if (!down.ok()) return Check(down.status());
    const std::string mark = "host " + host + " is down";
    if (launch::WaitUntil(
            [&] { return c_->scheduler().Log().find(mark, from) != std::string::npos; }, 10)) {
      detected_s_ = Seconds(cut, Clock::now());
    }
    auto up = c_->Exec(host, {"ip", "link", "set", "dev", "veth0", "up"});
    if (!up.ok()) Check(up.status());
    restored_ = Clock::now();
  }

  // Waits until `n` pushes have applied in all.
  void WaitApplied(int n) {
    launch::WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(ledger_.mu);
          return std::count_if(ledger_.pushes.begin(), ledger_.pushes.end(), [](const auto& p) {
                   return p.outcome == PushOutcome::kApplied;
                 }) >= n;
        },
        kRecoveryTimeout_s);
  }

  // Runs `fault`, waits until a push submitted after it began has applied
  // at each of `servers` (from `worker` only, if >= 0), then checks the
  // models.
  void Inject(const std::string& kind, const std::string& description,
              const std::vector<int>& servers, int worker, const std::function<void()>& fault) {
    FaultRecord record;
    record.kind = kind;
    record.description = description;
    detected_s_ = -1;
    // A worker fault takes that worker's daemon away while it pushes and
    // gets: the push in flight ends with the outcome the scheduler decided,
    // learned through the daemon that replaces it.
    const Clock::time_point at = Clock::now();
    const size_t errors_before = errors_.size();
    fault();
    record.detected_s = detected_s_;
    Clock::time_point resumed = at;
    record.recovered = launch::WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(ledger_.mu);
          for (int server : servers) {
            bool found = false;
            for (const PushRecord& p : ledger_.pushes) {
              if (p.server == server && p.submitted >= at &&
                  p.outcome == PushOutcome::kApplied && (worker < 0 || p.worker == worker)) {
                found = true;
                resumed = std::max(resumed, p.ended);
                break;
              }
            }
            if (!found) return false;
          }
          return true;
        },
        kRecoveryTimeout_s);
    // A cut link counts from its restoring; a kill from the kill.
    const Clock::time_point from = kind == "link" ? restored_ : at;
    record.recovery_s = Seconds(from, resumed);
    // And every worker trains again (a host that registers late, say),
    // so that the next fault starts from a whole cluster.
    Clock::time_point all_back = resumed;
    const bool everyone = launch::WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(ledger_.mu);
          Clock::time_point latest = resumed;
          for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
            bool found = false;
            for (const PushRecord& p : ledger_.pushes) {
              if (p.worker == w && p.submitted >= at && p.outcome == PushOutcome::kApplied) {
                found = true;
                latest = std::max(latest, p.ended);
                break;
              }
            }
            if (!found) return false;
          }
          all_back = latest;
          return true;
        },
        kRecoveryTimeout_s);
    record.recovered = record.recovered && everyone;
    record.all_back_s = Seconds(from, all_back);
    for (auto& w : workers_) w->Pause();
    const ModelCheck check = CheckModels();
    for (auto& w : workers_) w->Resume();
    record.exact = check.exact && errors_.size() == errors_before;
    record.lost = check.lost;
    record.extra = check.extra;
    record.culprits = check.culprits;
    std::string errors;
    for (size_t i = errors_before; i < errors_.size(); ++i) errors += "; " + errors_[i];
    std::string detected;
    if (kind == "link") {
      detected = record.detected_s >= 0
                     ? absl::StrFormat(" (restored; the cut was detected after %.2f s)",
                                       record.detected_s)
                     : " (restored; the cut was never detected)";
    }
    report_.faults.push_back(record);
    Progress("fault %zu (%s): %s: %s after %.2f s, every worker's after %.2f s%s; models %s "
             "(lost %lld, extra %lld)%s",
             report_.faults.size(), kind.c_str(), description.c_str(),
             record.recovered ? "a push after it applied" : "NOT RECOVERED: a push after it applied",
             record.recovery_s, record.all_back_s,
             detected.c_str(), check.exact ? "exact" : "NOT EXACT",
             static_cast<long long>(check.lost), static_cast<long long>(check.extra),
             (errors + check.culprits).c_str());
  }

  // Compares each server's current model with the sum of its pushes
  // reported applied (waiting up to 20 s: a promoted replica may still be
  // receiving the copies it lacked). Workers must be paused.
  ModelCheck CheckModels() {
    ModelCheck check;
    check.exact = true;
    for (int s = 0; s < 2; ++s) {
      std::vector<double> expected;
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        expected = ledger_.applied_sum[s];
      }
      SumModel& model = pairs_[s].current();
      const bool exact = launch::WaitUntil(
          [&] {
            std::lock_guard<std::mutex> lock(model.mu);
            return model.model == expected;
          },
          20);
      if (exact) continue;
      check.exact = false;
      std::lock_guard<std::mutex> lock(model.mu);
      int listed = 0;
      for (size_t k = 0; k < kSlots; ++k) {
        const double difference = model.model[k] - expected[k];
        if (difference < 0) check.lost += static_cast<int64_t>(-difference);
        if (difference > 0) check.extra += static_cast<int64_t>(difference);
        if (difference == 0 || listed >= 4) continue;
        ++listed;
        absl::StrAppend(&check.culprits, "; ", kServers[s], " slot ", k, " off by ", difference,
                        ", its pushes:");
        std::lock_guard<std::mutex> pushes(ledger_.mu);
        for (const PushRecord& p : ledger_.pushes) {
          if (p.server != s || static_cast<size_t>(p.id) % kSlots != k) continue;
          absl::StrAppend(&check.culprits, " [", p.id, " from w", p.worker + 1, ": ",
                          PushOutcomeName(p.outcome), p.reason.empty() ? "" : " (",
                          p.reason.substr(0, 160), p.reason.empty() ? "" : ")", "]");
        }
      }
    }
    return check;
  }

  const FaultRunOptions options_;
  const Clock::time_point began_ = Clock::now();
  std::unique_ptr<Cluster> c_;
  ServerPair pairs_[2];
  Ledger ledger_;
  std::atomic<int64_t> next_id_{0};
  std::vector<std::unique_ptr<TrainingWorker>> workers_;
  std::vector<std::string> errors_;
  double detected_s_ = -1;
  Clock::time_point restored_;  // CutLink's restoring
  FaultReport report_;
};

}  // namespace

absl::StatusOr<FaultReport> RunFaultScript(const FaultRunOptions& options) {
  Run run(options);
  return run.Go();
}

}  // namespace mlfabric::testing
