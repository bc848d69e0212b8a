#include "eval/sim/fluid_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace mlfabric::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Time resolution: boundaries closer than this to now count as reached.
constexpr double kTimeEpsS = 1e-12;

}  // namespace

void FluidSim::LinkHeap::Reset(int links) {
  heap_.clear();
  at_.assign(links, -1);
  key_.resize(links);
}

void FluidSim::LinkHeap::Push(int link, double key) {
  key_[link] = key;
  at_[link] = static_cast<int>(heap_.size());
  heap_.push_back(link);
  Up(at_[link]);
}

std::pair<int, double> FluidSim::LinkHeap::Pop() {
  const int top = heap_.front();
  Remove(top);
  return {top, key_[top]};
}

void FluidSim::LinkHeap::Update(int link, double key) {
  if (at_[link] < 0) return;
  key_[link] = key;
  Up(at_[link]);
  Down(at_[link]);
}

void FluidSim::LinkHeap::Remove(int link) {
  const int i = at_[link];
  if (i < 0) return;
  const int last = heap_.back();
  heap_.pop_back();
  at_[link] = -1;
  if (last == link) return;
  heap_[i] = last;
  at_[last] = i;
  Up(i);
  Down(at_[last]);
}

bool FluidSim::LinkHeap::Before(int a, int b) const {
  return key_[a] != key_[b] ? key_[a] < key_[b] : a < b;
}

void FluidSim::LinkHeap::Up(int i) {
  while (i > 0) {
    const int parent = (i - 1) / 2;
    if (!Before(heap_[i], heap_[parent])) break;
    std::swap(heap_[i], heap_[parent]);
    at_[heap_[i]] = i;
    at_[heap_[parent]] = parent;
    i = parent;
  }
}

void FluidSim::LinkHeap::Down(int i) {
  const int n = static_cast<int>(heap_.size());
  while (true) {
    int best = i;
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < n; ++child) {
      if (Before(heap_[child], heap_[best])) best = child;
    }
    if (best == i) break;
    std::swap(heap_[i], heap_[best]);
    at_[heap_[i]] = i;
    at_[heap_[best]] = best;
    i = best;
  }
}

FluidSim::FluidSim(int hosts, const NetworkTrace* trace)
    : hosts_(hosts),
      trace_(trace),
      capacity_(2 * hosts, 0),
      planned_sum_(2 * hosts, 0),
      scale_(2 * hosts, 1),
      reserved_sum_(2 * hosts, 0),
      best_effort_sum_(2 * hosts, 0),
      reserved_on_(2 * hosts),
      best_effort_on_(2 * hosts),
      is_touched_(2 * hosts, 0),
      is_load_changed_(2 * hosts, 0) {}

void FluidSim::At(double t_s, Callback callback) {
  events_.push(Event{std::max(t_s, now_s_), next_seq_++, std::move(callback)});
}

bool FluidSim::IntraHost(int src, int dst, double bits, Callback& on_done) {
  if (src != dst) return false;
  ++stats_.intra_host_copies;
  const double dt = intra_host_bps_ > 0 ? bits / intra_host_bps_ : 0;
  At(now_s_ + dt, [cb = std::move(on_done)] {
    if (cb) cb();
  });
  return true;
}

void FluidSim::StartFlow(int src, int dst, double bits, Callback on_done) {
  if (IntraHost(src, dst, bits, on_done)) return;
  Flow flow;
  flow.up_link = 2 * src;
  flow.down_link = 2 * dst + 1;
  flow.bits_at_ref = bits;
  flow.on_done = std::move(on_done);
  AddFlow(std::move(flow));
}

void FluidSim::StartReservedFlow(int src, int dst, double bits,
                                 std::vector<core::RateSegment> segments, Callback on_done) {
  if (IntraHost(src, dst, bits, on_done)) return;
  Flow flow;
  flow.up_link = 2 * src;
  flow.down_link = 2 * dst + 1;
  flow.bits_at_ref = bits;
  // A plan's segments do not overlap; the cursor needs them by start time.
  std::stable_sort(segments.begin(), segments.end(),
                   [](const core::RateSegment& a, const core::RateSegment& b) {
                     return a.from_s < b.from_s;
                   });
  flow.segments = std::move(segments);
  flow.reserved = !flow.segments.empty();
  flow.on_done = std::move(on_done);
  AddFlow(std::move(flow));
}

