// Elastic launching in mlfabric-run (Horovod's `horovodrun --min-np/--max-np
// --host-discovery-script`): which ranks run where as a discovery script's
// host list changes. Pure: the launcher (tools/run/elastic.h) runs the
// script, starts and stops the processes and keeps the time; this class
// decides.
//
//   ElasticPlan plan(ElasticLimits{/*min_np=*/2, /*max_np=*/4});
//   plan.SetHosts({{"n1", 2}, {"n2", 2}});   // no rank to stop
//   plan.Fill();           // ranks 0, 1 on n1 (slots 0, 1), 2, 3 on n2
//   plan.SetHosts({{"n1", 2}});              // stop ranks 2, 3 (n2 vanished)
//   plan.Exited(2, 143, /*stopped=*/true);   // rank 2 freed
//   plan.SetHosts({{"n1", 2}, {"n2", 2}});
//   plan.Fill();           // rank 2 on n2 slot 0; rank 3 once it has exited
//
// Ranks are numbers a process keeps for its life. A rank that starts takes
// the lowest number no live process holds (a replacement takes the number
// its predecessor freed); its size is the number of ranks alive once the
// batch it starts in has started. A slot is (host, index < slots); a rank
// holds its number and its slot until its process has exited, so a number
// is never held by two processes at once.
//
// A rank that exits non-zero, not stopped by the launcher, is a failure of
// its host; at `host_failure_limit` failures the host is blacklisted for
// the rest of the job: it counts as not listed from the next SetHosts on
// (its ranks stop, none starts there again; Horovod blacklists a host at
// its first failure). A rank that exits 0 is done: the job is then
// finishing -- no rank starts or is replaced -- and ends when none is left,
// with 0, or with the code of the first rank that failed meanwhile.
//
// Thread safety: none.
#ifndef MLFABRIC_TOOLS_RUN_ELASTIC_PLAN_H_
#define MLFABRIC_TOOLS_RUN_ELASTIC_PLAN_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/run/hosts.h"

namespace mlfabric::run {

// A discovery script's output, Horovod's format: one `host` or `host:slots`
// a line (slots >= 1, default 1); blank lines and '#' comments are skipped.
// An error names `script` and the line. An empty list is valid (no host now).
absl::StatusOr<std::vector<HostfileEntry>> ParseDiscoveryOutput(const std::string& text,
                                                                const std::string& script);

struct ElasticLimits {
  int min_np = 1;
  int max_np = 1 << 20;  // default: every slot
  int host_failure_limit = 3;
};

// A rank to start.
struct RankStart {
  int rank = 0;
  std::string host;
  int slot = 0;        // 0-based
  int host_slots = 1;  // the host's slots now
  int size = 1;        // ranks alive once this batch has started
  int local_size = 1;  // ranks alive on its host once this batch has started
  bool host_appeared = false;  // no rank has started on its host since it was listed
};

// A rank to stop, and why (its host vanished, or lost the rank's slot).
struct RankStop {
  int rank = 0;
  std::string host;
  bool host_vanished = true;
};

class ElasticPlan {
 public:
  explicit ElasticPlan(ElasticLimits limits) : limits_(limits) {}

  // The hosts listed now (blacklisted ones are ignored). Returns the ranks
  // whose host or slot is gone; they are marked stopping (not counted as
  // running) until Exited.
  std::vector<RankStop> SetHosts(const std::vector<HostfileEntry>& hosts);

  // The ranks to start in free slots, in host order, lowest free numbers
  // first, up to max_np alive; none if the job is finishing or if alive
  // ranks plus the ones that could start are fewer than min_np. They are
  // recorded as running.
  std::vector<RankStart> Fill();

  // Rank `rank`'s process exited with `code`; `stopped`: the launcher
  // stopped it. Returns what happened, for the launcher's progress line
  // ("rank 3 on n2 exited with 1: failure 1 of 3 on n2; ...").
  std::string Exited(int rank, int code, bool stopped);

  // Ranks running (not stopping).
  int running() const;
  // Ranks with a process (running or stopping).
  int alive() const { return static_cast<int>(ranks_.size()); }
  bool finishing() const { return finishing_; }
  // Finishing and no process left.
  bool done() const { return finishing_ && ranks_.empty(); }
  // The job's exit code once done().
  int exit_code() const { return exit_code_; }
  // The hosts listed by the last SetHosts, blacklisted ones left out.
  std::vector<std::string> hosts() const;
  bool blacklisted(const std::string& host) const { return blacklist_.count(host) > 0; }
  // The ranks alive on `host`.
  std::vector<int> RanksOn(const std::string& host) const;

 private:
  struct Rank {
    std::string host;
    int slot = 0;
    bool stopping = false;
  };
  ElasticLimits limits_;
  std::vector<HostfileEntry> hosts_;   // listed, not blacklisted, in order
  std::set<std::string> started_hosts_;  // listed hosts a rank has started on
  std::map<int, Rank> ranks_;          // by rank number
  std::map<std::string, int> failures_;
  std::set<std::string> blacklist_;
  bool finishing_ = false;
  int exit_code_ = 0;
};

}  // namespace mlfabric::run

#endif  // MLFABRIC_TOOLS_RUN_ELASTIC_PLAN_H_
