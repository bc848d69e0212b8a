#include "scheduler/service/in_doubt.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"

namespace mlfabric {
namespace {

// Entries of the servers' applied logs are kept this long (at least) for
// sources that register after their server's host.
constexpr double kAppliedKeepS = 120;

void Tell(ClusterState* state, const InDoubtPush& push, v1::Outcome outcome,
          const std::string& reason, int64_t applied_version) {
  v1::DaemonCommand command =
      commands::PushOutcome(push.transfer_id, push.local_id, outcome, reason);
  if (outcome == v1::OUTCOME_APPLIED) command.mutable_outcome()->set_applied_version(applied_version);
  state->RememberOutcome(push.transfer_id, {outcome, reason, applied_version, 0});
  state->Enqueue(push.src_host, std::move(command));
  if (outcome == v1::OUTCOME_APPLIED) {
    ++state->stats.in_doubt_applied;
  } else {
    ++state->stats.in_doubt_failed;
  }
  MLF_LOG(INFO) << "push " << push.transfer_id << " from " << push.src_host
                << " (in doubt since the stream broke): "
                << (outcome == v1::OUTCOME_APPLIED ? absl::StrCat("applied as version ",
                                                                  applied_version)
                                                   : absl::StrCat("failed: ", reason));
}

void Applied(ClusterState* state, const std::string& host, uint64_t push, int64_t version) {
  state->delivering.erase(push);
  state->applied_elsewhere[push] = {version, state->NowSeconds()};
  // A push this scheduler already ended as not applied: a promise broken.
  if (auto known = state->recent_outcomes.find(push);
      known != state->recent_outcomes.end() && known->second.outcome != v1::OUTCOME_APPLIED) {
    ++state->stats.outcome_contradicted;
    MLF_LOG(ERROR) << "push " << push << " was reported " << v1::Outcome_Name(known->second.outcome)
                   << " (" << known->second.reason << ") but host " << host
                   << "'s server applied it as version " << version;
  }
}

}  // namespace

void AcceptHostReport(ClusterState* state, const v1::RegisterHostRequest& request) {
  for (const v1::AppliedPush& entry : request.applied()) {
    if (entry.acknowledged()) {
      Applied(state, request.host(), entry.transfer_id(), entry.model_version());
    } else if (!state->applied_elsewhere.count(entry.transfer_id())) {
      state->delivering.insert(entry.transfer_id());
    }
  }
  const double now_s = state->NowSeconds();
  for (const v1::InDoubtPush& push : request.in_doubt()) {
    InDoubtPush& doubt = state->in_doubt[push.transfer_id()];
    doubt.transfer_id = push.transfer_id();
    doubt.local_id = push.local_id();
    doubt.src_host = request.host();
    doubt.job = push.job();
    doubt.server = push.server();
    doubt.since_s = now_s;
  }
  if (request.in_doubt_size() > 0) {
    MLF_LOG(WARNING) << "host " << request.host() << " registered with " << request.in_doubt_size()
                     << " push(es) in doubt; the servers' daemons decide them";
  }
}

bool AcceptLateCompletion(ClusterState* state, const v1::CompletionReport& report) {
  std::vector<uint64_t> pushes(report.pushes().begin(), report.pushes().end());
  if (pushes.empty()) pushes.push_back(report.transfer_id());
  bool known = false;
  for (uint64_t push : pushes) {
    known = known || state->in_doubt.count(push) > 0 || state->delivering.count(push) > 0;
  }
  if (!known) return false;
  const int64_t n = static_cast<int64_t>(pushes.size());
  for (int64_t i = 0; i < n; ++i) {
    if (report.applied()) {
      Applied(state, report.host(), pushes[i], report.model_version() - (n - 1 - i));
    } else {
      state->delivering.erase(pushes[i]);
    }
  }
  return true;
}

void ResolveInDoubt(ClusterState* state, double wait_s) {
  const double now_s = state->NowSeconds();
  for (auto it = state->in_doubt.begin(); it != state->in_doubt.end();) {
    const InDoubtPush& push = it->second;
    if (state->updates.count(push.transfer_id)) {  // still live here: ends as usual
      it = state->in_doubt.erase(it);
      continue;
    }
    if (auto told = state->recent_outcomes.find(push.transfer_id);
        told != state->recent_outcomes.end()) {
      // This scheduler ended it; its source did not hear.
      v1::DaemonCommand command = commands::PushOutcome(
          push.transfer_id, push.local_id, told->second.outcome, told->second.reason);
      command.mutable_outcome()->set_applied_version(told->second.applied_version);
      command.mutable_outcome()->set_delay(told->second.delay);
      state->Enqueue(push.src_host, std::move(command));
      it = state->in_doubt.erase(it);
      continue;
    }
    if (auto applied = state->applied_elsewhere.find(push.transfer_id);
        applied != state->applied_elsewhere.end()) {
      Tell(state, push, v1::OUTCOME_APPLIED, "", applied->second.first);
      it = state->in_doubt.erase(it);
      continue;
    }
    if (state->delivering.count(push.transfer_id)) {  // its application's ack decides
      ++it;
      continue;
    }
    std::string why;
    const JobState* job = state->FindJob(push.job);
    const ServerState* server = nullptr;
    if (job != nullptr) {
      if (auto found = job->servers.find(push.server); found != job->servers.end()) {
        server = &found->second;
      }
    }
    if ((push.transfer_id >> kEpochShift) == state->epoch()) {
      why = "this scheduler has no record of it";
    } else if (server != nullptr && state->AliveHost(server->host) != nullptr) {
      why = absl::StrCat("the scheduler restarted while it was in flight, and the daemon of "
                         "server '", push.server, "' on ", server->host,
                         " did not apply it (it cancelled the lost schedule's deliveries); "
                         "push it again");
    } else if (now_s - push.since_s >= wait_s) {
      why = absl::StrCat("the scheduler restarted while it was in flight, and the host of "
                         "server '", push.server, "' did not register with the new scheduler within ",
                         wait_s, " s (in_doubt_wait_s): not applied at any live server");
    } else {
      ++it;
      continue;
    }
    Tell(state, push, v1::OUTCOME_FAILED, why, 0);
    it = state->in_doubt.erase(it);
  }
  const double keep_s = std::max(kAppliedKeepS, 2 * wait_s);
  for (auto it = state->applied_elsewhere.begin(); it != state->applied_elsewhere.end();) {
    it = now_s - it->second.second > keep_s ? state->applied_elsewhere.erase(it) : std::next(it);
  }
}

}  // namespace mlfabric
