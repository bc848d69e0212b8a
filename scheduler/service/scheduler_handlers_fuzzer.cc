// libFuzzer target for the scheduler's control-plane handlers
// (scheduler_service.h, scheduler_handlers.cc), fed decoded requests as the
// gRPC face would pass them: any sequence of calls a daemon can make must
// end each call in a reply or an error that names what was wrong, never a
// crash, a hang, a command with a non-finite number in it or a batch the
// planner refuses. Build and run
// with clang: tools/fuzz grpc_handlers [seconds];
// scheduler_handlers_fuzzer_smoke_test runs it over the corpus with gcc.
//
// Input: one flags byte (bit 0: the mlfabric planner instead of fifo), then
// calls, each
//
//   [handler: 1 byte][n: 2 bytes, big-endian][n bytes]
//
// where the bytes are the handler's request proto (one that does not parse
// is skipped). kTick takes no bytes: it advances the fake clock by n ms
// and runs one batch cycle (plan + dispatch), as the batching loop would.
// kStream drains the commands queued for a host as its StreamSchedules call
// would, and kEndStream ends that stream as broken (both take a
// StreamSchedulesRequest). One service lives for the whole input, so later
// calls meet the hosts, servers and transfers earlier ones created.
//
// Never blocks: server_wait_s and ssp_max_wait_s are 0, the batching thread
// is never started, planning runs on the calling thread, and the outbox is
// only popped while it holds commands. Deterministic: the clock is a
// FakeClock and every id comes from the service's counters.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/scheduler.pb.h"
#include "scheduler/core/fifo_planner.h"
#include "scheduler/core/mlfabric_planner.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/scheduler_service.h"

namespace {

using namespace mlfabric;

enum Handler : uint8_t {
  kRegisterHost,
  kRegisterEntity,
  kSubmitUpdate,
  kReportCompletion,
  kReportBandwidth,
  kResolveServer,
  kSyncClock,
  kAwaitClock,
  kStream,     // BeginStream, then pop what is queued (StreamSchedulesRequest)
  kEndStream,  // the host's stream broke (StreamSchedulesRequest)
  kTick,       // advance the clock by n ms, run a batch cycle; no bytes
  kPlanDistribution,
  kReportEntityGone,  // a server leaving fails over to its replica
  kQueryOutcomes,     // never waits here (wait_s 0)
  kQueryMembership,
  kHandlers,
};

constexpr int kMaxCalls = 256;

// Three jobs, one per mode, so every path of the handlers and the batch
// cycle is reachable: "demo" aggregates on w1/w2 and may keep a replica,
// "sync" runs Mercury rounds, "ssp" bounds clocks.
SchedulerConfig FuzzConfig() {
  SchedulerConfig config;
  config.server_wait_s = 0;
  config.ssp_max_wait_s = 0;
  config.planner_threads = 1;
  config.transfer_slack_s = 1;
  config.round_timeout_s = 5;
  config.history_batches = 8;
  config.max_update_bytes = int64_t{1} << 30;
  JobConfig demo{"demo", "demo-token", 30, JobMode::kAsync};
  demo.aggregators = {"w1", "w2"};
  demo.divergence_max = 1.0;
  demo.momentum = 0.9;
  JobConfig sync{"sync", "sync-token", 30, JobMode::kSync};
  sync.backup_workers = 1;
  JobConfig ssp{"ssp", "ssp-token", 5, JobMode::kSsp};
  ssp.staleness_k = 1;
  ssp.priority_class = 1;
  ssp.user = "alice";
  config.jobs = {demo, sync, ssp};
  return config;
}

[[noreturn]] void Fail(const std::string& what, const google::protobuf::Message& message) {
  std::fprintf(stderr, "scheduler_handlers_fuzzer: %s:\n%s", what.c_str(),
               message.DebugString().c_str());
  std::abort();
}

void CheckStatus(const absl::Status& status) {
  if (!status.ok() && status.message().empty()) {
    std::fprintf(stderr, "scheduler_handlers_fuzzer: error %d without a message\n",
                 static_cast<int>(status.code()));
    std::abort();
  }
}

bool SegmentsOk(const google::protobuf::RepeatedPtrField<v1::RateSegment>& segments) {
  for (const v1::RateSegment& s : segments) {
    if (!std::isfinite(s.from_s()) || !std::isfinite(s.to_s()) || !std::isfinite(s.rate_bps()) ||
        s.rate_bps() < 0 || s.to_s() < s.from_s()) {
      return false;
    }
  }
  return true;
}

// What a daemon is told to do must be well formed.
void CheckCommand(const v1::DaemonCommand& command) {
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend:
      if (!std::isfinite(command.send().start_s()) || !SegmentsOk(command.send().segments()) ||
          command.send().bytes() <= 0) {
        Fail("malformed SendTransfer", command);
      }
      return;
    case v1::DaemonCommand::kExpect:
      if (!std::isfinite(command.expect().norm())) Fail("malformed ExpectDelivery", command);
      return;
    case v1::DaemonCommand::kAggregate:
      if (!std::isfinite(command.aggregate().start_s()) ||
          !SegmentsOk(command.aggregate().segments())) {
        Fail("malformed AggregateTask", command);
      }
      for (double w : command.aggregate().weights()) {
        if (!std::isfinite(w)) Fail("malformed AggregateTask", command);
      }
      return;
    case v1::DaemonCommand::kPromote:
      if (command.promote().server().empty() || command.promote().model_version() < 0) {
        Fail("malformed PromoteReplica", command);
      }
      return;
    case v1::DaemonCommand::kSnapshot:
      if (command.snapshot().transfer_id() == 0 || command.snapshot().server().empty() ||
          command.snapshot().dst_host().empty()) {
        Fail("malformed SnapshotToReplica", command);
      }
      return;
    case v1::DaemonCommand::kRelease:
      if (command.release().transfer_id() == 0) Fail("malformed ReleaseDelivery", command);
      return;
    case v1::DaemonCommand::kJobPriority:
      if (command.job_priority().priority_class() < 0 ||
          command.job_priority().priority_class() > 7 || command.job_priority().job().empty()) {
        Fail("malformed JobPriority", command);
      }
      return;
    case v1::DaemonCommand::kShrinkRound:
      if (command.shrink_round().server().empty() || command.shrink_round().size() <= 0) {
        Fail("malformed ShrinkRound", command);
      }
      return;
    case v1::DaemonCommand::kCancel:
    case v1::DaemonCommand::kOutcome:
    case v1::DaemonCommand::kJobKey:
      return;
    case v1::DaemonCommand::COMMAND_NOT_SET:
      Fail("empty command", command);
  }
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* request) {
  return request->ParseFromArray(data, static_cast<int>(size));
}

