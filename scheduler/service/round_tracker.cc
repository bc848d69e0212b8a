#include "scheduler/service/round_tracker.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"

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

// Why `record`'s worker may not contribute to a round opened at membership
// generation `round_state.generation` ("" when it may): the contributors of
// a member-sized round are the members of that generation (a worker that
// joined, or left and joined again, since counts from a later round); an
// elastic AllReduce root's are its ranks, less those that left and came back
// since. The generation of a contribution is its worker's membership when it
// is admitted (JobMembership::JoinedAt), so a push needs no field for it.
std::string NotOfGeneration(const JobState& job, const ServerState& server,
                            const RoundState& round_state, const UpdateRecord& record,
                            int64_t round) {
  const uint64_t generation = round_state.generation;
  const bool members = MemberSizedRounds(job, server);
  const bool ranks = ElasticRanks(job, server) && server.ranks.count(record.worker) > 0;
  if (generation == 0 || (!members && !ranks)) return "";
  const uint64_t joined = job.membership.JoinedAt(record.worker);
  if (joined == 0) {
    return absl::StrCat("not_a_member: worker '", record.worker, "' is no member of job '",
                        record.job, "' (membership generation ", job.membership.generation(),
                        "); round ", round, " sums the members of generation ", generation,
                        "; register it to join from a later round");
  }
  if (joined <= generation) return "";
  return absl::StrCat("stale_generation: worker '", record.worker, "' joined job '", record.job,
                      "' at membership generation ", joined, ", after round ", round,
                      " opened at generation ", generation,
                      "; it counts from the next round it finds open: get round ", round,
                      "'s sum and push round ", round + 1);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

std::string RoundMismatch(const RoundState& round_state, const UpdateRecord& record,
                          int64_t round) {
  const uint64_t id = record.transfer_id;
  if (record.dtype == v1::DTYPE_OPAQUE) {
    return absl::StrCat("a synchronous round sums its pushes: push ", id, " from '",
                        record.worker, "' is opaque bytes; push floats or integers");
  }
  // "mismatch:" lets AllReduce tell callers the inputs differ across ranks.
  if (round_state.bytes >= 0 &&
      (round_state.bytes != record.bytes || round_state.dtype != record.dtype)) {
    return absl::StrCat("mismatch: push ", id, " from '", record.worker, "' has ", record.bytes,
                        " bytes of ", DTypeName(record.dtype), " but round ", round, " sums ",
                        round_state.bytes, " bytes of ", DTypeName(round_state.dtype),
                        " (every rank must pass the same shape and type)");
  }
  if (round_state.shape.has_value() && record.shape.has_value() &&
      *round_state.shape != *record.shape) {
    return absl::StrCat("mismatch: push ", id, " from '", record.worker, "' has shape ",
                        ShapeText(*record.shape), " but round ", round, " sums shape ",
                        ShapeText(*round_state.shape), " from '", round_state.shape_worker,
                        "' (every rank must pass the same shape and type)");
  }
  return "";
}

void OpenRound(const JobState& job, ServerState* server, int64_t round) {
  const int32_t size = RoundSize(job, *server);
  if (size <= 0 || round < server->model_version || round > server->model_version + 1) return;
  RoundState& round_state = server->rounds[round];
  if (round_state.size > 0 || !round_state.failed.empty()) return;
  round_state.size = size;
  round_state.generation = job.membership.generation();
}

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
  // A round keeps the size it opened with: its server's daemon sums every
  // member against it, whatever the membership does meanwhile.
  const int32_t size = round_state.size > 0 ? round_state.size : round_size;
  if (static_cast<int32_t>(round_state.workers.size()) >= size) {
    // With backup workers the round closed without this push (Chen et al.,
    // 2016); without, a surplus worker pushed.
    state->Complete(id, v1::OUTCOME_DROPPED,
                    absl::StrCat("late_for_round: round ", round, " closed with its first ",
                                 size, " pushes; get the round's sum and go on"),
                    0);
    return false;
  }
  if (const JobState* job = state->FindJob(record->job); job != nullptr) {
    const std::string stale = NotOfGeneration(*job, *server, round_state, *record, round);
    if (!stale.empty()) {
      state->Complete(id, v1::OUTCOME_DROPPED, stale, 0);
      return false;
    }
  }
  const std::string mismatch = RoundMismatch(round_state, *record, round);
  if (!mismatch.empty()) {
    const std::string job_name = record->job, server_name = record->server;
    state->Complete(id, v1::OUTCOME_FAILED, mismatch, 0);  // erases *record
    state->FailRound(job_name, server_name, round, mismatch);
    return false;
  }
  if (round_state.size == 0) {
    const JobState* job = state->FindJob(record->job);
    round_state.size = size;
    round_state.generation = job != nullptr ? job->membership.generation() : 0;
  }
  round_state.bytes = record->bytes;
  round_state.dtype = record->dtype;
  if (!round_state.shape.has_value() && record->shape.has_value()) {
    round_state.shape = record->shape;
    round_state.shape_worker = record->worker;
  }
  round_state.workers.insert(record->worker);
  if (server->round_size > 0) server->ranks.insert(record->worker);
  record->round_member = true;
  if (static_cast<int32_t>(round_state.workers.size()) == size) {
    MLF_LOG(DEBUG) << "job " << record->job << ": round " << round << " of server "
                   << record->server << " has its " << size << " pushes (membership generation "
                   << round_state.generation << ")";
  }
  return true;
}

