// LocalRoundSums: a synchronous round's sum read by an application on the
// host that sums it, without a socket (Mercury PS, mercury.md §IV Key idea
// 3; the root rank of an AllReduce, mlfabric.md §6).
//
// The asking side of gets (ModelFetcher) uses it when the scheduler says
// the round's server lives on this host: instead of a data session to its
// own daemon, whose reply would cross loopback TCP, it waits for the sum
// here and gets a copy of it in a buffer of its own.
//
//   int64_t version; std::shared_ptr<SharedBuffer> sum;
//   RETURN_IF_ERROR(local->AwaitSum(job_id, "root", round, &version, &sum));
//
// Thread safety: implementations are called from any thread.
#ifndef MLFABRIC_DAEMON_ENGINE_LOCAL_ROUND_SUMS_H_
#define MLFABRIC_DAEMON_ENGINE_LOCAL_ROUND_SUMS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

class LocalRoundSums {
 public:
  virtual ~LocalRoundSums() = default;
  // Round `round` of server `server` of job `job` (on this host): once its
  // sum is complete, a copy of it in `*sum` and the version it yields in
  // `*version`, and (if `contributions` is not null) the pushes it sums.
  // The same errors, in the same words, as a get of the round from another
  // host.
  virtual absl::Status AwaitSum(uint32_t job, const std::string& server, int64_t round,
                                int64_t* version, std::shared_ptr<SharedBuffer>* sum,
                                uint32_t* contributions) = 0;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_LOCAL_ROUND_SUMS_H_
