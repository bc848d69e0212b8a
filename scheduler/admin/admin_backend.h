// AdminBackend: what the admin endpoint needs from the scheduler, as a small
// interface so the HTTP layer can be tested with a fake and never sees gRPC.
// SchedulerService implements it through SchedulerAdminBackend (below).
//
//   SchedulerAdminBackend backend(&service);
//   AdminHandler handler(&backend, options);
//
// Thread safety: implementations must allow concurrent calls.
#ifndef MLFABRIC_SCHEDULER_ADMIN_ADMIN_BACKEND_H_
#define MLFABRIC_SCHEDULER_ADMIN_ADMIN_BACKEND_H_

#include <string>

#include "absl/status/status.h"
#include "scheduler/service/snapshot.h"

namespace mlfabric::admin {

class AdminBackend {
 public:
  virtual ~AdminBackend() = default;
  virtual ClusterSnapshot Snapshot() const = 0;
  // What GET /api/v1/cycles shows (now_s, batch_interval_ms,
  // recent_cycles); the rest may be left empty. A full Snapshot by default.
  virtual ClusterSnapshot CyclesSnapshot() const { return Snapshot(); }
  virtual absl::Status UpdateJobParams(const std::string& job, const JobParamsUpdate& update) = 0;
  virtual absl::Status DrainHost(const std::string& host, bool drain) = 0;
};

// Forwards to any object with the same three methods (SchedulerService).
template <typename Service>
class ServiceAdminBackend final : public AdminBackend {
 public:
  explicit ServiceAdminBackend(Service* service) : service_(service) {}
  ClusterSnapshot Snapshot() const override { return service_->Snapshot(); }
  ClusterSnapshot CyclesSnapshot() const override { return service_->CyclesSnapshot(); }
  absl::Status UpdateJobParams(const std::string& job, const JobParamsUpdate& update) override {
    return service_->UpdateJobParams(job, update);
  }
  absl::Status DrainHost(const std::string& host, bool drain) override {
    return service_->DrainHost(host, drain);
  }

 private:
  Service* service_;
};

}  // namespace mlfabric::admin

#endif  // MLFABRIC_SCHEDULER_ADMIN_ADMIN_BACKEND_H_
