#include "testing/loadgen/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/control/scheduler_client.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::testing {
namespace {

namespace v1 = mlfabric::v1;

double LocalNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// When a transfer of `bytes` that starts at `start_s` and is paced to
// `segments` (scheduler clock) has all its bytes out: what the daemons'
// pacing (daemon/pacing) would make of its schedule. A schedule that
// carries fewer bytes ends with its last segment.
double TransferEnd(double start_s,
                   const google::protobuf::RepeatedPtrField<v1::RateSegment>& segments,
                   int64_t bytes) {
  double bits = 8.0 * static_cast<double>(bytes);
  double t = start_s;
  for (const v1::RateSegment& segment : segments) {
    const double from = std::max(segment.from_s(), t);
    if (segment.to_s() <= from || segment.rate_bps() <= 0) continue;
    const double can = (segment.to_s() - from) * segment.rate_bps();
    if (can >= bits) return from + bits / segment.rate_bps();
    bits -= can;
    t = segment.to_s();
  }
  return t;
}

enum class EventKind { kGet, kPush, kReport, kSync };

struct Event {
  double due_s;  // local clock
  EventKind kind;
  int index;          // worker or host
  int64_t version;    // kPush: the model version the worker computed from
  bool operator>(const Event& other) const { return due_s > other.due_s; }
};

}  // namespace

bool LoadReport::Consistent() const { return Problems().empty(); }

std::vector<std::string> LoadReport::Problems() const {
  std::vector<std::string> out;
  if (submit_errors > 0) out.push_back(absl::StrCat(submit_errors, " SubmitUpdate calls failed"));
  if (duplicate_outcomes > 0) {
    out.push_back(absl::StrCat(duplicate_outcomes, " pushes got a second outcome"));
  }
  if (unknown_outcomes > 0) {
    out.push_back(absl::StrCat(unknown_outcomes, " outcomes named no push of this run"));
  }
  if (without_outcome > 0) out.push_back(absl::StrCat(without_outcome, " pushes never ended"));
  if (gets_answered != gets) {
    out.push_back(absl::StrCat(gets - gets_answered, " of ", gets, " gets never answered"));
  }
  if (distribution_errors > 0) {
    out.push_back(absl::StrCat(distribution_errors, " PlanDistribution calls failed"));
  }
  if (stream_breaks > 0) out.push_back(absl::StrCat(stream_breaks, " schedule streams broke"));
  if (rpc_errors > 0) out.push_back(absl::StrCat(rpc_errors, " other calls failed"));
  if (applied != delivered) {
    out.push_back(absl::StrCat(applied, " pushes reported applied but the servers applied ",
                               delivered));
  }
  if (shard_disagreements > 0) {
    out.push_back(absl::StrCat(shard_disagreements,
                               " server groups whose shards applied different numbers of pushes"));
  }
  for (const std::string& error : errors) out.push_back("error: " + error);
  return out;
}

void LoadReport::Add(const LoadReport& o) {
  elapsed_s = std::max(elapsed_s, o.elapsed_s);
  hosts += o.hosts;
  for (auto [mine, theirs] :
       {std::pair{&pushes, o.pushes}, {&submit_errors, o.submit_errors}, {&applied, o.applied},
        {&dropped, o.dropped}, {&failed, o.failed}, {&duplicate_outcomes, o.duplicate_outcomes},
        {&unknown_outcomes, o.unknown_outcomes}, {&without_outcome, o.without_outcome},
        {&gets, o.gets}, {&gets_answered, o.gets_answered}, {&distributions, o.distributions},
        {&distribution_errors, o.distribution_errors}, {&delivered, o.delivered},
        {&delivery_reports, o.delivery_reports}, {&cancelled, o.cancelled}, {&rpcs, o.rpcs},
        {&rpc_errors, o.rpc_errors}, {&commands, o.commands}, {&stream_breaks, o.stream_breaks},
        {&shard_disagreements, o.shard_disagreements}}) {
    *mine += theirs;
  }
  for (const auto& [reason, count] : o.reasons) reasons[reason] += count;
  errors.insert(errors.end(), o.errors.begin(), o.errors.end());
}

class LoadGenerator::Impl {
 public:
  explicit Impl(LoadOptions options) : options_(std::move(options)) {}
  ~Impl() { Shutdown(); }

  absl::Status Start();
  void StopLoad() { load_stopped_ = true; }
  LoadReport Drain(double timeout_s);
  LoadReport Snapshot() const;

