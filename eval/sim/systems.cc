#include "eval/sim/systems.h"

#include "eval/sim/harness.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "eval/sim/sgd_task.h"
#include "scheduler/core/distribution.h"
#include "scheduler/core/network.h"
#include "scheduler/core/planner_factory.h"
#include "scheduler/service/batch_builder.h"
#include "scheduler/service/plan_lead.h"

namespace mlfabric::sim {
namespace {

using internal::Harness;
using internal::Snapshot;
using internal::WallClock;

// CPU seconds used so far by the calling thread. The planning time charged
// to simulated time is measured with it rather than the wall clock: the
// simulator's planner runs on the calling thread (PlannerOptions::threads
// is 1 from MakePlanner), so this is the call's whole cost, and it leaves
// out the time the thread waited for a core, which on a shared machine
// would charge other processes' load to the scheduler and make the
// simulated schedule depend on it.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Mean, 99th percentile (nearest rank) and maximum of `ms` (0s when empty).
struct Spread {
  double mean = 0, p99 = 0, max = 0;
};
Spread SpreadOf(std::vector<double> ms) {
  Spread s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  s.mean = sum / static_cast<double>(ms.size());
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(ms.size())));
  s.p99 = ms[std::max<size_t>(rank, 1) - 1];
  s.max = ms.back();
  return s;
}

// ---------------------------------------------------------------------------
// MLfabric-A / MLfabric-S: the real core planner, executed per plan.
class Mlfabric final : public Harness {
 public:
  Mlfabric(const SimConfig& c, const SystemSpec& s, const ProgressFn& p,
           const PlanningTimeFn& planning_time)
      : Harness(c, s, /*ps=*/true, p),
        sync_(s.kind == SystemKind::kMlfabricS),
        planning_time_(planning_time),
        server_(layout_.server),
        hosts_(layout_.hosts),
        iteration_(c.workers, 0),
        outstanding_(c.workers, 0),
        held_get_(c.workers, false),
        get_asked_s_(c.workers, 0.0),
        reserved_(2 * hosts_),
        plan_lead_(c.instant_planning ? 0
                   : c.plan_lead_ms < 0 ? PlanLead::kAuto
                                        : 1e-3 * c.plan_lead_ms) {
    // Worker machines "m<i>" (2 workers each by default), the server "s"
    // (and its further shards "s1", "s2", ...: §10.2), dedicated aggregators
    // "a<i>" (only when not co-hosted with workers).
    for (int m = 0; m < layout_.machines; ++m) names_.push_back(absl::StrCat("m", m));
    for (int j = 0; j < layout_.servers; ++j) {
      names_.push_back(j == 0 ? std::string("s") : absl::StrCat("s", j));
      shard_names_.push_back(names_.back());
      // Byte ranges of (nearly) equal size, the first ones a byte longer.
      shard_bytes_.push_back(c.model_bytes / layout_.servers +
                             (j < c.model_bytes % layout_.servers ? 1 : 0));
    }
    for (int h = layout_.machines + layout_.servers; h < hosts_; ++h) {
      names_.push_back(absl::StrCat("a", h - layout_.machines - layout_.servers));
    }
    for (int h : layout_.aggregator_hosts) aggregator_names_.push_back(names_[h]);
    // k° distributors of §10.3: the first k° aggregator hosts (-1: all).
    const int k_dist = config_.distributors < 0
                           ? static_cast<int>(aggregator_names_.size())
                           : std::min<int>(config_.distributors, aggregator_names_.size());
    distributor_names_.assign(aggregator_names_.begin(), aggregator_names_.begin() + k_dist);
    for (int h = 0; h < hosts_; ++h) index_[names_[h]] = h;
  }

 private:
  enum class State { kWaiting, kPlanned, kArrived, kApplied, kDropped };
  struct Update {
    int worker = 0;
    int64_t version = 0;
    double pushed_s = 0;
    std::shared_ptr<Weights> grad;
    State state = State::kWaiting;
  };
  // A cut batch of pushes and its plan, which takes effect once planned.
  struct PushWork {
    core::Batch batch;
    std::string prefix;  // of its aggregates' keys
    core::Plan plan;
    bool late = false;   // a batch tick came while it was being planned
  };
  // An aggregate waiting for what it sums. Alg. 3 on a sharded model
  // (§10.2) sends one aggregate per part, all from one aggregator with the
  // same constituents and consecutive in the plan; they form one entry.
  struct PendingAggregate {
    std::vector<core::Transfer> transfers;  // one per part, in part order
    int needed = 0;
    int received = 0;
    int running = 0;  // started transfers still moving
  };

