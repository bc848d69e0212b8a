#include "scheduler/core/network.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace mlfabric::core {

namespace {

// Builds a residual profile starting at `start_s` from a constant capacity
// and an optional profile of (from_s, rate_bps) points.
LinkProfile MakeProfile(double start_s, double constant_bps,
                        const std::vector<ProfilePoint>& points) {
  LinkProfile p;
  double initial = constant_bps;
  if (!points.empty() && !(constant_bps > 0)) initial = points.front().second;
  for (const ProfilePoint& point : points) {
    if (point.first <= start_s) initial = point.second;
  }
  p.times_s.push_back(start_s);
  p.rates_bps.push_back(std::max(0.0, initial));
  for (const ProfilePoint& point : points) {
    if (point.first > start_s) {
      p.times_s.push_back(point.first);
      p.rates_bps.push_back(std::max(0.0, point.second));
    }
  }
  while (p.first_open + 1 < p.rates_bps.size() && p.rates_bps[p.first_open] == 0) ++p.first_open;
  return p;
}

double PeakOf(const LinkProfile& p) {
  return *std::max_element(p.rates_bps.begin(), p.rates_bps.end());
}

// Index of the segment containing `t` (t >= times[0]).
size_t SegmentIndex(const LinkProfile& p, double t) {
  // Reservations mostly land at the end of a profile: check the tail first.
  if (t >= p.times_s.back()) return p.times_s.size() - 1;
  auto it = std::upper_bound(p.times_s.begin(), p.times_s.end(), t);
  return static_cast<size_t>(it - p.times_s.begin()) - 1;
}

// SegmentIndex(p, t) when t lies at or a few segments after segment `hint`
// (consecutive reservation segments split a profile left to right), found
// without a binary search; otherwise SegmentIndex's.
size_t SegmentIndexFrom(const LinkProfile& p, double t, size_t hint) {
  if (hint < p.times_s.size() && p.times_s[hint] <= t) {
    size_t k = hint;
    for (int step = 0; step < 4; ++step, ++k) {
      if (k + 1 == p.times_s.size() || p.times_s[k + 1] > t) return k;
    }
  }
  return SegmentIndex(p, t);
}

// Adds [from, to) at `rate` to a fill's segments, extending the last one
// when it runs on at the same rate.
void AppendSegment(std::vector<RateSegment>* segments, double from, double to, double rate) {
  if (!segments->empty() && segments->back().rate_bps == rate && segments->back().to_s == from) {
    segments->back().to_s = to;
  } else {
    segments->push_back({from, to, rate});
  }
}

// One step of the fill walk: the slot [t, next) at `rate` takes what it
// can of `*bits`. True with *end set when the bits are all placed (or
// never can be: no rate now and no breakpoint ahead); false to go on at
// `next`.
inline bool FillStep(double rate, double next, double t, double* bits,
                     std::vector<RateSegment>* segments, double* end) {
  if (rate > 0) {
    const double capacity = next == kInfinity ? kInfinity : rate * (next - t);
    // Under a thousandth of a bit left after a slot is the residue of
    // filling it exactly, not a reason for one more (empty) segment that
    // would also move the end to the next profile breakpoint.
    const bool fits = *bits <= capacity + 1e-3;
    const double to = fits ? std::min(t + *bits / rate, next) : next;
    if (segments != nullptr) AppendSegment(segments, t, to, rate);
    if (fits) {
      *end = to;
      return true;
    }
    *bits -= capacity;
    return false;
  }
  if (next == kInfinity) {
    *end = kInfinity;
    return true;
  }
  return false;
}

// The fill walk of Fig. 4(b), shared by FillEnd and Fill so both give the
// same end time bit for bit. `segments` may be null.
double Walk(const std::vector<LinkProfile>& links, const Path& path, double start_s, double t0,
            double bits, bool reference, std::vector<RateSegment>* segments) {
  constexpr int kMaxLinks = LinkList::kMaxLinks;
  const int n = path.links.size();
  if (n > kMaxLinks) return kInfinity;
  if (n == 0) {  // same host: a copy in memory, no link to share
    const double from = std::max(t0, start_s);
    const double to = from + bits / kLocalCopyBps;
    if (segments != nullptr && to > from) segments->push_back({from, to, kLocalCopyBps});
    return to;
  }
  const LinkProfile* p[kMaxLinks];
  size_t k[kMaxLinks];
  double t = std::max(t0, start_s);
  if (reference) {
    for (int l = 0; l < n; ++l) {
      p[l] = &links[path.links[l]];
      k[l] = 0;
      while (k[l] + 1 < p[l]->times_s.size() && p[l]->times_s[k[l] + 1] <= t) ++k[l];
    }
  } else {
    // Jump over every link's saturated prefix, then position each link at t.
    for (int l = 0; l < n; ++l) {
      p[l] = &links[path.links[l]];
      t = std::max(t, p[l]->times_s[p[l]->first_open]);
    }
    for (int l = 0; l < n; ++l) k[l] = SegmentIndex(*p[l], t);
  }
  if (n == 2) {
    // A host-to-host path (uplink, downlink), the usual one: the loop
    // below with its inner loops unrolled, the same arithmetic.
    const double* t0s = p[0]->times_s.data();
    const double* t1s = p[1]->times_s.data();
    const double* r0s = p[0]->rates_bps.data();
    const double* r1s = p[1]->rates_bps.data();
    const size_t n0 = p[0]->times_s.size(), n1 = p[1]->times_s.size();
    size_t k0 = k[0], k1 = k[1];
    for (;;) {
      // Nothing moves while either link has no residual: jump to the end
      // of that link's segment, the other link following (the steps in
      // between move no bits and add no segment, so this is exact).
      if (r0s[k0] <= 0 || r1s[k1] <= 0) {
        if (r0s[k0] <= 0) {
          if (k0 + 1 == n0) return kInfinity;
          t = t0s[++k0];
          while (k1 + 1 < n1 && t1s[k1 + 1] <= t) ++k1;
        } else {
          if (k1 + 1 == n1) return kInfinity;
          t = t1s[++k1];
          while (k0 + 1 < n0 && t0s[k0 + 1] <= t) ++k0;
        }
        continue;
      }
      const double rate = std::min(r0s[k0], r1s[k1]);
      const double next = std::min(k0 + 1 < n0 ? t0s[k0 + 1] : kInfinity,
                                    k1 + 1 < n1 ? t1s[k1 + 1] : kInfinity);
      if (double end; FillStep(rate, next, t, &bits, segments, &end)) return end;
      t = next;
      if (k0 + 1 < n0 && t0s[k0 + 1] == t) ++k0;
      if (k1 + 1 < n1 && t1s[k1 + 1] == t) ++k1;
    }
  }
  for (;;) {
    double rate = kInfinity;
    double next = kInfinity;
    for (int l = 0; l < n; ++l) {
      rate = std::min(rate, p[l]->rates_bps[k[l]]);
      if (k[l] + 1 < p[l]->times_s.size()) next = std::min(next, p[l]->times_s[k[l] + 1]);
    }
    if (double end; FillStep(rate, next, t, &bits, segments, &end)) return end;
    t = next;
    for (int l = 0; l < n; ++l) {
      if (k[l] + 1 < p[l]->times_s.size() && p[l]->times_s[k[l] + 1] == t) ++k[l];
    }
  }
}

}  // namespace

