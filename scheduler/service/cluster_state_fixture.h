// A ClusterState for unit tests of the service's parts, without sockets or
// gRPC: a FakeClock, a real CommandOutbox (read back as the daemons would)
// and admin history, and the given hosts alive, each with an incarnation,
// an open outbox and a data address.
//
//   struct Fixture : ClusterStateFixture {
//     Fixture() : ClusterStateFixture({"s1", "w1"}) { state.GetOrAddJob("demo")... }
//   };
#ifndef MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_FIXTURE_H_
#define MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_FIXTURE_H_

#include <initializer_list>
#include <chrono>
#include <string>
#include <vector>

#include "common/clock.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

struct ClusterStateFixture {
  SchedulerConfig config;
  FakeClock clock{100.0};
  CommandOutbox outbox;
  AdminHistory history{8};
  ClusterState state{config, &clock, &outbox, &history};

  explicit ClusterStateFixture(std::initializer_list<const char*> hosts) {
    for (const char* host : hosts) {
      HostState& h = state.hosts().Register(host);
      h.alive = true;
      h.incarnation = state.NewIncarnation();
      h.data_address = std::string(host) + ":1";
      outbox.Open(host, h.incarnation);
    }
  }

  // A push from `src` to server "ps" of job "demo", waiting for a batch
  // (in the server's pending list), with a fresh transfer id.
  UpdateRecord& AddPush(const std::string& src, int64_t version = 0) {
    UpdateRecord record;
    record.transfer_id = state.NewTransferId();
    record.job = "demo";
    record.server = "ps";
    record.src_host = src;
    record.worker = src;
    record.local_id = 40 + record.transfer_id;
    record.bytes = 64;
    record.version = version;
    state.GetOrAddJob("demo").servers["ps"].pending.push_back(record.transfer_id);
    return state.AddPush(record);
  }

  // Every command queued for `host`, in order, as its daemon would read them.
  std::vector<v1::DaemonCommand> Drain(const std::string& host) {
    std::vector<v1::DaemonCommand> out;
    v1::DaemonCommand command;
    while (outbox.Pop(host, state.hosts().Register(host).incarnation, std::chrono::milliseconds(0),
                      &command) == CommandOutbox::PopResult::kCommand) {
      out.push_back(command);
    }
    return out;
  }
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_FIXTURE_H_
