// Daemon: The control plane: the schedule stream and the commands on it (DESIGN.md §3 step 3).
#include "daemon/daemon.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <cerrno>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <deque>
#include <functional>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregator/reduce.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/transport/framing.h"

#include "daemon/daemon_internal.h"

namespace mlfabric {

// ---------------------------------------------------------------- control

void Daemon::ScheduleStreamLoop() {
  while (!stopping_.load()) {
    v1::StreamSchedulesRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_host(config_.host);
      request.set_incarnation(incarnation_);
    }
    std::shared_ptr<daemon::ScheduleStream> stream = scheduler_->StreamSchedules(request);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = stream;
      if (stopping_.load()) stream->Cancel();  // Stop() ran before the stream was known
    }
    v1::DaemonCommand command;
    while (stream->Read(&command)) HandleCommand(command);
    absl::Status status = stream->Finish();
    if (stopping_.load()) break;
    MLF_LOG(WARNING) << "lost the scheduler's schedule stream: " << daemon::RpcErrorText(status)
                     << "; its plans end here, and the pushes in flight wait for the "
                     << "scheduler's word once this daemon has registered again";
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Pushes in flight stay in doubt: the scheduler this daemon registers
      // with next tells their outcomes (issue 16 item 4). Their bytes stop
      // here; pushes still being submitted fail when their SubmitUpdate does.
      send_->DropAll();
      // Nothing planned by the scheduler that is gone is applied from now
      // on, so what the servers' applications applied (applied_log_) is
      // final for the pushes of its plans. Deliveries already handed over
      // are reported as such.
      size_t cancelled = 0;
      KeepHeldCopiesLocked();
      for (const auto& [key, endpoint] : servers_) {
        cancelled += delivery_.CancelAll(key, "the scheduler that planned it is gone").size();
        daemon::RoundTable::Effects fx;
        rounds_.FailServer(key, "the scheduler that planned the round is gone", &fx,
                           /*spare_delivering=*/true);
        ApplyRoundEffectsLocked(fx);
      }
      if (cancelled > 0) {
        MLF_LOG(WARNING) << "cancelled " << cancelled << " expected update(s) of the lost schedule";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (auto status = RegisterHost(); !status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const daemon::PushTable::Push& push : pushes_.TakeAllSubmitted()) {
        v1::LocalMessage done;
        done.mutable_push_done()->set_request_id(push.request_id);
        done.mutable_push_done()->set_outcome(v1::OUTCOME_FAILED);
        done.mutable_push_done()->set_reason(absl::StrCat(
            "the daemon lost its connection to the scheduler and could not register again: ",
            status.message()));
        (void)push.app->channel->Send(done);
      }
      fatal_ = status;
      cv_.notify_all();
      return;
    }
    // The scheduler may have restarted: registered applications register again.
    const std::vector<std::shared_ptr<AppSession>> apps = apps_->Sessions();
    for (const auto& app : apps) {
      if (!app->registered) continue;
      v1::RegisterEntityRequest entity =
          internal::EntityRequest(config_.host, app->uid, app->registration);
      if (app->role == v1::ROLE_SERVER) {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto version = server_versions_.find(ServerKey(app->job_id, app->name));
            version != server_versions_.end()) {
          entity.set_model_version(version->second);
        }
      }
      v1::RegisterEntityReply reply;
      if (scheduler_->RegisterEntity(entity, &reply).ok() && !reply.job_data_key().empty()) {
        data_keys_.SetJobKey(reply.job_id(), reply.job_data_key());
      }
    }
  }
}

