#include "scheduler/service/admin_history.h"

#include <algorithm>
#include <utility>

namespace mlfabric {
namespace {

template <typename T>
void PushBounded(std::deque<T>* queue, T value, size_t limit) {
  queue->push_back(std::move(value));
  while (queue->size() > limit) queue->pop_front();
}

}  // namespace

AdminHistory::AdminHistory(int64_t max_batches)
    : max_batches_(static_cast<size_t>(std::max<int64_t>(0, max_batches))) {
  delay_histogram_.bounds = {0, 1, 2, 4, 8, 16, 32, 64, 128};
  delay_histogram_.counts.assign(delay_histogram_.bounds.size() + 1, 0);
}

void AdminHistory::RecordBatch(BatchView batch) {
  PushBounded(&recent_batches_, std::move(batch), max_batches_);
}

void AdminHistory::RecordDrop(DropView drop) {
  ++drops_by_category_[drop.category];
  PushBounded(&recent_drops_, std::move(drop), kRecentDrops);
}

void AdminHistory::RecordDelay(const DelayView& delay) {
  PushBounded(&recent_delays_, delay, kRecentDelays);
  DelayHistogram& h = delay_histogram_;
  const size_t bucket =
      std::lower_bound(h.bounds.begin(), h.bounds.end(), delay.delay) - h.bounds.begin();
  ++h.counts[bucket];
  ++h.total;
  h.sum += delay.delay;
  if (delay.planned_s > 0) {
    PushPhases& p = push_phases_[delay.job];
    ++p.count;
    p.latency_s += delay.latency_s;
    p.queued_s += delay.queued_s;
    p.planned_s += delay.planned_s;
    p.late_s += delay.late_s;
  }
}

bool AdminHistory::LinkSampleDue(double now_s) {
  if (now_s - last_link_sample_s_ < kLinkSamplePeriodS) return false;
  last_link_sample_s_ = now_s;
  return true;
}

void AdminHistory::RecordLinkSample(LinkSample sample) {
  PushBounded(&link_samples_, std::move(sample), kLinkSamples);
}

void AdminHistory::RecordCycle(const CycleView& cycle) {
  PushBounded(&recent_cycles_, cycle, kRecentCycles);
}

void AdminHistory::CopyInto(ClusterSnapshot* snap) const {
  snap->recent_batches.assign(recent_batches_.begin(), recent_batches_.end());
  snap->recent_drops.assign(recent_drops_.begin(), recent_drops_.end());
  snap->drops_by_category = drops_by_category_;
  snap->recent_delays.assign(recent_delays_.begin(), recent_delays_.end());
  snap->delay_histogram = delay_histogram_;
  snap->push_phases = push_phases_;
  snap->link_samples.assign(link_samples_.begin(), link_samples_.end());
  CopyCyclesInto(snap);
}

void AdminHistory::CopyCyclesInto(ClusterSnapshot* snap) const {
  snap->recent_cycles.assign(recent_cycles_.begin(), recent_cycles_.end());
}

}  // namespace mlfabric