double LinkProfile::RateAt(double t) const {
  if (t < times_s.front()) return 0;
  return rates_bps[SegmentIndex(*this, t)];
}

double SegmentBits(const std::vector<RateSegment>& segments) {
  double bits = 0;
  for (const RateSegment& s : segments) bits += s.rate_bps * (s.to_s - s.from_s);
  return bits;
}

absl::StatusOr<Network> Network::FromBatch(const Batch& batch) {
  Network net;
  net.start_s_ = batch.now_s;
  for (size_t i = 0; i < batch.hosts.size(); ++i) {
    const HostLink& host = batch.hosts[i];
    net.host_index_[host.name] = static_cast<int>(i);
    net.host_names_.push_back(host.name);
    net.links_.push_back(MakeProfile(batch.now_s, host.uplink_bps, host.uplink_profile));
    net.links_.push_back(MakeProfile(batch.now_s, host.downlink_bps, host.downlink_profile));
  }
  std::unordered_map<std::string, int> link_index;
  for (size_t i = 0; i < batch.links.size(); ++i) {
    const TopologyLink& link = batch.links[i];
    if (link.name.empty()) return absl::InvalidArgumentError(absl::StrCat("links[", i, "].name: empty"));
    if (!link_index.emplace(link.name, static_cast<int>(net.links_.size())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("links[", i, "].name: duplicate link '", link.name, "'"));
    }
    if (link.profile.empty() && !(std::isfinite(link.bps) && link.bps > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("links[", i, "].bps: must be a positive number of bits per second"));
    }
    net.links_.push_back(MakeProfile(batch.now_s, link.bps, link.profile));
  }
  const int64_t num_hosts = static_cast<int64_t>(batch.hosts.size());
  for (size_t i = 0; i < batch.paths.size(); ++i) {
    const FixedPath& path = batch.paths[i];
    const int src = net.HostIndex(path.src);
    const int dst = net.HostIndex(path.dst);
    if (src < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("paths[", i, "].src: '", path.src, "' is not in hosts"));
    }
    if (dst < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("paths[", i, "].dst: '", path.dst, "' is not in hosts"));
    }
    if (path.links.size() > 6) {
      return absl::InvalidArgumentError(absl::StrCat("paths[", i, "].links: at most 6 links"));
    }
    std::vector<int> ids;
    for (size_t j = 0; j < path.links.size(); ++j) {
      auto it = link_index.find(path.links[j]);
      if (it == link_index.end()) {
        return absl::InvalidArgumentError(absl::StrCat("paths[", i, "].links[", j, "]: '",
                                                       path.links[j], "' is not in links"));
      }
      ids.push_back(it->second);
    }
    net.fixed_paths_[src * num_hosts + dst] = std::move(ids);
  }
  for (const LinkProfile& link : net.links_) net.peak_bps_.push_back(PeakOf(link));
  return net;
}