  absl::Status Start() override {
    absl::StatusOr<std::unique_ptr<core::Planner>> planner = core::MakePlanner("mlfabric");
    if (!planner.ok()) return planner.status();
    planner_ = std::move(*planner);
    const Snapshot initial = TakeSnapshot();
    for (int w = 0; w < config_.workers; ++w) OnModel(w, initial, 0);
    ScheduleTick(1);
    return absl::OkStatus();
  }

  int64_t InFlight() const override {
    int64_t n = 0;
    for (const auto& [id, u] : updates_) {
      if (u.state != State::kApplied && u.state != State::kDropped) ++n;
    }
    return n;
  }

  void Finish() override {
    const Spread planning = SpreadOf(planning_ms_);
    result_.planning_ms_mean = planning.mean;
    result_.planning_ms_p99 = planning.p99;
    result_.planning_ms_max = planning.max;
    if (batch_count_ > 0) result_.plan_lead_ms_mean = plan_lead_ms_total_ / batch_count_;
  }

  void OnModel(int w, Snapshot model, int64_t version) {
    const int64_t it = iteration_[w]++;
    sim_.At(sim_.now() + ComputeTimeS(config_, w, it), [this, w, model, version, it] {
      Update u;
      u.worker = w;
      u.version = version;
      u.pushed_s = sim_.now();
      u.grad = std::make_shared<Weights>(task_.Gradient(*model, w, it));
      const std::string id = absl::StrCat("u", next_update_++);
      updates_.emplace(id, std::move(u));
      pending_push_.push_back(id);
      ++result_.pushed;
      if (sync_) return;  // MLfabric-S: the model comes after the round
      // Pipelined (§4 push/get): push returns at once and the worker asks
      // for the freshest model, unless it already has the maximum number of
      // unresolved pushes.
      ++outstanding_[w];
      const int bound = config_.max_outstanding_pushes;
      if (bound > 0 && outstanding_[w] >= bound) {
        held_get_[w] = true;
      } else {
        AskModel(w);
      }
    });
  }

  void AskModel(int w) {
    get_asked_s_[w] = sim_.now();
    pending_get_.push_back(w);
  }

  // An update of worker `w` was applied or dropped.
  void Resolved(int w) {
    if (sync_) return;
    --outstanding_[w];
    if (held_get_[w]) {
      held_get_[w] = false;
      AskModel(w);
    }
  }

  void ScheduleTick(int64_t k) {
    sim_.At(k * config_.batch_interval_s, [this, k] {
      PruneReservations();
      // The live scheduler plans one batch at a time (its BatchLoop, one
      // thread per scheduler): a tick that finds the planner still busy
      // cuts nothing, and its pushes wait for the first tick after the plan
      // is ready (ticks overrun are not made up). Gets are planned apart
      // from the batch cycle (the live get handler), so they keep the ticks,
      // before the cut, whose batch then sees their reservations. One due
      // while a batch is being planned does not see that batch's transfers
      // (nor they its streams), as in the live scheduler.
      if (!pending_get_.empty() && GetBatchDue()) PlanGets();
      if (planning_ != nullptr) {
        // Counted here, not when it takes effect: a plan may still be in
        // the planner when the run ends.
        if (!planning_->late) ++result_.late_plans;
        planning_->late = true;
      } else if (!pending_push_.empty()) {
        CutPushes();
      }
      ScheduleTick(k + 1);
    });
  }

  // --- residual network as the scheduler sees it --------------------------
  void PruneReservations() {
    const double now = sim_.now();
    for (auto& link : reserved_) {
      link.erase(std::remove_if(link.begin(), link.end(),
                                [now](const core::RateSegment& s) { return s.to_s <= now; }),
                 link.end());
    }
  }

  // The residual of a link from `from_s` on: the same maths as the live
  // scheduler's.
  std::vector<core::ProfilePoint> Residual(double capacity_bps, int link, double from_s) const {
    return core::ResidualProfile(capacity_bps, from_s, reserved_[link]);
  }

