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
// Cost: an event costs what it changes, not what is in flight. A flow's
// bits are kept as (bits at t_ref, rate) and settled only when its rate
// changes; each flow's next change (last bit, segment boundary) sits in a
// heap; a recomputation re-rates only the reserved flows whose segment
// changed or whose link's overbooking factor changed, and re-shares the
// best-effort flows only when their set or the capacity left to them
// changed. A trace period re-reads every link. At 1000 workers on 96
// shards (~10^5 flows in flight) this is what makes a simulated second
// take seconds rather than minutes.
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
#include <queue>
#include <utility>
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
  int active_flows() const { return live_flows_; }
  const FluidStats& stats() const { return stats_; }

 private:
  struct Flow {
    int64_t id = -1;    // creation order; -1: a free slot
    int up_link = 0;    // 2 * src
    int down_link = 0;  // 2 * dst + 1
    // Bits left at t_ref_s; the rate has been constant since then.
    double bits_at_ref = 0;
    double t_ref_s = 0;
    double rate_bps = 0;
    // Reserved: its plan's segments (by start time), the first one not yet
    // over, and the plan's rate now (before any overbooking factor).
    std::vector<core::RateSegment> segments;
    size_t segment = 0;
    double planned_bps = 0;
    bool reserved = false;
    // Positions in the lists of its two links: reserved_on_ (reserved) or
    // best_effort_on_ (best effort).
    int pos_up = -1;
    int pos_down = -1;
    int64_t version = 0;  // heap entries of older versions are stale
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
  // A flow's next change: its last bit or a segment boundary.
  struct Change {
    double t_s;
    int64_t id;
    int slot;
    int64_t version;
  };
  struct ChangeLater {
    bool operator()(const Change& a, const Change& b) const {
      return a.t_s != b.t_s ? a.t_s > b.t_s : a.id > b.id;
    }
  };

  void AddFlow(Flow flow);
  void RemoveFlow(int slot);
  void RecomputeRates();
  // Re-reads every link's capacity from the trace (a new period).
  void RefreshCapacities();
  // Moves a reserved flow to the segment of now; a flow whose plan is over
  // with bits left becomes best effort.
  void Retime(int slot);
  // Rates the flow at `rate_bps` from now (settling its bits first).
  void SetRate(int slot, double rate_bps);
  // Shares what reserved flows leave of each link max-min fairly among the
  // best-effort flows.
  void ShareFairly();
  // Updates stats_.max_link_load over the links whose load changed.
  void NoteLinkLoad();
  // Bits the flow has left now.
  double Remaining(const Flow& f) const;
  // Counts the flow's bits moved since t_ref_s as delivered; t_ref_s = now.
  void Settle(Flow& f);
  // Puts the flow's next change in the heap (older entries become stale).
  void Schedule(int slot);
  double NextChangeOf(const Flow& f) const;
  // Time of the next flow change or trace period, or infinity.
  double NextFlowChangeS();
  // reserved_sum_[link] += delta; best-effort flows there are re-shared.
  void AddReserved(int link, double delta_bps);
  void Touch(int link);
  void MarkLoad(int link);
  // Removes the flow at `pos` of `link`'s list (swap with the last).
  void Unlist(std::vector<int>& list, int pos, int link);
  // Puts a flow on its links' best-effort lists.
  void ListBestEffort(int slot);
  bool Stale(const Change& c) const;

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

  std::vector<Flow> flows_;  // by slot
  std::vector<int> free_slots_;
  int live_flows_ = 0;
  std::priority_queue<Change, std::vector<Change>, ChangeLater> changes_;

  // Per link (2 * host: uplink, 2 * host + 1: downlink).
  std::vector<double> capacity_;       // the trace's, read at the last period start
  double capacity_until_s_ = -1;       // the trace's next period (re-read then)
  std::vector<double> planned_sum_;    // Σ planned_bps of its reserved flows
  std::vector<double> scale_;          // ≤ 1: capacity / planned_sum when overbooked
  std::vector<double> reserved_sum_;   // Σ rate_bps of its reserved flows
  std::vector<double> best_effort_sum_;
  std::vector<std::vector<int>> reserved_on_;     // slots
  std::vector<std::vector<int>> best_effort_on_;  // slots

  // Work for the next RecomputeRates.
  std::vector<int> retime_;         // reserved flows started or at a boundary
  std::vector<int> touched_;        // links whose reserved set or plans changed
  std::vector<char> is_touched_;
  bool best_effort_dirty_ = false;
  std::vector<int> load_changed_;   // links whose load changed (NoteLinkLoad)
  std::vector<char> is_load_changed_;

  // Links by key, smallest first (ties: lower link), with keys that change
  // in place: ShareFairly's links by fair share.
  class LinkHeap {
   public:
    void Reset(int links);
    bool empty() const { return heap_.empty(); }
    void Push(int link, double key);
    std::pair<int, double> Pop();  // (link, key)
    void Update(int link, double key);  // no-op unless the link is in
    void Remove(int link);              // no-op unless the link is in

   private:
    bool Before(int a, int b) const;
    void Up(int i);
    void Down(int i);
    std::vector<int> heap_;
    std::vector<int> at_;  // by link: index in heap_, -1: not in
    std::vector<double> key_;
  };

  // ShareFairly's working space.
  std::vector<double> scratch_residual_;
  std::vector<int> scratch_unfrozen_;
  std::vector<double> scratch_share_;
  std::vector<int> scratch_raised_;
  LinkHeap scratch_heap_;

  FluidStats stats_;
};

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_FLUID_SIM_H_