 private:
  struct Host {
    std::string name;
    std::unique_ptr<daemon::SchedulerClient> client;
    std::unique_ptr<daemon::ScheduleStream> stream;
    std::thread reader;
    int driver = 0;
  };
  struct Worker {
    std::string name;
    int host = 0;
    int target = 0;
    int driver = 0;
  };
  // What a worker pushes to: one server, or a group's shards.
  struct Target {
    std::string name;
    std::vector<int> servers;  // indices into servers_, in shard order
  };
  // A worker's get in progress: answered when every shard of its target is.
  struct PendingGet {
    int remaining = 0;
    double ready_s = 0;       // local clock: the latest shard's answer
    int64_t version = 0;      // the oldest shard's version
  };
  struct Server {
    std::string name;
    int host = 0;
    int target = 0;
    int shard = 0;            // index in its group (0 for a plain server)
    int64_t part_bytes = 0;   // its part of the model
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, v1::ExpectDelivery> expected;  // by sequence
    std::map<uint64_t, v1::CancelDelivery> cancelled;  // by sequence
    std::set<uint64_t> unready;   // held group parts not yet reported ready, by sequence
    std::set<uint64_t> released;  // held group parts released, by transfer id
    uint64_t next_sequence = 1;
    int64_t model_version = 0;
    std::vector<int> gets;  // workers waiting, in request order
    double busy_until_s = 0;  // scheduler clock: its last distribution still leaving
    std::mt19937_64 rng;
    std::thread delivery;
    std::thread distribution;
  };
  struct Driver {
    std::mutex mu;
    std::condition_variable cv;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
    std::mt19937_64 rng;
    std::thread thread;
  };

  double SchedulerNow() const { return LocalNow() + offset_s_; }
  double ComputeTime(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(-options_.jitter, options_.jitter);
    return options_.period_s * (1 + u(rng));
  }
  // Start's steps: host i (servers' hosts first) registers and opens its
  // schedule stream; server s and worker w register their entities.
  absl::Status RegisterHost(int i, const daemon::ClientSecurity& security);
  absl::Status RegisterServer(int s);
  absl::Status RegisterWorker(int w);
  int ServerCount() const { return options_.servers * options_.shards; }
  // Each host's first report and clock sync, each worker's first get.
  void ScheduleFirstEvents(std::mt19937_64& rng);
  void Schedule(int driver, Event event);
  void Error(const std::string& text);
  // `a_call`: false for a report of a batched call (counted once, apart).
  // `call` names the RPC in the error kept for the summary.
  void CountRpc(const char* call, const absl::Status& status, bool counted_elsewhere = false,
                bool a_call = true);

  void DriverLoop(int index);
  void RequestGet(int worker);
  void AnswerGet(int worker, double ready_s, int64_t version, std::mt19937_64& rng);
  void Push(int worker, int64_t version);
  void ReportBandwidth(int host, std::mt19937_64& rng);
  void SyncClock(int host);
  void ReaderLoop(int host);
  void Handle(int host, const v1::DaemonCommand& command);
  // Transfer `transfer_id` to host `dst_host` has its bytes in at `end_s`;
  // wakes the server there, if any.
  void NoteArrival(uint64_t transfer_id, double end_s, const std::string& dst_host);
  void DeliveryLoop(int server);
  // DeliveryLoop's steps, with `lock` on server.mu (released while calling).
  // Reports held parts whose bytes are in as ready; the time until the next
  // one's are (at most 0.1 s).
  double ReportReadyParts(Server& server, std::unique_lock<std::mutex>& lock);
  // Both add their report to *reports, which DeliveryLoop sends in one
  // call before it waits (as mlfabricd's CompletionReporter does).
  void SkipCancelled(Server& server, std::vector<v1::CompletionReport>* reports);
  void Apply(Server& server, std::vector<v1::CompletionReport>* reports);
  void SendReports(Server& server, std::unique_lock<std::mutex>& lock,
                   std::vector<v1::CompletionReport>* reports);
  void DistributionLoop(int server);
  void Shutdown();
  int64_t ShardDisagreements() const;

  const LoadOptions options_;
  double offset_s_ = 0;  // scheduler clock - local clock
  std::vector<std::unique_ptr<Host>> hosts_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<Target> targets_;
  std::map<std::string, int> server_by_name_;
  std::unordered_map<int, int> server_by_host_;  // host index -> server on it
  std::unordered_map<std::string, int> server_by_host_name_;

  std::mutex gets_mu_;
  std::vector<PendingGet> pending_gets_;  // by worker
  std::vector<std::unique_ptr<Driver>> drivers_;
  double started_s_ = 0;

  std::atomic<bool> load_stopped_{false};
  std::atomic<bool> done_{false};
  bool shut_down_ = false;

  std::mutex arrivals_mu_;
  std::unordered_map<uint64_t, double> arrivals_;  // transfer id -> end, scheduler clock

  mutable std::mutex pushes_mu_;
  std::condition_variable drained_cv_;
  std::unordered_map<uint64_t, bool> pushes_;  // local id -> ended
  int64_t open_pushes_ = 0;
  std::map<std::string, int64_t> reasons_;
  std::vector<std::string> errors_;
  std::atomic<uint64_t> next_local_id_{1};

  std::atomic<int64_t> pushes_made_{0}, submit_errors_{0}, applied_{0}, dropped_{0}, failed_{0},
      duplicate_outcomes_{0}, unknown_outcomes_{0}, gets_{0}, gets_answered_{0},
      distributions_{0}, distribution_errors_{0}, delivered_{0}, delivery_reports_{0},
      cancelled_{0}, rpcs_{0}, rpc_errors_{0}, commands_{0}, stream_breaks_{0};
};

