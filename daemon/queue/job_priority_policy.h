// Job priority across co-located jobs (TensorLights, tensorlights.md §IV).
//
// Several jobs' parameter servers may share one host NIC. TensorLights
// (§IV-B) gives each job's model-update traffic a distinct priority so that
// the workers of one job are not turned into stragglers by contention with
// another job; the daemon's queue applies that job priority ABOVE Mercury's
// per-tensor priority. Three modes (docs/architecture.md §5):
//
//   kFifo  No job priority: every job has rank 0, so jobs compete only
//          through their tensor priorities and, at equal tensor priority,
//          by arrival order (the "stop sign" of §IV-C: ties broken by
//          arrival time). This is the paper's FIFO baseline for job traffic;
//          Mercury's tensor priority (mercury.md §IV-A key idea 2) is kept
//          because it is a property of each transfer, not of the job mix.
//   kOne   TLs-One (§IV-B): a static ranking, recomputed only when a job
//          arrives or departs. Jobs are ranked by an explicit `rank_key`
//          (lower key = higher priority; e.g. the job's model-update size,
//          which §IV-B suggests so small jobs are not blocked by large ones),
//          ties by arrival order.
//   kRr    TLs-RR (§IV-C): the kOne ranking rotated every `rotation_period_s`
//          (default 20 s, §V): at rotation k the job at base position i gets
//          rank (i - k) mod n, so the top job drops to the bottom each
//          period and every job is on top once every n periods.
//
// Time is a parameter (`now_s`, any monotonic time base; the caller decides
// which). Rotation counts from `epoch_s` and is NOT reset by job arrival or
// departure: resetting it on every arrival would let a stream of arrivals
// keep the same job on top forever (starvation), which §IV-C's fairness
// argument rules out.
//
//   JobPriorityPolicy policy({JobPriorityMode::kRr, /*rotation_period_s=*/20,
//                             /*epoch_s=*/0});
//   policy.AddJob(7);
//   policy.AddJob(9);
//   policy.RankOf(7, /*now_s=*/5);   // 0: job 7 first during [0, 20)
//   policy.RankOf(7, /*now_s=*/25);  // 1: job 9 first during [20, 40)
//
// Thread safety: none; a policy is owned by one PriorityPacketQueue or one
// caller and used from one thread (const methods may be called
// concurrently if nothing mutates).
#ifndef MLFABRIC_DAEMON_QUEUE_JOB_PRIORITY_POLICY_H_
#define MLFABRIC_DAEMON_QUEUE_JOB_PRIORITY_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlfabric::daemon {

using JobId = uint64_t;

enum class JobPriorityMode { kFifo, kOne, kRr };

// "fifo", "one", "rr" (the names used in configs and on command lines).
absl::StatusOr<JobPriorityMode> ParseJobPriorityMode(absl::string_view name);
const char* JobPriorityModeName(JobPriorityMode mode);

struct JobPriorityOptions {
  JobPriorityMode mode = JobPriorityMode::kFifo;
  // kRr only: length of one rotation period, seconds. Must be > 0.
  double rotation_period_s = 20.0;
  // kRr only: the time rotation 0 starts.
  double epoch_s = 0.0;
};

class JobPriorityPolicy {
 public:
  // Rank 0 is the highest priority.
  using Rank = uint32_t;

  explicit JobPriorityPolicy(JobPriorityOptions options = {});

  // Validates options (positive finite rotation period for kRr).
  static absl::StatusOr<JobPriorityPolicy> Create(JobPriorityOptions options);

  // Registers a job (job arrival). `rank_key`: lower = higher priority;
  // ties keep arrival order. Re-ranks the remaining jobs (TLs-One).
  // AlreadyExists if the job is registered.
  absl::Status AddJob(JobId job, double rank_key = 0.0);
  // Job departure; re-ranks. NotFound if unknown.
  absl::Status RemoveJob(JobId job);
  // Changes a registered job's rank_key (its arrival stays) and re-ranks:
  // a job whose priority is set while it runs. NotFound if unknown,
  // InvalidArgument for NaN.
  absl::Status SetRankKey(JobId job, double rank_key);
  bool HasJob(JobId job) const { return base_index_.contains(job); }
  size_t num_jobs() const { return base_order_.size(); }

  // The job's rank at `now_s`; NotFound if unknown. Always 0 in kFifo.
  absl::StatusOr<Rank> RankOf(JobId job, double now_s) const;
  // Same, for a job known to be registered (the queue's hot path). The
  // result for an unregistered job is unspecified (but safe).
  Rank RankOfRegistered(JobId job, double now_s) const;

  // Jobs from highest to lowest priority at `now_s`. In kFifo: arrival
  // order (they all share rank 0).
  std::vector<JobId> Ranking(double now_s) const;

  // kRr: the first time > now_s at which the ranking changes (the next
  // rotation boundary), so a caller can reconfigure NIC classes then.
  // +infinity for kFifo/kOne or fewer than two jobs.
  double NextChangeTime(double now_s) const;

  // Number of whole rotation periods elapsed at now_s (0 before epoch_s,
  // always 0 for non-kRr modes).
  int64_t RotationIndex(double now_s) const;

  const JobPriorityOptions& options() const { return options_; }

 private:
  struct Entry {
    JobId job;
    double rank_key;
    uint64_t arrival;
  };
  void Rebuild();

  JobPriorityOptions options_;
  uint64_t next_arrival_ = 0;
  std::vector<Entry> base_order_;  // sorted by (rank_key, arrival)
  absl::flat_hash_map<JobId, size_t> base_index_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_QUEUE_JOB_PRIORITY_POLICY_H_
