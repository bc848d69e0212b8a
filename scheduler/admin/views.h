// Renderers of a ClusterSnapshot for the admin endpoint: JSON documents for
// /api/v1/*, the Prometheus text exposition for /metrics and a Chrome-trace
// (Perfetto-loadable) JSON of recent schedules. Pure functions: a snapshot
// in, text or JSON out; no I/O, no clock (times come from the snapshot).
//
//   ClusterSnapshot snap = backend.Snapshot();
//   std::string text = RenderPrometheus(snap);
//   nlohmann::json hosts = HostsJson(snap);
//
// Units in every document: seconds on the scheduler's clock (`now_s` says
// what "now" is), bits per second, bytes.
#ifndef MLFABRIC_SCHEDULER_ADMIN_VIEWS_H_
#define MLFABRIC_SCHEDULER_ADMIN_VIEWS_H_

#include <string>

#include "nlohmann/json.hpp"
#include "scheduler/service/snapshot.h"

namespace mlfabric::admin {

nlohmann::json ClusterJson(const ClusterSnapshot& snap);
nlohmann::json HostsJson(const ClusterSnapshot& snap);
nlohmann::json JobsJson(const ClusterSnapshot& snap);
// `limit`: at most this many recent batches (most recent last).
nlohmann::json BatchesJson(const ClusterSnapshot& snap, size_t limit);
nlohmann::json TransfersJson(const ClusterSnapshot& snap);
nlohmann::json DropsJson(const ClusterSnapshot& snap);
nlohmann::json DelaysJson(const ClusterSnapshot& snap);
nlohmann::json LinksJson(const ClusterSnapshot& snap);
// The recent batch cycles and their p50/p99/max total time.
nlohmann::json CyclesJson(const ClusterSnapshot& snap);

// Prometheus text format 0.0.4.
std::string RenderPrometheus(const ClusterSnapshot& snap);

// Chrome trace event format: one track per link (process "uplinks" /
// "downlinks", one thread per host), each scheduled transfer of the recent
// batches as a complete ("X") event on its source uplink and its
// destination downlink, timestamps in microseconds since scheduler start.
nlohmann::json ChromeTrace(const ClusterSnapshot& snap);

}  // namespace mlfabric::admin

#endif  // MLFABRIC_SCHEDULER_ADMIN_VIEWS_H_