void LoadGenerator::Impl::Error(const std::string& text) {
  std::lock_guard<std::mutex> lock(pushes_mu_);
  if (errors_.size() < 8) errors_.push_back(text);
}

void LoadGenerator::Impl::CountRpc(const char* call, const absl::Status& status,
                                   bool counted_elsewhere, bool a_call) {
  if (a_call) ++rpcs_;
  if (status.ok() || counted_elsewhere) return;
  if (done_) return;  // calls cut short by the end of the run
  ++rpc_errors_;
  Error(absl::StrCat(call, ": ", daemon::RpcErrorText(status)));
}

void LoadGenerator::Impl::Schedule(int driver, Event event) {
  Driver& d = *drivers_[driver];
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.events.push(event);
  }
  d.cv.notify_one();
}

absl::Status LoadGenerator::Impl::Start() {
  if (options_.workers < 1 || options_.workers_per_host < 1 || options_.servers < 1 ||
      options_.shards < 1 || options_.driver_threads < 1) {
    return absl::InvalidArgumentError(
        "workers, workers_per_host, servers, shards and driver_threads must be >= 1");
  }
  if (options_.shards > 1 &&
      (options_.update_bytes % 4 != 0 || options_.update_bytes / 4 < options_.shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update_bytes: a model in ", options_.shards, " shards of whole float32 elements needs ",
        "a multiple of 4 bytes and at least ", 4 * options_.shards, ", got ",
        options_.update_bytes));
  }
  started_s_ = LocalNow();
  std::mt19937_64 rng(options_.seed);
  const int worker_hosts =
      (options_.workers + options_.workers_per_host - 1) / options_.workers_per_host;
  for (int d = 0; d < options_.driver_threads; ++d) {
    drivers_.push_back(std::make_unique<Driver>());
    drivers_.back()->rng.seed(options_.seed * 7919 + d);
  }
  // Server hosts first, then worker hosts, each with its own connection.
  daemon::ClientSecurity security;
  security.cluster_secret = options_.cluster_secret;
  for (int i = 0; i < ServerCount() + worker_hosts; ++i) {
    if (absl::Status status = RegisterHost(i, security); !status.ok()) return status;
  }
  for (int t = 0; t < options_.servers; ++t) {
    targets_.push_back({absl::StrFormat("ps%d", t), {}});
  }
  for (int s = 0; s < ServerCount(); ++s) {
    if (absl::Status status = RegisterServer(s); !status.ok()) return status;
  }
  pending_gets_.resize(options_.workers);
  for (int w = 0; w < options_.workers; ++w) {
    if (absl::Status status = RegisterWorker(w); !status.ok()) return status;
  }
  for (size_t s = 0; s < servers_.size(); ++s) {
    servers_[s]->delivery = std::thread([this, s] { DeliveryLoop(static_cast<int>(s)); });
    servers_[s]->distribution = std::thread([this, s] { DistributionLoop(static_cast<int>(s)); });
  }
  ScheduleFirstEvents(rng);
  for (size_t d = 0; d < drivers_.size(); ++d) {
    drivers_[d]->thread = std::thread([this, d] { DriverLoop(static_cast<int>(d)); });
  }
  return absl::OkStatus();
}

absl::Status LoadGenerator::Impl::RegisterHost(int i, const daemon::ClientSecurity& security) {
  auto host = std::make_unique<Host>();
  host->name = options_.host_prefix + (i < ServerCount()
                                           ? absl::StrFormat("srv%d", i)
                                           : absl::StrFormat("h%04d", i - ServerCount()));
  host->driver = i % options_.driver_threads;
  host->client = daemon::MakeGrpcSchedulerClient(options_.scheduler_address, 2, security);
  v1::RegisterHostRequest request;
  request.set_protocol_version(1);
  request.set_host(host->name);
  request.set_data_address(absl::StrCat("127.0.0.1:", 20000 + i));
  request.set_uplink_bps(options_.link_bps);
  request.set_downlink_bps(options_.link_bps);
  const double sent_s = LocalNow();
  request.set_daemon_time_s(sent_s);
  v1::RegisterHostReply reply;
  absl::Status status = absl::UnavailableError("not tried");
  // The first connection may take a moment (the scheduler just started).
  for (int attempt = 0; attempt < 20 && !status.ok(); ++attempt) {
    if (attempt > 0) host->client->WaitForConnection(1);
    status = host->client->RegisterHost(request, &reply);
    ++rpcs_;
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("host ", host->name, ": RegisterHost: ",
                                                    daemon::RpcErrorText(status)));
  }
  if (i == 0) offset_s_ = reply.scheduler_time_s() - (sent_s + LocalNow()) / 2;
  v1::StreamSchedulesRequest stream;
  stream.set_host(host->name);
  stream.set_incarnation(reply.incarnation());
  host->stream = host->client->StreamSchedules(stream);
  hosts_.push_back(std::move(host));
  const int index = static_cast<int>(hosts_.size()) - 1;
  hosts_.back()->reader = std::thread([this, index] { ReaderLoop(index); });
  return absl::OkStatus();
}

