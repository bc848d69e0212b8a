#include "eval/sim/systems.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "eval/sim/sgd_task.h"
#include "scheduler/core/distribution.h"
#include "scheduler/core/planner_factory.h"

namespace mlfabric::sim {
namespace {

using Snapshot = std::shared_ptr<const Weights>;
using WallClock = std::chrono::steady_clock;

// What every system shares: the simulated cluster, the real model at the
// server, accuracy sampling on a fixed grid, and the result.
class Harness {
 public:
  // `ps`: the layout has a parameter server (and maybe dedicated
  // aggregators); all-reduce systems use the worker machines only.
  Harness(const SimConfig& config, const SystemSpec& spec, bool ps, const ProgressFn& progress)
      : config_(config),
        spec_(spec),
        layout_(MakeLayout(config)),
        trace_(config, ps ? layout_.server : -1),
        sim_(ps ? layout_.hosts : layout_.machines, &trace_),
        task_(config.sgd, config.seed),
        server_model_(task_.InitialWeights()),
        progress_(progress) {
    result_.system = spec.name;
    sim_.set_intra_host_bps(config.intra_host_bps);
  }
  virtual ~Harness() = default;

  absl::StatusOr<SystemResult> Run() {
    const auto started = WallClock::now();
    if (absl::Status s = Start(); !s.ok()) return s;
    ScheduleEval(0);
    sim_.Run([this] { return reached_ || !status_.ok(); }, config_.max_sim_s);
    if (!status_.ok()) return status_;
    result_.sim_end_s = sim_.now();
    result_.final_accuracy = last_accuracy_;
    result_.model_versions = server_version_;
    result_.in_flight = InFlight();
    if (result_.sim_end_s > 0) {
      result_.gradients_per_s = result_.applied / result_.sim_end_s;
      result_.rounds_per_s = result_.gradients_per_s / config_.workers;
    }
    int64_t delay_count = 0;
    double delay_sum = 0;
    for (const auto& [delay, count] : result_.delay_histogram) {
      delay_count += count;
      delay_sum += static_cast<double>(delay) * count;
      result_.max_delay = std::max(result_.max_delay, delay);
    }
    if (delay_count > 0) result_.mean_delay = delay_sum / delay_count;
    if (result_.accuracy_curve.empty() || result_.accuracy_curve.back().first < sim_.now()) {
      result_.accuracy_curve.push_back({sim_.now(), last_accuracy_});
    }
    result_.fluid = sim_.stats();
    result_.wall_s = std::chrono::duration<double>(WallClock::now() - started).count();
    return result_;
  }

 protected:
  virtual absl::Status Start() = 0;
  // Gradients pushed and neither applied nor dropped, counted from the
  // system's own state (not from the counters).
  virtual int64_t InFlight() const = 0;

  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  void NoteGet(double requested_s) {
    get_sum_s_ += sim_.now() - requested_s;
    result_.mean_get_s = get_sum_s_ / ++get_count_;
  }
  void NotePushApplied(double pushed_s) {
    push_sum_s_ += sim_.now() - pushed_s;
    result_.mean_push_to_apply_s = push_sum_s_ / ++push_count_;
  }

  void RecordDelay(int64_t delay) {
    ++result_.delay_histogram[delay];
    const int64_t bound = spec_.kind == SystemKind::kMlfabricA ? tau_max() : 0;
    if (bound > 0 && delay > bound) ++result_.delay_bound_violations;
  }

  int64_t tau_max() const { return spec_.tau_max > 0 ? spec_.tau_max : config_.tau_max; }
  double model_bits() const { return 8.0 * static_cast<double>(config_.model_bytes); }
  Snapshot TakeSnapshot() const { return std::make_shared<const Weights>(server_model_); }

  const SimConfig& config_;
  SystemSpec spec_;
  HostLayout layout_;
  NetworkTrace trace_;
  FluidSim sim_;
  SgdTask task_;
  Weights server_model_;
  int64_t server_version_ = 0;
  SystemResult result_;