  // Host h's links as the scheduler sees them now, their residual from
  // `from_s` (a push batch's plan time) on. The monitor reports the trace
  // with a lag (§7: t_lag).
  core::HostLink HostView(int h, double from_s) const {
    const double seen_s = std::max(0.0, sim_.now() - config_.monitor_lag_s);
    core::HostLink link;
    link.name = names_[h];
    link.uplink_bps = trace_.CapacityBps(h, true, seen_s);
    link.downlink_bps = trace_.CapacityBps(h, false, seen_s);
    if (!reserved_[2 * h].empty()) {
      link.uplink_profile = Residual(link.uplink_bps, 2 * h, from_s);
    }
    if (!reserved_[2 * h + 1].empty()) {
      link.downlink_profile = Residual(link.downlink_bps, 2 * h + 1, from_s);
    }
    return link;
  }

  void Reserve(const core::Transfer& t) {
    // The daemon refuses a transfer with an empty segment [t, t] ("unusable
    // rate segments"); count how often the planner emits one.
    for (const core::RateSegment& s : t.segments) {
      if (!(s.from_s < s.to_s)) ++result_.empty_segments;
    }
    const int src = index_.at(t.src), dst = index_.at(t.dst);
    if (src == dst) return;  // intra-host (worker to its own machine's aggregator)
    for (const core::RateSegment& s : t.segments) {
      reserved_[2 * src].push_back(s);
      reserved_[2 * dst + 1].push_back(s);
    }
  }

  // Starts `t` at its planned start (or now if that has passed).
  void StartPlanned(const core::Transfer& t, std::function<void()> on_done) {
    const int src = index_.at(t.src), dst = index_.at(t.dst);
    const double bits = 8.0 * static_cast<double>(t.bytes);
    auto start = [this, src, dst, bits, segments = t.segments, on_done]() {
      sim_.StartReservedFlow(src, dst, bits, segments, on_done);
    };
    if (t.start_s > sim_.now()) {
      sim_.At(t.start_s, start);
    } else {
      start();
    }
  }

