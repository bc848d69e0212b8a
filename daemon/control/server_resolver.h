// ServerResolver: where a job's server lives (its host, data address, job
// id and round size), as the scheduler's ResolveServer says, remembered for
// a short while so that a worker's gets do not each cost a scheduler round
// trip (an AllReduce of 1,024 floats takes a few ms in all).
//
//   ServerResolver resolver(scheduler, clock, /*ttl_s=*/1.0);
//   v1::ResolveServerReply where;
//   RETURN_IF_ERROR(resolver.Resolve(job, server, &where));
//   ... a get to where.data_address() fails:
//   resolver.Forget(job, server);   // the next get asks the scheduler again
//
// An answer is used for at most ttl_s; a get that fails forgets it; Clear()
// forgets every answer (the daemon calls it when the scheduler restarted,
// which may number jobs differently). So a server that moved costs at most
// the gets that were already on their way to its old host, as it would
// without the cache. Errors are the scheduler's, unchanged, and are not
// remembered.
//
// Thread safety: every method may be called from any thread (own lock, a
// leaf; the RPC is made without it).
#ifndef MLFABRIC_DAEMON_CONTROL_SERVER_RESOLVER_H_
#define MLFABRIC_DAEMON_CONTROL_SERVER_RESOLVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/control/scheduler_client.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class ServerResolver {
 public:
  // `scheduler` and `clock` must outlive the resolver; ttl_s = 0 asks the
  // scheduler every time.
  ServerResolver(SchedulerClient* scheduler, const Clock* clock, double ttl_s);

  absl::Status Resolve(const std::string& job, const std::string& server,
                       v1::ResolveServerReply* where);
  void Forget(const std::string& job, const std::string& server);
  void Clear();

  // Scheduler calls made (for tests and the daemon's counters).
  int64_t calls() const;

 private:
  struct Entry {
    v1::ResolveServerReply where;
    double until_s = 0;
  };

  SchedulerClient* const scheduler_;
  const Clock* const clock_;
  const double ttl_s_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Clear() bumps it
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_CONTROL_SERVER_RESOLVER_H_