 private:
  void ScheduleEval(int64_t k) {
    sim_.At(k * config_.eval_interval_s, [this, k] {
      if (evaluated_version_ != server_version_) {
        last_accuracy_ = task_.TestAccuracy(server_model_);
        evaluated_version_ = server_version_;
      }
      const double now = sim_.now();
      if (now >= next_curve_point_s_) {
        result_.accuracy_curve.push_back({now, last_accuracy_});
        next_curve_point_s_ = now + 1.0;
      }
      if (progress_) progress_(spec_.name, now, last_accuracy_);
      if (last_accuracy_ >= config_.target_accuracy) {
        reached_ = true;
        result_.reached_target = true;
        result_.time_to_target_s = now;
        return;
      }
      ScheduleEval(k + 1);
    });
  }

  ProgressFn progress_;
  double get_sum_s_ = 0, push_sum_s_ = 0;
  int64_t get_count_ = 0, push_count_ = 0;
  absl::Status status_;
  bool reached_ = false;
  double last_accuracy_ = 0;
  int64_t evaluated_version_ = -1;
  double next_curve_point_s_ = 0;
};

// ---------------------------------------------------------------------------
// Vanilla asynchronous PS, pipelined like MLfabric-A: on completion a worker
// pushes its update (fair-sharing the server downlink, FIFO apply on arrival)
// and at once pulls the current model (fair-sharing the server uplink), then
// computes on it; max_outstanding_pushes bounds unresolved pushes per worker.
class AsyncPs final : public Harness {
 public:
  AsyncPs(const SimConfig& c, const SystemSpec& s, const ProgressFn& p)
      : Harness(c, s, /*ps=*/true, p),
        iteration_(c.workers, 0),
        outstanding_(c.workers, 0),
        held_get_(c.workers, false) {}

 private:
  absl::Status Start() override {
    const Snapshot initial = TakeSnapshot();
    for (int w = 0; w < config_.workers; ++w) OnModel(w, initial, 0);
    return absl::OkStatus();
  }
  int64_t InFlight() const override { return pushes_in_flight_; }

  void OnModel(int w, Snapshot model, int64_t version) {
    const int64_t it = iteration_[w]++;
    sim_.At(sim_.now() + ComputeTimeS(config_, w, it), [this, w, model, version, it] {
      auto grad = std::make_shared<Weights>(task_.Gradient(*model, w, it));
      ++result_.pushed;
      ++pushes_in_flight_;
      ++outstanding_[w];
      const double pushed_s = sim_.now();
      sim_.StartFlow(layout_.HostOf(w), layout_.server, model_bits(),
                     [this, w, grad, version, pushed_s] {
        NotePushApplied(pushed_s);
        --pushes_in_flight_;
        --outstanding_[w];
        SgdTask::Apply(*grad, -config_.sgd.lr / config_.workers, &server_model_);
        RecordDelay(server_version_ - version);
        ++server_version_;
        ++result_.applied;
        if (held_get_[w]) {
          held_get_[w] = false;
          Pull(w);
        }
      });
      const int bound = config_.max_outstanding_pushes;
      if (bound > 0 && outstanding_[w] >= bound) {
        held_get_[w] = true;
      } else {
        Pull(w);
      }
    });
  }

  // The server answers with the model as it is when the pull starts.
  void Pull(int w) {
    const Snapshot snap = TakeSnapshot();
    const int64_t v = server_version_;
    const double asked_s = sim_.now();
    sim_.StartFlow(layout_.server, layout_.HostOf(w), model_bits(), [this, w, snap, v, asked_s] {
      NoteGet(asked_s);
      OnModel(w, snap, v);
    });
  }

  std::vector<int64_t> iteration_;
  std::vector<int> outstanding_;
  std::vector<bool> held_get_;
  int64_t pushes_in_flight_ = 0;
};

// ---------------------------------------------------------------------------
// Synchronous all-reduce baselines (ring and binary tree).
class AllReduce final : public Harness {
 public:
  AllReduce(const SimConfig& c, const SystemSpec& s, const ProgressFn& p)
      : Harness(c, s, /*ps=*/false, p) {}

