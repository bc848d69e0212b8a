// SchedulerService: lifecycle, observers, admin actions and the batch cycle.
// The control-plane handlers are in scheduler_handlers.cc.
#include "scheduler/service/scheduler_service.h"

#include "scheduler/service/outcome_queries.h"
#include "scheduler/service/replica_sync.h"

#include "scheduler/service/in_doubt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "scheduler/core/network.h"
#include "scheduler/service/batch_builder.h"
#include "scheduler/service/replica_tracker.h"
#include "scheduler/service/round_tracker.h"

namespace mlfabric {
namespace {

int PlannerThreads(int64_t configured) {
  if (configured > 0) return static_cast<int>(configured);
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

// The aggregators' kernels sum floating point (aggregator/reduce.h): other
// element types cannot share an aggregate (PendingUpdate::element_type, where
// 0 means "not summable" — so not the proto's value, as DTYPE_FLOAT32 is 0).
int AggregatableElementType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return 1;
    case v1::DTYPE_FLOAT64: return 2;
    default: return 0;
  }
}

SchedulerService::SchedulerService(SchedulerConfig config, const Clock* clock,
                                   std::unique_ptr<core::Planner> planner)
    : config_(std::move(config)),
      clock_(clock),
      planner_(std::move(planner)),
      planner_threads_(PlannerThreads(config_.planner_threads)),
      started_s_(clock_->NowSeconds()),
      auth_(config_),
      history_(config_.history_batches),
      state_(config_, clock_, &outbox_, &history_),
      dispatcher_(config_, &state_, &history_),
      plan_lead_(config_.plan_lead_ms < 0 ? PlanLead::kAuto : 1e-3 * config_.plan_lead_ms),
      loop_(config_.batch_interval_ms, [this] { RunBatchCycle(); }) {
  for (const auto& [name, job] : state_.jobs()) auth_.AddJob(job.id, name, job.config.token);
  // A host given work of a job gets the job's data key first; every host
  // gets the priority class of each job that has one (TensorLights
  // ranking in the daemons' queues and on their NICs).
  outbox_.SetJobKeys(auth_.job_keys());
  for (const auto& [name, job] : state_.jobs()) {
    outbox_.SetJobClass(job.id, name, job.config.priority_class);
  }
}

absl::Status SchedulerService::CheckHostSession(const std::string& host,
                                                const std::string& session) const {
  if (!auth_.hosts_authenticated()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  const HostState* registered = state_.hosts().Find(host);
  if (registered == nullptr || registered->session_token.empty() ||
      !ConstantTimeEquals(session, registered->session_token)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "host '", host, "': ", session.empty() ? "no" : "a wrong",
        " session token; a daemon registers its host first and presents the token it got"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerService::CheckJobToken(const std::string& job,
                                             const std::string& token) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobState* known = state_.FindJob(job);
  if (known == nullptr) return absl::OkStatus();
  if (!ConstantTimeEquals(token, known->config.token)) {
    return absl::PermissionDeniedError(absl::StrCat("job '", job, "': ",
                                                    token.empty() ? "no" : "a wrong",
                                                    " job token on the call"));
  }
  return absl::OkStatus();
}

SchedulerService::~SchedulerService() { Stop(); }

void SchedulerService::Start() { loop_.Start(); }

void SchedulerService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  outbox_.Stop();
  servers_cv_.notify_all();
  clocks_cv_.notify_all();
  outcomes_cv_.notify_all();
  loop_.Stop();
}

SchedulerService::Stats SchedulerService::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.stats;
}

ClusterSnapshot SchedulerService::CyclesSnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterSnapshot snap;
  snap.now_s = clock_->NowSeconds();
  snap.started_s = started_s_;
  snap.batch_interval_ms = config_.batch_interval_ms;
  history_.CopyCyclesInto(&snap);
  return snap;
}

