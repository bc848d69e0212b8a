// The simulator kernel: a discrete-event loop over a fluid network model.
//
// Hosts have an uplink and a downlink whose capacities follow a
// NetworkTrace (congestion-free core, §7.4, as the scheduler assumes). A flow
// goes from a source host's uplink to a destination host's downlink and
// carries a number of bits. Between events every rate is constant, so the
// loop jumps from event to event exactly (no time step):
//
//  * a *reserved* flow (MLfabric) follows the rate segments its plan reserved;
//    when the links' actual capacity is below the sum of reservations (the
//    trace changed after planning, or the monitor lags) every reserved flow on
//    the link is slowed by the same factor; when its segments are over and
//    bits remain, it continues as a best-effort flow;
//  * *best-effort* flows (vanilla async PS, all-reduce, late reserved flows)
//    share what reserved flows leave max-min fairly (progressive filling).
//
// So the sum of rates on a link never exceeds its capacity; the largest
// load/capacity ratio seen is kept in stats() for tests to check.
//
//   FluidSim sim(hosts, &trace);
//   sim.At(0.5, [&] { sim.StartFlow(0, 3, 8e8, [&] { ... arrived ... }); });
//   sim.Run([&] { return done; }, 600.0);
//
// Deterministic: events at equal times run in scheduling order, flows that
// finish at the same instant complete in creation order.
// Thread safety: none (one simulation, one thread).
#ifndef MLFABRIC_EVAL_SIM_FLUID_SIM_H_
#define MLFABRIC_EVAL_SIM_FLUID_SIM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <vector>

#include "eval/sim/sim_config.h"
#include "scheduler/core/types.h"

namespace mlfabric::sim {

struct FluidStats {
  int64_t events = 0;
  int64_t flows_started = 0;
  int64_t intra_host_copies = 0;  // src == dst transfers (no NIC)
  int64_t flows_completed = 0;
  int64_t rate_recomputations = 0;
  // max over links and instants of (sum of flow rates) / capacity.
  double max_link_load = 0;
  // Reserved flows that needed a best-effort tail (plan outran by the trace).
  int64_t reserved_flows_late = 0;
  double bits_delivered = 0;
};

class FluidSim {
 public:
  using Callback = std::function<void()>;

  FluidSim(int hosts, const NetworkTrace* trace);

  double now() const { return now_s_; }
  int hosts() const { return hosts_; }

  // Runs `callback` at time `t_s` (>= now).
  void At(double t_s, Callback callback);
  // Transfers whose source and destination are the same host (two workers
  // of one machine) bypass the NIC: they take bits / intra_host_bps and
  // touch no link. Default: infinite (instant).
  void set_intra_host_bps(double bps) { intra_host_bps_ = bps; }

  // Starts a best-effort flow now; `on_done` runs when its last bit arrives.
  void StartFlow(int src, int dst, double bits, Callback on_done);
  // Starts a flow that follows `segments` (absolute times) from now on.
  void StartReservedFlow(int src, int dst, double bits, std::vector<core::RateSegment> segments,
                         Callback on_done);

  // Advances until `stop()` returns true (checked after every event) or the
  // time reaches `until_s`. Returns the time reached.
  double Run(const std::function<bool()>& stop, double until_s);

  // Actual capacity of a link now (the trace; no lag).
  double CapacityBps(int host, bool up, double t_s) const {
    return trace_->CapacityBps(host, up, t_s);
  }
  int active_flows() const { return static_cast<int>(flows_.size()); }
  const FluidStats& stats() const { return stats_; }

 private:
  struct Flow {
    int64_t id = 0;
    int up_link = 0;    // 2 * src
    int down_link = 0;  // 2 * dst + 1
    double remaining_bits = 0;
    std::vector<core::RateSegment> segments;  // empty: best effort
    bool reserved = false;
    double rate_bps = 0;
    Callback on_done;
  };
  struct Event {
    double t_s;
    int64_t seq;
    Callback callback;
  };
  struct EventLater {
    bool operator()(const Event& a, const Event& b) const {
      return a.t_s != b.t_s ? a.t_s > b.t_s : a.seq > b.seq;
    }
  };

  void AddFlow(Flow flow);
  void RecomputeRates();
  // RecomputeRates' steps, over the links' `capacity` now. Rates the
  // reserved flows (their plan, scaled down on overbooked links) and
  // returns what they leave of each link.
  std::vector<double> RateReservedFlows(const std::vector<double>& capacity);
  // Shares the `residual` capacity max-min fairly among best-effort flows.
  void ShareFairly(std::vector<double> residual);
  // Updates stats_.max_link_load with the links' load under the new rates.
  void NoteLinkLoad(const std::vector<double>& capacity);
  // Time of the next rate change of the current flow set (completion,
  // segment boundary, trace period), assuming rates stay as computed.
  double NextFlowChangeS() const;
  void Advance(double t_s);

  // True (and `on_done` scheduled) when src == dst: an intra-host copy.
  bool IntraHost(int src, int dst, double bits, Callback& on_done);

  int hosts_;
  const NetworkTrace* trace_;
  double intra_host_bps_ = 0;  // 0: instant
  double now_s_ = 0;
  int64_t next_seq_ = 0;
  int64_t next_flow_id_ = 0;
  bool dirty_ = true;
  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  std::map<int64_t, Flow> flows_;  // by id: creation order
  FluidStats stats_;
};

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_FLUID_SIM_H_
