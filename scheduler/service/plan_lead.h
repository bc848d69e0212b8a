// The plan lead: how far after its cut a batch is planned for.
//
// A batch's plan takes effect when its commands are queued for the
// daemons, the planner's time after the cut (mlfabric §7.4 measures that
// overhead per batch). Planned for the moment of the cut, every transfer
// the plan starts at once would start that much late, on what is left of
// its rate segments, while the next batch already counts those links as
// free again. So the batch is planned for the cut plus a lead: by default
// the longest of the last 20 cycles' times from cut to commands queued (an
// estimate of this cycle's, which is not known until it ends). A plan ready
// early leaves its links idle until the lead has passed; one ready late
// starts late by less. The longest, not a lower quantile: in the simulator
// (32 workers, 4 shards, plans of 0.2-1 ms) the 90th percentile gave 1.19-1.38
// rounds/s, the longest 1.38-1.43, a fixed lead above every plan 1.51 and
// instant planning 1.53.
//
//   PlanLead lead(PlanLead::kAuto, /*max_s=*/1.0);
//   const double plan_s = now_s + lead.LeadS();   // the batch's now_s
//   ... plan, dispatch ...
//   lead.Record(clock.NowSeconds() - now_s);
//
// Pure; the live scheduler and the simulator (eval/sim) share it.
// Thread safety: none; its owner serialises calls.
#ifndef MLFABRIC_SCHEDULER_SERVICE_PLAN_LEAD_H_
#define MLFABRIC_SCHEDULER_SERVICE_PLAN_LEAD_H_

#include <cstddef>
#include <deque>

namespace mlfabric {

class PlanLead {
 public:
  static constexpr double kAuto = -1;
  static constexpr size_t kWindow = 20;

  // `fixed_s` >= 0 leads every batch by that (0: plan for the cut, the
  // paper's); kAuto estimates it from Record, never beyond `max_s`.
  explicit PlanLead(double fixed_s = kAuto, double max_s = 1.0);

  // The lead for the next batch, in seconds: 0 until a cycle is recorded.
  double LeadS() const;
  // One cycle's time from its cut to its commands queued (seconds;
  // negative or non-finite values count as 0).
  void Record(double cycle_s);

  bool automatic() const { return fixed_s_ < 0; }

 private:
  double fixed_s_;
  double max_s_;
  std::deque<double> recent_;  // the last kWindow cycles, oldest first
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_PLAN_LEAD_H_