absl::Status LoadGenerator::Impl::RegisterServer(int s) {
  auto server = std::make_unique<Server>();
  server->target = s / options_.shards;
  server->shard = s % options_.shards;
  const std::string& group = targets_[server->target].name;
  server->name = options_.shards == 1 ? group : absl::StrFormat("%s-%d", group, server->shard);
  server->host = s;
  server->rng.seed(options_.seed * 104729 + s);
  // Shard j of S holds elements [n*j/S, n*(j+1)/S) of the model's n floats.
  const int64_t elements = options_.update_bytes / 4;
  const int64_t begin = 4 * (elements * server->shard / options_.shards);
  const int64_t end = 4 * (elements * (server->shard + 1) / options_.shards);
  server->part_bytes = options_.shards == 1 ? options_.update_bytes : end - begin;
  v1::RegisterEntityRequest request;
  request.set_job(options_.job);
  request.set_job_token(options_.job_token);
  request.set_role(v1::ROLE_SERVER);
  request.set_name(server->name);
  request.set_host(hosts_[s]->name);
  if (options_.shards > 1) {
    v1::ShardSpec* spec = request.mutable_shard();
    spec->set_group(group);
    spec->set_index(server->shard);
    spec->set_count(options_.shards);
    spec->set_begin(begin);
    spec->set_end(end);
  }
  v1::RegisterEntityReply reply;
  absl::Status status = hosts_[s]->client->RegisterEntity(request, &reply);
  ++rpcs_;
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("server ", server->name, ": RegisterEntity: ",
                                                    daemon::RpcErrorText(status)));
  }
  server_by_name_[server->name] = s;
  server_by_host_[s] = s;
  server_by_host_name_[hosts_[s]->name] = s;
  targets_[server->target].servers.push_back(s);
  servers_.push_back(std::move(server));
  return absl::OkStatus();
}

absl::Status LoadGenerator::Impl::RegisterWorker(int w) {
  Worker worker;
  worker.name = absl::StrFormat("w%04d", w);
  worker.host = ServerCount() + w / options_.workers_per_host;
  worker.target = w % options_.servers;
  worker.driver = w % options_.driver_threads;
  v1::RegisterEntityRequest request;
  request.set_job(options_.job);
  request.set_job_token(options_.job_token);
  request.set_role(v1::ROLE_WORKER);
  request.set_name(worker.name);
  request.set_host(hosts_[worker.host]->name);
  request.set_delay_bound(-1);
  request.set_divergence_bound(-1);
  v1::RegisterEntityReply reply;
  absl::Status status = hosts_[worker.host]->client->RegisterEntity(request, &reply);
  ++rpcs_;
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("worker ", worker.name, ": RegisterEntity: ",
                                                    daemon::RpcErrorText(status)));
  }
  workers_.push_back(std::move(worker));
  return absl::OkStatus();
}

void LoadGenerator::Impl::ScheduleFirstEvents(std::mt19937_64& rng) {
  // Every host reports and syncs at its own phase; every worker starts
  // with a get at a random point of its first period.
  std::uniform_real_distribution<double> phase(0, 1);
  const double now_s = LocalNow();
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const int host = static_cast<int>(h);
    Schedule(hosts_[h]->driver, {now_s + phase(rng) * options_.bandwidth_report_s,
                                 EventKind::kReport, host, 0});
    Schedule(hosts_[h]->driver,
             {now_s + phase(rng) * options_.clock_sync_s, EventKind::kSync, host, 0});
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    Schedule(workers_[w].driver,
             {now_s + phase(rng) * options_.period_s, EventKind::kGet, static_cast<int>(w), 0});
  }
}

