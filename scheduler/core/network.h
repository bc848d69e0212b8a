// The scheduler's network model (docs/architecture.md §4, paper §5.1 and Fig. 4).
//
// Every link (a host's uplink, a host's downlink, or an explicit topology
// link) has a piecewise-constant *residual* capacity over time: the
// monitor's measurement minus the reservations made so far. A transfer
// started at `t0` moves its bytes at its path's residual bottleneck rate at
// every instant ("fills the residual", Fig. 4(b)); `t_en` is when its last
// byte arrives. `NetUp` (Fig. 4(c)) subtracts that rate profile from every
// link of the path. With the default congestion-free core (§7.4) a path is
// the source uplink plus the destination downlink.
//
//   Network net = Network::FromBatch(batch).value();
//   Path path = net.PathBetween(net.HostIndex("w1"), net.HostIndex("s1"));
//   FillResult fill = net.Fill(path, batch.now_s, 8.0 * bytes);
//   net.Reserve(path, fill.segments);             // NetUp
//
// A transfer whose source and destination are the same host crosses no
// link (docs/architecture.md §5: the daemon hands it over in shared memory and the
// planner charges no NIC for it): its path is empty and it moves at
// kLocalCopyBps from its start, reserving nothing. Charging it to the
// host's uplink and downlink instead made the planner halve a root's
// incoming rate for its own contribution and route that contribution
// through another host's aggregator (three crossings instead of none).
//
// Undo: `BeginJournal()` makes every later change recordable so that
// `RollbackTo(mark)` restores the exact previous state (bit for bit); the
// optimised Alg. 3 uses this instead of copying the network per split point.
//
// Thread safety: a Network is a plain value; concurrent const use is safe,
// mutation needs exclusive access. Copy it to give each thread its own.
#ifndef MLFABRIC_SCHEDULER_CORE_NETWORK_H_
#define MLFABRIC_SCHEDULER_CORE_NETWORK_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/core/types.h"

namespace mlfabric::core {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The rate of a same-host transfer (an empty path): a copy in memory. A
// conservative figure for one core's memcpy plus the receive side's sum
// (memcpy alone measured 8.5 GB/s on the 2-core test machine).
inline constexpr double kLocalCopyBps = 5e10;

// One link's residual capacity: `rates_bps[k]` holds on
// [times_s[k], times_s[k+1]); the last rate holds for ever. times_s[0] is the
// batch's `now_s`: nothing before it can be scheduled.
struct LinkProfile {
  std::vector<double> times_s;
  std::vector<double> rates_bps;
  // Every segment before this index has zero residual (a skip pointer: the
  // saturated prefix only grows as reservations are added).
  size_t first_open = 0;

  double RateAt(double t) const;
};

// The link ids a transfer crosses: at most kMaxLinks, stored inline (paths
// are built in the planners' innermost loops; no allocation).
class LinkList {
 public:
  // A streaming chain's path holds every hop's links (aggregation.h).
  static constexpr int kMaxLinks = 24;
  void push_back(int id) { ids_[size_++] = id; }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int operator[](int i) const { return ids_[i]; }
  const int* begin() const { return ids_; }
  const int* end() const { return ids_ + size_; }

 private:
  int ids_[kMaxLinks] = {};
  int size_ = 0;
};

struct Path {
  LinkList links;
};

struct FillResult {
  bool feasible = false;  // false: the path never offers enough capacity
  double end_s = kInfinity;
  std::vector<RateSegment> segments;
};

class Network {
 public:
  // Builds the residual network at `batch.now_s` from the hosts' capacities
  // (profiles override constants; before its first point a profile uses the
  // constant, or its first rate when no constant is given) and the optional
  // explicit topology. Fails on unknown link/host names in `paths`.
  static absl::StatusOr<Network> FromBatch(const Batch& batch);

  // -1 when `name` is not a host.
  int HostIndex(const std::string& name) const;
  const std::string& HostName(int host) const { return host_names_[host]; }
  int UplinkOf(int host) const { return 2 * host; }
  int DownlinkOf(int host) const { return 2 * host + 1; }
  // Empty when src_host == dst_host (a copy in memory, see above) and no
  // explicit topology path is given for the pair.
  Path PathBetween(int src_host, int dst_host) const;