int Network::HostIndex(const std::string& name) const {
  auto it = host_index_.find(name);
  return it == host_index_.end() ? -1 : it->second;
}

Path Network::PathBetween(int src_host, int dst_host) const {
  Path path;
  const std::vector<int>* fixed = nullptr;
  if (!fixed_paths_.empty()) {
    auto it = fixed_paths_.find(static_cast<int64_t>(src_host) *
                                    static_cast<int64_t>(host_names_.size()) +
                                dst_host);
    if (it != fixed_paths_.end()) fixed = &it->second;
  }
  if (src_host == dst_host && fixed == nullptr) return path;  // a copy in memory
  path.links.push_back(UplinkOf(src_host));
  if (fixed != nullptr) {
    for (int id : *fixed) path.links.push_back(id);
  }
  path.links.push_back(DownlinkOf(dst_host));
  return path;
}

double Network::FillEnd(const Path& path, double t0, double bits, bool reference) const {
  return Walk(links_, path, start_s_, t0, bits, reference, nullptr);
}

FillResult Network::Fill(const Path& path, double t0, double bits) const {
  FillResult result;
  result.end_s = Walk(links_, path, start_s_, t0, bits, false, &result.segments);
  result.feasible = result.end_s != kInfinity;
  if (!result.feasible) result.segments.clear();
  return result;
}

double Network::CapacityBits(int id, double from_s, double to_s) const {
  const LinkProfile& p = links_[id];
  from_s = std::max(from_s, start_s_);
  double bits = 0;
  for (size_t k = SegmentIndex(p, from_s); k < p.times_s.size() && p.times_s[k] < to_s; ++k) {
    const double a = std::max(from_s, p.times_s[k]);
    const double b = k + 1 < p.times_s.size() ? std::min(to_s, p.times_s[k + 1]) : to_s;
    if (b > a) bits += p.rates_bps[k] * (b - a);
  }
  return bits;
}