void LoadGenerator::Impl::DriverLoop(int index) {
  Driver& d = *drivers_[index];
  std::unique_lock<std::mutex> lock(d.mu);
  while (!done_) {
    if (d.events.empty()) {
      d.cv.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    const double wait_s = d.events.top().due_s - LocalNow();
    if (wait_s > 0) {
      d.cv.wait_for(lock, std::chrono::duration<double>(std::min(wait_s, 0.1)));
      continue;
    }
    const Event event = d.events.top();
    d.events.pop();
    lock.unlock();
    switch (event.kind) {
      case EventKind::kGet:
        if (!load_stopped_) RequestGet(event.index);
        break;
      case EventKind::kPush:
        if (!load_stopped_) Push(event.index, event.version);
        break;
      case EventKind::kReport:
        ReportBandwidth(event.index, d.rng);
        break;
      case EventKind::kSync:
        SyncClock(event.index);
        break;
    }
    lock.lock();
  }
}

void LoadGenerator::Impl::RequestGet(int index) {
  const Target& target = targets_[workers_[index].target];
  ++gets_;
  {
    std::lock_guard<std::mutex> lock(gets_mu_);
    pending_gets_[index] = {static_cast<int>(target.servers.size()), 0,
                            std::numeric_limits<int64_t>::max()};
  }
  for (int s : target.servers) {
    Server& server = *servers_[s];
    {
      std::lock_guard<std::mutex> server_lock(server.mu);
      server.gets.push_back(index);
    }
    server.cv.notify_all();
  }
}

void LoadGenerator::Impl::AnswerGet(int index, double ready_s, int64_t version,
                                    std::mt19937_64& rng) {
  {
    std::lock_guard<std::mutex> lock(gets_mu_);
    PendingGet& get = pending_gets_[index];
    get.ready_s = std::max(get.ready_s, ready_s);
    get.version = std::min(get.version, version);
    if (--get.remaining > 0) return;
    ready_s = get.ready_s;
    version = get.version;
  }
  ++gets_answered_;
  // The worker has the model once every tree delivered its part, and
  // pushes after computing on it.
  Schedule(workers_[index].driver, {ready_s + ComputeTime(rng), EventKind::kPush, index, version});
}

void LoadGenerator::Impl::Push(int index, int64_t version) {
  const Worker& worker = workers_[index];
  Host& host = *hosts_[worker.host];
  const uint64_t local_id = next_local_id_++;
  {
    // Known before the call: its SendTransfer and outcome may come first.
    std::lock_guard<std::mutex> lock(pushes_mu_);
    pushes_[local_id] = false;
    ++open_pushes_;
  }
  v1::SubmitUpdateRequest request;
  request.set_job(options_.job);
  request.set_src_host(host.name);
  request.set_worker(worker.name);
  request.set_server(targets_[worker.target].name);
  request.set_bytes(options_.update_bytes);
  request.set_version(version);
  request.set_norm(1.0);
  request.set_local_id(local_id);
  request.set_dtype(v1::DTYPE_FLOAT32);
  v1::TensorInfo* tensor = request.add_tensors();
  tensor->set_tensor_id(0);
  tensor->set_bytes(static_cast<uint64_t>(options_.update_bytes));
  v1::SubmitUpdateReply reply;
  absl::Status status = host.client->SubmitUpdate(request, &reply);
  ++pushes_made_;
  CountRpc("SubmitUpdate", status, /*counted_elsewhere=*/true);
  if (!status.ok()) {
    // Refused: the call's error is its end (the daemon fails the push).
    ++submit_errors_;
    Error(absl::StrCat("SubmitUpdate of ", worker.name, ": ", daemon::RpcErrorText(status)));
    std::lock_guard<std::mutex> lock(pushes_mu_);
    auto it = pushes_.find(local_id);
    if (it != pushes_.end() && !it->second) {
      it->second = true;
      --open_pushes_;
    }
    drained_cv_.notify_all();
  }
  // The worker asks for the model it computes its next update from.
  Schedule(worker.driver, {LocalNow(), EventKind::kGet, index, 0});
}

void LoadGenerator::Impl::ReportBandwidth(int index, std::mt19937_64& rng) {
  Host& host = *hosts_[index];
  std::uniform_real_distribution<double> u(1 - options_.bandwidth_variation, 1);
  v1::BandwidthReport report;
  report.set_host(host.name);
  report.set_uplink_bps(options_.link_bps * u(rng));
  report.set_downlink_bps(options_.link_bps * u(rng));
  CountRpc("ReportBandwidth", host.client->ReportBandwidth(report));
  if (!done_) {
    Schedule(host.driver,
             {LocalNow() + options_.bandwidth_report_s, EventKind::kReport, index, 0});
  }
}

void LoadGenerator::Impl::SyncClock(int index) {
  Host& host = *hosts_[index];
  // mlfabricd takes three samples and keeps the one with the shortest trip.
  for (int sample = 0; sample < 3; ++sample) {
    v1::SyncClockRequest request;
    request.set_host(host.name);
    v1::SyncClockReply reply;
    CountRpc("SyncClock", host.client->SyncClock(request, &reply));
  }
  if (!done_) {
    Schedule(host.driver, {LocalNow() + options_.clock_sync_s, EventKind::kSync, index, 0});
  }
}

void LoadGenerator::Impl::ReaderLoop(int index) {
  Host& host = *hosts_[index];
  v1::DaemonCommand command;
  while (host.stream->Read(&command)) {
    ++commands_;
    Handle(index, command);
  }
  const absl::Status status = host.stream->Finish();
  if (!done_) {
    ++stream_breaks_;
    Error(absl::StrCat("host ", host.name, ": schedule stream ended: ",
                       daemon::RpcErrorText(status)));
  }
}

void LoadGenerator::Impl::NoteArrival(uint64_t transfer_id, double end_s,
                                      const std::string& dst_host) {
  {
    std::lock_guard<std::mutex> lock(arrivals_mu_);
    arrivals_[transfer_id] = end_s;
  }
  // Waking only the server it goes to: with many shards, waking all of
  // them for every part was most of this generator's CPU.
  auto it = server_by_host_name_.find(dst_host);
  if (it != server_by_host_name_.end()) servers_[it->second]->cv.notify_all();
}

void LoadGenerator::Impl::Handle(int index, const v1::DaemonCommand& command) {
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend: {
      const v1::SendTransfer& send = command.send();
      NoteArrival(send.transfer_id(), TransferEnd(send.start_s(), send.segments(), send.bytes()),
                  send.dst_host());
      break;
    }
    case v1::DaemonCommand::kAggregate: {
      const v1::AggregateTask& task = command.aggregate();
      NoteArrival(task.aggregate_id(), TransferEnd(task.start_s(), task.segments(), task.bytes()),
                  task.dst_host());
      break;
    }
    case v1::DaemonCommand::kExpect: {
      const v1::ExpectDelivery& expect = command.expect();
      auto it = server_by_name_.find(expect.server());
      if (it == server_by_name_.end() || servers_[it->second]->host != index) {
        Error(absl::StrCat("host ", hosts_[index]->name, " told to expect a delivery to server '",
                           expect.server(), "'"));
        break;
      }
      Server& server = *servers_[it->second];
      {
        std::lock_guard<std::mutex> lock(server.mu);
        server.expected[expect.sequence()] = expect;
        if (expect.held() && expect.group_push() != 0) server.unready.insert(expect.sequence());
      }
      server.cv.notify_all();
      break;
    }
    case v1::DaemonCommand::kCancel: {
      const v1::CancelDelivery& cancel = command.cancel();
      auto it = server_by_name_.find(cancel.server());
      // A cancel without a server names an aggregation or a held copy,
      // neither of which this emulation keeps.
      if (it == server_by_name_.end() || cancel.sequence() == 0) break;
      Server& server = *servers_[it->second];
      {
        std::lock_guard<std::mutex> lock(server.mu);
        // Not found: handed over already; its report answers (as mlfabricd).
        if (cancel.sequence() >= server.next_sequence) {
          server.cancelled[cancel.sequence()] = cancel;
          server.unready.erase(cancel.sequence());
        }
      }
      server.cv.notify_all();
      break;
    }
    case v1::DaemonCommand::kRelease: {
      auto it = server_by_host_.find(index);
      if (it == server_by_host_.end()) {
        Error(absl::StrCat("host ", hosts_[index]->name, " holds no server but was told to ",
                           "release transfer ", command.release().transfer_id()));
        break;
      }
      Server& server = *servers_[it->second];
      {
        std::lock_guard<std::mutex> lock(server.mu);
        server.released.insert(command.release().transfer_id());
      }
      server.cv.notify_all();
      break;
    }
    case v1::DaemonCommand::kOutcome: {
      const v1::PushOutcome& outcome = command.outcome();
      std::lock_guard<std::mutex> lock(pushes_mu_);
      auto it = pushes_.find(outcome.local_id());
      if (it == pushes_.end()) {
        ++unknown_outcomes_;
        break;
      }
      if (it->second) {
        ++duplicate_outcomes_;
        break;
      }
      it->second = true;
      --open_pushes_;
      switch (outcome.outcome()) {
        case v1::OUTCOME_APPLIED:
          ++applied_;
          break;
        case v1::OUTCOME_DROPPED:
          ++dropped_;
          ++reasons_[outcome.reason()];
          break;
        default:
          ++failed_;
          ++reasons_[outcome.reason()];
          break;
      }
      drained_cv_.notify_all();
      break;
    }
    default:
      break;  // job keys; no replicas or rounds in this emulation
  }
}

