// Server groups (mlfabric.md §10.2): one model split by byte
// ranges across S shard servers, each a server application on any host.
//
// Workers push to and get from the group's name. The group has a
// ServerState of its own (cluster_state.h) whose pending pushes are planned
// as one batch: each push is one core update whose parts go to the shards'
// hosts, reserved together (core §10.2). Dispatch gives the push one
// sequence number of the group and sends one part per shard, each its own
// transfer, announced *held* at its shard. Then:
//
//   every part's bytes in   -> each shard's daemon reports it ready
//   all parts ready         -> released at every shard (ReleaseDelivery)
//   every shard applied it  -> the push is applied (one version, all shards)
//   a part fails before     -> cancelled at every shard: no shard applies
//   the release                it, and the push fails with the part's error
//
// A group aggregate (in-network aggregation of a group's pushes, §5.2 with
// §10.2) is one such unit under an id of its own: each constituent push
// sends each shard's part to the aggregator (a feed), the aggregator sums
// the parts shard by shard and sends each sum to its shard, held there
// under one group sequence number; released when every sum is in, applied
// as `count` updates at every shard, and its pushes end with it (all
// applied, or all failed with the reason).
//
// So every shard applies the same pushes in the same order (the group's
// sequence numbers), with the same versions, and a push is applied at every
// shard or at none. The one exception is documented in README.md ("Server
// groups"): a shard that dies after the release, before applying.
//
//   RETURN_IF_ERROR(RegisterShard(&state, job, request));   // RegisterEntity
//   std::string lacks = GroupIncomplete(state, *job, group); // "" when whole
//   DispatchGroupPush(...);                                  // plan_dispatcher.cc
//   GroupPartReady(&state, part_id);                        // ReportCompletion
//   GroupPartEnded(&state, part_id, applied, version, error);
//
// How a group push or group aggregate ends when something else ends it (a
// push completed, a host down, an aggregate failed) is ClusterState's own
// (cluster_state.h: EndGroupPush, FailGroupAggregate), so that this part
// sits above cluster_state and cluster_state never includes it.
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SERVER_GROUPS_H_
#define MLFABRIC_SCHEDULER_SERVICE_SERVER_GROUPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/scheduler.pb.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// A group push is a part per shard, each planned, sent, held, released
// and reported on its own: the bound keeps one push's control-plane cost
// (about five messages a part) within what a batch can carry. 128 covers
// the 96- and 128-shard layouts docs/results.md measures at 1000 workers.
inline constexpr int kMaxShards = 128;

// Records server `request.name()` as shard request.shard().index of group
// request.shard().group (creating the group's entry on first sight), after
// checking the spec against the shards registered so far: errors name the
// field and the shard it conflicts with.
absl::Status RegisterShard(ClusterState* state, JobState* job,
                           const v1::RegisterEntityRequest& request);

// RegisterEntity's part for a server `request` names: a shard registers
// into its group (RegisterShard); a plain server may not take a group's
// name, nor a shard's without its spec.
absl::Status RegisterServerOfGroups(ClusterState* state, JobState* job,
                                    const v1::RegisterEntityRequest& request);
// " (shard i of S of group 'g', bytes [b, e))" for the log; "" for no shard.
std::string ShardText(const v1::ShardSpec& spec);

// Whether a push of `bytes` bytes (-1: a get) may go to server `name`:
// not to a shard (its group takes it), and to a group only when complete
// and for the whole model. OK for any other server.
absl::Status CheckGroupPush(const ClusterState& state, const JobState& job,
                            const std::string& name, const ServerState& server, int64_t bytes);

// "" when every shard of `group` is registered on a live host and their
// ranges tile [0, total); else what is missing, for an error message.
std::string GroupIncomplete(const ClusterState& state, const JobState& job,
                            const ServerState& group);

// The group's model size (the last shard's end), once complete.
int64_t GroupBytes(const ServerState& group);

// Part `part_id` has all its bytes at its shard: once every part has, they
// are released at every shard.
void GroupPartReady(ClusterState* state, uint64_t part_id);

// Part `part_id` ended at its shard (applied, with the shard's version) or
// failed to move or be applied (with `error`). The push is applied when
// every part is; it fails when one part fails. For a group aggregate the
// part may also be a feed (only its failure is reported), and its
// constituents are applied as consecutive versions ending at the shards'.
void GroupPartEnded(ClusterState* state, uint64_t part_id, bool applied, int64_t version,
                    const std::string& error);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SERVER_GROUPS_H_
