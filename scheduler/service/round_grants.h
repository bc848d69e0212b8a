// Rounds on the previous round's plan. A synchronous round that repeats
// with the same members and sizes (every step of a data-parallel job, every
// AllReduce of a model's gradients) is planned once; from then on each
// member holds a grant for its next round: the transfer id its next push
// will have, and the rate its last plan gave it. The member's daemon sends
// that push as soon as the application makes it, without waiting for the
// scheduler, and names the grant in its SubmitUpdate. The scheduler then
// does not plan the push: it admits it to its round as any push, accounts
// for it on the links at the granted rate from now (later batches plan
// around it), announces it to the round's root (whose daemon sums the
// bytes that came first) and answers with the grant for the round after.
//
// This departs from planning every batch (mlfabric.md §4) in one way: a
// granted push's rate is its last plan's, not one computed against what
// the links carry now. A grant is therefore given only while that plan
// still describes the network: the member's uplink and the root's downlink
// within SchedulerConfig::round_grant_change of the capacities the plan
// saw, and the job's membership generation unchanged. Otherwise the next
// round is planned, and its plan gives the grants after it. A round whose
// membership changes under its grants ends by the round tracker's rules;
// a push whose bytes left on a grant but that ends before it is announced
// (dropped, failed, or naming a grant this scheduler did not give, as after
// a restart) has those bytes discarded at the root (DiscardGranted).
//
// Not for rounds with backup workers (the root must know which pushes a
// round closed with before their bytes count), server groups, servers
// with a replica, or exchange servers.
//
//   // dispatching a round member's planned transfer:
//   send.next_round = IssueRoundGrant(&state, config, job, name, &server, record, rate, address);
//   // SubmitUpdate naming a grant:
//   if (TakeRoundGrant(&server, request, &grant, &why)) { ...admit...; DispatchGranted(...); }
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_ROUND_GRANTS_H_
#define MLFABRIC_SCHEDULER_SERVICE_ROUND_GRANTS_H_

#include <optional>
#include <string>

#include "proto/scheduler.pb.h"
#include "scheduler/service/cluster_state.h"
#include "scheduler/service/scheduler_config.h"

namespace mlfabric {

// Whether `server_name`'s rounds may run on grants (see the file comment).
bool GrantsAllowed(const SchedulerConfig& config, const JobState& job,
                   const std::string& server_name, const ServerState& server);

// The grant for `record`'s worker's next round (record.version + 1), whose
// transfer its plan sends to the server's host at `rate_bps` on average:
// kept in server->grants (replacing the worker's earlier one) and returned
// for the worker's daemon. Nullopt when the rounds may not run on grants,
// the rate is unusable, or a link's capacity has moved more than
// round_grant_change away from `planned` (the grant the push itself came
// on, whose plan is being reused; null for a push just planned).
std::optional<v1::RoundGrant> IssueRoundGrant(ClusterState* state, const SchedulerConfig& config,
                                              const JobState& job, const std::string& server_name,
                                              ServerState* server, const UpdateRecord& record,
                                              double rate_bps, const std::string& dst_address,
                                              const IssuedGrant* planned = nullptr);

// A SubmitUpdate naming grant request.granted_transfer_id(): true with the
// grant taken out of server->grants when it is the worker's grant for this
// round, of these bytes, from this host; otherwise false with `why`.
bool TakeRoundGrant(ServerState* server, const v1::SubmitUpdateRequest& request,
                    IssuedGrant* grant, std::string* why);

// `record`, a push sent on `grant` and admitted to its round: in flight from
// `now_s` at the grant's rate (its reservation for later batches), with its
// deadline as a planned round member's, and announced to the root's daemon.
// Returns the worker's grant for the round after (nullopt: it is planned).
std::optional<v1::RoundGrant> DispatchGranted(ClusterState* state, const SchedulerConfig& config,
                                              const JobState& job, const std::string& server_name,
                                              ServerState* server, UpdateRecord* record,
                                              const IssuedGrant& grant, double now_s);

// The bytes of push `transfer_id`, sent on a grant to `server_name`'s host,
// are of no use (the push ended before it was announced there): its daemon
// erases them and refuses the rest.
void DiscardGranted(ClusterState* state, const ServerState& server,
                    const std::string& server_name, uint64_t transfer_id,
                    const std::string& reason);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_ROUND_GRANTS_H_
