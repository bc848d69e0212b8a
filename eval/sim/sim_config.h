// Configuration of the discrete-event simulator at scale (paper §7).
//
// One SimConfig describes one simulated cluster: N workers, 2 per machine,
// one parameter server, k aggregators co-hosted on worker machines (§7),
// the compute-straggler setting
// C1-C3 and the network-background setting N1-N3 of §7:
//
//   C1 (r, s) = (10%, 2)   C2 (10%, 4)   C3 (4%, 2)
//     each iteration a worker is slowed down by factor s with probability r;
//   N1 p = (0, 0, 0, 0.1, 0.9)   N2 (0, 0.1, 0.1, 0.1, 0.7)   N3 (0.5, 0, 0, 0, 0.5)
//     every T = 5 s every host NIC direction independently takes a rate from
//     {1, 2.5, 3.3, 5, 10} Gbit/s with these probabilities.
//
//   SimConfig config;                       // the paper's C1-N1, 30 workers
//   config.compute = ComputeSettingByName("C2").value();
//
// Transfer sizes and compute times are those of ResNet-50 (100 MB update,
// 100 ms compute, 10 Gbit/s NICs) at full scale: the simulator is fluid, so
// nothing needs to be scaled down. The learning problem is a small real one
// (see sgd_task.h). All randomness derives from `seed`.
#ifndef MLFABRIC_EVAL_SIM_SIM_CONFIG_H_
#define MLFABRIC_EVAL_SIM_SIM_CONFIG_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::sim {

// The NIC rates of §7, in Gbit/s.
inline constexpr std::array<double, 5> kRatesGbps = {1, 2.5, 3.3, 5, 10};

struct ComputeSetting {
  std::string name = "C1";
  double straggler_probability = 0.10;  // r
  double slowdown = 2;                  // s
};

struct NetworkSetting {
  std::string name = "N1";
  std::array<double, 5> probabilities = {0, 0, 0, 0.1, 0.9};  // over kRatesGbps
};

// C1, C2, C3 (§7) and "C0" (no stragglers, for tests); else InvalidArgument.
absl::StatusOr<ComputeSetting> ComputeSettingByName(const std::string& name);
// N1, N2, N3 (§7) and "N0" (every NIC at 10 Gbit/s, for tests).
absl::StatusOr<NetworkSetting> NetworkSettingByName(const std::string& name);

// The small real learning problem whose accuracy defines time to accuracy.
struct SgdConfig {
  int features = 32;
  int classes = 10;
  int batch = 32;              // samples per worker gradient (paper: 32 per worker)
  int test_samples = 2000;
  double class_separation = 0.5;  // std of the class means; sets the Bayes accuracy
  double conditioning = 30;       // ratio of the largest to the smallest feature scale
  // Step size for one synchronous step with the mean of N gradients. An
  // asynchronous server applies each gradient with lr / N, so N applied
  // gradients move the model as far as one synchronous step (linear scaling).
  double lr = 0.3;
};