ClusterSnapshot SchedulerService::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterSnapshot snap;
  snap.now_s = clock_->NowSeconds();
  snap.started_s = started_s_;
  snap.planner = planner_->Name();
  snap.batch_interval_ms = config_.batch_interval_ms;
  snap.planner_threads = planner_threads_;
  snap.stats = state_.stats;
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  state_.Reservations(&up, &down);
  for (const auto& [name, host] : state_.hosts().all()) {
    HostView view;
    view.name = name;
    view.data_address = host.data_address;
    view.alive = host.alive;
    view.draining = host.draining;
    view.capacity_up_bps = host.capacity_up_bps;
    view.capacity_down_bps = host.capacity_down_bps;
    view.reported_up_bps = host.uplink_bps;
    view.reported_down_bps = host.downlink_bps;
    view.last_report_s = host.last_report_s;
    view.reports = host.reports;
    view.reserved_up_bps = up.count(name) ? core::RateAt(up.at(name), snap.now_s) : 0;
    view.reserved_down_bps = down.count(name) ? core::RateAt(down.at(name), snap.now_s) : 0;
    view.available_up_bps = std::max(0.0, view.reported_up_bps - view.reserved_up_bps);
    view.available_down_bps = std::max(0.0, view.reported_down_bps - view.reserved_down_bps);
    snap.hosts.push_back(std::move(view));
  }
  for (const auto& [name, job] : state_.jobs()) {
    JobView view;
    view.id = job.id;
    view.params = job.config;
    view.params.token.clear();
    view.applied = job.applied;
    view.dropped = job.dropped;
    view.failed = job.failed;
    for (const auto& [server_name, server] : job.servers) {
      ServerView sv{server_name, server.host, server.model_version,
                    static_cast<int64_t>(server.pending.size()), server.in_flight};
      for (const ShardSlot& slot : server.shards) sv.shards.push_back(slot.server);
      sv.group = server.group;
      if (auto replica = job.replica_hosts.find(server_name); replica != job.replica_hosts.end()) {
        sv.replica_host = replica->second;
        sv.replica_applied = server.replica.applied;
        sv.replica_lag = static_cast<int64_t>(server.replica.in_flight.size() +
                                              server.replica.pending.size());
        sv.divergence_estimate = DivergenceEstimate(state_, job, server_name, server);
      }
      view.servers.push_back(std::move(sv));
    }
    view.failovers = job.failovers;
    const JobMembership& membership = job.membership;
    view.members.assign(membership.members().begin(), membership.members().end());
    view.generation = membership.generation();
    view.membership_changes.assign(membership.history().begin(), membership.history().end());
    view.workers = state_.stragglers.Evaluate(name);
    for (const auto& [key, wait] : ssp_waiting_) {
      if (key.first == name) view.ssp_waiting.push_back(wait);
    }
    if (auto counts = ssp_wait_counts_.find(name); counts != ssp_wait_counts_.end()) {
      view.ssp_waits = counts->second.first;
      view.ssp_wait_timeouts = counts->second.second;
    }
    snap.jobs.push_back(std::move(view));
  }
  for (const auto& [id, record] : state_.pushes()) {
    if (record.state == UpdateState::kInFlight) snap.in_flight.push_back(record.planned);
  }
  history_.CopyInto(&snap);
  return snap;
}

absl::Status SchedulerService::UpdateJobParams(const std::string& job_name,
                                               const JobParamsUpdate& update) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = state_.FindJob(job_name);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job '", job_name, "'"));
  if (update.tau_max) RETURN_IF_ERROR(ValidateDelayBound("tau_max", *update.tau_max));
  if (update.staleness_k) RETURN_IF_ERROR(ValidateDelayBound("staleness_k", *update.staleness_k));
  if (update.divergence_max &&
      (!std::isfinite(*update.divergence_max) || *update.divergence_max < 0)) {
    return absl::InvalidArgumentError("divergence_max: must be finite and >= 0");
  }
  if (update.momentum && !(*update.momentum >= 0 && *update.momentum < 1)) {
    return absl::InvalidArgumentError("momentum: must be in [0, 1)");
  }
  if (update.priority_class && (*update.priority_class < 0 || *update.priority_class > 7)) {
    return absl::InvalidArgumentError("priority_class: must be in [0, 7]");
  }
  JobConfig& config = job->config;
  if (update.tau_max) config.tau_max = *update.tau_max;
  if (update.staleness_k) config.staleness_k = *update.staleness_k;
  if (update.divergence_max) config.divergence_max = *update.divergence_max;
  if (update.momentum) config.momentum = *update.momentum;
  if (update.priority_class) {
    config.priority_class = *update.priority_class;
    // The daemons re-rank it in their queues and on their NICs.
    outbox_.SetJobClass(job->id, job_name, config.priority_class);
  }
  MLF_LOG(INFO) << "admin: job " << job_name << " now tau_max " << config.tau_max
                << ", staleness_k " << config.staleness_k << ", divergence_max "
                << config.divergence_max << ", momentum " << config.momentum
                << ", priority_class " << config.priority_class;
  return absl::OkStatus();
}

