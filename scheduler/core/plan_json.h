// JSON codec for the planner contract of docs/architecture.md §4: a Batch in, a Plan
// out (units: bytes, seconds, bits per second). Used by the `mlfabric-plan`
// CLI and by tests; the service speaks protobuf and does not need it.
//
//   absl::StatusOr<Batch> batch = BatchFromJson(text);
//   if (!batch.ok()) { /* message names the field: "updates[2].bytes: ..." */ }
//   std::string out = PlanToJson(plan).dump(2);
//
// Strictness: inside the objects this codec defines (hosts[], updates[],
// shards[], replica, links[], paths[]) an unknown key is an error that names
// it, because a misspelt optional field would otherwise be silently ignored;
// unknown top-level keys are ignored so that the contract can grow (and a
// batch file may carry comments or expectations for its reader).
// `updates[].tensors` (per-tensor layout, DESIGN §3) is accepted and ignored:
// the core schedules whole updates.
//
// Extensions beyond the §4 contract (all optional): `seed` (uint64, default
// 1), `updates[].shards` ([{"server", "bytes"}], §10.2), `hosts[].
// downlink_profile`, `links` ([{"name", "bps", "profile"}]) and `paths`
// ([{"src", "dst", "links": [...]}]) for an explicit topology, and
// `replica.pending` ([{"id", "worker", "bytes", "norm"}]: updates whose
// replica transfers an earlier plan punted, re-sent ahead of this batch's;
// replication.h). The plan adds
// `transfers[].bytes`, `transfers[].constituents` (aggregates) and
// `stats.aggregation_split`, `stats.replica_divergence`.
//
// Thread safety: pure functions.
#ifndef MLFABRIC_SCHEDULER_CORE_PLAN_JSON_H_
#define MLFABRIC_SCHEDULER_CORE_PLAN_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "scheduler/core/types.h"

namespace mlfabric::core {

// Parses and checks the shape of one batch (types, required fields, ranges
// that JSON decides). Cross-field checks (hosts exist, ...) are
// ValidateBatch's and the planners' job.
absl::StatusOr<Batch> BatchFromJson(const nlohmann::ordered_json& json);
absl::StatusOr<Batch> BatchFromJsonText(const std::string& text);

// The inverse of BatchFromJson (every field written; round-trips exactly).
nlohmann::ordered_json BatchToJson(const Batch& batch);

// The plan exactly as docs/architecture.md §4 lays it out (keys in that order).
nlohmann::ordered_json PlanToJson(const Plan& plan);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_PLAN_JSON_H_
