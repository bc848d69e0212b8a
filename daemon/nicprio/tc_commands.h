// TensorLights host NIC priorities as `tc` command lines (tensorlights.md
// §V "Implementation"; docs/architecture.md §5).
//
// TensorLights enforces job priority on the host running co-located
// parameter servers with Linux htb: each job's PS traffic is mapped to a
// priority band by its TCP port. This kernel has htb and u32 but no prio
// qdisc, so strict priority is built from htb alone:
//
//   tc qdisc add dev IF root handle 1: htb default ff
//   tc class add dev IF parent 1: classid 1:1 htb rate LINK ceil LINK
//   tc class add dev IF parent 1:1 classid 1:10 htb rate MIN ceil LINK prio P0
//   tc class add dev IF parent 1:1 classid 1:11 htb rate MIN ceil LINK prio P1
//   ...
//   tc class add dev IF parent 1:1 classid 1:ff htb rate MIN ceil LINK prio 7
//   tc filter add dev IF parent 1: protocol ip prio 1 u32
//       match ip sport PORT 0xffff flowid 1:10          (and dport)
//
// Every class is guaranteed only MIN (default 1 Mbit/s) and may borrow up
// to the whole link; htb lends spare bandwidth to the lowest `prio` first,
// so the ranking decides whose traffic goes first while staying
// work-conserving (§IV-B "manipulating priority is work-conserving"). The
// job at rank r gets prio min(r, max_bands - 1): "tc only supports a
// limited number of priority bands ... multiple jobs may share the same
// priority band" (§V); prio 7 is kept for unclassified traffic (class ff).
// Job i of the job list always owns class 1:(10+i) (hex), so re-ranking
// (TLs-One on arrival/departure, TLs-RR every T) is only `tc class change`
// of the prio values: filters stay and no packet is misclassified during a
// rotation. Filters match both sport (the PS sending model updates, the
// direction §IV-B regulates) and dport (a worker on this host sending
// gradients to that PS).
//
//   NicPrioConfig config{"eth0", /*link_rate_bps=*/10e9};
//   std::vector<NicJob> jobs = {{"jobA", {2222}}, {"jobB", {3333, 3334}}};
//   auto setup = SetupCommands(config, jobs, /*ranking=*/{1, 0}).value();
//   for (const TcCommand& c : setup) Run(c);        // argv, argv[0] == "tc"
//   ... Run each of RankCommands(config, jobs, {0, 1}).value() to rotate
//   for (const TcCommand& c : TeardownCommands(config)) Run(c);
//
// Pure: builds argv vectors, runs nothing. Thread safety: free functions,
// reentrant.
#ifndef MLFABRIC_DAEMON_NICPRIO_TC_COMMANDS_H_
#define MLFABRIC_DAEMON_NICPRIO_TC_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mlfabric::nicprio {

// argv of one command; argv[0] is "tc".
using TcCommand = std::vector<std::string>;

struct NicPrioConfig {
  std::string interface;
  // Ceiling of every class: the NIC's line rate.
  double link_rate_bps = 10e9;
  // Guaranteed rate of each class; small so priority decides nearly all
  // of the bandwidth.
  double min_rate_bps = 1e6;
  // htb prio values used for jobs: 0 .. max_bands-1 (1..7).
  int max_bands = 7;
};

// A co-located job: its parameter servers' TCP ports on this host.
struct NicJob {
  std::string name;
  std::vector<uint16_t> ports;
};

// The class id ("1:10", "1:11", ...) of job `index` in the job list.
std::string JobClassId(size_t index);
inline constexpr char kDefaultClassId[] = "1:ff";
inline constexpr size_t kMaxJobs = 0xef;

// `ranking` lists job indices (into `jobs`) from highest to lowest
// priority and must be a permutation of 0..jobs.size()-1.
// InvalidArgument (naming the field) for a bad interface name, rates,
// band count, empty or duplicate ports, too many jobs or a bad ranking.
absl::StatusOr<std::vector<TcCommand>> SetupCommands(
    const NicPrioConfig& config, const std::vector<NicJob>& jobs,
    const std::vector<size_t>& ranking);

// Re-prioritises the classes SetupCommands created (same config and jobs).
absl::StatusOr<std::vector<TcCommand>> RankCommands(
    const NicPrioConfig& config, const std::vector<NicJob>& jobs,
    const std::vector<size_t>& ranking);

// Removes everything: deleting the root qdisc drops classes and filters.
std::vector<TcCommand> TeardownCommands(const NicPrioConfig& config);

// Shell-readable form for logs and --dry_run ("tc qdisc add dev ...").
std::string FormatCommand(const TcCommand& command);

// The htb prio of the job at `rank`.
int BandForRank(const NicPrioConfig& config, size_t rank);

}  // namespace mlfabric::nicprio

#endif  // MLFABRIC_DAEMON_NICPRIO_TC_COMMANDS_H_