absl::Status SchedulerService::DrainHost(const std::string& host_name, bool drain) {
  std::lock_guard<std::mutex> lock(mu_);
  HostState* host = state_.hosts().Find(host_name);
  if (host == nullptr) {
    return absl::NotFoundError(absl::StrCat("host '", host_name, "' is not registered"));
  }
  host->draining = drain;
  MLF_LOG(INFO) << "admin: host " << host_name << (drain ? " drained" : " back in service");
  return absl::OkStatus();
}

void SchedulerService::SampleLinksLocked(
    double now_s, const std::map<std::string, std::vector<core::RateSegment>>& up,
    const std::map<std::string, std::vector<core::RateSegment>>& down) {
  auto reserved = [now_s](const std::map<std::string, std::vector<core::RateSegment>>& links,
                          const std::string& name) {
    auto it = links.find(name);
    return it == links.end() ? 0.0 : core::RateAt(it->second, now_s);
  };
  LinkSample sample;
  sample.at_s = now_s;
  for (const auto& [name, host] : state_.hosts().all()) {
    if (!host.alive) continue;
    sample.links.push_back({name, reserved(up, name), reserved(down, name), host.uplink_bps,
                            host.downlink_bps});
  }
  history_.RecordLinkSample(std::move(sample));
}

void SchedulerService::LogStragglersLocked(double now_s) {
  if (stragglers_logged_s_ >= 0 && now_s - stragglers_logged_s_ < 1.0) return;
  stragglers_logged_s_ = now_s;
  std::set<std::pair<std::string, std::string>> now;
  for (const auto& [job_name, job] : state_.jobs()) {
    for (const WorkerTiming& w : state_.stragglers.Evaluate(job_name)) {
      const auto key = std::make_pair(job_name, w.worker);
      if (w.straggler) now.insert(key);
      if (w.straggler && !stragglers_.count(key)) {
        MLF_LOG(WARNING) << "straggler: worker " << w.worker << " of job " << job_name << " takes "
                         << absl::StrFormat("%.0f", 1000 * w.iteration_s) << " ms per iteration, "
                         << absl::StrFormat("%.1f", w.slowdown)
                         << "x its job's median (compute "
                         << absl::StrFormat("%.0f", 1000 * w.compute_s) << " ms, transfer "
                         << absl::StrFormat("%.0f", 1000 * w.transfer_s) << " ms)";
      } else if (!w.straggler && stragglers_.count(key)) {
        MLF_LOG(INFO) << "straggler: worker " << w.worker << " of job " << job_name
                      << " is no longer slower than " << config_.straggler_factor
                      << "x its job's median";
      }
    }
  }
  stragglers_ = std::move(now);
}