  double start_s() const { return start_s_; }
  bool has_fixed_paths() const { return !fixed_paths_.empty(); }
  const LinkProfile& link(int id) const { return links_[id]; }
  int num_links() const { return static_cast<int>(links_.size()); }
  // The highest capacity link `id` offers at any time (an upper bound on any
  // residual rate it will ever have).
  double PeakRate(int id) const { return peak_bps_[id]; }
  // All segments of link `id` before this time have zero residual.
  double OpenFrom(int id) const { return links_[id].times_s[links_[id].first_open]; }

  // t_en of `bits` started at `t0` (Fig. 4(b)); no segments are produced.
  // `reference` walks every link from its first segment instead of using
  // binary search and the skip pointer (the straightforward implementation
  // the benchmark compares against; the result is bit-identical).
  double FillEnd(const Path& path, double t0, double bits, bool reference = false) const;
  // Same walk, also returning the rate segments the transfer would use.
  FillResult Fill(const Path& path, double t0, double bits) const;
  // Same walk writing the segments into `*segments` (cleared first; reusing
  // one buffer avoids an allocation per call). Returns t_en.
  double FillInto(const Path& path, double t0, double bits,
                  std::vector<RateSegment>* segments) const;

  // Bits link `id`'s residual capacity can carry in [from_s, to_s).
  double CapacityBits(int id, double from_s, double to_s) const;

  // NetUp: subtracts `segments` from every link of `path` (residuals are
  // clamped at zero against rounding).
  void Reserve(const Path& path, const std::vector<RateSegment>& segments);
  // The inverse of Reserve: gives `segments` back to every link of `path`.
  void Release(const Path& path, const std::vector<RateSegment>& segments);

  // Journal for exact undo (see the file comment).
  void BeginJournal() { journaling_ = true; }
  size_t JournalMark() const { return journal_.size(); }
  void RollbackTo(size_t mark);
  // Forgets the journal (no mark taken before may be rolled back to).
  void DiscardJournal() { journal_.clear(); }

  // For tests: keep every breakpoint (no MergeZeroRuns), the profiles as
  // they were before runs of zero residual were merged.
  void set_merge_zero_runs(bool merge) { merge_zero_runs_ = merge; }

 private:
  struct JournalEntry {
    enum Kind : uint8_t {
      kRate,      // rates_bps[index] was old_rate
      kInserted,  // a breakpoint was inserted at `index`
      kRemoved,   // breakpoint old_time (rate old_rate) was removed from `index`
    };
    int link;
    Kind kind;
    size_t index;
    double old_rate;
    size_t old_first_open;
    double old_time = 0;
  };

  // Makes `t` a breakpoint of `link` and returns its index; the search
  // starts at segment `hint` when that is at or before t's.
  size_t SplitAt(int link, double t, size_t hint = 0);
  // Removes the breakpoints among indices [lo, hi] of `link` that separate
  // two segments of zero residual. A fill moves nothing in such a run, so
  // one segment serves it as well, to the bit, and the fill walk and later
  // inserts no longer pay for breakpoints that change nothing (a worker's
  // uplink saturated part after part gathered hundreds).
  void MergeZeroRuns(int link, size_t lo, size_t hi);
  void AddRate(const Path& path, const std::vector<RateSegment>& segments, double sign);

  double start_s_ = 0;
  std::vector<std::string> host_names_;
  std::unordered_map<std::string, int> host_index_;
  std::vector<LinkProfile> links_;
  std::vector<double> peak_bps_;
  // Extra links for (src, dst) host pairs with a fixed path.
  std::unordered_map<int64_t, std::vector<int>> fixed_paths_;
  bool journaling_ = false;
  bool merge_zero_runs_ = true;
  std::vector<JournalEntry> journal_;
};

// Bits moved by `segments` (sum of rate x duration).
double SegmentBits(const std::vector<RateSegment>& segments);

// Reservations kept as rate segments (what the service and the simulator
// hold for transfers in flight) turned into the residual profiles a Batch
// carries (HostLink::uplink_profile / downlink_profile).
//
// The sum of the rates of `segments` in force at `t` (a segment holds on
// [from_s, to_s)).
double RateAt(const std::vector<RateSegment>& segments, double t);
// `capacity_bps - reservations` from `now_s` on, as a capacity profile:
// one point per change, never negative, starting at `now_s`.
std::vector<ProfilePoint> ResidualProfile(double capacity_bps, double now_s,
                                          const std::vector<RateSegment>& reserved);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_NETWORK_H_
