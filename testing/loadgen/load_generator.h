// LoadGenerator: many emulated daemons in one process, driving a real
// mlfabric-scheduler over real gRPC with no data plane.
//
// Each emulated host does what mlfabricd does on the control plane
// (proto/scheduler.proto): it registers (with the cluster secret), holds
// one StreamSchedules call, reports bandwidth and syncs its clock
// periodically, and answers the commands it is sent. Workers get the model,
// compute for `period_s` (jittered), push (SubmitUpdate) and get again, as
// an asynchronous parameter-server worker does. A server's host batches the
// gets that arrive while its previous distribution is leaving and asks the
// scheduler for their tree (PlanDistribution), and hands the updates it is
// told to expect to its "application" in sequence order once their planned
// transfers (SendTransfer, AggregateTask: start and rate segments) would
// have ended, reporting each applied (ReportCompletion) or, when cancelled
// with `confirm`, not applied. No bytes move: a transfer takes the time its
// schedule gives it.
//
//   LoadOptions options;
//   options.scheduler_address = "127.0.0.1:50051";
//   options.cluster_secret = secret;
//   options.job_token = token;            // of job `options.job` in the scheduler's config
//   LoadGenerator load(options);
//   RETURN_IF_ERROR(load.Start());        // registered, streaming, pushing
//   sleep(10);
//   load.StopLoad();                      // no new pushes or gets
//   LoadReport report = load.Drain(30);   // every push ended, every get answered?
//   if (!report.Consistent()) Print(report.Problems());
//
// With `shards` > 1 every push target is a server group (mlfabric.md
// §10.2): `shards` shard servers, each on its own host, splitting the model
// by byte ranges. A shard's host reports each held part ready once its
// planned transfer would have ended (CompletionReport.part_ready), applies
// it in sequence order once released (ReleaseDelivery), and answers its
// part of every get; a worker has the model when every shard answered.
// Several jobs in one scheduler: one LoadGenerator each, with distinct
// `host_prefix`es; LoadReport::Add sums their reports.
//
// What it checks (Consistent): every SubmitUpdate and PlanDistribution was
// answered without error, every push ended exactly once (applied, dropped
// or failed), every get was answered, no schedule stream broke, the
// pushes reported applied are exactly those the servers applied, and
// (after Drain) every shard of a group applied as many pushes as the others.
// Thread safety: Start, StopLoad, Drain and Snapshot from one thread.
#ifndef MLFABRIC_TESTING_LOADGEN_LOAD_GENERATOR_H_
#define MLFABRIC_TESTING_LOADGEN_LOAD_GENERATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlfabric::testing {

struct LoadOptions {
  std::string scheduler_address;
  std::string cluster_secret;  // empty: the scheduler does not authenticate hosts
  std::string job = "load";
  std::string job_token;
  int workers = 1000;
  int workers_per_host = 1;
  int servers = 1;             // push targets; worker i pushes to target i % servers
  // 1: each target is one server on its own host. > 1: each target is a
  // server group "ps<i>" of this many shard servers "ps<i>-<j>", each on its
  // own host, splitting the model by byte ranges of whole float32 elements
  // (update_bytes must then be a multiple of 4 and hold >= shards elements).
  int shards = 1;
  std::string host_prefix;     // before every host's name: several jobs in one scheduler
  double period_s = 0.1;       // a worker's compute time between its get and its push
  double jitter = 0.2;         // +- this fraction of period_s, uniformly
  int64_t update_bytes = 100'000'000;
  double link_bps = 10e9;      // every host's NIC, each direction
  // Bandwidth reports (each host, this often) vary the reported rate by up
  // to this fraction below link_bps, so reservations and the network model
  // keep changing as under a real monitor.
  double bandwidth_report_s = 1.0;
  double bandwidth_variation = 0.2;
  double clock_sync_s = 10;    // each host: 3 SyncClock calls this often (mlfabricd's default)
  int driver_threads = 8;      // threads making the hosts' and workers' unary calls
  uint64_t seed = 1;
};

// Counts since Start.
struct LoadReport {
  double elapsed_s = 0;
  int hosts = 0;
  int64_t pushes = 0;           // SubmitUpdate calls
  int64_t submit_errors = 0;
  int64_t applied = 0;          // PushOutcome by outcome
  int64_t dropped = 0;
  int64_t failed = 0;
  int64_t duplicate_outcomes = 0;  // a second outcome for one push
  int64_t unknown_outcomes = 0;    // an outcome for no push of ours
  int64_t without_outcome = 0;     // pushes still open
  std::map<std::string, int64_t> reasons;  // dropped and failed, by reason
  int64_t gets = 0;             // gets requested by workers
  int64_t gets_answered = 0;
  int64_t distributions = 0;    // PlanDistribution calls
  int64_t distribution_errors = 0;
  int64_t delivered = 0;        // pushes the servers applied (constituents counted)
  int64_t delivery_reports = 0; // ReportCompletion calls, applied or not
  int64_t cancelled = 0;        // deliveries cancelled at a server
  int64_t rpcs = 0;             // unary calls made, all kinds
  int64_t rpc_errors = 0;       // of those, failed (other than the counted ones above)
  int64_t commands = 0;         // DaemonCommands received on the streams
  int64_t stream_breaks = 0;    // streams that ended before StopLoad's Drain
  int64_t shard_disagreements = 0;  // after Drain: groups whose shards applied different counts
  std::vector<std::string> errors;  // the first few error texts

  // True when nothing was lost, duplicated or refused (see the header).
  bool Consistent() const;
  // What Consistent() found wrong, one line each.
  std::vector<std::string> Problems() const;
  // Adds another generator's counts (several jobs): sums, and the longer
  // elapsed time; errors are appended.
  void Add(const LoadReport& other);
};

class LoadGenerator {
 public:
  explicit LoadGenerator(LoadOptions options);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  // Registers every host and entity, opens the streams and starts the
  // workers (each first gets the model at a random point of one period).
  absl::Status Start();
  // Workers make no new pushes or gets; outcomes and deliveries go on.
  void StopLoad();
  // After StopLoad: waits up to `timeout_s` until every push has ended and
  // every get was answered, then ends the streams. The final counts.
  LoadReport Drain(double timeout_s);
  // The counts so far.
  LoadReport Snapshot() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTING_LOADGEN_LOAD_GENERATOR_H_