void FluidSim::AddFlow(Flow flow) {
  flow.id = next_flow_id_++;
  flow.t_ref_s = now_s_;
  ++stats_.flows_started;
  int slot;
  if (free_slots_.empty()) {
    slot = static_cast<int>(flows_.size());
    flows_.push_back(Flow{});
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  flow.version = flows_[slot].version + 1;
  flows_[slot] = std::move(flow);
  Flow& f = flows_[slot];
  ++live_flows_;
  if (f.reserved) {
    f.pos_up = static_cast<int>(reserved_on_[f.up_link].size());
    reserved_on_[f.up_link].push_back(slot);
    f.pos_down = static_cast<int>(reserved_on_[f.down_link].size());
    reserved_on_[f.down_link].push_back(slot);
    retime_.push_back(slot);  // its rate is read at the next recomputation
  } else {
    ListBestEffort(slot);
  }
  dirty_ = true;
}

void FluidSim::Unlist(std::vector<int>& list, int pos, int link) {
  const int moved = list.back();
  list.pop_back();
  if (pos == static_cast<int>(list.size())) return;  // it was the last
  list[pos] = moved;
  Flow& m = flows_[moved];
  (m.up_link == link ? m.pos_up : m.pos_down) = pos;
}

void FluidSim::ListBestEffort(int slot) {
  Flow& f = flows_[slot];
  f.pos_up = static_cast<int>(best_effort_on_[f.up_link].size());
  best_effort_on_[f.up_link].push_back(slot);
  f.pos_down = static_cast<int>(best_effort_on_[f.down_link].size());
  best_effort_on_[f.down_link].push_back(slot);
  best_effort_dirty_ = true;
}

void FluidSim::RemoveFlow(int slot) {
  Flow& f = flows_[slot];
  if (f.reserved) {
    Unlist(reserved_on_[f.up_link], f.pos_up, f.up_link);
    Unlist(reserved_on_[f.down_link], f.pos_down, f.down_link);
    AddReserved(f.up_link, -f.rate_bps);
    AddReserved(f.down_link, -f.rate_bps);
    Touch(f.up_link);
    Touch(f.down_link);
  } else {
    Unlist(best_effort_on_[f.up_link], f.pos_up, f.up_link);
    Unlist(best_effort_on_[f.down_link], f.pos_down, f.down_link);
    best_effort_dirty_ = true;
  }
  f.id = -1;
  ++f.version;
  f.segments = {};
  f.on_done = nullptr;
  --live_flows_;
  free_slots_.push_back(slot);
  dirty_ = true;
}

double FluidSim::Remaining(const Flow& f) const {
  return std::max(0.0, f.bits_at_ref - f.rate_bps * (now_s_ - f.t_ref_s));
}

void FluidSim::Settle(Flow& f) {
  const double left = Remaining(f);
  stats_.bits_delivered += f.bits_at_ref - left;
  f.bits_at_ref = left;
  f.t_ref_s = now_s_;
}

double FluidSim::NextChangeOf(const Flow& f) const {
  const double left = Remaining(f);
  if (left <= 1e-6) return now_s_;
  double next = f.rate_bps > 0 ? now_s_ + left / f.rate_bps : kInf;
  if (f.reserved && f.segment < f.segments.size()) {
    const core::RateSegment& s = f.segments[f.segment];
    next = std::min(next, s.from_s > now_s_ + kTimeEpsS ? s.from_s : s.to_s);
  }
  return next;
}

void FluidSim::Schedule(int slot) {
  Flow& f = flows_[slot];
  ++f.version;
  const double t = NextChangeOf(f);
  if (t < kInf) changes_.push(Change{t, f.id, slot, f.version});
}

bool FluidSim::Stale(const Change& c) const {
  const Flow& f = flows_[c.slot];
  return f.id != c.id || f.version != c.version;
}

void FluidSim::SetRate(int slot, double rate_bps) {
  Flow& f = flows_[slot];
  if (rate_bps == f.rate_bps) return;
  Settle(f);
  if (f.reserved) {
    AddReserved(f.up_link, rate_bps - f.rate_bps);
    AddReserved(f.down_link, rate_bps - f.rate_bps);
  }
  f.rate_bps = rate_bps;
  MarkLoad(f.up_link);
  MarkLoad(f.down_link);
  Schedule(slot);
}

void FluidSim::AddReserved(int link, double delta_bps) {
  if (delta_bps == 0) return;
  reserved_sum_[link] += delta_bps;
  if (!best_effort_on_[link].empty()) best_effort_dirty_ = true;
}

void FluidSim::Touch(int link) {
  if (is_touched_[link]) return;
  is_touched_[link] = 1;
  touched_.push_back(link);
}

void FluidSim::MarkLoad(int link) {
  if (is_load_changed_[link]) return;
  is_load_changed_[link] = 1;
  load_changed_.push_back(link);
}

void FluidSim::RefreshCapacities() {
  const int links = 2 * hosts_;
  for (int l = 0; l < links; ++l) {
    capacity_[l] = trace_->CapacityBps(l / 2, l % 2 == 0, now_s_);
    Touch(l);
    MarkLoad(l);
  }
  capacity_until_s_ = trace_->NextChangeS(now_s_);
  best_effort_dirty_ = true;
}

void FluidSim::Retime(int slot) {
  Flow& f = flows_[slot];
  if (f.id < 0 || !f.reserved) return;
  while (f.segment < f.segments.size() && f.segments[f.segment].to_s <= now_s_ + kTimeEpsS) {
    ++f.segment;
  }
  if (f.segment == f.segments.size()) {
    Touch(f.up_link);
    Touch(f.down_link);
    // Plan over, bits remain: best effort from now on.
    ++stats_.reserved_flows_late;
    Settle(f);
    Unlist(reserved_on_[f.up_link], f.pos_up, f.up_link);
    Unlist(reserved_on_[f.down_link], f.pos_down, f.down_link);
    AddReserved(f.up_link, -f.rate_bps);
    AddReserved(f.down_link, -f.rate_bps);
    f.reserved = false;
    f.planned_bps = 0;
    ListBestEffort(slot);
    return;
  }
  const core::RateSegment& s = f.segments[f.segment];
  const double planned = s.from_s <= now_s_ + kTimeEpsS ? s.rate_bps : 0;
  if (planned == f.planned_bps) return;
  f.planned_bps = planned;
  Touch(f.up_link);
  Touch(f.down_link);
}

void FluidSim::RecomputeRates() {
  ++stats_.rate_recomputations;
  if (now_s_ >= capacity_until_s_) RefreshCapacities();
  std::vector<int> retimed;
  retimed.swap(retime_);
  for (int slot : retimed) Retime(slot);

  // Reserved flows: the planned rate, scaled down where the links cannot
  // carry the sum of reservations any more. Only the touched links' sums
  // (reservations started, ended or at a boundary, or a new period) can
  // have changed; a flow is re-rated when its plan or a link's factor did.
  std::vector<int> rescaled;
  for (int l : touched_) {
    double sum = 0;
    for (int slot : reserved_on_[l]) sum += flows_[slot].planned_bps;
    planned_sum_[l] = sum;
    const double scale = sum > capacity_[l] ? capacity_[l] / sum : 1.0;
    if (scale != scale_[l]) {
      scale_[l] = scale;
      rescaled.push_back(l);
    }
  }
  auto rate = [&](int slot) {
    const Flow& f = flows_[slot];
    SetRate(slot, f.planned_bps * std::min(scale_[f.up_link], scale_[f.down_link]));
  };
  for (int slot : retimed) {
    const Flow& f = flows_[slot];
    if (f.id < 0) continue;
    if (f.reserved) rate(slot);
    Schedule(slot);  // its next boundary, even if the rate stayed
  }
  for (int l : rescaled) {
    for (int slot : reserved_on_[l]) rate(slot);
  }
  // The touched links' reserved rates summed afresh (the increments of
  // SetRate elsewhere drift by rounding only).
  for (int l : touched_) {
    double sum = 0;
    for (int slot : reserved_on_[l]) sum += flows_[slot].rate_bps;
    if (sum != reserved_sum_[l]) {
      reserved_sum_[l] = sum;
      if (!best_effort_on_[l].empty()) best_effort_dirty_ = true;
    }
    MarkLoad(l);
    is_touched_[l] = 0;
  }
  touched_.clear();

  if (best_effort_dirty_) {
    ShareFairly();
    best_effort_dirty_ = false;
  }
  NoteLinkLoad();
}

void FluidSim::ShareFairly() {
  const int links = 2 * hosts_;
  // Best-effort flows: max-min fair share of what reserved flows leave
  // (progressive filling). The links wait in a min-heap by fair share
  // (residual / flows not yet frozen), ties by link; freezing a link's
  // flows raises the shares of their other links, which are then re-keyed
  // once each. Scratch space is kept between calls: this runs at most
  // events of a run with many late flows.
  std::vector<double>& residual = scratch_residual_;
  std::vector<int>& unfrozen = scratch_unfrozen_;
  std::vector<double>& share_of = scratch_share_;  // by slot; < 0: not yet frozen
  std::vector<int>& raised = scratch_raised_;      // other links of a frozen link's flows
  residual.resize(links);
  unfrozen.resize(links);
  share_of.resize(flows_.size());
  LinkHeap& heap = scratch_heap_;
  heap.Reset(links);
  for (int l = 0; l < links; ++l) {
    residual[l] = std::max(0.0, capacity_[l] - reserved_sum_[l]);
    unfrozen[l] = static_cast<int>(best_effort_on_[l].size());
    if (unfrozen[l] > 0) heap.Push(l, residual[l] / unfrozen[l]);
    if (l % 2 == 0) {
      for (int slot : best_effort_on_[l]) share_of[slot] = -1;
    }
  }
  while (!heap.empty()) {
    const auto [link, share] = heap.Pop();
    raised.clear();
    for (int slot : best_effort_on_[link]) {
      if (share_of[slot] >= 0) continue;
      share_of[slot] = share;
      const Flow& f = flows_[slot];
      const int other = f.up_link == link ? f.down_link : f.up_link;
      residual[other] = std::max(0.0, residual[other] - share);
      --unfrozen[other];
      raised.push_back(other);
    }
    for (int other : raised) {
      if (unfrozen[other] > 0) {
        heap.Update(other, residual[other] / unfrozen[other]);
      } else {
        heap.Remove(other);
      }
    }
    residual[link] = std::max(0.0, residual[link] - share * unfrozen[link]);
    unfrozen[link] = 0;
  }
  for (int l = 0; l < links; ++l) {
    double sum = 0;
    for (int slot : best_effort_on_[l]) {
      if (l % 2 == 0) SetRate(slot, share_of[slot]);
      sum += share_of[slot];
    }
    if (sum != best_effort_sum_[l]) {
      best_effort_sum_[l] = sum;
      MarkLoad(l);
    }
  }
}

void FluidSim::NoteLinkLoad() {
  for (int l : load_changed_) {
    const double load = reserved_sum_[l] + best_effort_sum_[l];
    if (load > 0) stats_.max_link_load = std::max(stats_.max_link_load, load / capacity_[l]);
    is_load_changed_[l] = 0;
  }
  load_changed_.clear();
}

double FluidSim::NextFlowChangeS() {
  // Stale entries pile up as rates change; rebuild when they dominate.
  if (changes_.size() > 4 * static_cast<size_t>(live_flows_) + 4096) {
    changes_ = {};
    for (int slot = 0; slot < static_cast<int>(flows_.size()); ++slot) {
      const Flow& f = flows_[slot];
      if (f.id < 0) continue;
      const double t = NextChangeOf(f);
      if (t < kInf) changes_.push(Change{t, f.id, slot, f.version});
    }
  }
  while (!changes_.empty() && Stale(changes_.top())) changes_.pop();
  if (live_flows_ == 0) return kInf;
  double next = capacity_until_s_;
  if (!changes_.empty()) next = std::min(next, changes_.top().t_s);
  return next;
}

double FluidSim::Run(const std::function<bool()>& stop, double until_s) {
  while (true) {
    if (dirty_) {
      RecomputeRates();
      dirty_ = false;
    }
    const double t_flow = NextFlowChangeS();
    const double t_event = events_.empty() ? kInf : events_.top().t_s;
    const double t = std::min({t_flow, t_event, until_s});
    if (t == kInf) break;  // nothing left to simulate
    if (t > now_s_) now_s_ = t;
    ++stats_.events;

    // Flows whose last bit or segment boundary is now. Completions run in
    // creation order.
    std::vector<std::pair<int64_t, int>> finished;  // id, slot
    while (!changes_.empty() && changes_.top().t_s <= now_s_ + kTimeEpsS) {
      const Change c = changes_.top();
      changes_.pop();
      if (Stale(c)) continue;
      Flow& f = flows_[c.slot];
      const double left = Remaining(f);
      // The same test as the heap's, so an entry popped for its last bit
      // always completes.
      const bool done =
          left <= 1e-6 || (f.rate_bps > 0 && now_s_ + left / f.rate_bps <= now_s_ + kTimeEpsS);
      if (done) {
        finished.emplace_back(f.id, c.slot);
      } else if (f.reserved) {
        ++f.version;  // re-scheduled by the recomputation
        retime_.push_back(c.slot);
        dirty_ = true;
      } else {
        Schedule(c.slot);  // rounding: its last bit is a hair later
      }
    }
    std::sort(finished.begin(), finished.end());
    std::vector<Callback> done;
    done.reserve(finished.size());
    for (const auto& [id, slot] : finished) {
      Flow& f = flows_[slot];
      Settle(f);
      stats_.bits_delivered += f.bits_at_ref;
      f.bits_at_ref = 0;
      done.push_back(std::move(f.on_done));
      RemoveFlow(slot);
      ++stats_.flows_completed;
    }
    if (t == t_flow && now_s_ >= capacity_until_s_) dirty_ = true;  // a trace period
    for (Callback& callback : done) {
      if (callback) callback();
    }
    while (!events_.empty() && events_.top().t_s <= now_s_) {
      Callback callback = events_.top().callback;
      events_.pop();
      callback();
      dirty_ = true;
    }
    if (stop && stop()) break;
    if (now_s_ >= until_s) break;
  }
  return now_s_;
}

}  // namespace mlfabric::sim