bool SchedulerService::CutBatchLocked(
    const std::string& job_name, JobState& job, const std::string& server_name,
    ServerState& server, double now_s, bool use_reservations,
    const std::map<std::string, std::vector<core::RateSegment>>& up,
    const std::map<std::string, std::vector<core::RateSegment>>& down, BatchWork* item) {
  // A server with no new pushes may still owe its replica copies punted
  // earlier (§5.3: they go "along with the next batch").
  const bool flush_replica = !server.replica.pending.empty() &&
                             job.replica_hosts.count(server_name) > 0 && use_reservations;
  if (server.pending.empty() && !flush_replica) return false;
  const int32_t round_size = RoundSize(job, server);
  if (round_size > 0 && !AdmitRoundPushesLocked(&server, round_size)) return false;
  // replica_bound "strict": only the pushes the replica's progress leaves
  // room for; the rest wait (punted copies still go, so room is made).
  size_t admitted = server.pending.size();
  if (round_size == 0 && use_reservations && config_.replica_bound == "strict") {
    admitted = StrictReplicaAdmits(state_, job, server_name, server);
    state_.stats.replica_bound_waits += static_cast<int64_t>(server.pending.size() - admitted);
    if (admitted == 0 && !flush_replica) return false;
  }
  item->batch_id = state_.NewBatchId();
  item->job = job_name;
  item->server = server_name;
  item->priority_class = job.config.priority_class;
  item->round_size = round_size;

  BatchInputs in;
  in.now_s = now_s;
  in.mode = job.config.mode == JobMode::kSync || round_size > 0 ? core::Mode::kSync
                                                                : core::Mode::kAsync;
  // The core has no stale-synchronous mode: an ssp job is planned as async
  // with its tau_max (its K bounds clocks, AwaitClock). Workers may have
  // registered tighter bounds (Table 1, registerAsWorker(params)).
  in.tau_max = DelayBound(job);
  in.model_version = server.model_version;
  in.unapplied = server.in_flight;  // updates already scheduled commit first (§5.1)
  in.synchronous_round = round_size > 0;
  in.server_host = server.host;
  in.seed = item->batch_id;
  in.streaming_aggregation = config_.streaming_aggregation;
  AddBatchUpdatesLocked(job, server, admitted, &in);
  in.aggregator_candidates = AggregatorCandidatesLocked(job, server, admitted, round_size);
  // §5.3: a registered replica gets this batch's updates (and the copies
  // punted earlier) within the divergence bound.
  if (round_size == 0 && use_reservations) {
    in.replica = ReplicaSpecFor(&state_, job, server_name, &server);
    if (in.replica.has_value() && config_.replica_aggregation != "none") {
      AllowReplicaAggregation(state_, server, in.aggregator_candidates,
                              /*pending_only=*/config_.replica_aggregation == "punted",
                              &*in.replica);
    }
  }
  in.host_link = [&](const std::string& name) {
    // A name no daemon registered has no links (and no entry is made for it).
    static const HostState kUnregistered;
    const HostState* registered = state_.hosts().Find(name);
    const HostState& host = registered != nullptr ? *registered : kUnregistered;
    core::HostLink link{name, host.uplink_bps, host.downlink_bps, {}, {}};
    if (use_reservations) {
      if (auto it = up.find(name); it != up.end()) {
        link.uplink_profile = core::ResidualProfile(host.uplink_bps, now_s, it->second);
      }
      if (auto it = down.find(name); it != down.end()) {
        link.downlink_profile = core::ResidualProfile(host.downlink_bps, now_s, it->second);
      }
    }
    return link;
  };
  item->batch = BuildBatch(in);
  return true;
}

bool SchedulerService::AdmitRoundPushesLocked(ServerState* server, int32_t round_size) {
  const std::vector<uint64_t> candidates = server->pending;
  server->pending.clear();
  for (uint64_t id : candidates) {
    auto* record = state_.FindPush(id);
    if (record == nullptr) continue;
    if (AdmitToRound(&state_, server, round_size, record)) {
      server->pending.push_back(id);
    }
  }
  return !server->pending.empty();
}

void SchedulerService::AddBatchUpdatesLocked(JobState& job, const ServerState& server,
                                             size_t admitted, BatchInputs* in) {
  // A server group's push (server_groups.h): shard 0's part is the
  // update's own, the others are its §10.2 components, reserved together.
  std::vector<core::ShardPart> parts;
  for (size_t i = 1; i < server.shards.size(); ++i) {
    const ShardSlot& slot = server.shards[i];
    parts.push_back({job.servers[slot.server].host, slot.end - slot.begin});
  }
  for (size_t i = 0; i < admitted; ++i) {
    const uint64_t id = server.pending[i];
    const UpdateRecord& record = state_.pushes().at(id);  // pending: not ended
    const int64_t bytes = server.shards.empty() ? record.bytes
                                                : server.shards[0].end - server.shards[0].begin;
    in->updates.push_back({{std::to_string(id), record.src_host, bytes, record.version,
                            record.norm, parts},
                           AggregatableElementType(record.dtype)});
  }
}