void LoadGenerator::Impl::DeliveryLoop(int index) {
  Server& server = *servers_[index];
  std::unique_lock<std::mutex> lock(server.mu);
  std::vector<v1::CompletionReport> reports;
  while (!done_) {
    const double next_ready_s = ReportReadyParts(server, lock);
    const uint64_t sequence = server.next_sequence;
    if (server.cancelled.count(sequence) > 0) {
      SkipCancelled(server, &reports);
      continue;
    }
    auto expected = server.expected.find(sequence);
    double wait_s = next_ready_s;
    if (expected != server.expected.end() &&
        (!expected->second.held() || server.released.count(expected->second.transfer_id()))) {
      double end_s = -1;
      {
        std::lock_guard<std::mutex> arrivals_lock(arrivals_mu_);
        auto it = arrivals_.find(expected->second.transfer_id());
        if (it != arrivals_.end()) end_s = it->second;
      }
      // A released part's bytes are in: it was reported ready.
      if (expected->second.held()) end_s = 0;
      wait_s = std::min(wait_s, end_s < 0 ? 0.1 : end_s - SchedulerNow());
      if (wait_s <= 0) {
        Apply(server, &reports);
        if (reports.size() >= 256) SendReports(server, lock, &reports);
        continue;
      }
    }
    if (!reports.empty()) {
      SendReports(server, lock, &reports);
      continue;  // the state may have changed meanwhile
    }
    server.cv.wait_for(lock, std::chrono::duration<double>(std::clamp(wait_s, 0.001, 0.1)));
  }
}

