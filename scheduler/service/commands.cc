#include "scheduler/service/commands.h"

namespace mlfabric::commands {

v1::DaemonCommand ExpectDelivery(const Expect& e) {
  v1::DaemonCommand command;
  v1::ExpectDelivery* expect = command.mutable_expect();
  expect->set_transfer_id(e.transfer_id);
  expect->set_job_id(e.job_id);
  expect->set_server(e.server);
  expect->set_sequence(e.sequence);
  expect->set_bytes(e.bytes);
  expect->set_src_host(e.src_host);
  expect->set_worker(e.worker);
  expect->set_version(e.version);
  expect->set_norm(e.norm);
  for (uint64_t constituent : e.constituents) expect->add_constituents(constituent);
  if (e.round_size > 0) {
    expect->set_round_size(e.round_size);
    expect->set_contributions(e.contributions);
    expect->set_dtype(e.dtype);
  }
  if (e.held) expect->set_held(true);
  if (e.source != 0) expect->set_source_transfer_id(e.source);
  if (e.group_push != 0) expect->set_group_push(e.group_push);
  return command;
}

v1::DaemonCommand ReleaseDelivery(uint64_t transfer_id, uint64_t sequence,
                                  bool cancel_if_incomplete) {
  v1::DaemonCommand command;
  v1::ReleaseDelivery* release = command.mutable_release();
  release->set_transfer_id(transfer_id);
  release->set_sequence(sequence);
  if (cancel_if_incomplete) release->set_cancel_if_incomplete(true);
  return command;
}

v1::DaemonCommand SendTransfer(const Send& s, const std::vector<core::RateSegment>& segments) {
  v1::DaemonCommand command;
  v1::SendTransfer* send = command.mutable_send();
  send->set_transfer_id(s.transfer_id);
  if (s.source_transfer_id != 0) send->set_source_transfer_id(s.source_transfer_id);
  if (s.local_id != 0) send->set_local_id(s.local_id);
  send->set_job_id(s.job_id);
  send->set_dst_host(s.dst_host);
  send->set_dst_address(s.dst_address);
  send->set_start_s(s.start_s);
  send->set_bytes(s.bytes);
  if (s.part) {
    send->set_part(true);
    send->set_part_offset(s.part_offset);
  }
  if (s.next_round.has_value()) *send->mutable_next_round() = *s.next_round;
  AddSegments(segments, send->mutable_segments());
  return command;
}

v1::DaemonCommand PromoteReplica(uint32_t job_id, const std::string& server,
                                 const std::string& old_host, const std::string& reason,
                                 int64_t model_version) {
  v1::DaemonCommand command;
  v1::PromoteReplica* promote = command.mutable_promote();
  promote->set_job_id(job_id);
  promote->set_server(server);
  promote->set_old_host(old_host);
  promote->set_reason(reason);
  promote->set_model_version(model_version);
  return command;
}

v1::DaemonCommand AggregateTask(const Aggregate& a, const std::vector<core::RateSegment>& segments) {
  v1::DaemonCommand command;
  v1::AggregateTask* task = command.mutable_aggregate();
  task->set_aggregate_id(a.aggregate_id);
  task->set_job_id(a.job_id);
  for (uint64_t constituent : a.constituents) {
    task->add_constituents(constituent);
    task->add_weights(1.0);
  }
  task->set_dst_host(a.dst_host);
  task->set_dst_address(a.dst_address);
  task->set_start_s(a.start_s);
  AddSegments(segments, task->mutable_segments());
  task->set_bytes(a.bytes);
  task->set_dtype(a.dtype);
  return command;
}

v1::DaemonCommand CancelDelivery(uint64_t transfer_id, const std::string& server,
                                 uint64_t sequence, const std::string& reason, bool confirm) {
  v1::DaemonCommand command;
  v1::CancelDelivery* cancel = command.mutable_cancel();
  cancel->set_transfer_id(transfer_id);
  cancel->set_server(server);
  cancel->set_sequence(sequence);
  cancel->set_reason(reason);
  if (confirm) cancel->set_confirm(true);
  return command;
}

v1::DaemonCommand DiscardGranted(uint64_t transfer_id, const std::string& server,
                                 const std::string& reason) {
  v1::DaemonCommand command;
  v1::CancelDelivery* discard = command.mutable_cancel();
  discard->set_transfer_id(transfer_id);
  discard->set_server(server);
  discard->set_reason(reason);
  discard->set_discard(true);
  return command;
}

v1::DaemonCommand ReleaseHold(uint64_t transfer_id, const std::string& reason) {
  v1::DaemonCommand command;
  v1::CancelDelivery* release = command.mutable_cancel();
  release->set_transfer_id(transfer_id);
  release->set_release_hold(true);
  release->set_reason(reason);
  return command;
}

v1::DaemonCommand FailRound(const std::string& server, int64_t round, uint32_t job_id,
                            const std::string& reason) {
  v1::DaemonCommand command;
  v1::CancelDelivery* cancel = command.mutable_cancel();
  cancel->set_server(server);
  cancel->set_fail_round(true);
  cancel->set_round(round);
  cancel->set_job_id(job_id);
  cancel->set_reason(reason);
  return command;
}

v1::DaemonCommand ShrinkRound(const std::string& server, int64_t round, uint32_t job_id,
                              int32_t size, const std::string& reason) {
  v1::DaemonCommand command;
  v1::ShrinkRound* shrink = command.mutable_shrink_round();
  shrink->set_job_id(job_id);
  shrink->set_server(server);
  shrink->set_round(round);
  shrink->set_size(size);
  shrink->set_reason(reason);
  return command;
}

v1::DaemonCommand PushOutcome(uint64_t transfer_id, uint64_t local_id, v1::Outcome outcome,
                              const std::string& reason) {
  v1::DaemonCommand command;
  v1::PushOutcome* result = command.mutable_outcome();
  result->set_transfer_id(transfer_id);
  result->set_local_id(local_id);
  result->set_outcome(outcome);
  result->set_reason(reason);
  return command;
}

void AddSegments(const std::vector<core::RateSegment>& segments,
                 google::protobuf::RepeatedPtrField<v1::RateSegment>* out) {
  for (const core::RateSegment& segment : segments) {
    if (!(segment.to_s > segment.from_s)) continue;
    v1::RateSegment* s = out->Add();
    s->set_from_s(segment.from_s);
    s->set_to_s(segment.to_s);
    s->set_rate_bps(segment.rate_bps);
  }
}

}  // namespace mlfabric::commands