 private:
  absl::Status Start() override {
    StartRound();
    return absl::OkStatus();
  }
  int64_t InFlight() const override { return in_flight_; }

  void StartRound() {
    const int n = config_.workers;
    double slowest = 0;
    mean_.assign(server_model_.size(), 0.0);
    for (int w = 0; w < n; ++w) {
      slowest = std::max(slowest, ComputeTimeS(config_, w, round_));
      SgdTask::Apply(task_.Gradient(server_model_, w, round_), 1.0 / n, &mean_);
    }
    result_.pushed += n;
    in_flight_ = n;
    round_started_s_ = sim_.now();
    sim_.At(sim_.now() + slowest, [this] {
      if (spec_.kind == SystemKind::kRingSync) {
        RingStep(0);
      } else {
        TreeReduce();
      }
    });
  }

  void EndRound() {
    round_s_sum_ += sim_.now() - round_started_s_;
    result_.mean_round_s = round_s_sum_ / static_cast<double>(round_ + 1);
    SgdTask::Apply(mean_, -config_.sgd.lr, &server_model_);
    ++server_version_;
    result_.applied += config_.workers;
    in_flight_ = 0;
    RecordDelay(0);
    ++round_;
    StartRound();
  }

  void RingStep(int step) {
    const int n = config_.workers;
    if (step == 2 * (n - 1)) {
      EndRound();
      return;
    }
    step_remaining_ = n;
    for (int i = 0; i < n; ++i) {
      // Ranks are ordered by machine, so with 2 workers per machine half the
      // ring hops are intra-host and every NIC direction carries one flow.
      sim_.StartFlow(layout_.HostOf(i), layout_.HostOf((i + 1) % n), model_bits() / n,
                     [this, step] {
        if (--step_remaining_ == 0) RingStep(step + 1);
      });
    }
  }

  // Heap-numbered binary tree rooted at worker 0.
  void TreeReduce() {
    const int n = config_.workers;
    children_left_.assign(n, 0);
    for (int i = 1; i < n; ++i) ++children_left_[(i - 1) / 2];
    for (int i = 1; i < n; ++i) {
      if (children_left_[i] == 0) SendUp(i);
    }
  }
  void SendUp(int i) {
    const int parent = (i - 1) / 2;
    sim_.StartFlow(layout_.HostOf(i), layout_.HostOf(parent), model_bits(), [this, parent] {
      if (--children_left_[parent] > 0) return;
      if (parent == 0) {
        received_ = 0;
        SendDown(0);
      } else {
        SendUp(parent);
      }
    });
  }
  void SendDown(int i) {
    const int n = config_.workers;
    for (int c = 2 * i + 1; c <= 2 * i + 2 && c < n; ++c) {
      sim_.StartFlow(layout_.HostOf(i), layout_.HostOf(c), model_bits(), [this, c, n] {
        SendDown(c);
        if (++received_ == n - 1) EndRound();
      });
    }
  }