  // --- pushes ---------------------------------------------------------------
  // Cuts the pending pushes into a batch and plans it on the real core.
  // mlfabric §7.4 measures the scheduler's overhead per batch; here it is
  // paid in simulated time: the plan takes effect (drops, reservations,
  // transfers, commit order) only at the cut plus the planning time, as the
  // live scheduler dispatches a plan when its planner call returns. Its
  // times stay those of the cut (the planner saw the network then), so
  // transfers due meanwhile start late on what is left of their segments.
  void CutPushes() {
    auto work = std::make_shared<PushWork>();
    work->batch = PushBatch();
    work->prefix = absl::StrCat("b", batch_count_, ":");
    PlanningSample sample{batch_count_++, sim_.now(),
                          static_cast<int>(work->batch.updates.size()), 0.0};
    pending_push_.clear();
    std::optional<core::Plan> plan = TimedPlan(work->batch, &sample.measured_s);
    if (!plan.has_value()) return;
    work->plan = std::move(*plan);
    const double planning_s = planning_time_ ? planning_time_(sample) : sample.measured_s;
    if (!(planning_s >= 0)) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("planning time of batch ", sample.batch, ": ", planning_s, " s")));
      return;
    }
    planning_ms_.push_back(1e3 * planning_s);
    plan_lead_.Record(planning_s);
    if (config_.instant_planning || planning_s == 0) {
      ApplyPushPlan(*work);
      return;
    }
    planning_ = work;
    sim_.At(sim_.now() + planning_s, [this, work] {
      planning_.reset();
      ApplyPushPlan(*work);
    });
  }

  // Puts a batch's plan into effect now.
  void ApplyPushPlan(const PushWork& work) {
    const core::Plan& plan = work.plan;
    if (!ApplyDrops(plan)) return;
    std::vector<core::Commit> commits = plan.commits;
    std::sort(commits.begin(), commits.end(),
              [](const core::Commit& a, const core::Commit& b) { return a.position < b.position; });
    for (const core::Commit& c : commits) commit_queue_.push_back(c.update);
    std::set<std::string> planned;
    std::map<std::string, std::string> hop_final;  // hop's "agg:<n>" -> final key
    IndexAggregates(plan, work.prefix, &planned, &hop_final);
    const std::set<std::string> streaming = StreamingAggregates(plan, work.prefix);
    // A sharded update has one delivery per part (a direct transfer or an
    // aggregate); it has arrived when all have.
    for (const core::Transfer& t : plan.transfers) {
      if (t.kind == core::TransferKind::kDirect) ++parts_left_[t.update];
    }
    if (!StartTransfers(plan, work.prefix, hop_final, streaming, &planned)) return;
    for (const core::UpdateRequest& r : work.batch.updates) {
      Update& u = updates_.at(r.id);
      if (u.state == State::kDropped) continue;
      if (!planned.count(r.id)) {
        Fail(absl::InternalError(absl::StrCat("plan has neither a transfer nor a drop for ", r.id)));
        return;
      }
      u.state = State::kPlanned;
    }
  }

  // The batch of the pending pushes, assembled as the live scheduler does
  // (BuildBatch): every simulated update is float32 of the model's size, so
  // all can share aggregates.
  core::Batch PushBatch() {
    BatchInputs in;
    // Planned for when it will take effect (plan_lead.h), as the live
    // scheduler does.
    const double lead_s = plan_lead_.LeadS();
    plan_lead_ms_total_ += 1e3 * lead_s;
    in.now_s = sim_.now() + lead_s;
    in.mode = sync_ ? core::Mode::kSync : core::Mode::kAsync;
    in.tau_max = tau_max();
    in.model_version = server_version_;
    for (const auto& [id, u] : updates_) {
      if (u.state == State::kPlanned || u.state == State::kArrived) ++in.unapplied;
    }
    in.server_host = names_[server_];
    in.seed = MixSeed(config_.seed, 0x62617463ULL, static_cast<uint64_t>(batch_count_));
    in.aggregator_candidates = aggregator_names_;
    in.streaming_aggregation = config_.streaming_aggregation;
    for (const std::string& id : pending_push_) {
      const Update& u = updates_.at(id);
      double norm = 0;
      for (double g : *u.grad) norm += g * g;
      const int host = layout_.HostOf(u.worker);
      // §10.2: the first shard's part is the update's own; the others are
      // planned with it (eq. 18: it arrives when its last part does).
      std::vector<core::ShardPart> shards;
      for (size_t j = 1; j < shard_names_.size(); ++j) {
        shards.push_back({shard_names_[j], shard_bytes_[j]});
      }
      in.updates.push_back(
          {{id, names_[host], shard_bytes_[0], u.version, std::sqrt(norm), std::move(shards)},
           1});
    }
    in.host_link = [this, from_s = in.now_s](const std::string& name) {
      return HostView(index_.at(name), from_s);
    };
    return BuildBatch(in);
  }

  // The planner's plan of `batch`, its wall time counted and its CPU time
  // in *cpu_s; nullopt (the run failed) if it has none.
  std::optional<core::Plan> TimedPlan(const core::Batch& batch, double* cpu_s) {
    const auto started = WallClock::now();
    const double cpu_started = ThreadCpuSeconds();
    absl::StatusOr<core::Plan> plan = planner_->PlanBatch(batch);
    *cpu_s = ThreadCpuSeconds() - cpu_started;
    const double ms = std::chrono::duration<double, std::milli>(WallClock::now() - started).count();
    if (!plan.ok()) {
      Fail(absl::InternalError(absl::StrCat("planner failed at t=", batch.now_s, " s: ",
                                            plan.status().message())));
      return std::nullopt;
    }
    planner_ms_total_ += ms;
    result_.planner_ms_max = std::max(result_.planner_ms_max, ms);
    ++result_.planner_calls;
    batch_updates_total_ += static_cast<int64_t>(batch.updates.size());
    result_.planner_ms_mean = planner_ms_total_ / result_.planner_calls;
    result_.planner_mean_batch = static_cast<double>(batch_updates_total_) / result_.planner_calls;
    return std::move(*plan);
  }

  // Ends the plan's dropped updates; false (the run failed) if a
  // synchronous plan dropped one.
  bool ApplyDrops(const core::Plan& plan) {
    for (const core::Drop& d : plan.dropped) {
      Update& u = updates_.at(d.id);
      if (sync_) {
        Fail(absl::InternalError(absl::StrCat("sync plan dropped ", d.id, ": ", d.reason)));
        return false;
      }
      u.state = State::kDropped;
      u.grad.reset();
      ++result_.dropped;
      ++result_.drop_reasons[d.reason];
      Resolved(u.worker);
    }
    return true;
  }

  // Reserves every transfer's rates and records the plan's aggregates that
  // reach a server, by key (the first one's name when a sharded group sends
  // one per part); a streaming chain's hops (core/aggregation.h) feed the
  // one their `into` chain ends at (*hop_final). Each aggregate's
  // constituents go to *planned.
  void IndexAggregates(const core::Plan& plan, const std::string& prefix,
                       std::set<std::string>* planned,
                       std::map<std::string, std::string>* hop_final) {
    std::map<std::string, const core::Transfer*> by_name;
    const core::Transfer* previous = nullptr;
    std::string previous_key;
    for (const core::Transfer& t : plan.transfers) {
      Reserve(t);
      const core::Transfer* last = previous;
      previous = nullptr;
      if (t.kind != core::TransferKind::kAggregate) continue;
      by_name[t.update] = &t;
      if (!t.into.empty()) continue;
      // Each aggregate delivers one part of every constituent.
      for (const std::string& c : t.constituents) ++parts_left_[c];
      previous = &t;
      if (last != nullptr && last->src == t.src && last->constituents == t.constituents) {
        aggregates_.at(previous_key).transfers.push_back(t);  // the group's next part
        continue;
      }
      const std::string key = prefix + t.update;
      previous_key = key;
      aggregates_[key].transfers = {t};
      for (const std::string& c : t.constituents) {
        aggregate_of_[c] = key;
        planned->insert(c);  // a chain member summed at its own host has no transfer
      }
    }
    for (const core::Transfer& t : plan.transfers) {
      if (t.kind != core::TransferKind::kAggregate || t.into.empty()) continue;
      const core::Transfer* next = &t;
      while (!next->into.empty()) next = by_name.at(next->into);
      const std::string key = prefix + next->update;
      (*hop_final)[t.update] = key;
      ++aggregates_.at(key).needed;
    }
    for (const core::Transfer& t : plan.transfers) {
      if (t.kind == core::TransferKind::kToAggregator) {
        ++aggregates_.at(aggregate_of_.at(t.update)).needed;
      }
    }
  }

  // Alg. 3's aggregates start once every constituent is in (store and
  // forward); a chain streams, so all of its hops start as planned (in
  // lock-step, on the same rates) and it has arrived when every part of it
  // has: then needed counts the aggregate's own transfer too. A chain is
  // an aggregate some member of which came without a transfer of its own.
  // Returns this batch's chains.
  std::set<std::string> StreamingAggregates(const core::Plan& plan, const std::string& prefix) {
    std::set<std::string> streaming;
    for (auto& [key, agg] : aggregates_) {
      if (key.compare(0, prefix.size(), prefix) != 0) continue;  // an earlier batch's
      std::set<std::string> sent;  // constituents with a transfer of their own
      for (const core::Transfer& t : plan.transfers) {
        if (t.kind == core::TransferKind::kToAggregator && aggregate_of_.count(t.update) &&
            aggregate_of_.at(t.update) == key) {
          sent.insert(t.update);
        }
      }
      if (sent.size() < agg.transfers.front().constituents.size()) {
        streaming.insert(key);
        ++agg.needed;
      }
    }
    return streaming;
  }

  // One part of aggregate `key` is in: once all are, Alg. 3's aggregate
  // starts, and a chain has arrived.
  void AggregatePartDone(const std::string& key, bool chain) {
    PendingAggregate& agg = aggregates_.at(key);
    if (++agg.received < agg.needed) return;
    if (!chain) {
      StartAggregate(key);
      return;
    }
    ++result_.aggregates;
    const std::vector<std::string> ids = agg.transfers.front().constituents;
    for (const std::string& id : ids) aggregate_of_.erase(id);
    aggregates_.erase(key);
    Delivered(ids);
  }

  // Starts the plan's transfers at their planned times; false (the run
  // failed) on a transfer kind the simulator does not plan.
  bool StartTransfers(const core::Plan& plan, const std::string& prefix,
                      const std::map<std::string, std::string>& hop_final,
                      const std::set<std::string>& streaming, std::set<std::string>* planned) {
    for (const core::Transfer& t : plan.transfers) {
      switch (t.kind) {
        case core::TransferKind::kDirect: {
          planned->insert(t.update);
          const std::string id = t.update;
          StartPlanned(t, [this, id] { Delivered({id}); });
          break;
        }
        case core::TransferKind::kToAggregator: {
          planned->insert(t.update);
          const std::string key = aggregate_of_.at(t.update);
          const bool chain = streaming.count(key) > 0;
          StartPlanned(t, [this, key, chain] { AggregatePartDone(key, chain); });
          break;
        }
        case core::TransferKind::kAggregate: {
          if (auto hop = hop_final.find(t.update); hop != hop_final.end()) {
            const std::string key = hop->second;
            StartPlanned(t, [this, key] { AggregatePartDone(key, true); });
          } else if (streaming.count(prefix + t.update)) {
            const std::string key = prefix + t.update;
            StartPlanned(t, [this, key] { AggregatePartDone(key, true); });
          }
          break;  // Alg. 3's: started when its constituents are in
        }
        default:
          Fail(absl::InternalError("unexpected replica transfer without a replica"));
          return false;
      }
    }
    return true;
  }

  // Alg. 3's aggregates start once every constituent is in: one transfer,
  // or one per part of a sharded model, each delivering that part of every
  // constituent.
  void StartAggregate(const std::string& key) {
    PendingAggregate& agg = aggregates_.at(key);
    const std::vector<core::Transfer> transfers = agg.transfers;
    agg.running = static_cast<int>(transfers.size());
    result_.aggregates += static_cast<int64_t>(transfers.size());
    for (const core::Transfer& t : transfers) {
      StartPlanned(t, [this, key, ids = t.constituents] {
        PendingAggregate& done = aggregates_.at(key);
        if (--done.running == 0) {
          for (const std::string& id : ids) aggregate_of_.erase(id);
          aggregates_.erase(key);
        }
        Delivered(ids);
      });
    }
  }

  // One part of each of `ids` is in (at its shard); those whose last part
  // it was have arrived.
  void Delivered(const std::vector<std::string>& ids) {
    std::vector<std::string> arrived;
    for (const std::string& id : ids) {
      auto left = parts_left_.find(id);
      if (--left->second > 0) continue;
      parts_left_.erase(left);
      arrived.push_back(id);
    }
    if (!arrived.empty()) OnArrived(arrived);
  }

  void OnArrived(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) updates_.at(id).state = State::kArrived;
    if (sync_) {
      arrived_in_round_ += static_cast<int>(ids.size());
      if (arrived_in_round_ < config_.workers) return;
      arrived_in_round_ = 0;
      Weights mean(server_model_.size(), 0.0);
      for (auto it = updates_.begin(); it != updates_.end();) {
        if (it->second.state == State::kArrived) {
          SgdTask::Apply(*it->second.grad, 1.0 / config_.workers, &mean);
          ++result_.applied;
          it = updates_.erase(it);  // applied: no longer tracked
        } else {
          ++it;
        }
      }
      SgdTask::Apply(mean, -config_.sgd.lr, &server_model_);
      ++server_version_;
      RecordDelay(0);
      for (int w = 0; w < config_.workers; ++w) pending_get_.push_back(w);
      return;
    }
    while (!commit_queue_.empty()) {
      auto it = updates_.find(commit_queue_.front());
      if (it == updates_.end() || it->second.state == State::kDropped) {
        commit_queue_.pop_front();
        continue;
      }
      Update& u = it->second;
      if (u.state != State::kArrived) break;
      SgdTask::Apply(*u.grad, -config_.sgd.lr / config_.workers, &server_model_);
      RecordDelay(server_version_ - u.version);
      ++server_version_;
      ++result_.applied;
      NotePushApplied(u.pushed_s);
      Resolved(u.worker);
      updates_.erase(it);  // applied: no longer tracked
      commit_queue_.pop_front();
    }
  }

  // --- model distribution (§10.3) -------------------------------------------
  // kServer: requests keep waiting at the server until the server sends of
  // the previous distribution end within this batch interval (see
  // SimConfig::get_batching).
  bool GetBatchDue() const {
    if (config_.get_batching == SimConfig::GetBatching::kTick) return true;
    return server_sends_until_s_ <= sim_.now() + config_.batch_interval_s + 1e-12;
  }

  void PlanGets() {
    // One copy per machine per get batch: the workers of a machine that ask
    // in the same batch share it (the second copy is intra-host). A sharded
    // model (§10.2) is one distribution per shard, of its part, planned now
    // (so every part is of this version); a machine has the model when all
    // its parts are in.
    auto get = std::make_shared<GetBatch>();
    get->model = TakeSnapshot();
    get->version = server_version_;
    get->parts = static_cast<int>(shard_names_.size());
    std::vector<std::string> requesters;
    for (int w : pending_get_) {
      const int host = layout_.HostOf(w);
      if (get->waiting[host].empty()) requesters.push_back(names_[host]);
      get->waiting[host].push_back(w);
    }
    pending_get_.clear();
    std::vector<std::shared_ptr<ShardGet>> shards;
    for (size_t j = 0; j < shard_names_.size(); ++j) {
      core::DistributionRequest request;
      request.now_s = sim_.now();
      request.server = shard_names_[j];
      request.model_bytes = shard_bytes_[j];
      request.distributors = distributor_names_;
      request.requesters = requesters;
      request.seed = MixSeed(config_.seed, 0x676574ULL, static_cast<uint64_t>(get_count_), j);
      std::set<int> involved = {layout_.server + static_cast<int>(j)};
      for (int h : layout_.aggregator_hosts) involved.insert(h);
      for (const auto& [host, workers] : get->waiting) involved.insert(host);
      for (int h : involved) request.hosts.push_back(HostView(h, sim_.now()));
      absl::StatusOr<core::DistributionPlan> plan = core::PlanModelDistribution(request);
      if (plan.ok() && config_.get_deadline_slack > 0) {
        core::DistributionOptions spare;
        spare.deadline_s =
            request.now_s + config_.get_deadline_slack * (plan->total_s - request.now_s);
        plan = core::PlanModelDistribution(request, spare);
      }
      if (!plan.ok()) {
        Fail(absl::InternalError(absl::StrCat("model distribution of ", request.server,
                                              " failed at t=", request.now_s,
                                              " s: ", plan.status().message())));
        return;
      }
      auto shard = std::make_shared<ShardGet>();
      shard->batch = get;
      shard->server = request.server;
      // Transfers out of each distributor wait for its own copy.
      std::set<std::string> served;
      for (const core::Transfer& t : plan->transfers) {
        Reserve(t);
        served.insert(t.dst);
        if (t.src != shard->server) {
          shard->outgoing[t.src].push_back(t);
          continue;
        }
        shard->first.push_back(t);
        ++result_.get_server_sends;
        for (const core::RateSegment& seg : t.segments) {
          server_sends_until_s_ = std::max(server_sends_until_s_, seg.to_s);
        }
      }
      for (const std::string& name : requesters) {
        if (!served.count(name)) {
          Fail(absl::InternalError(absl::StrCat("model distribution of ", shard->server,
                                                " left ", name, " out")));
          return;
        }
      }
      shards.push_back(std::move(shard));
    }
    ++get_count_;
    ++result_.get_batches;
    get_requesters_total_ += static_cast<int64_t>(requesters.size());
    result_.get_batch_mean_machines =
        static_cast<double>(get_requesters_total_) / result_.get_batches;
    for (const auto& shard : shards) {
      for (const core::Transfer& t : shard->first) LaunchModelTransfer(t, shard);
    }
  }

  // One batched model distribution in progress: what every shard's part
  // goes to, and who waits for all of them.
  struct GetBatch {
    Snapshot model;
    int64_t version = 0;
    int parts = 1;
    std::map<int, std::vector<int>> waiting;  // machine -> its requesting workers
    std::map<int, int> parts_in;              // machine -> parts arrived
  };
  struct ShardGet {
    std::shared_ptr<GetBatch> batch;
    std::string server;
    std::vector<core::Transfer> first;  // the shard server's own sends
    std::map<std::string, std::vector<core::Transfer>> outgoing;  // by distributor
  };

  void LaunchModelTransfer(const core::Transfer& t, std::shared_ptr<ShardGet> shard) {
    const int dst = index_.at(t.dst);
    const std::string dst_name = t.dst;
    StartPlanned(t, [this, dst, dst_name, shard] {
      // A distributor that also asked is served by its own receipt.
      GetBatch& get = *shard->batch;
      auto waiting = get.waiting.find(dst);
      if (waiting != get.waiting.end() && ++get.parts_in[dst] == get.parts) {
        for (int w : waiting->second) {
          if (!sync_) NoteGet(get_asked_s_[w]);
          OnModel(w, get.model, get.version);
        }
        get.waiting.erase(waiting);
      }
      auto it = shard->outgoing.find(dst_name);
      if (it == shard->outgoing.end()) return;
      for (const core::Transfer& next : it->second) LaunchModelTransfer(next, shard);
    });
  }

  const bool sync_;
  const PlanningTimeFn planning_time_;  // nullptr: the measured CPU time
  const int server_;
  const int hosts_;
  std::vector<std::string> names_;
  std::vector<std::string> aggregator_names_;
  std::vector<std::string> distributor_names_;
  std::vector<std::string> shard_names_;  // "s", then "s1", "s2", ... (§10.2)
  std::vector<int64_t> shard_bytes_;      // each shard's part of the model
  std::unordered_map<std::string, int> index_;
  std::unique_ptr<core::Planner> planner_;
  std::vector<int64_t> iteration_;
  std::vector<int> outstanding_;  // pushed, neither applied nor dropped (async)
  std::vector<bool> held_get_;    // get held back by max_outstanding_pushes
  std::vector<double> get_asked_s_;
  std::vector<std::vector<core::RateSegment>> reserved_;  // per link: 2h up, 2h+1 down
  std::map<std::string, Update> updates_;
  std::vector<std::string> pending_push_;
  std::vector<int> pending_get_;
  std::deque<std::string> commit_queue_;
  std::map<std::string, PendingAggregate> aggregates_;
  std::map<std::string, std::string> aggregate_of_;
  std::unordered_map<std::string, int> parts_left_;  // update -> parts not yet delivered
  int64_t next_update_ = 0;
  int64_t batch_count_ = 0;
  int64_t get_count_ = 0;
  int64_t get_requesters_total_ = 0;
  double server_sends_until_s_ = 0;  // end of the server's planned model sends
  int arrived_in_round_ = 0;
  double planner_ms_total_ = 0;
  int64_t batch_updates_total_ = 0;
  std::shared_ptr<PushWork> planning_;  // the batch being planned; nullptr: planner free
  std::vector<double> planning_ms_;     // every push batch's planning time
  PlanLead plan_lead_;                  // how far after its cut a push batch is planned for
  double plan_lead_ms_total_ = 0;
};

}  // namespace

