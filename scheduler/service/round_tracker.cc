#include "scheduler/service/round_tracker.h"

#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"

namespace mlfabric {

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return "float32";
    case v1::DTYPE_FLOAT64: return "float64";
    case v1::DTYPE_INT32: return "int32";
    case v1::DTYPE_INT64: return "int64";
    case v1::DTYPE_FLOAT16: return "float16";
    case v1::DTYPE_INT8: return "int8";
    case v1::DTYPE_UINT8: return "uint8";
    case v1::DTYPE_INT16: return "int16";
    case v1::DTYPE_UINT16: return "uint16";
    case v1::DTYPE_OPAQUE: return "opaque bytes";
    default: return "an unknown type";
  }
}

namespace {

// Rounds before the previous one can no longer be joined: forget them,
// but remember the last kFailedRoundsKept that failed. A failed round
// moves the server on at once, so a member can arrive after later rounds
// failed too (a host whose ranks passed differing shapes spoils its
// rounds without waiting for them: AllReduce's SpoilRound); it must
// learn why its round failed, not that it is stale.
void ForgetOldRounds(ServerState* server) {
  constexpr size_t kFailedRoundsKept = 64;
  size_t failed_kept = 0;
  const auto joinable = server->rounds.lower_bound(server->model_version - 1);
  for (auto it = std::make_reverse_iterator(joinable); it != server->rounds.rend();) {
    const bool keep = !it->second.failed.empty() && failed_kept < kFailedRoundsKept;
    if (keep) {
      ++failed_kept;
      ++it;
    } else {
      it = std::make_reverse_iterator(server->rounds.erase(std::next(it).base()));
    }
  }
}

// Why `record` cannot join a synchronous round that sums `round_state`'s
// shape and type ("" when it can).
std::string RoundMismatch(const RoundState& round_state, const UpdateRecord& record,
                          int64_t round) {
  const uint64_t id = record.transfer_id;
  std::string mismatch;
  if (record.dtype == v1::DTYPE_OPAQUE) {
    mismatch = absl::StrCat("a synchronous round sums its pushes: push ", id, " from '",
                            record.worker,
                            "' is opaque bytes; push floats or integers");
  } else if (round_state.bytes >= 0 &&
             (round_state.bytes != record.bytes || round_state.dtype != record.dtype)) {
    // "mismatch:" lets AllReduce tell callers the inputs differ across ranks.
    mismatch = absl::StrCat(
        "mismatch: push ", id, " from '", record.worker, "' has ", record.bytes, " bytes of ",
        DTypeName(record.dtype), " but round ", round, " sums ", round_state.bytes,
        " bytes of ", DTypeName(round_state.dtype),
        " (every rank must pass the same shape and type)");
  }
  return mismatch;
}

}  // namespace

bool AdmitToRound(ClusterState* state, ServerState* server, int32_t round_size,
                  UpdateRecord* record) {
  const int64_t round = record->version;
  const uint64_t id = record->transfer_id;
  ForgetOldRounds(server);
  if (auto known = server->rounds.find(round);
      known != server->rounds.end() && !known->second.failed.empty()) {
    state->Complete(id, v1::OUTCOME_FAILED,
                    absl::StrCat("round ", round, " failed: ", known->second.failed), 0);
    return false;
  }
  if (round < server->model_version) {
    state->Complete(id, v1::OUTCOME_DROPPED,
                    absl::StrCat("stale: round ", round, " is over (the server is at version ",
                                 server->model_version, "); get the new sum and push again"),
                    0);
    return false;
  }
  // A worker pushes round v + 1 only after getting round v's sum, which it
  // may have before the scheduler hears that round v is applied.
  if (round > server->model_version + 1) {
    state->Complete(id, v1::OUTCOME_DROPPED,
                    absl::StrCat("future round ", round, ": the server is at version ",
                                 server->model_version,
                                 "; push with the version your last get returned"),
                    0);
    return false;
  }
  RoundState& round_state = server->rounds[round];
  if (round_state.workers.count(record->worker)) {
    state->Complete(id, v1::OUTCOME_DROPPED,
                    absl::StrCat("duplicate: worker '", record->worker,
                                 "' already has a push in round ", round),
                    0);
    return false;
  }
  if (static_cast<int32_t>(round_state.workers.size()) >= round_size) {
    // With backup workers the round closed without this push (Chen et al.,
    // 2016); without, a surplus worker pushed.
    state->Complete(id, v1::OUTCOME_DROPPED,
                    absl::StrCat("late_for_round: round ", round, " closed with its first ",
                                 round_size, " pushes; get the round's sum and go on"),
                    0);
    return false;
  }
  const std::string mismatch = RoundMismatch(round_state, *record, round);
  if (!mismatch.empty()) {
    const std::string job_name = record->job, server_name = record->server;
    state->Complete(id, v1::OUTCOME_FAILED, mismatch, 0);  // erases *record
    state->FailRound(job_name, server_name, round, mismatch);
    return false;
  }
  round_state.bytes = record->bytes;
  round_state.dtype = record->dtype;
  round_state.workers.insert(record->worker);
  record->round_member = true;
  return true;
}

}  // namespace mlfabric
