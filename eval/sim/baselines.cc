// The simulated baselines (§7): a vanilla asynchronous parameter server and
// synchronous ring (RR-Sync) and tree (Tr-Sync) all-reduce, on the common
// harness.
#include <algorithm>
#include <memory>

#include "eval/sim/harness.h"

namespace mlfabric::sim::internal {
namespace {

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

}  // namespace

std::unique_ptr<Harness> MakeAsyncPs(const SimConfig& config, const SystemSpec& spec,
                                     const ProgressFn& progress) {
  return std::make_unique<AsyncPs>(config, spec, progress);
}

std::unique_ptr<Harness> MakeAllReduce(const SimConfig& config, const SystemSpec& spec,
                                       const ProgressFn& progress) {
  return std::make_unique<AllReduce>(config, spec, progress);
}

}  // namespace mlfabric::sim::internal
