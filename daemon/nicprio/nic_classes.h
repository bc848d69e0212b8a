// NicClasses: mlfabricd's own TensorLights classes on the host NIC
// (tensorlights.md §IV-B/C, §V; docs/architecture.md §5).
//
// The daemon's queue ranks the jobs whose packets it sends. Traffic of a
// job that does not pass through the daemon (its ranks' MPI sums below the
// AllReduce threshold, a TensorFlow parameter server of its own) meets the
// other jobs' only at the NIC; there TensorLights gives each job an htb
// class by its servers' TCP ports (tc_commands.h). NicClasses installs
// those classes when the daemon starts, ranks the listed jobs as the
// queue does (TLs-One, or TLs-RR rotated every period on the same clock
// and epoch), re-ranks them when the scheduler changes a job's priority
// class (its config, or the admin endpoint), and removes them when the
// daemon stops. A job's base rank is its priority class (0 first), then
// its place in the list.
//
//   NicClasses::Options options;
//   options.nic = {"eth0", /*link_rate_bps=*/25e9};
//   options.jobs = ParseNicJobs("jobA:2222;jobB:3333,3334").value();
//   options.priority = {JobPriorityMode::kRr, /*rotation_period_s=*/20};
//   auto classes = NicClasses::Start(options, &clock);   // installs
//   (*classes)->SetJobClass("jobB", 0);  (*classes)->SetJobClass("jobA", 2);
//   ...                                                  // jobB first now
//   (*classes)->Stop();                                  // removes them
//
// tc runs on a thread of its own (never on the caller's: SetJobClass is
// called under the daemon's receive lock). A tc failure after start-up is
// logged and retried at the next change; it never stops the daemon.
//
// Thread safety: every method may be called from any thread.
#ifndef MLFABRIC_DAEMON_NICPRIO_NIC_CLASSES_H_
#define MLFABRIC_DAEMON_NICPRIO_NIC_CLASSES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/nicprio/tc_commands.h"
#include "daemon/queue/job_priority_policy.h"

namespace mlfabric::nicprio {

class NicClasses {
 public:
  struct Options {
    NicPrioConfig nic;
    std::vector<NicJob> jobs;
    // kOne or kRr (kFifo has nothing to install).
    daemon::JobPriorityOptions priority;
  };
  // Runs a list of tc commands (RunTcAll; tests pass a recorder).
  using Runner = std::function<absl::Status(const std::vector<TcCommand>&)>;

  // Validates `options`, installs the classes in list order and starts
  // the thread that re-ranks them. InvalidArgument naming what is wrong;
  // the runner's error if set-up failed (whatever was installed is removed
  // again). `clock` must outlive the object.
  static absl::StatusOr<std::unique_ptr<NicClasses>> Start(Options options, const Clock* clock,
                                                           Runner run);
  ~NicClasses();  // Stop()

  NicClasses(const NicClasses&) = delete;
  NicClasses& operator=(const NicClasses&) = delete;

  // The scheduler's priority class (0..7, 0 most urgent) of job `name`.
  // False if `name` is not one of the listed jobs (its traffic has no
  // class here); the new ranking is installed shortly after.
  bool SetJobClass(absl::string_view name, int32_t priority_class) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the classes and ends the thread; later calls do nothing.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The job names from first to last as installed now, and how many
  // re-rankings have been installed since start-up.
  std::vector<std::string> Installed() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t rerankings() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& interface() const { return options_.nic.interface; }

 private:
  NicClasses(Options options, daemon::JobPriorityPolicy policy, const Clock* clock, Runner run);
  std::vector<size_t> RankingLocked(double now_s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double RankKey(size_t job, int32_t priority_class) const;
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const Clock* const clock_;
  const Runner run_;
  mutable Mutex mu_;
  CondVar changed_;
  daemon::JobPriorityPolicy policy_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> classes_ ABSL_GUARDED_BY(mu_);  // by job index
  std::vector<size_t> installed_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rerankings_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace mlfabric::nicprio

#endif  // MLFABRIC_DAEMON_NICPRIO_NIC_CLASSES_H_