std::vector<std::string> SchedulerService::AggregatorCandidatesLocked(const JobState& job,
                                                                      const ServerState& server,
                                                                      size_t admitted,
                                                                      int32_t round_size) {
  // §6: a synchronous round's aggregation tree is built over the job's own
  // workers unless the job names its aggregators.
  std::vector<std::string> candidates = job.config.aggregators;
  if (candidates.empty() && round_size > 0) {
    for (const auto& [name, worker] : job.workers) candidates.push_back(worker.host);
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  }
  // A group's pushes are summed at the job's aggregators (server_groups.h)
  // shard by shard, which needs every shard's range to start on a whole
  // element (the kernels sum float32 or float64). Not for rounds.
  if (!server.shards.empty()) {
    int64_t element = 4;
    for (size_t i = 0; i < admitted; ++i) {
      if (state_.pushes().at(server.pending[i]).dtype == v1::DTYPE_FLOAT64) element = 8;
    }
    bool aligned = round_size == 0;
    for (const ShardSlot& slot : server.shards) aligned = aligned && slot.begin % element == 0;
    if (!aligned) candidates.clear();
  }
  std::vector<std::string> usable;
  for (const std::string& name : candidates) {
    const HostState* host = state_.AliveHost(name);
    if (host != nullptr && !host->draining) usable.push_back(name);
  }
  return usable;
}

void SchedulerService::RunBatchCycle() {
  outbox_.WakeWatchers();  // a stream that missed a wake-up (command_outbox.h)
  std::vector<BatchWork> work;
  CycleView cycle;
  using SteadyClock = std::chrono::steady_clock;
  const auto started = SteadyClock::now();
  auto ms_between = [](SteadyClock::time_point from, SteadyClock::time_point to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  };
  // The service's lock, with the time spent waiting for it (held by the
  // calls of the daemons) counted in the cycle's lock_wait_ms.
  auto lock_timed = [&] {
    const auto asked = SteadyClock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cycle.lock_wait_ms += ms_between(asked, SteadyClock::now());
    return lock;
  };
  {
    std::unique_lock<std::mutex> lock = lock_timed();
    const auto cutting = SteadyClock::now();
    const double now_s = clock_->NowSeconds();
    cycle.start_s = now_s;
    state_.ExpireOverdue(now_s);
    ResolveInDoubt(&state_, config_.in_doubt_wait_s);
    SendReplicaSnapshots(&state_);  // before any batch is cut (replica_sync.h)
    LogStragglersLocked(now_s);
    // The links' reservations, collected once for the cut and (once a
    // second) the admin endpoint's link sample: a pass over every transfer
    // in flight.
    const bool use_reservations = planner_->UsesReservations();
    const bool sample_links = history_.LinkSampleDue(now_s);
    // The batches are planned for when their commands will be queued
    // (plan_lead.h): the network from then on, their transfers from then.
    cycle.lead_ms = 1e3 * plan_lead_.LeadS();
    const double plan_s = now_s + 1e-3 * cycle.lead_ms;
    std::map<std::string, std::vector<core::RateSegment>> up, down;
    if (use_reservations || sample_links) state_.Reservations(&up, &down);
    if (sample_links) SampleLinksLocked(now_s, up, down);
    state_.ForEachServer([&](const std::string& job_name, JobState& job,
                             const std::string& server_name, ServerState& server) {
      BatchWork item;
      if (CutBatchLocked(job_name, job, server_name, server, plan_s, use_reservations, up, down,
                         &item)) {
        work.push_back(std::move(item));
      }
    });
    if (!work.empty()) ++state_.stats.batches;
    cycle.cut_ms = ms_between(cutting, SteadyClock::now());
  }
  if (work.empty()) return;
  const auto planning = SteadyClock::now();
  PlanInParallel(*planner_, planner_threads_, &work);
  cycle.plan_ms = ms_between(planning, SteadyClock::now());
  for (const BatchWork& item : work) {
    MLF_LOG(DEBUG) << "job " << item.job << " server " << item.server << ": "
                   << item.batch.updates.size() << " updates planned in " << item.compute_ms
                   << " ms on thread " << item.worker_thread;
    std::unique_lock<std::mutex> lock = lock_timed();
    const auto dispatching = SteadyClock::now();
    {
      // The batch's streams wake once its commands are all queued.
      const CommandOutbox::WakeupHold hold(&outbox_);
      dispatcher_.Apply(item, planner_->Name());
    }
    cycle.dispatch_ms += ms_between(dispatching, SteadyClock::now());
    ++cycle.batches;
    cycle.updates += static_cast<int64_t>(item.batch.updates.size());
  }
  // The cycle's time as the admin endpoint shows it (GET /api/v1/cycles):
  // what a batch interval must cover for the scheduler to keep up.
  std::unique_lock<std::mutex> lock = lock_timed();
  cycle.total_ms = ms_between(started, SteadyClock::now());
  plan_lead_.Record(clock_->NowSeconds() - cycle.start_s);
  // With the scheduler's "push ... at" lines: how long a complete round
  // waits for its commands (the clock is the daemons' steady clock too).
  MLF_LOG(DEBUG) << "batch cycle at " << absl::StrFormat("%.6f", cycle.start_s) << ": "
                 << cycle.batches << " batch(es) planned in "
                 << absl::StrFormat("%.3f", cycle.plan_ms) << " ms, commands queued after "
                 << absl::StrFormat("%.3f", cycle.total_ms) << " ms";
  history_.RecordCycle(cycle);
}