void LoadGenerator::Impl::SendReports(Server& server, std::unique_lock<std::mutex>& lock,
                                      std::vector<v1::CompletionReport>* reports) {
  std::vector<v1::CompletionReport> sending = std::move(*reports);
  reports->clear();
  lock.unlock();
  delivery_reports_ += static_cast<int64_t>(sending.size());
  const std::vector<absl::Status> results = hosts_[server.host]->client->ReportCompletions(sending);
  ++rpcs_;
  for (const absl::Status& status : results) {
    CountRpc("ReportCompletions (applied)", status, false, /*a_call=*/false);
  }
  lock.lock();
}

double LoadGenerator::Impl::ReportReadyParts(Server& server, std::unique_lock<std::mutex>& lock) {
  double next_s = 0.1;
  if (server.unready.empty()) return next_s;
  std::vector<uint64_t> ready;  // transfer ids
  const double now_s = SchedulerNow();
  {
    std::lock_guard<std::mutex> arrivals_lock(arrivals_mu_);
    for (auto sequence = server.unready.begin(); sequence != server.unready.end();) {
      auto expected = server.expected.find(*sequence);
      auto arrival = expected == server.expected.end()
                         ? arrivals_.end()
                         : arrivals_.find(expected->second.transfer_id());
      if (arrival == arrivals_.end() || arrival->second > now_s) {
        if (arrival != arrivals_.end()) next_s = std::min(next_s, arrival->second - now_s);
        ++sequence;
        continue;
      }
      ready.push_back(expected->second.transfer_id());
      sequence = server.unready.erase(sequence);
    }
  }
  if (ready.empty()) return next_s;
  lock.unlock();
  // In one call, as mlfabricd's CompletionReporter sends what it queued.
  Host& host = *hosts_[server.host];
  std::vector<v1::CompletionReport> reports;
  for (uint64_t transfer_id : ready) {
    v1::CompletionReport& report = reports.emplace_back();
    report.set_host(host.name);
    report.set_transfer_id(transfer_id);
    report.set_part_ready(true);
    ++delivery_reports_;
  }
  const std::vector<absl::Status> results = host.client->ReportCompletions(reports);
  ++rpcs_;
  for (const absl::Status& status : results) {
    CountRpc("ReportCompletions (part ready)", status, /*counted_elsewhere=*/false, false);
  }
  lock.lock();
  return 0;  // the state may have changed meanwhile
}

void LoadGenerator::Impl::SkipCancelled(Server& server,
                                        std::vector<v1::CompletionReport>* reports) {
  const uint64_t sequence = server.next_sequence;
  auto cancelled = server.cancelled.find(sequence);
  const v1::CancelDelivery cancel = cancelled->second;
  server.cancelled.erase(cancelled);
  if (auto expected = server.expected.find(sequence); expected != server.expected.end()) {
    server.released.erase(expected->second.transfer_id());
    server.expected.erase(expected);
  }
  server.unready.erase(sequence);
  ++server.next_sequence;
  ++cancelled_;
  if (cancel.confirm()) {
    v1::CompletionReport& report = reports->emplace_back();
    report.set_host(hosts_[server.host]->name);
    report.set_transfer_id(cancel.transfer_id());
    report.set_applied(false);
    report.set_error(cancel.reason());
  }
}

void LoadGenerator::Impl::Apply(Server& server, std::vector<v1::CompletionReport>* reports) {
  // Its bytes are in: the application applies it (an aggregate as its
  // constituents, in order; a group's part as the push it belongs to).
  auto expected = server.expected.find(server.next_sequence);
  const v1::ExpectDelivery expect = std::move(expected->second);
  server.expected.erase(expected);
  server.released.erase(expect.transfer_id());
  ++server.next_sequence;
  const int64_t count = std::max(1, expect.constituents_size());
  server.model_version += count;
  v1::CompletionReport& report = reports->emplace_back();
  report.set_host(hosts_[server.host]->name);
  report.set_transfer_id(expect.transfer_id());
  report.set_applied(true);
  report.set_model_version(server.model_version);
  if (expect.constituents_size() > 0) {
    for (uint64_t id : expect.constituents()) report.add_pushes(id);
  } else if (expect.group_push() != 0) {
    report.add_pushes(expect.group_push());
  } else {
    report.add_pushes(expect.transfer_id());
  }
  {
    std::lock_guard<std::mutex> arrivals_lock(arrivals_mu_);
    arrivals_.erase(expect.transfer_id());
  }
  // A group's pushes are counted once, at its first shard.
  if (server.shard == 0) delivered_ += count;
}