// A registered host gets a non-zero incarnation.
void CallRegisterHost(SchedulerService& service, const uint8_t* data, size_t size) {
  v1::RegisterHostRequest request;
  v1::RegisterHostReply reply;
  if (!Parse(data, size, &request)) return;
  const absl::Status status = service.RegisterHost(request, &reply);
  CheckStatus(status);
  if (status.ok() && reply.incarnation() == 0) Fail("incarnation 0", reply);
}

// A distribution plan names every requester once, at finite rates.
void CallPlanDistribution(SchedulerService& service, const uint8_t* data, size_t size) {
  v1::PlanDistributionRequest request;
  v1::PlanDistributionReply reply;
  if (!Parse(data, size, &request)) return;
  const absl::Status status = service.PlanDistribution(request, &reply);
  CheckStatus(status);
  // A plan names every requester once, in order, and only live hosts.
  if (status.ok() && reply.routes_size() != request.requesters_size()) std::abort();
  // The rates a daemon places late gets by are finite and not negative.
  for (const v1::DistributionRoute& route : reply.routes()) {
    if (!(route.rate_bps() >= 0 && std::isfinite(route.rate_bps()) &&
          route.uplink_bps() >= 0 && std::isfinite(route.uplink_bps()) &&
          route.children() >= 0)) {
      std::abort();
    }
  }
  if (!(reply.copy_bps() >= 0 && std::isfinite(reply.copy_bps()))) std::abort();
}

// An outcome query answers every uid asked.
void CallQueryOutcomes(SchedulerService& service, const uint8_t* data, size_t size) {
  v1::QueryOutcomesRequest request;
  v1::QueryOutcomesReply reply;
  if (!Parse(data, size, &request)) return;
  request.set_wait_s(0);
  const absl::Status status = service.QueryOutcomes(request, &reply);
  CheckStatus(status);
  if (status.ok() && reply.pushes_size() != request.push_uids_size()) std::abort();
}

// A membership answer is sorted and unique, of a generation >= 1.
void CallQueryMembership(SchedulerService& service, const uint8_t* data, size_t size) {
  v1::QueryMembershipRequest request;
  v1::QueryMembershipReply reply;
  if (!Parse(data, size, &request)) return;
  const absl::Status status = service.QueryMembership(request, &reply);
  CheckStatus(status);
  if (!status.ok()) return;
  if (reply.generation() < 1) std::abort();
  for (int i = 1; i < reply.members_size(); ++i) {
    if (!(reply.members(i - 1) < reply.members(i))) std::abort();
  }
}