double Network::FillInto(const Path& path, double t0, double bits,
                         std::vector<RateSegment>* segments) const {
  segments->clear();
  const double end = Walk(links_, path, start_s_, t0, bits, false, segments);
  if (end == kInfinity) segments->clear();
  return end;
}

size_t Network::SplitAt(int link, double t, size_t hint) {
  LinkProfile& p = links_[link];
  const size_t k = SegmentIndexFrom(p, t, hint);
  if (p.times_s[k] == t) return k;
  p.times_s.insert(p.times_s.begin() + k + 1, t);
  p.rates_bps.insert(p.rates_bps.begin() + k + 1, p.rates_bps[k]);
  if (journaling_) journal_.push_back({link, JournalEntry::kInserted, k + 1, 0, p.first_open});
  if (p.first_open > k) ++p.first_open;
  return k + 1;
}

void Network::MergeZeroRuns(int link, size_t lo, size_t hi) {
  LinkProfile& p = links_[link];
  hi = std::min(hi, p.times_s.size() - 1);
  lo = std::max<size_t>(lo, 1);  // times_s[0] is the batch's start: it stays
  if (lo > hi) return;
  // One pass that keeps breakpoints in place, then one erase of the gap.
  // An undo re-inserts removed breakpoints in reverse, so each is recorded
  // at its index among those kept so far (where it goes back).
  size_t w = lo;
  size_t first_open = p.first_open;
  for (size_t k = lo; k <= hi; ++k) {
    if (p.rates_bps[k] == 0 && p.rates_bps[w - 1] == 0) {
      if (journaling_) {
        journal_.push_back({link, JournalEntry::kRemoved, w, 0.0, first_open, p.times_s[k]});
      }
      // first_open == w only when it was the last segment (its rate is 0).
      if (first_open >= w) --first_open;
      continue;
    }
    p.times_s[w] = p.times_s[k];
    p.rates_bps[w] = p.rates_bps[k];
    ++w;
  }
  if (w <= hi) {
    p.times_s.erase(p.times_s.begin() + w, p.times_s.begin() + hi + 1);
    p.rates_bps.erase(p.rates_bps.begin() + w, p.rates_bps.begin() + hi + 1);
  }
  p.first_open = first_open;
}

void Network::AddRate(const Path& path, const std::vector<RateSegment>& segments, double sign) {
  for (int link : path.links) {
    LinkProfile& p = links_[link];
    size_t hint = 0;  // segments run forward in time: each split starts the next search
    size_t lo = p.times_s.size(), hi = 0;  // the breakpoints touched
    for (const RateSegment& s : segments) {
      if (!(s.to_s > s.from_s) || s.rate_bps <= 0) continue;
      const size_t from = SplitAt(link, std::max(s.from_s, start_s_), hint);
      const size_t to = SplitAt(link, s.to_s, from);
      hint = to;
      lo = std::min(lo, from);
      hi = std::max(hi, to);
      for (size_t k = from; k < to; ++k) {
        if (journaling_) {
          journal_.push_back({link, JournalEntry::kRate, k, p.rates_bps[k], p.first_open});
        }
        p.rates_bps[k] = std::max(0.0, p.rates_bps[k] + sign * s.rate_bps);
      }
    }
    if (sign < 0 && lo <= hi && merge_zero_runs_) MergeZeroRuns(link, lo, hi);
    const size_t old_first_open = p.first_open;
    if (sign < 0) {
      while (p.first_open + 1 < p.rates_bps.size() && p.rates_bps[p.first_open] == 0) {
        ++p.first_open;
      }
    } else {
      p.first_open = 0;
      while (p.first_open + 1 < p.rates_bps.size() && p.rates_bps[p.first_open] == 0) {
        ++p.first_open;
      }
    }
    if (journaling_ && p.first_open != old_first_open) {
      // A rate entry re-writing the same value carries the old skip pointer.
      journal_.push_back({link, JournalEntry::kRate, p.first_open, p.rates_bps[p.first_open],
                          old_first_open});
    }
  }
}

