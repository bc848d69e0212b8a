#include "scheduler/core/internal/random_batch.h"

#include <algorithm>
#include <string>

namespace mlfabric::core::internal {

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  int64_t Between(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // §7 network setting N2: {1, 2.5, 3.3, 5, 10} Gbit/s w.p. {0, .1, .1, .1, .7}
  // plus 1 Gbit/s stragglers w.p. .05 (taken from the 10 Gbit/s share).
  double NicRate() {
    const double x = Uniform();
    if (x < 0.05) return 1e9;
    if (x < 0.15) return 2.5e9;
    if (x < 0.25) return 3.3e9;
    if (x < 0.35) return 5e9;
    return 1e10;
  }

 private:
  uint64_t state_;
};

std::vector<ProfilePoint> RandomProfile(Rng& rng, double now_s) {
  std::vector<ProfilePoint> profile;
  double t = now_s - rng.Uniform();
  const int points = static_cast<int>(rng.Between(1, 4));
  for (int i = 0; i < points; ++i) {
    profile.push_back({t, rng.NicRate()});
    t += 0.05 + rng.Uniform() * 0.5;
  }
  return profile;
}

// Adds host `name` (a server: 10 Gbit/s each way; else N2 rates, with
// profiles or an outage when the options ask for them).
void AddHost(const RandomBatchOptions& options, const std::string& name, bool server, Rng& rng,
             Batch* batch) {
  HostLink host;
  host.name = name;
  host.uplink_bps = server ? 1e10 : rng.NicRate();
  host.downlink_bps = server ? 1e10 : rng.NicRate();
  if (options.profiles && !server) {
    host.uplink_profile = RandomProfile(rng, batch->now_s);
    host.downlink_profile = RandomProfile(rng, batch->now_s);
  }
  if (options.busy_points > 0) {
    for (const bool up : {true, false}) {
      std::vector<ProfilePoint>* profile = up ? &host.uplink_profile : &host.downlink_profile;
      const double capacity = up ? host.uplink_bps : host.downlink_bps;
      profile->clear();  // replaces `profiles`' (appended, the times would not increase)
      double t = batch->now_s;
      for (int i = 0; i < options.busy_points; ++i) {
        profile->push_back({t, capacity * (rng.Uniform() < 0.3 ? 0.0 : rng.Uniform())});
        t += 0.3 * rng.Uniform() / options.busy_points;
      }
      profile->push_back({t, capacity});
    }
  }
  if (options.outages && rng.Uniform() < 0.3) {
    std::vector<ProfilePoint>& profile =
        rng.Uniform() < 0.5 ? host.uplink_profile : host.downlink_profile;
    const double rate = rng.NicRate();
    const double down_at = batch->now_s + 0.05 * rng.Uniform();
    profile = {{batch->now_s - 1, rate}, {down_at, 0.0}};
    if (rng.Uniform() < 0.5) profile.push_back({down_at + rng.Uniform(), rate});
  }
  batch->hosts.push_back(std::move(host));
}

// The replica "r0", its aggregators, lead, punted pushes and bound.
void AddReplica(const RandomBatchOptions& options, int workers, Rng& rng, Batch* batch) {
  AddHost(options, "r0", true, rng, batch);
  ReplicaSpec replica;
  replica.host = "r0";
  for (int a = 0; a < options.replica_aggregators; ++a) {
    const std::string name = "ra" + std::to_string(a);
    AddHost(options, name, false, rng, batch);
    replica.aggregators.push_back(name);
  }
  replica.momentum = 0.9 * rng.Uniform();
  replica.history_norm = rng.Uniform();
  const int lead = static_cast<int>(rng.Between(0, 2));
  for (int i = 0; i < lead; ++i) replica.lead.push_back(rng.Uniform());
  const int pending = static_cast<int>(rng.Between(0, 3)) - 1;  // often none
  for (int i = 0; i < pending; ++i) {
    UpdateRequest u;
    u.id = "p" + std::to_string(i);
    u.worker = "w" + std::to_string(rng.Between(0, workers - 1));
    u.bytes = rng.Between(options.min_bytes, options.max_bytes);
    u.norm = 0.1 + rng.Uniform();
    replica.pending.push_back(std::move(u));
  }
  // Between "everything must be replicated" and "almost nothing".
  replica.divergence_bound = rng.Uniform() * 0.5 * options.updates;
  batch->replica = std::move(replica);
}

// The updates g0, g1, ... with their deadlines, norms and shards.
void AddUpdates(const RandomBatchOptions& options, int workers, Rng& rng, Batch* batch) {
  const int max_deadline = options.max_deadline > 0 ? options.max_deadline : 2 * options.updates;
  for (int i = 0; i < options.updates; ++i) {
    UpdateRequest u;
    u.id = "g" + std::to_string(i);
    u.worker = "w" + std::to_string(rng.Between(0, workers - 1));
    u.bytes = options.equal_shards ? options.max_bytes / (options.shards + 1)
                                   : rng.Between(options.min_bytes, options.max_bytes);
    const int64_t deadline = rng.Between(1, max_deadline);
    u.version = deadline + batch->v_init - batch->tau_max;
    u.norm = 0.1 + rng.Uniform();
    for (int j = 1; j <= options.shards; ++j) {
      u.shards.push_back({"s" + std::to_string(j),
                          options.equal_shards ? u.bytes
                                               : rng.Between(options.min_bytes, options.max_bytes)});
    }
    if (options.mixed_shards && !u.shards.empty()) {
      const double x = rng.Uniform();
      if (x < 0.2) {
        std::reverse(u.shards.begin(), u.shards.end());
      } else if (x < 0.35) {
        u.shards.pop_back();
      }
    }
    batch->updates.push_back(std::move(u));
  }
}

}  // namespace

Batch RandomBatch(const RandomBatchOptions& options) {
  Rng rng(options.seed * 0x2545F4914F6CDD1Dull + 7);
  Batch batch;
  batch.now_s = 10.0;
  batch.mode = options.sync ? Mode::kSync : Mode::kAsync;
  batch.tau_max = 2 * options.updates + 4;
  batch.v_init = 1000;
  batch.server = "s0";
  batch.seed = options.seed;
  AddHost(options, "s0", true, rng, &batch);
  for (int j = 1; j <= options.shards; ++j) {
    AddHost(options, "s" + std::to_string(j), true, rng, &batch);
  }
  const int workers = options.workers > 0 ? options.workers : std::max(1, options.updates / 2);
  for (int w = 0; w < workers; ++w) AddHost(options, "w" + std::to_string(w), false, rng, &batch);
  for (int a = 0; a < options.aggregators; ++a) {
    if (options.worker_aggregators) {
      batch.aggregators.push_back("w" + std::to_string(a % workers));
      continue;
    }
    const std::string name = "a" + std::to_string(a);
    AddHost(options, name, false, rng, &batch);
    batch.aggregators.push_back(name);
  }
  if (options.replica) AddReplica(options, workers, rng, &batch);
  AddUpdates(options, workers, rng, &batch);
  return batch;
}

}  // namespace mlfabric::core::internal