void Daemon::HandleCommand(const v1::DaemonCommand& command) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend:
      // A push's commands may overtake its SubmitUpdate reply.
      // A group push's part names the push as its source.
      pushes_.Adopt(command.send().part() ? command.send().source_transfer_id()
                                          : command.send().transfer_id(),
                    command.send().local_id());
      ScheduleSendLocked(command.send());
      break;
    case v1::DaemonCommand::kAggregate:
      StartAggregationLocked(command.aggregate());
      break;
    case v1::DaemonCommand::kPromote:
      PromoteReplicaLocked(command.promote());
      break;
    case v1::DaemonCommand::kJobKey:
      data_keys_.SetJobKey(command.job_key().job_id(), command.job_key().key());
      break;
    case v1::DaemonCommand::kExpect: {
      const v1::ExpectDelivery& expect = command.expect();
      if (expect.round_size() > 0) {
        JoinRoundLocked(expect);
        break;
      }
      const std::string key = ServerKey(expect.job_id(), expect.server());
      const ServerEndpoint& endpoint = servers_[key];
      if (endpoint.app == nullptr) {
        delivery_.Expect(key, expect, "server application is not connected");
        reporter_->ReportFailure(expect.transfer_id(),
                                 absl::StrCat("server '", expect.server(), "' is not connected to ",
                                              config_.host, "'s daemon"));
      } else {
        delivery_.Expect(key, expect);
        if (expect.group_push() != 0 && expect.held()) unready_parts_[expect.transfer_id()] = key;
      }
      TryDeliverLocked(expect.job_id(), expect.server());
      break;
    }
    case v1::DaemonCommand::kRelease: {
      // The server applied the push of this held replica copy, or every
      // shard has its part of this group push.
      const v1::ReleaseDelivery& release = command.release();
      unready_parts_.erase(release.transfer_id());
      auto incoming = incoming_.find(release.transfer_id());
      const bool whole = incoming != incoming_.end() &&
                         incoming->second.received >= incoming->second.total;
      if (release.cancel_if_incomplete() && !whole) {
        // Its source went away before sending it all: it never will.
        const std::string why = "its source went away before all its bytes arrived";
        if (std::optional<v1::ExpectDelivery> cancelled =
                delivery_.CancelTransfer(release.sequence(), release.transfer_id(), why)) {
          incoming_.erase(release.transfer_id());
          reporter_->ReportFailure(release.transfer_id(), why);
          TryDeliverLocked(cancelled->job_id(), cancelled->server());
        }
        break;
      }
      if (std::optional<v1::ExpectDelivery> released =
              delivery_.Release(release.sequence(), release.transfer_id())) {
        TryDeliverLocked(released->job_id(), released->server());
      }
      break;
    }
    case v1::DaemonCommand::kCancel: {
      const v1::CancelDelivery& cancel = command.cancel();
      if (cancel.release_hold()) {
        (void)pushes_.TakeHeld(cancel.transfer_id());
        break;
      }
      if (orphan_copies_.erase(cancel.transfer_id()) > 0) {  // its push did not apply
        MLF_LOG(INFO) << "dropping held replica copy " << cancel.transfer_id() << ": "
                      << cancel.reason();
        incoming_.erase(cancel.transfer_id());
      }
      if (cancel.fail_round()) {
        daemon::RoundTable::Effects fx;
        rounds_.Fail(ServerKey(cancel.job_id(), cancel.server()), cancel.round(), cancel.reason(),
                     &fx);
        ApplyRoundEffectsLocked(fx);
        break;
      }
      {
        daemon::RoundTable::Effects fx;
        const bool member = rounds_.FailMemberRound(cancel.transfer_id(), cancel.reason(), &fx);
        ApplyRoundEffectsLocked(fx);
        if (member) break;
      }
      if (aggregations_.Active(cancel.transfer_id())) {
        DropAggregationLocked(cancel.transfer_id(), cancel.reason());
        break;
      }
      unready_parts_.erase(cancel.transfer_id());
      if (std::optional<v1::ExpectDelivery> cancelled =
              delivery_.CancelTransfer(cancel.sequence(), cancel.transfer_id(), cancel.reason())) {
        incoming_.erase(cancel.transfer_id());
        // Skipped before the application had it: it will not be applied.
        if (cancel.confirm()) reporter_->ReportFailure(cancel.transfer_id(), cancel.reason());
        TryDeliverLocked(cancelled->job_id(), cancelled->server());
      }
      // Not found: handed over already; the acknowledgement answers.
      break;
    }
    case v1::DaemonCommand::kOutcome: {
      const v1::PushOutcome& outcome = command.outcome();
      pushes_.Adopt(outcome.transfer_id(), outcome.local_id());
      std::optional<daemon::PushTable::Push> push =
          pushes_.TakeForOutcome(outcome.transfer_id(), outcome.hold_for_replica());
      if (!push.has_value()) break;
      v1::LocalMessage done;
      v1::LocalPushDone* body = done.mutable_push_done();
      body->set_request_id(push->request_id);
      body->set_outcome(outcome.outcome());
      body->set_reason(outcome.reason());
      body->set_applied_version(outcome.applied_version());
      body->set_delay(outcome.delay());
      (void)push->app->channel->Send(done);
      break;
    }
    default:
      MLF_LOG(WARNING) << "ignoring an unknown command from the scheduler";
  }
}

}  // namespace mlfabric