void LoadGenerator::Impl::DistributionLoop(int index) {
  Server& server = *servers_[index];
  Host& host = *hosts_[server.host];
  std::unique_lock<std::mutex> lock(server.mu);
  while (!done_) {
    const double busy_s = server.busy_until_s - SchedulerNow();
    if (server.gets.empty() || busy_s > 0) {
      server.cv.wait_for(lock, std::chrono::duration<double>(std::clamp(busy_s, 0.001, 0.1)));
      continue;
    }
    // The gets that came while the last distribution left form one batch
    // (mlfabric.md §10.3): one model version, one tree.
    std::vector<int> batch = std::move(server.gets);
    server.gets.clear();
    const int64_t version = server.model_version;
    lock.unlock();
    v1::PlanDistributionRequest request;
    request.set_host(host.name);
    request.set_job(options_.job);
    request.set_server(server.name);
    request.set_model_bytes(server.part_bytes);
    std::set<int> seen;
    for (int w : batch) {
      if (seen.insert(workers_[w].host).second) request.add_requesters(hosts_[workers_[w].host]->name);
    }
    double total_s = 8.0 * static_cast<double>(server.part_bytes) *
                     static_cast<double>(seen.size()) / options_.link_bps;
    v1::PlanDistributionReply reply;
    const absl::Status status = host.client->PlanDistribution(request, &reply);
    ++distributions_;
    CountRpc("PlanDistribution", status, /*counted_elsewhere=*/true);
    if (!status.ok()) {
      ++distribution_errors_;
      Error(absl::StrCat("PlanDistribution for ", seen.size(), " hosts: ",
                         daemon::RpcErrorText(status)));
    } else if (reply.routes_size() != request.requesters_size()) {
      ++distribution_errors_;
      Error(absl::StrCat("PlanDistribution: ", reply.routes_size(), " routes for ",
                         request.requesters_size(), " requesters"));
    } else {
      total_s = reply.total_s();
    }
    lock.lock();
    server.busy_until_s = SchedulerNow() + total_s;
    const double now_s = LocalNow();
    lock.unlock();
    for (int w : batch) AnswerGet(w, now_s + total_s, version, server.rng);
    lock.lock();
  }
}

LoadReport LoadGenerator::Impl::Snapshot() const {
  LoadReport r;
  r.elapsed_s = LocalNow() - started_s_;
  r.hosts = static_cast<int>(hosts_.size());
  r.pushes = pushes_made_;
  r.submit_errors = submit_errors_;
  r.applied = applied_;
  r.dropped = dropped_;
  r.failed = failed_;
  r.duplicate_outcomes = duplicate_outcomes_;
  r.unknown_outcomes = unknown_outcomes_;
  r.gets = gets_;
  r.gets_answered = gets_answered_;
  r.distributions = distributions_;
  r.distribution_errors = distribution_errors_;
  r.delivered = delivered_;
  r.delivery_reports = delivery_reports_;
  r.cancelled = cancelled_;
  r.rpcs = rpcs_;
  r.rpc_errors = rpc_errors_;
  r.commands = commands_;
  r.stream_breaks = stream_breaks_;
  std::lock_guard<std::mutex> lock(pushes_mu_);
  r.without_outcome = open_pushes_;
  r.reasons = reasons_;
  r.errors = errors_;
  return r;
}

LoadReport LoadGenerator::Impl::Drain(double timeout_s) {
  load_stopped_ = true;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto drained = [this] {
    if (gets_answered_ != gets_) return false;
    std::lock_guard<std::mutex> lock(pushes_mu_);
    return open_pushes_ == 0;
  };
  while (!drained() && std::chrono::steady_clock::now() < deadline) {
    std::unique_lock<std::mutex> lock(pushes_mu_);
    drained_cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  // Let the last reports of applied pushes land before counting.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  LoadReport report = Snapshot();
  report.shard_disagreements = ShardDisagreements();
  Shutdown();
  return report;
}

int64_t LoadGenerator::Impl::ShardDisagreements() const {
  int64_t disagreements = 0;
  for (const Target& target : targets_) {
    std::set<int64_t> versions;
    for (int s : target.servers) {
      std::lock_guard<std::mutex> lock(servers_[s]->mu);
      versions.insert(servers_[s]->model_version);
    }
    if (versions.size() > 1) ++disagreements;
  }
  return disagreements;
}

void LoadGenerator::Impl::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  load_stopped_ = true;
  done_ = true;
  for (auto& driver : drivers_) {
    driver->cv.notify_all();
    if (driver->thread.joinable()) driver->thread.join();
  }
  for (auto& server : servers_) {
    server->cv.notify_all();
    if (server->delivery.joinable()) server->delivery.join();
    if (server->distribution.joinable()) server->distribution.join();
  }
  for (auto& host : hosts_) {
    if (host->stream) host->stream->Cancel();
  }
  for (auto& host : hosts_) {
    if (host->reader.joinable()) host->reader.join();
  }
}

LoadGenerator::LoadGenerator(LoadOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
LoadGenerator::~LoadGenerator() = default;
absl::Status LoadGenerator::Start() { return impl_->Start(); }
void LoadGenerator::StopLoad() { impl_->StopLoad(); }
LoadReport LoadGenerator::Drain(double timeout_s) { return impl_->Drain(timeout_s); }
LoadReport LoadGenerator::Snapshot() const { return impl_->Snapshot(); }

}  // namespace mlfabric::testing