absl::Status SchedulerService::QueryOutcomes(const v1::QueryOutcomesRequest& request,
                                             v1::QueryOutcomesReply* reply) {
  if (request.push_uids_size() > static_cast<int>(kMaxOutcomeQueryPushes)) {
    return absl::InvalidArgumentError(absl::StrCat("push_uids: ", request.push_uids_size(),
                                                   " uids; at most ", kMaxOutcomeQueryPushes));
  }
  if (!(request.wait_s() >= 0)) {
    return absl::InvalidArgumentError("wait_s: must be a number >= 0");
  }
  const std::vector<uint64_t> uids(request.push_uids().begin(), request.push_uids().end());
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(std::min(request.wait_s(), kMaxOutcomeQueryWaitS)));
  std::unique_lock<std::mutex> lock(mu_);
  if (state_.FindJob(request.job()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job '", request.job(), "'"));
  }
  ++state_.stats.outcome_queries;
  std::vector<v1::PushState> states;
  while (true) {
    states = PushStates(state_, request.job(), request.worker(), uids);
    if (!AnyInFlight(states) || stopping_ || std::chrono::steady_clock::now() >= deadline) break;
    // Outcomes are decided by reports and the batch loop: look again soon.
    outcomes_cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                         std::chrono::milliseconds(50)));
  }
  for (v1::PushState& push : states) *reply->add_pushes() = std::move(push);
  reply->set_uptime_s(clock_->NowSeconds() - started_s_);
  return absl::OkStatus();
}

absl::Status SchedulerService::QueryMembership(const v1::QueryMembershipRequest& request,
                                               v1::QueryMembershipReply* reply) {
  if (request.worker().empty()) {
    return absl::InvalidArgumentError("worker: empty; the asking worker's name is needed");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const JobState* job = state_.FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job '", request.job(), "'"));
  if (job->workers.count(request.worker()) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", request.worker(),
                                                      "' is not registered with job '",
                                                      request.job(), "'"));
  }
  reply->set_generation(job->membership.generation());
  for (const std::string& member : job->membership.members()) reply->add_members(member);
  return absl::OkStatus();
}

void SchedulerService::ReserveDistribution(double now_s, const core::DistributionPlan& plan) {
  std::vector<ClusterState::DistributionLeg> legs;
  // store_forward plans have timed transfers; cut_through ones a stream per
  // requester from its parent at the plan's rate until it has the model.
  for (const core::Transfer& t : plan.transfers) {
    legs.push_back({t.src, t.dst, t.segments, t.end_s});
  }
  if (plan.transfers.empty()) {
    for (const core::Delivery& d : plan.deliveries) {
      if (d.rate_bps <= 0 || d.at_s <= now_s) continue;
      legs.push_back({d.via, d.host, {{now_s, d.at_s, d.rate_bps}}, d.at_s});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  state_.ReserveDistribution(std::move(legs));
}

}  // namespace mlfabric
