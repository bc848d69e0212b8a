// Daemon: the control plane: the schedule stream and the commands on it
// (docs/architecture.md §3 step 3), each handed to the part it is for.
#include "daemon/daemon.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "daemon/daemon_internal.h"

namespace mlfabric {

// ---------------------------------------------------------------- control

void Daemon::ScheduleStreamLoop() {
  while (!stopping_.load()) {
    v1::StreamSchedulesRequest request;
    {
      daemon::ReceiveLock::Hold lock(&lock_);
      request.set_host(config_.host);
      request.set_incarnation(incarnation_);
    }
    std::shared_ptr<daemon::ScheduleStream> stream = scheduler_->StreamSchedules(request);
    {
      daemon::ReceiveLock::Hold lock(&lock_);
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
    registering_.store(true);  // pushes refused meanwhile say why
    app_requests_->RegistrationStarted();  // new pushes wait for the registration
    ScheduleLost();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (auto status = RegisterHost(); !status.ok()) {
      daemon::ReceiveLock::Hold lock(&lock_);
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
      lock.Unlock();
      app_requests_->RegistrationEnded(absl::UnavailableError(absl::StrCat(
          "the daemon lost its connection to the scheduler and could not register again: ",
          status.message())));
      End();
      return;
    }
    // The scheduler may have restarted: registered applications register again.
    const std::vector<std::shared_ptr<AppSession>> apps = apps_->Sessions();
    for (const auto& app : apps) {
      if (!app->registered) continue;
      v1::RegisterEntityRequest entity =
          daemon::EntityRequest(config_.host, app->uid, app->registration);
      if (app->role == v1::ROLE_SERVER) {
        daemon::ReceiveLock::Hold lock(&lock_);
        if (std::optional<int64_t> version =
                servers_->VersionLocked(daemon::ServerKey(app->job_id, app->name))) {
          entity.set_model_version(*version);
        }
      }
      v1::RegisterEntityReply reply;
      if (scheduler_->RegisterEntity(entity, &reply).ok() && !reply.job_data_key().empty()) {
        data_keys_.SetJobKey(reply.job_id(), reply.job_data_key());
      }
    }
    registering_.store(false);
    app_requests_->RegistrationEnded(absl::OkStatus());  // the pushes that waited go now
  }
}

void Daemon::ScheduleLost() {
  // Grants are the lost scheduler's word: pushes are planned again.
  app_requests_->ClearGrants();
  daemon::ReceiveLock::Hold lock(&lock_);
  granted_here_.clear();
  // Pushes in flight stay in doubt: the scheduler this daemon registers
  // with next tells their outcomes. Their bytes stop
  // here; pushes still being submitted fail when their SubmitUpdate does.
  send_->DropAll();
  // Nothing planned by the scheduler that is gone is applied from now on,
  // so what the servers' applications applied (the applied log) is final
  // for the pushes of its plans. Deliveries already handed over are
  // reported as such.
  const size_t cancelled = deliveries_->ScheduleLostLocked("the scheduler that planned it is gone");
  for (const std::string& key : servers_->KeysLocked()) {
    rounds_->FailServerLocked(key, "the scheduler that planned the round is gone",
                              /*spare_delivering=*/true);
  }
  if (cancelled > 0) {
    MLF_LOG(WARNING) << "cancelled " << cancelled << " expected update(s) of the lost schedule";
  }
}

void Daemon::SendGranted(v1::SendTransfer send) {
  v1::DaemonCommand command;
  v1::SendTransfer* granted = command.mutable_send();
  *granted = std::move(send);
  daemon::ReceiveLock::Hold lock(&lock_);
  const double start_s = clock_->NowSeconds() + clock_offset_s_;
  granted->set_start_s(start_s);
  for (v1::RateSegment& segment : *granted->mutable_segments()) {
    segment.set_from_s(start_s + segment.from_s());
    segment.set_to_s(start_s + segment.to_s());
  }
  if (granted->dst_host() == config_.host) {
    pushes_.Adopt(granted->transfer_id(), granted->local_id());
    granted_here_[granted->transfer_id()] = *granted;
    return;
  }
  lock.Unlock();
  HandleCommand(command);
}

void Daemon::HandleCommand(const v1::DaemonCommand& command) {
  std::vector<LocalSend> local;
  ApplyCommand(command, &local);
  // Same-host transfers are taken in without the lock (the receive side
  // takes it per step), in the order their commands came.
  for (LocalSend& send : local) DeliverLocal(send);
}

void Daemon::DeliverLocal(const LocalSend& local) {
  transport::PacketHeader begin;
  begin.kind = transport::PacketKind::kBegin;
  begin.job = local.send.job_id();
  begin.transfer = local.send.transfer_id();
  begin.offset = local.buffer->size();
  absl::Status delivered = receiver_->DeliverLocal(begin, *local.buffer,
                                                   static_cast<uint32_t>(config_.payload_bytes));
  if (!delivered.ok()) {
    MLF_LOG(WARNING) << "transfer " << local.send.transfer_id() << " within " << config_.host
                     << " failed: " << delivered.message();
    reporter_->ReportFailure(local.send.transfer_id(), std::string(delivered.message()));
  }
}

void Daemon::ApplyCommand(const v1::DaemonCommand& command, std::vector<LocalSend>* local) {
  const double received_s = clock_->NowSeconds();
  daemon::ReceiveLock::Hold lock(&lock_);
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend:
      ApplySendLocked(command.send(), received_s, local);
      break;
    case v1::DaemonCommand::kAggregate:
      ApplyAggregateLocked(command.aggregate());
      break;
    case v1::DaemonCommand::kPromote:
      PromoteReplicaLocked(command.promote());
      break;
    case v1::DaemonCommand::kJobKey:
      data_keys_.SetJobKey(command.job_key().job_id(), command.job_key().key());
      break;
    case v1::DaemonCommand::kJobPriority: {
      const v1::JobPriority& priority = command.job_priority();
      if (priority.priority_class() < 0 || priority.priority_class() > 7) {
        MLF_LOG(WARNING) << "job priority command for job " << priority.job_id()
                         << " names class " << priority.priority_class()
                         << ", outside [0, 7]; ignored";
        break;
      }
      // Every job's class comes again with each registration: said only
      // when it changed.
      if (!send_->SetJobPriorityClass(priority.job_id(), priority.priority_class())) break;
      // Re-ranked on its own thread: tc does not run under the receive lock.
      const bool on_nic =
          nic_classes_ != nullptr && nic_classes_->SetJobClass(priority.job(), priority.priority_class());
      MLF_LOG(INFO) << "job " << priority.job_id() << " (" << priority.job()
                    << ") has priority class " << priority.priority_class()
                    << " (ranks co-located jobs under --job_priority=" << config_.job_priority
                    << (on_nic ? ", in the queue and on " + nic_classes_->interface() : "")
                    << ")";
      break;
    }
    case v1::DaemonCommand::kExpect:
      if (command.expect().round_size() > 0) {
        rounds_->JoinLocked(command.expect());
        // A granted member from this host, announced: taken in now.
        if (auto granted = granted_here_.find(command.expect().transfer_id());
            granted != granted_here_.end()) {
          const v1::SendTransfer send = std::move(granted->second);
          granted_here_.erase(granted);
          ApplySendLocked(send, received_s, local);
        }
      } else {
        deliveries_->ExpectLocked(command.expect());
      }
      break;
    case v1::DaemonCommand::kRelease:
      // The server applied the push of this held replica copy, or every
      // shard has its part of this group push.
      deliveries_->ReleaseLocked(command.release());
      break;
    case v1::DaemonCommand::kCancel:
      CancelLocked(command.cancel());
      break;
    case v1::DaemonCommand::kShrinkRound: {
      const v1::ShrinkRound& shrink = command.shrink_round();
      rounds_->ShrinkLocked(daemon::ServerKey(shrink.job_id(), shrink.server()), shrink.round(),
                            shrink.size(), shrink.reason());
      break;
    }
    case v1::DaemonCommand::kSnapshot:
      ApplySnapshotLocked(command.snapshot());
      break;
    case v1::DaemonCommand::kOutcome:
      ApplyOutcomeLocked(command.outcome());
      break;
    default:
      MLF_LOG(WARNING) << "ignoring an unknown command from the scheduler";
  }
}

void Daemon::ApplySendLocked(const v1::SendTransfer& send, double received_s,
                             std::vector<LocalSend>* local) {
  // When the plan arrived (and got the receive lock) against when it
  // lets the bytes go, in this daemon's clock: the push-to-first-packet
  // path, with "submitting push" and "sending transfer".
  const double now_s = clock_->NowSeconds();
  MLF_LOG(DEBUG) << "send command for transfer " << send.transfer_id() << " (local id "
                 << send.local_id() << ") to " << send.dst_host() << " at "
                 << absl::StrFormat("%.6f", received_s) << " (lock after "
                 << absl::StrFormat("%.3f", (now_s - received_s) * 1e3) << " ms)"
                 << ", planned start "
                 << absl::StrFormat("%+.3f", (send.start_s() - clock_offset_s_ - now_s) * 1e3)
                 << " ms from now";
  // A push's commands may overtake its SubmitUpdate reply.
  // A group push's part names the push as its source.
  pushes_.Adopt(send.part() ? send.source_transfer_id() : send.transfer_id(), send.local_id());
  if (send.has_next_round()) {
    // A round member: its next round's push may leave on this plan.
    if (std::optional<daemon::PushTable::Push> push = pushes_.Find(send.transfer_id())) {
      app_requests_->AddGrant(*push->app, push->server, send.next_round());
    }
  }
  ScheduleSendLocked(send, local);
}

void Daemon::ApplyAggregateLocked(const v1::AggregateTask& aggregate) {
  const double now_s = clock_->NowSeconds();
  MLF_LOG(DEBUG) << "aggregate command for transfer " << aggregate.aggregate_id() << " at "
                 << absl::StrFormat("%.6f", now_s) << ", planned start "
                 << absl::StrFormat("%+.3f", (aggregate.start_s() - clock_offset_s_ - now_s) * 1e3)
                 << " ms from now";
  aggregation_->StartLocked(aggregate);
}

void Daemon::ApplySnapshotLocked(const v1::SnapshotToReplica& snapshot) {
  // A snapshot of a local server for its new replica, at a cut in its
  // commit order (engine/replica_snapshots.h).
  if (!servers_->KnownLocked(daemon::ServerKey(snapshot.job_id(), snapshot.server()))) {
    reporter_->ReportFailure(snapshot.transfer_id(),
                             absl::StrCat("server '", snapshot.server(), "' is not on ",
                                          config_.host));
    return;
  }
  snapshots_->AddLocked(snapshot);
  deliveries_->TryDeliverLocked(snapshot.job_id(), snapshot.server());
}

void Daemon::ApplyOutcomeLocked(const v1::PushOutcome& outcome) {
  pushes_.Adopt(outcome.transfer_id(), outcome.local_id());
  std::optional<daemon::PushTable::Push> push =
      pushes_.TakeForOutcome(outcome.transfer_id(), outcome.hold_for_replica());
  if (!push.has_value()) return;
  v1::LocalMessage done;
  v1::LocalPushDone* body = done.mutable_push_done();
  body->set_request_id(push->request_id);
  body->set_outcome(outcome.outcome());
  body->set_reason(outcome.reason());
  body->set_applied_version(outcome.applied_version());
  body->set_delay(outcome.delay());
  // Nobody else here holds the buffer (a sender still writing it, a
  // checksum being computed, a held replica copy): the application may
  // fill it again for its next push instead of making a new one. The
  // application's push_mappings keep a share of the mapping, not of
  // this SharedBuffer, and never touch the bytes: they do not count.
  body->set_buffer_released(push->buffer != nullptr && push->buffer.use_count() == 1);
  (void)push->app->channel->Send(done);
}

void Daemon::CancelLocked(const v1::CancelDelivery& cancel) {
  if (cancel.discard()) {
    // Bytes sent on a round grant for a push that ended before it was
    // announced here: neither summed nor delivered.
    MLF_LOG(INFO) << "discarding transfer " << cancel.transfer_id() << " (sent on a grant): "
                  << cancel.reason();
    incoming_->Discard(cancel.transfer_id());
    granted_here_.erase(cancel.transfer_id());
    return;
  }
  if (cancel.release_hold()) {
    (void)pushes_.TakeHeld(cancel.transfer_id());
    return;
  }
  // A held copy kept across a lost stream whose push did not apply.
  (void)deliveries_->DropHeldCopyLocked(cancel.transfer_id(), cancel.reason());
  if (cancel.fail_round()) {
    rounds_->FailLocked(daemon::ServerKey(cancel.job_id(), cancel.server()), cancel.round(),
                        cancel.reason());
    return;
  }
  if (rounds_->FailMemberLocked(cancel.transfer_id(), cancel.reason())) return;
  if (aggregation_->Active(cancel.transfer_id())) {
    aggregation_->DropLocked(cancel.transfer_id(), cancel.reason());
    return;
  }
  deliveries_->CancelLocked(cancel);
}

void Daemon::ScheduleSendLocked(const v1::SendTransfer& send, std::vector<LocalSend>* local) {
  auto schedule = [&](std::shared_ptr<SharedBuffer> buffer, std::vector<v1::TensorInfo> tensors,
                      std::shared_ptr<const transport::PacketChecksums> checksums) {
    // Same host: no socket, and no pacing (the bytes use no NIC; taken in
    // at once, they are ready no later than the plan says).
    if (send.dst_host() == config_.host && buffer != nullptr && buffer->size() > 0 &&
        static_cast<int64_t>(buffer->size()) == send.bytes()) {
      local->push_back(LocalSend{send, std::move(buffer)});
      return;
    }
    absl::Status scheduled =
        send_->Schedule(send, std::move(buffer), std::move(tensors), std::move(checksums));
    if (!scheduled.ok()) {
      reporter_->ReportFailure(send.transfer_id(), std::string(scheduled.message()));
    }
  };
  // A replica copy (§5.3) sends the bytes of another push of this host.
  const uint64_t source = send.source_transfer_id() != 0 ? send.source_transfer_id()
                                                         : send.transfer_id();
  std::optional<daemon::PushTable::Push> push = pushes_.Find(source);
  // A member of an aggregation on this host (the scheduler sends the task
  // first) is summed here; anything else for this host (a push to a server
  // on it, a group push's part, which is a slice of the buffer) goes
  // through the data plane like any transfer.
  if (push.has_value() && send.dst_host() == config_.host && !send.part() &&
      aggregation_->AggregateOf(send.transfer_id()).has_value()) {
    aggregation_->AcceptLocalLocked(send, push->buffer);
    return;
  }
  if (push.has_value() && send.part()) {
    // A part of a push to a server group (§10.2): its own transfer, of the
    // bytes its shard holds. Copied, so that the part's packets are framed
    // and checksummed as a transfer of their own.
    const uint64_t size = push->buffer->size();
    if (send.part_offset() < 0 || send.bytes() <= 0 ||
        static_cast<uint64_t>(send.part_offset()) + static_cast<uint64_t>(send.bytes()) > size) {
      reporter_->ReportFailure(send.transfer_id(),
                               absl::StrCat("part [", send.part_offset(), ", +", send.bytes(),
                                            ") lies outside push ", source, " (", size, " bytes)"));
      return;
    }
    absl::StatusOr<SharedBuffer> slice = SharedBuffer::Create(static_cast<size_t>(send.bytes()));
    if (!slice.ok()) {
      reporter_->ReportFailure(send.transfer_id(), std::string(slice.status().message()));
      return;
    }
    std::memcpy(slice->data(), push->buffer->data() + send.part_offset(),
                static_cast<size_t>(send.bytes()));
    schedule(std::make_shared<SharedBuffer>(std::move(*slice)), {}, nullptr);
    return;
  }
  if (push.has_value()) {
    schedule(push->buffer, push->tensors, push->checksums);
    return;
  }
  if (send.source_transfer_id() != 0) {
    // The outgoing transfer keeps the held bytes alive.
    if (std::optional<daemon::PushTable::Push> held = pushes_.TakeHeld(source)) {
      schedule(held->buffer, held->tensors, held->checksums);
      return;
    }
  }
  reporter_->ReportFailure(send.transfer_id(),
                           absl::StrCat("no pushed data on ", config_.host, " for push ", source));
}

void Daemon::PromoteReplicaLocked(const v1::PromoteReplica& promote) {
  const std::string from = daemon::ServerKey(promote.job_id(), "replica:" + promote.server());
  const std::string to = daemon::ServerKey(promote.job_id(), promote.server());
  // The replica's commit positions carry on under the server's name. What
  // an old server endpoint here still expected was failed by the scheduler.
  const std::shared_ptr<AppSession> app = servers_->RenameLocked(from, to);
  const std::vector<uint64_t> dropped = deliveries_->RenameLocked(from, to, promote.server());
  MLF_LOG(WARNING) << "this host's replica of server '" << promote.server()
                   << "' is the server now (" << promote.reason() << "); "
                   << (app ? "serving it" : "but its application is not connected")
                   << (dropped.empty() ? ""
                                       : absl::StrCat("; dropped ", dropped.size(),
                                                      " deliveries of the old server here"));
  if (app == nullptr) {
    const std::string why = absl::StrCat("server '", promote.server(), "' is not connected to ",
                                         config_.host, "'s daemon");
    for (uint64_t transfer : deliveries_->CancelAllLocked(to, why)) {
      reporter_->ReportFailure(transfer, why);
    }
    return;
  }
  // From now on it is the server: it leaves as one, and registers as one
  // with a restarted scheduler.
  app->role = v1::ROLE_SERVER;
  app->registration.set_role(v1::ROLE_SERVER);
  v1::LocalMessage note;
  v1::LocalPromoted* body = note.mutable_promoted();
  body->set_server(promote.server());
  body->set_old_host(promote.old_host());
  body->set_reason(promote.reason());
  body->set_model_version(promote.model_version());
  (void)app->channel->Send(note);
  deliveries_->TryDeliverLocked(promote.job_id(), promote.server());
  lock_.NotifyAll();  // gets waiting for the server (AwaitServer)
}

}  // namespace mlfabric