absl::StatusOr<SystemSpec> ParseSystem(const std::string& name) {
  if (name == "mlfabric-a") return SystemSpec{name, SystemKind::kMlfabricA, 0};
  if (name.rfind("mlfabric-a-", 0) == 0) {
    int64_t tau = 0;
    if (!absl::SimpleAtoi(name.substr(11), &tau) || tau < 1) {
      return absl::InvalidArgumentError(absl::StrCat("systems: bad delay bound in '", name, "'"));
    }
    return SystemSpec{name, SystemKind::kMlfabricA, tau};
  }
  if (name == "mlfabric-s") return SystemSpec{name, SystemKind::kMlfabricS, 0};
  if (name == "async") return SystemSpec{name, SystemKind::kAsync, 0};
  if (name == "rr-sync") return SystemSpec{name, SystemKind::kRingSync, 0};
  if (name == "tr-sync") return SystemSpec{name, SystemKind::kTreeSync, 0};
  return absl::InvalidArgumentError(absl::StrCat(
      "systems: '", name,
      "' is not one of mlfabric-a, mlfabric-a-<tau>, mlfabric-s, async, rr-sync, tr-sync"));
}

absl::StatusOr<SystemResult> RunSystem(const SimConfig& config, const SystemSpec& spec,
                                       const ProgressFn& progress,
                                       const PlanningTimeFn& planning_time) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Harness> harness;
  switch (spec.kind) {
    case SystemKind::kMlfabricA:
    case SystemKind::kMlfabricS:
      harness = std::make_unique<Mlfabric>(config, spec, progress, planning_time);
      break;
    case SystemKind::kAsync:
      harness = internal::MakeAsyncPs(config, spec, progress);
      break;
    case SystemKind::kRingSync:
    case SystemKind::kTreeSync:
      harness = internal::MakeAllReduce(config, spec, progress);
      break;
  }
  return harness->Run();
}

}  // namespace mlfabric::sim