  int64_t round_ = 0;
  int64_t in_flight_ = 0;
  double round_started_s_ = 0;
  double round_s_sum_ = 0;
  int step_remaining_ = 0;
  int received_ = 0;
  std::vector<int> children_left_;
  Weights mean_;
};

// ---------------------------------------------------------------------------
// MLfabric-A / MLfabric-S: the real core planner, executed per plan.
class Mlfabric final : public Harness {
 public:
  Mlfabric(const SimConfig& c, const SystemSpec& s, const ProgressFn& p)
      : Harness(c, s, /*ps=*/true, p),
        sync_(s.kind == SystemKind::kMlfabricS),
        server_(layout_.server),
        hosts_(layout_.hosts),
        iteration_(c.workers, 0),
        outstanding_(c.workers, 0),
        held_get_(c.workers, false),
        get_asked_s_(c.workers, 0.0),
        reserved_(2 * hosts_) {
    // Worker machines "m<i>" (2 workers each by default), the server "s",
    // dedicated aggregators "a<i>" (only when not co-hosted with workers).
    for (int m = 0; m < layout_.machines; ++m) names_.push_back(absl::StrCat("m", m));
    names_.push_back("s");
    for (int h = layout_.machines + 1; h < hosts_; ++h) {
      names_.push_back(absl::StrCat("a", h - layout_.machines - 1));
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
  struct PendingAggregate {
    core::Transfer transfer;
    int needed = 0;
    int received = 0;
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
      if (!pending_push_.empty()) PlanPushes();
      if (!pending_get_.empty() && GetBatchDue()) PlanGets();
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

  std::vector<core::ProfilePoint> Residual(double capacity_bps, int link) const {
    const double now = sim_.now();
    const std::vector<core::RateSegment>& reserved = reserved_[link];
    std::set<double> times = {now};
    for (const core::RateSegment& s : reserved) {
      if (s.from_s > now) times.insert(s.from_s);
      times.insert(s.to_s);
    }
    std::vector<core::ProfilePoint> profile;
    for (double t : times) {
      double used = 0;
      for (const core::RateSegment& s : reserved) {
        if (s.from_s <= t && t < s.to_s) used += s.rate_bps;
      }
      const double rate = std::max(0.0, capacity_bps - used);
      if (!profile.empty() && profile.back().second == rate) continue;
      profile.push_back({t, rate});
    }
    return profile;
  }

  // The monitor reports the trace with a lag (§7: t_lag).
  core::HostLink HostView(int h) const {
    const double seen_s = std::max(0.0, sim_.now() - config_.monitor_lag_s);
    core::HostLink link;
    link.name = names_[h];
    link.uplink_bps = trace_.CapacityBps(h, true, seen_s);
    link.downlink_bps = trace_.CapacityBps(h, false, seen_s);
    if (!reserved_[2 * h].empty()) link.uplink_profile = Residual(link.uplink_bps, 2 * h);
    if (!reserved_[2 * h + 1].empty()) {
      link.downlink_profile = Residual(link.downlink_bps, 2 * h + 1);
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
  void PlanPushes() {
    core::Batch batch;
    batch.now_s = sim_.now();
    batch.mode = sync_ ? core::Mode::kSync : core::Mode::kAsync;
    batch.tau_max = tau_max();
    int64_t unapplied = 0;
    for (const auto& [id, u] : updates_) {
      if (u.state == State::kPlanned || u.state == State::kArrived) ++unapplied;
    }
    batch.v_init = server_version_ + (sync_ ? 0 : unapplied);
    batch.server = "s";
    batch.aggregators = aggregator_names_;
    batch.seed = MixSeed(config_.seed, 0x62617463ULL, static_cast<uint64_t>(batch_count_));
    std::set<int> involved = {server_};
    for (int h : layout_.aggregator_hosts) involved.insert(h);
    for (const std::string& id : pending_push_) {
      const Update& u = updates_.at(id);
      double norm = 0;
      for (double g : *u.grad) norm += g * g;
      const int host = layout_.HostOf(u.worker);
      batch.updates.push_back(
          {id, names_[host], config_.model_bytes, u.version, std::sqrt(norm), {}});
      involved.insert(host);
    }
    for (int h : involved) batch.hosts.push_back(HostView(h));
    const std::string prefix = absl::StrCat("b", batch_count_++, ":");
    pending_push_.clear();

    const auto started = WallClock::now();
    absl::StatusOr<core::Plan> plan = planner_->PlanBatch(batch);
    const double ms = std::chrono::duration<double, std::milli>(WallClock::now() - started).count();
    if (!plan.ok()) {
      Fail(absl::InternalError(absl::StrCat("planner failed at t=", batch.now_s, " s: ",
                                            plan.status().message())));
      return;
    }
    planner_ms_total_ += ms;
    result_.planner_ms_max = std::max(result_.planner_ms_max, ms);
    ++result_.planner_calls;
    batch_updates_total_ += static_cast<int64_t>(batch.updates.size());
    result_.planner_ms_mean = planner_ms_total_ / result_.planner_calls;
    result_.planner_mean_batch = static_cast<double>(batch_updates_total_) / result_.planner_calls;

    for (const core::Drop& d : plan->dropped) {
      Update& u = updates_.at(d.id);
      if (sync_) {
        Fail(absl::InternalError(absl::StrCat("sync plan dropped ", d.id, ": ", d.reason)));
        return;
      }
      u.state = State::kDropped;
      u.grad.reset();
      ++result_.dropped;
      ++result_.drop_reasons[d.reason];
      Resolved(u.worker);
    }
    std::vector<core::Commit> commits = plan->commits;
    std::sort(commits.begin(), commits.end(),
              [](const core::Commit& a, const core::Commit& b) { return a.position < b.position; });
    for (const core::Commit& c : commits) commit_queue_.push_back(c.update);
    std::set<std::string> planned;
    for (const core::Transfer& t : plan->transfers) {
      Reserve(t);
      if (t.kind != core::TransferKind::kAggregate) continue;
      const std::string key = prefix + t.update;
      PendingAggregate& agg = aggregates_[key];
      agg.transfer = t;
      for (const std::string& c : t.constituents) aggregate_of_[c] = key;
    }
    for (const core::Transfer& t : plan->transfers) {
      if (t.kind == core::TransferKind::kToAggregator) {
        ++aggregates_.at(aggregate_of_.at(t.update)).needed;
      }
    }
    for (const core::Transfer& t : plan->transfers) {
      switch (t.kind) {
        case core::TransferKind::kDirect: {
          planned.insert(t.update);
          const std::string id = t.update;
          StartPlanned(t, [this, id] { OnArrived({id}); });
          break;
        }
        case core::TransferKind::kToAggregator: {
          planned.insert(t.update);
          const std::string key = aggregate_of_.at(t.update);
          StartPlanned(t, [this, key] {
            PendingAggregate& agg = aggregates_.at(key);
            if (++agg.received == agg.needed) StartAggregate(key);
          });
          break;
        }
        case core::TransferKind::kAggregate:
          break;  // started when its constituents are in
        default:
          Fail(absl::InternalError("unexpected replica transfer without a replica"));
          return;
      }
    }
    for (const core::UpdateRequest& r : batch.updates) {
      Update& u = updates_.at(r.id);
      if (u.state == State::kDropped) continue;
      if (!planned.count(r.id)) {
        Fail(absl::InternalError(absl::StrCat("plan has neither a transfer nor a drop for ", r.id)));
        return;
      }
      u.state = State::kPlanned;
    }
  }

  void StartAggregate(const std::string& key) {
    const core::Transfer t = aggregates_.at(key).transfer;
    ++result_.aggregates;
    StartPlanned(t, [this, key] {
      const std::vector<std::string> ids = aggregates_.at(key).transfer.constituents;
      for (const std::string& id : ids) aggregate_of_.erase(id);
      aggregates_.erase(key);
      OnArrived(ids);
    });
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
    core::DistributionRequest request;
    request.now_s = sim_.now();
    request.server = "s";
    request.model_bytes = config_.model_bytes;
    request.distributors = distributor_names_;
    request.seed = MixSeed(config_.seed, 0x676574ULL, static_cast<uint64_t>(get_count_++));
    std::set<int> involved = {server_};
    for (int h : layout_.aggregator_hosts) involved.insert(h);
    // One copy per machine per get batch: the workers of a machine that ask
    // in the same batch share it (the second copy is intra-host).
    auto get = std::make_shared<GetBatch>();
    for (int w : pending_get_) {
      const int host = layout_.HostOf(w);
      if (get->waiting[host].empty()) request.requesters.push_back(names_[host]);
      get->waiting[host].push_back(w);
      involved.insert(host);
    }
    for (int h : involved) request.hosts.push_back(HostView(h));
    pending_get_.clear();
    absl::StatusOr<core::DistributionPlan> plan = core::PlanModelDistribution(request);
    if (plan.ok() && config_.get_deadline_slack > 0) {
      core::DistributionOptions spare;
      spare.deadline_s =
          request.now_s + config_.get_deadline_slack * (plan->total_s - request.now_s);
      plan = core::PlanModelDistribution(request, spare);
    }
    if (!plan.ok()) {
      Fail(absl::InternalError(absl::StrCat("model distribution failed at t=", request.now_s,
                                            " s: ", plan.status().message())));
      return;
    }
    // Transfers out of each distributor wait for its own copy.
    get->model = TakeSnapshot();
    get->version = server_version_;
    std::set<std::string> served;
    for (const core::Transfer& t : plan->transfers) {
      Reserve(t);
      if (t.src != "s") get->outgoing[t.src].push_back(t);
      served.insert(t.dst);
      if (t.src == "s") {
        ++result_.get_server_sends;
        for (const core::RateSegment& seg : t.segments) {
          server_sends_until_s_ = std::max(server_sends_until_s_, seg.to_s);
        }
      }
    }
    ++result_.get_batches;
    get_requesters_total_ += static_cast<int64_t>(request.requesters.size());
    result_.get_batch_mean_machines =
        static_cast<double>(get_requesters_total_) / result_.get_batches;
    for (const core::Transfer& t : plan->transfers) {
      if (t.src == "s") LaunchModelTransfer(t, get);
    }
    for (const auto& [host, workers] : get->waiting) {
      if (!served.count(names_[host])) {
        Fail(absl::InternalError(absl::StrCat("model distribution left ", names_[host], " out")));
        return;
      }
    }
  }

  // One batched model distribution in progress.
  struct GetBatch {
    Snapshot model;
    int64_t version = 0;
    std::map<std::string, std::vector<core::Transfer>> outgoing;  // by distributor
    std::map<int, std::vector<int>> waiting;  // machine -> its requesting workers
  };

  void LaunchModelTransfer(const core::Transfer& t, std::shared_ptr<GetBatch> get) {
    const int dst = index_.at(t.dst);
    const std::string dst_name = t.dst;
    StartPlanned(t, [this, dst, dst_name, get] {
      // A distributor that also asked is served by its own receipt.
      auto waiting = get->waiting.find(dst);
      if (waiting != get->waiting.end()) {
        for (int w : waiting->second) {
          if (!sync_) NoteGet(get_asked_s_[w]);
          OnModel(w, get->model, get->version);
        }
        get->waiting.erase(waiting);
      }
      auto it = get->outgoing.find(dst_name);
      if (it == get->outgoing.end()) return;
      for (const core::Transfer& next : it->second) LaunchModelTransfer(next, get);
    });
  }

  const bool sync_;
  const int server_;
  const int hosts_;
  std::vector<std::string> names_;
  std::vector<std::string> aggregator_names_;
  std::vector<std::string> distributor_names_;
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
  int64_t next_update_ = 0;
  int64_t batch_count_ = 0;
  int64_t get_count_ = 0;
  int64_t get_requesters_total_ = 0;
  double server_sends_until_s_ = 0;  // end of the server's planned model sends
  int arrived_in_round_ = 0;
  double planner_ms_total_ = 0;
  int64_t batch_updates_total_ = 0;
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
                                       const ProgressFn& progress) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Harness> harness;
  switch (spec.kind) {
    case SystemKind::kMlfabricA:
    case SystemKind::kMlfabricS:
      harness = std::make_unique<Mlfabric>(config, spec, progress);
      break;
    case SystemKind::kAsync:
      harness = std::make_unique<AsyncPs>(config, spec, progress);
      break;
    case SystemKind::kRingSync:
    case SystemKind::kTreeSync:
      harness = std::make_unique<AllReduce>(config, spec, progress);
      break;
  }
  return harness->Run();
}

}  // namespace mlfabric::sim