namespace {

// The leaver's pushes not yet admitted to a round of `server_name` fail:
// they would take a survivor's place in a round sized without them.
void FailLeaversPending(ClusterState* state, const std::string& job_name,
                        const std::string& server_name, ServerState* server,
                        const std::string& worker, const std::string& reason) {
  std::vector<uint64_t> ids;
  for (uint64_t id : server->pending) {
    const UpdateRecord* record = state->FindPush(id);
    if (record != nullptr && record->job == job_name && record->worker == worker &&
        !record->round_member) {
      ids.push_back(id);
    }
  }
  for (uint64_t id : ids) {
    auto& pending = server->pending;
    pending.erase(std::remove(pending.begin(), pending.end(), id), pending.end());
    state->Complete(id, v1::OUTCOME_FAILED, reason, 0);
  }
}

// Who can still make `round_state` complete: its pushes in, plus the
// contributors of its generation yet to push that are members still (an
// elastic AllReduce root: its ranks, less those that left).
size_t CanCome(const JobState& job, const ServerState& server, const RoundState& round_state) {
  size_t can_come = round_state.workers.size();
  if (server.round_size > 0) {
    int64_t live = server.round_size - RanksLeft(job, server);
    for (const std::string& w : round_state.workers) live -= job.membership.Contains(w) ? 1 : 0;
    return can_come + static_cast<size_t>(std::max<int64_t>(0, live));
  }
  for (const std::string& member : job.membership.members()) {
    if (round_state.workers.count(member) == 0 &&
        job.membership.JoinedAt(member) <= round_state.generation) {
      ++can_come;
    }
  }
  return can_come;
}

// The rounds of `server` a push is in (admitted or pending) that have not
// failed or got all their pushes, with whether they can still complete
// (CanCome reaches their size).
std::map<int64_t, bool> OpenRounds(const ClusterState& state, const JobState& job,
                                   const ServerState& server) {
  std::map<int64_t, bool> open;
  for (const auto& [round, round_state] : server.rounds) {
    if (round < server.model_version || !round_state.failed.empty() ||
        round_state.workers.empty() ||
        static_cast<int32_t>(round_state.workers.size()) >= round_state.size) {
      continue;
    }
    open[round] = static_cast<int32_t>(CanCome(job, server, round_state)) >= round_state.size;
  }
  for (uint64_t id : server.pending) {
    const UpdateRecord* record = state.FindPush(id);
    if (record == nullptr || record->version < server.model_version) continue;
    auto known = server.rounds.find(record->version);
    // Not announced yet: its size can still go down (ShrinkUnannounced).
    if (known == server.rounds.end() || known->second.workers.empty()) {
      open.emplace(record->version, true);
    }
  }
  return open;
}

// member_loss shrink: round `round` of `server`, announced to its daemon,
// which the pushes in and the contributors left still owe (CanCome) cannot
// fill, closes with those. Its server's daemon is told after every member
// it was announced (the same command stream), so it sums against the new
// size from then on and delivers the sum with that count.
void ShrinkRound(ClusterState* state, const std::string& job_name, const JobState& job,
                 const std::string& server_name,
                 ServerState* server, int64_t round, const std::string& left) {
  RoundState& round_state = server->rounds.at(round);
  const auto size = static_cast<int32_t>(CanCome(job, *server, round_state));
  const std::string reason =
      absl::StrCat(left, "; round ", round, " closes with ", size, " of its ", round_state.size,
                   " pushes (member_loss shrink)");
  MLF_LOG(INFO) << "job " << job_name << ": " << reason;
  round_state.size = size;
  state->Enqueue(server->host, commands::ShrinkRound(server_name, round, job.id, size, reason));
}

// member_loss shrink: the rounds of `server` opened but not yet announced
// to its daemon (no push admitted) are sized by the contributors of their
// generation left (an elastic AllReduce root: its ranks left). Logged as
// ShrinkRound's are, so an operator sees every round that shrank.
void ShrinkUnannounced(const std::string& job_name, const JobState& job,
                       const std::string& server_name, ServerState* server,
                       const std::string& left_why) {
  for (auto& [round, round_state] : server->rounds) {
    if (round < server->model_version || !round_state.failed.empty() ||
        !round_state.workers.empty() || round_state.size <= 0) {
      continue;
    }
    int32_t left = RoundSize(job, *server);
    if (server->round_size == 0) {
      const int64_t backup = job.config.backup_workers;
      left = static_cast<int32_t>(std::max<int64_t>(
          1, static_cast<int64_t>(job.membership.MembersSince(round_state.generation)) - backup));
    }
    if (left < round_state.size) {
      MLF_LOG(INFO) << "job " << job_name << ": " << left_why << "; round " << round
                    << " of server '" << server_name << "', not yet announced, closes with "
                    << left << " of its " << round_state.size << " pushes (member_loss shrink)";
      round_state.size = left;
    }
  }
}

// MemberLeft at one server whose rounds counted `worker`: its pending
// pushes fail, and its open rounds follow the member_loss in force there (a
// server registered with M that is not ElasticRanks: fail, and M is kept).
void SettleRoundsLeft(ClusterState* state, const std::string& job_name, JobState* job,
                      const std::string& name, const std::string& worker,
                      const std::string& left) {
  ServerState& server = job->servers.at(name);
  const bool explicit_size = server.round_size > 0;
  const bool shrink = explicit_size ? ElasticRanks(*job, server)
                                    : job->config.member_loss == MemberLoss::kShrink;
  FailLeaversPending(state, job_name, name, &server, worker, left);
  if (shrink) ShrinkUnannounced(job_name, *job, name, &server, left);
  const int32_t next_size = RoundSize(*job, server);
  for (const auto& [round, can_complete] : OpenRounds(*state, *job, server)) {
    if (!shrink && explicit_size) {
      state->FailRound(
          job_name, name, round,
          absl::StrCat(left, "; server '", name, "' was registered with round size ",
                       server.round_size, " (an AllReduce root), which keeps it unless the "
                       "job's config says \"member_loss\": \"shrink\", so the round fails; "
                       "the next one waits for all ", next_size, " again"));
    } else if (!shrink) {
      state->FailRound(job_name, name, round,
                       absl::StrCat(left, "; the job's member_loss is fail, so the round ",
                                    "fails and the next one has size ", next_size));
    } else if (!can_complete) {
      ShrinkRound(state, job_name, *job, name, &server, round, left);
    }
  }
}

}  // namespace

