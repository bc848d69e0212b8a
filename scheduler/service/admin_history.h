// AdminHistory: what the scheduler remembers only to show it (the admin
// endpoint, scheduler/admin): recent batches, drops and delays, the delay
// histogram and periodic link-use samples, each bounded so that a long run
// keeps a flat memory footprint. Nothing here feeds back into planning.
//
//   history.RecordDrop(view);                   // from the outcome state machine
//   if (history.LinkSampleDue(now_s)) history.RecordLinkSample(sample);
//   history.CopyInto(&snapshot);                // for ClusterSnapshot
//
// Thread safety: none; the scheduler service calls it under its lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_ADMIN_HISTORY_H_
#define MLFABRIC_SCHEDULER_SERVICE_ADMIN_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "scheduler/service/snapshot.h"

namespace mlfabric {

class AdminHistory {
 public:
  static constexpr size_t kRecentDrops = 200;
  static constexpr size_t kRecentDelays = 1000;
  static constexpr size_t kLinkSamples = 240;
  static constexpr double kLinkSamplePeriodS = 0.25;
  // About 100 s of cycles at the default 100 ms interval.
  static constexpr size_t kRecentCycles = 1024;

  // Keeps the last `max_batches` batches (SchedulerConfig::history_batches).
  explicit AdminHistory(int64_t max_batches);

  void RecordBatch(BatchView batch);
  // Counts the drop under its category (all time) and keeps it among the recent.
  void RecordDrop(DropView drop);
  // Keeps the delay among the recent, adds it to the histogram and, if it
  // was planned, its parts to its job's PushPhases.
  void RecordDelay(const DelayView& delay);
  // True (and the sample clock advanced) when a link sample is due at `now_s`.
  bool LinkSampleDue(double now_s);
  void RecordLinkSample(LinkSample sample);
  void RecordCycle(const CycleView& cycle);

  // Fills the snapshot's history fields (recent_*, drops_by_category,
  // delay_histogram, push_phases, link_samples, recent_cycles).
  void CopyInto(ClusterSnapshot* snap) const;
  // recent_cycles only.
  void CopyCyclesInto(ClusterSnapshot* snap) const;

 private:
  const size_t max_batches_;
  std::deque<BatchView> recent_batches_;
  std::deque<DropView> recent_drops_;
  std::map<std::string, int64_t> drops_by_category_;
  std::deque<DelayView> recent_delays_;
  DelayHistogram delay_histogram_;
  std::map<std::string, PushPhases> push_phases_;
  std::deque<LinkSample> link_samples_;
  std::deque<CycleView> recent_cycles_;
  double last_link_sample_s_ = -1e300;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_ADMIN_HISTORY_H_