struct SimConfig {
  int workers = 30;
  ComputeSetting compute;
  NetworkSetting network;
  double trace_period_s = 5;        // T of §7
  // §7: "server ... hosted on a dedicated machine with 10Gbps bandwidth":
  // by default the server NIC does not follow the N-traces.
  bool server_follows_trace = false;
  double server_bps = 10e9;
  // Parameter-server shards (§10.2): the model is split
  // into `servers` byte ranges of (nearly) equal size, each held by its own
  // server on its own dedicated host and NIC (server_bps each). MLfabric-A/S
  // push every update as that many parts, planned together by the core
  // (which may aggregate them: an aggregator then sends each shard one
  // aggregate of its part), apply an update once all its parts are in
  // (the same commit order at every shard), and get the model as one
  // distribution per shard (a worker has it when every part is in; the
  // parts are of one version). The vanilla async PS and the all-reduce
  // baselines ignore it (one server; none).
  int servers = 1;
  int64_t model_bytes = 100'000'000;  // ResNet-50 (§7.1)
  double compute_s = 0.100;           // one iteration on a P100 at batch 32
  double batch_interval_s = 0.100;    // §7: "We batch requests ... every 100ms"
  double monitor_lag_s = 0.2;         // §7: t_lag
  int64_t tau_max = 30;               // MLfabric-A delay bound (§7.1: 30, 60)
  // §7: "30 workers in a cluster of 15 baremetal machines ... (2 cards/
  // physical machine)": workers w and w+1 (w even) share one machine and its
  // NIC. Transfers between two workers of one machine (ring/tree hops) do
  // not touch the NIC; they take bits / intra_host_bps.
  int workers_per_host = 2;
  double intra_host_bps = 80e9;       // ~PCIe 3.0 x16 between the two GPUs
  // Aggregators / model distributors (k of §5.2, k° of §10.3). §7: "The
  // aggregators are co-hosted with worker clients": with
  // aggregators_on_workers (default) the k aggregators are the first k
  // worker machines (-1: every worker machine; the paper does not state k);
  // otherwise k extra idle hosts (the old simulator's setting).
  int aggregators = -1;
  bool aggregators_on_workers = true;
  // Model distributors (k° of §10.3, which the paper keeps apart from the
  // k aggregators of §5.2): the first `distributors` aggregator hosts; -1:
  // all of them; 0: none, every model copy leaves the server directly.
  int distributors = -1;
  // Asynchronous workers (MLfabric-A and vanilla async PS) are pipelined: a
  // worker pushes its update (push returns at once) and immediately gets the
  // freshest model, then computes again. At most max_outstanding_pushes of its
  // updates may be pushed and neither applied nor dropped; when the bound is
  // reached the worker holds its get until one resolves. 0: unbounded.
  // Default 2: one update in flight while the next is computed (1 would be
  // the old, unpipelined behaviour). The paper states no bound; unbounded
  // only queues more updates that go stale and are dropped (docs/results.md).
  int max_outstanding_pushes = 2;
  // When MLfabric-A/-S plan a batch of model gets (§10.3). kServer (default):
  // "At the server, requests are batched and responded with same version of
  // model": requests wait at the server while its uplink is still sending
  // the previous distribution, and all that waited form one batch, planned at
  // the first 100 ms tick at which the previous batch's server sends end
  // within one interval (the next batch queues right behind them). The model
  // is the server's model at that tick. kTick (the earlier simulator): every
  // tick's new requests are planned at once, even when the server uplink is
  // already reserved seconds ahead, so each small batch gets its own server
  // sends and its answer is the model as of planning, seconds before it
  // leaves the server.
  enum class GetBatching { kServer, kTick };
  GetBatching get_batching = GetBatching::kServer;
  // > 0: each get batch may finish this many times later than the per-batch
  // optimum if that spends fewer server copies (core DistributionOptions::
  // deadline_s); 0 keeps the per-batch objective.
  double get_deadline_slack = 0;
  // MLfabric-A/S update batches may go through streaming chains
  // (core/aggregation.h) besides Alg. 3; false: Alg. 3 alone.
  bool streaming_aggregation = true;
  // MLfabric-A/S: false (default) charges each push batch's planning time to
  // simulated time, as the live scheduler pays it (mlfabric §7.4: the
  // scheduler's overhead): the plan takes effect at the batch's cut plus the
  // planner's time, and the planner plans one batch at a time, so no batch
  // is cut while the last one is being planned. true: every plan takes
  // effect at its cut (the earlier simulator), which leaves the scheduler's
  // own cost out of the figures. The planning time is measured either way.
  bool instant_planning = false;
  // With planning charged, a batch is planned for its cut plus this lead
  // (scheduler/service/plan_lead.h), as the live scheduler's plan_lead_ms:
  // < 0 estimates it from the last batches' planning times; 0 plans for
  // the cut (the live default). Not used with instant_planning.
  double plan_lead_ms = 0;
  uint64_t seed = 1;
  double max_sim_s = 600;
  double target_accuracy = 0.70;
  double eval_interval_s = 0.05;      // test accuracy sampled on this grid
  SgdConfig sgd;
};

// Checks ranges and cross-field constraints; the error names the field.
absl::Status ValidateConfig(const SimConfig& config);

// Host layout shared by every system: worker machines 0..machines-1 (worker w
// on machine w / workers_per_host), then the server hosts (PS systems; one
// per shard), then dedicated aggregator hosts when !aggregators_on_workers.
struct HostLayout {
  int machines = 0;
  int server = 0;       // host index of the parameter server (the first shard's)
  int servers = 1;      // shards, on hosts server .. server + servers - 1
  int aggregators = 0;  // k, resolved (-1 -> machines)
  std::vector<int> aggregator_hosts;
  int hosts = 0;        // total hosts, server and dedicated aggregators included
  int workers_per_host = 1;
  int HostOf(int worker) const { return worker / workers_per_host; }
};
HostLayout MakeLayout(const SimConfig& config);

// Deterministic 64-bit mixing (splitmix64) of a seed and up to four keys; the
// one source of randomness in the simulator, so that every system sees the
// same network trace and the same stragglers for a seed.
uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0);
// A double in [0, 1) from MixSeed's output.
double UnitFromBits(uint64_t bits);

// The N-trace: capacity of host `host`'s uplink (`up`) or downlink at time
// `t_s`, constant over each period [kT, (k+1)T).
class NetworkTrace {
 public:
  // Hosts server_host .. server_host + config.servers - 1 are servers
  // (server_host -1: none).
  NetworkTrace(const SimConfig& config, int server_host);
  double CapacityBps(int host, bool up, double t_s) const;
  // The first period boundary strictly after t_s.
  double NextChangeS(double t_s) const;

 private:
  NetworkSetting setting_;
  double period_s_;
  uint64_t seed_;
  int server_host_;
  int servers_;
  bool server_follows_trace_;
  double server_bps_;
};

// The C-setting: compute time of `worker`'s `iteration`-th gradient.
double ComputeTimeS(const SimConfig& config, int worker, int64_t iteration);

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_SIM_CONFIG_H_