void MemberJoined(ClusterState* state, const std::string& job_name, const std::string& worker,
                  const std::string& host) {
  JobState* job = state->FindJob(job_name);
  if (job == nullptr ||
      !job->membership.Join(worker, state->NowSeconds(), absl::StrCat("registered on ", host))) {
    return;
  }
  state->stragglers.Rejoin(job_name, worker);
  MLF_LOG(INFO) << "job " << job_name << ": worker " << worker << " joined on " << host
                << "; membership generation " << job->membership.generation() << ", "
                << job->membership.size() << " member(s)";
}

void MemberLeft(ClusterState* state, const std::string& job_name, const std::string& worker,
                const std::string& why) {
  JobState* job = state->FindJob(job_name);
  if (job == nullptr || !job->membership.Leave(worker, state->NowSeconds(), why)) return;
  state->stragglers.Leave(job_name, worker);  // out of the job's median, clock kept
  const uint64_t generation = job->membership.generation();
  MLF_LOG(WARNING) << "job " << job_name << ": worker " << worker << " left (" << why
                   << "); membership generation " << generation << ", "
                   << job->membership.size() << " member(s)";
  const std::string left = absl::StrCat("worker '", worker, "' left the job (", why,
                                        ") at membership generation ", generation);
  std::vector<std::string> servers;
  for (const auto& [name, server] : job->servers) {
    // A server registered with M: only where the leaver is one of its ranks.
    if (MemberSizedRounds(*job, server) || server.ranks.count(worker) > 0) {
      servers.push_back(name);
    }
  }
  for (const std::string& name : servers) {
    SettleRoundsLeft(state, job_name, job, name, worker, left);
  }
}

void MembersOnHostLeft(ClusterState* state, const std::string& host, const std::string& why) {
  std::vector<std::pair<std::string, std::string>> leaving;  // job, worker
  for (const auto& [job_name, job] : state->jobs()) {
    for (const std::string& member : job.membership.members()) {
      auto info = job.workers.find(member);
      if (info != job.workers.end() && info->second.host == host) {
        leaving.emplace_back(job_name, member);
      }
    }
  }
  for (const auto& [job_name, worker] : leaving) {
    MemberLeft(state, job_name, worker, absl::StrCat("its host ", host, " is down: ", why));
  }
}

}  // namespace mlfabric