// A host that may stream reads only well-formed commands.
void CallStream(SchedulerService& service, const uint8_t* data, size_t size) {
  v1::StreamSchedulesRequest request;
  if (!Parse(data, size, &request)) return;
  const absl::Status status = service.BeginStream(request.host(), request.incarnation());
  CheckStatus(status);
  if (!status.ok()) return;
  v1::DaemonCommand command;
  while (service.outbox().Queued(request.host()) > 0 &&
         service.outbox().Pop(request.host(), request.incarnation(),
                              std::chrono::milliseconds(0),
                              &command) == CommandOutbox::PopResult::kCommand) {
    CheckCommand(command);
  }
}

void Call(SchedulerService& service, FakeClock& clock, uint8_t handler, const uint8_t* data,
          size_t size) {
  switch (handler) {
    case kRegisterHost:
      return CallRegisterHost(service, data, size);
    case kRegisterEntity: {
      v1::RegisterEntityRequest request;
      v1::RegisterEntityReply reply;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.RegisterEntity(request, &reply));
      return;
    }
    case kSubmitUpdate: {
      v1::SubmitUpdateRequest request;
      v1::SubmitUpdateReply reply;
      if (!Parse(data, size, &request)) return;
      const absl::Status status = service.SubmitUpdate(request, &reply);
      CheckStatus(status);
      if (status.ok() && reply.transfer_id() == 0) Fail("transfer id 0", reply);
      return;
    }
    case kReportCompletion: {
      v1::CompletionReport request;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.ReportCompletion(request));
      return;
    }
    case kReportBandwidth: {
      v1::BandwidthReport request;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.ReportBandwidth(request));
      return;
    }
    case kReportEntityGone: {
      v1::EntityGoneReport request;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.ReportEntityGone(request));
      return;
    }
    case kResolveServer: {
      v1::ResolveServerRequest request;
      v1::ResolveServerReply reply;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.ResolveServer(request, &reply));
      return;
    }
    case kPlanDistribution:
      return CallPlanDistribution(service, data, size);
    case kSyncClock: {
      v1::SyncClockRequest request;
      if (!Parse(data, size, &request)) return;
      if (!std::isfinite(service.NowSeconds())) std::abort();
      return;
    }
    case kAwaitClock: {
      v1::AwaitClockRequest request;
      v1::AwaitClockReply reply;
      if (!Parse(data, size, &request)) return;
      CheckStatus(service.AwaitClock(request, &reply));
      return;
    }
    case kQueryOutcomes:
      return CallQueryOutcomes(service, data, size);
    case kQueryMembership:
      return CallQueryMembership(service, data, size);
    case kStream:
      return CallStream(service, data, size);
    case kEndStream: {
      v1::StreamSchedulesRequest request;
      if (!Parse(data, size, &request)) return;
      service.EndStream(request.host(), request.incarnation(), "schedule stream broken");
      return;
    }
    case kTick:
      clock.Advance(static_cast<double>(size) / 1000);
      service.RunBatchCycle();
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    SetMinLogLevel(LogLevel::kError);
    google::protobuf::SetLogHandler(nullptr);  // "invalid UTF-8" for every bad string
    return true;
  }();
  (void)quiet;
  if (size < 1) return 0;
  const bool mlfabric_planner = data[0] & 1;
  FakeClock clock(100.0);
  std::unique_ptr<core::Planner> planner;
  if (mlfabric_planner) {
    planner = std::make_unique<core::MlfabricPlanner>();
  } else {
    planner = std::make_unique<core::FifoPlanner>();
  }
  SchedulerService service(FuzzConfig(), &clock, std::move(planner));
  size_t at = 1;
  for (int calls = 0; calls < kMaxCalls && at + 3 <= size; ++calls) {
    const uint8_t handler = data[at] % kHandlers;
    const size_t n = (size_t{data[at + 1]} << 8) | data[at + 2];
    at += 3;
    if (handler == kTick) {
      Call(service, clock, handler, nullptr, n);
      continue;
    }
    const size_t length = std::min(n, size - at);
    Call(service, clock, handler, data + at, length);
    at += length;
  }
  // Whatever the handlers accepted, the planner can plan: a batch it
  // refuses fails every push in it ("scheduler could not plan").
  const ClusterSnapshot snap = service.Snapshot();
  if (auto errors = snap.drops_by_category.find("plan_error");
      errors != snap.drops_by_category.end() && errors->second > 0) {
    for (const DropView& drop : snap.recent_drops) {
      std::fprintf(stderr, "scheduler_handlers_fuzzer: push %llu failed: %s\n",
                   static_cast<unsigned long long>(drop.transfer_id), drop.reason.c_str());
    }
    std::abort();
  }
  for (const HostView& host : snap.hosts) {
    if (host.available_up_bps < 0 || host.available_down_bps < 0) std::abort();
  }
  return 0;
}