void Network::Reserve(const Path& path, const std::vector<RateSegment>& segments) {
  AddRate(path, segments, -1.0);
}

void Network::Release(const Path& path, const std::vector<RateSegment>& segments) {
  AddRate(path, segments, +1.0);
}

void Network::RollbackTo(size_t mark) {
  while (journal_.size() > mark) {
    const JournalEntry& e = journal_.back();
    LinkProfile& p = links_[e.link];
    switch (e.kind) {
      case JournalEntry::kInserted:
        p.times_s.erase(p.times_s.begin() + e.index);
        p.rates_bps.erase(p.rates_bps.begin() + e.index);
        break;
      case JournalEntry::kRemoved:
        p.times_s.insert(p.times_s.begin() + e.index, e.old_time);
        p.rates_bps.insert(p.rates_bps.begin() + e.index, e.old_rate);
        break;
      case JournalEntry::kRate:
        p.rates_bps[e.index] = e.old_rate;
        break;
    }
    p.first_open = e.old_first_open;
    journal_.pop_back();
  }
}

double RateAt(const std::vector<RateSegment>& segments, double t) {
  double sum = 0;
  for (const RateSegment& s : segments) {
    if (s.from_s <= t && t < s.to_s) sum += s.rate_bps;
  }
  return sum;
}

std::vector<ProfilePoint> ResidualProfile(double capacity_bps, double now_s,
                                          const std::vector<RateSegment>& reserved) {
  // The profile's points: now and every boundary after it.
  std::vector<double> times = {now_s};
  for (const RateSegment& s : reserved) {
    if (s.to_s <= now_s) continue;
    if (s.from_s > now_s) times.push_back(s.from_s);
    times.push_back(s.to_s);
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  // A sweep over the segments by start and by end keeps the ones in force
  // (from_s <= t < to_s), by index: summed in that order, each point's rate
  // is RateAt(reserved, t) to the bit, at the cost of the segments in force
  // rather than of all of them (a link of a busy simulated server holds
  // thousands).
  const int n = static_cast<int>(reserved.size());
  std::vector<int> by_start(n), by_end(n);
  for (int i = 0; i < n; ++i) by_start[i] = by_end[i] = i;
  std::sort(by_start.begin(), by_start.end(),
            [&](int a, int b) { return reserved[a].from_s < reserved[b].from_s; });
  std::sort(by_end.begin(), by_end.end(),
            [&](int a, int b) { return reserved[a].to_s < reserved[b].to_s; });
  std::vector<char> started(n, 0), ended(n, 0);
  std::vector<int> active;  // ascending index
  size_t next_start = 0, next_end = 0;
  std::vector<ProfilePoint> profile;
  for (double t : times) {
    for (; next_start < by_start.size() && reserved[by_start[next_start]].from_s <= t;
         ++next_start) {
      const int i = by_start[next_start];
      started[i] = 1;
      if (!ended[i] && t < reserved[i].to_s) {
        active.insert(std::lower_bound(active.begin(), active.end(), i), i);
      }
    }
    for (; next_end < by_end.size() && reserved[by_end[next_end]].to_s <= t; ++next_end) {
      const int i = by_end[next_end];
      ended[i] = 1;
      if (!started[i]) continue;
      const auto it = std::lower_bound(active.begin(), active.end(), i);
      if (it != active.end() && *it == i) active.erase(it);
    }
    double sum = 0;
    for (int i : active) sum += reserved[i].rate_bps;
    const double rate = std::max(0.0, capacity_bps - sum);
    if (!profile.empty() && profile.back().second == rate) continue;
    profile.push_back({t, rate});
  }
  return profile;
}

}  // namespace mlfabric::core
