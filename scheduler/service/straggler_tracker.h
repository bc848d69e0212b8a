// StragglerTracker: each worker's recent iteration, transfer and compute
// times, from the timestamps of its pushes, and which workers are
// stragglers (the straggler is what MLfabric is built against,
// mlfabric.md §1).
//
// A worker's iteration ends with its push: the iteration time is the time
// between two consecutive pushes of one worker to one job; the transfer
// time is a push's time from SubmitUpdate to its outcome; the compute time
// is the iteration time less the previous push's transfer time (it
// includes the worker's get of the model: the scheduler does not see
// gets). Each is the median of the last `window` samples. A worker with at
// least `min_samples` iterations is a straggler when its iteration time
// exceeds `factor` times the median of its job's workers' iteration times.
// Iteration counts are the workers' clocks: pushes submitted so far.
//
//   StragglerTracker tracker({.factor = 1.5, .window = 20});
//   tracker.OnPush("job", "rank1", now_s);            // SubmitUpdate accepted
//   tracker.OnOutcome("job", "rank1", submitted_s, now_s);
//   for (const WorkerTiming& w : tracker.Evaluate("job")) if (w.straggler) ...
//
// Thread safety: none (the scheduler service calls it under its lock).
#ifndef MLFABRIC_SCHEDULER_SERVICE_STRAGGLER_TRACKER_H_
#define MLFABRIC_SCHEDULER_SERVICE_STRAGGLER_TRACKER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mlfabric {

struct StragglerOptions {
  double factor = 1.5;  // slower than factor x the job's median: a straggler
  int window = 20;      // samples kept per worker
  int min_samples = 3;  // iterations needed before a worker is judged
};

struct WorkerTiming {
  std::string worker;
  int64_t iterations = 0;   // pushes submitted: the worker's clock
  double iteration_s = 0;   // medians over the window; 0 = no sample yet
  double transfer_s = 0;
  double compute_s = 0;
  double slowdown = 0;      // iteration_s / the job's median; 0 = not judged
  bool straggler = false;
};

class StragglerTracker {
 public:
  explicit StragglerTracker(StragglerOptions options = {});

  void OnPush(const std::string& job, const std::string& worker, double now_s);
  void OnOutcome(const std::string& job, const std::string& worker, double submitted_s,
                 double now_s);
  // The worker left the job (elastic training, JobMembership): it is no
  // longer listed or judged, and its times leave the job's median; its
  // clock (Iterations) and samples are kept for a rejoin.
  void Leave(const std::string& job, const std::string& worker);
  // The worker is a member again: listed and judged as before, and the
  // time it was away is no iteration of its.
  void Rejoin(const std::string& job, const std::string& worker);

  // The job's workers that have not left, by name, with the straggler flags.
  std::vector<WorkerTiming> Evaluate(const std::string& job) const;
  bool IsStraggler(const std::string& job, const std::string& worker) const;
  // The worker's clock: pushes submitted so far (0 before its first).
  int64_t Iterations(const std::string& job, const std::string& worker) const;

 private:
  struct Samples {
    int64_t iterations = 0;
    double last_push_s = -1;
    double last_transfer_s = -1;
    bool left = false;  // Leave: out of the job until Rejoin
    std::deque<double> iteration_s;
    std::deque<double> transfer_s;
    std::deque<double> compute_s;
  };
  void Keep(std::deque<double>* samples, double value) const;

  const StragglerOptions options_;
  std::map<std::pair<std::string, std::string>, Samples> workers_;  // (job, worker)
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_STRAGGLER_TRACKER_H_
