#include "eval/sim/fluid_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

namespace mlfabric::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Time resolution: boundaries closer than this to now count as reached.
constexpr double kTimeEpsS = 1e-12;

}  // namespace

FluidSim::FluidSim(int hosts, const NetworkTrace* trace) : hosts_(hosts), trace_(trace) {}

void FluidSim::At(double t_s, Callback callback) {
  events_.push(Event{std::max(t_s, now_s_), next_seq_++, std::move(callback)});
}

void FluidSim::AddFlow(Flow flow) {
  flow.id = next_flow_id_++;
  ++stats_.flows_started;
  flows_.emplace(flow.id, std::move(flow));
  dirty_ = true;
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
  flow.remaining_bits = bits;
  flow.on_done = std::move(on_done);
  AddFlow(std::move(flow));
}

void FluidSim::StartReservedFlow(int src, int dst, double bits,
                                 std::vector<core::RateSegment> segments, Callback on_done) {
  if (IntraHost(src, dst, bits, on_done)) return;
  Flow flow;
  flow.up_link = 2 * src;
  flow.down_link = 2 * dst + 1;
  flow.remaining_bits = bits;
  flow.segments = std::move(segments);
  flow.reserved = !flow.segments.empty();
  flow.on_done = std::move(on_done);
  AddFlow(std::move(flow));
}

void FluidSim::RecomputeRates() {
  ++stats_.rate_recomputations;
  const int links = 2 * hosts_;
  std::vector<double> capacity(links);
  for (int l = 0; l < links; ++l) capacity[l] = trace_->CapacityBps(l / 2, l % 2 == 0, now_s_);
  ShareFairly(RateReservedFlows(capacity));
  NoteLinkLoad(capacity);
}

std::vector<double> FluidSim::RateReservedFlows(const std::vector<double>& capacity) {
  const int links = static_cast<int>(capacity.size());
  // Reserved flows: the planned rate, scaled down where the links cannot
  // carry the sum of reservations any more.
  std::vector<double> planned_sum(links, 0);
  std::vector<double> planned(0);
  for (auto& [id, f] : flows_) {
    if (!f.reserved) continue;
    if (now_s_ >= f.segments.back().to_s - kTimeEpsS) {
      f.reserved = false;  // plan over, bits remain: best effort from now on
      ++stats_.reserved_flows_late;
      continue;
    }
    double rate = 0;
    for (const core::RateSegment& s : f.segments) {
      if (s.from_s <= now_s_ + kTimeEpsS && now_s_ + kTimeEpsS < s.to_s) {
        rate = s.rate_bps;
        break;
      }
    }
    f.rate_bps = rate;
    planned_sum[f.up_link] += rate;
    planned_sum[f.down_link] += rate;
  }
  std::vector<double> residual = capacity;
  for (auto& [id, f] : flows_) {
    if (!f.reserved) continue;
    auto scale = [&](int l) {
      return planned_sum[l] > capacity[l] ? capacity[l] / planned_sum[l] : 1.0;
    };
    f.rate_bps *= std::min(scale(f.up_link), scale(f.down_link));
    residual[f.up_link] -= f.rate_bps;
    residual[f.down_link] -= f.rate_bps;
  }
  for (double& r : residual) r = std::max(0.0, r);
  return residual;
}

void FluidSim::ShareFairly(std::vector<double> residual) {
  const int links = static_cast<int>(residual.size());
  // Best-effort flows: max-min fair share of the residual (progressive
  // filling with a lazily updated heap of per-link fair shares).
  std::vector<std::vector<Flow*>> on_link(links);
  std::vector<int> unfrozen(links, 0);
  for (auto& [id, f] : flows_) {
    if (f.reserved) continue;
    f.rate_bps = -1;  // not yet frozen
    on_link[f.up_link].push_back(&f);
    on_link[f.down_link].push_back(&f);
    ++unfrozen[f.up_link];
    ++unfrozen[f.down_link];
  }
  using Entry = std::tuple<double, int, int64_t>;  // share, link, version
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::vector<int64_t> version(links, 0);
  for (int l = 0; l < links; ++l) {
    if (unfrozen[l] > 0) heap.emplace(residual[l] / unfrozen[l], l, 0);
  }
  while (!heap.empty()) {
    const auto [share, link, v] = heap.top();
    heap.pop();
    if (v != version[link] || unfrozen[link] == 0) continue;
    for (Flow* f : on_link[link]) {
      if (f->rate_bps >= 0) continue;
      f->rate_bps = share;
      const int other = f->up_link == link ? f->down_link : f->up_link;
      residual[other] = std::max(0.0, residual[other] - share);
      --unfrozen[other];
      ++version[other];
      if (unfrozen[other] > 0) heap.emplace(residual[other] / unfrozen[other], other, version[other]);
    }
    residual[link] = std::max(0.0, residual[link] - share * unfrozen[link]);
    unfrozen[link] = 0;
  }
}

void FluidSim::NoteLinkLoad(const std::vector<double>& capacity) {
  const int links = static_cast<int>(capacity.size());
  std::vector<double> load(links, 0);
  for (const auto& [id, f] : flows_) {
    load[f.up_link] += f.rate_bps;
    load[f.down_link] += f.rate_bps;
  }
  for (int l = 0; l < links; ++l) {
    if (load[l] > 0) stats_.max_link_load = std::max(stats_.max_link_load, load[l] / capacity[l]);
  }
}

double FluidSim::NextFlowChangeS() const {
  if (flows_.empty()) return kInf;
  double next = trace_->NextChangeS(now_s_);
  for (const auto& [id, f] : flows_) {
    if (f.rate_bps > 0) next = std::min(next, now_s_ + f.remaining_bits / f.rate_bps);
    if (f.reserved) {
      for (const core::RateSegment& s : f.segments) {
        if (s.from_s > now_s_ + kTimeEpsS) next = std::min(next, s.from_s);
        if (s.to_s > now_s_ + kTimeEpsS) next = std::min(next, s.to_s);
      }
    }
  }
  return next;
}

void FluidSim::Advance(double t_s) {
  const double dt = t_s - now_s_;
  if (dt > 0) {
    for (auto& [id, f] : flows_) {
      const double moved = std::min(f.remaining_bits, f.rate_bps * dt);
      f.remaining_bits -= moved;
      stats_.bits_delivered += moved;
    }
  }
  now_s_ = t_s;
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
    if (t > now_s_) Advance(t);
    ++stats_.events;

    // Completions, in creation order.
    std::vector<Callback> done;
    for (auto it = flows_.begin(); it != flows_.end();) {
      const double rate = it->second.rate_bps;
      const bool finished = it->second.remaining_bits <= 1e-6 ||
                            (rate > 0 && it->second.remaining_bits / rate <= kTimeEpsS);
      if (finished) {
        stats_.bits_delivered += it->second.remaining_bits;
        done.push_back(std::move(it->second.on_done));
        it = flows_.erase(it);
        ++stats_.flows_completed;
        dirty_ = true;
      } else {
        ++it;
      }
    }
    if (t == t_flow) dirty_ = true;  // segment boundary or trace period
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
