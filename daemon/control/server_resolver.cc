#include "daemon/control/server_resolver.h"

namespace mlfabric::daemon {

ServerResolver::ServerResolver(SchedulerClient* scheduler, const Clock* clock, double ttl_s)
    : scheduler_(scheduler), clock_(clock), ttl_s_(ttl_s) {}

absl::Status ServerResolver::Resolve(const std::string& job, const std::string& server,
                                     v1::ResolveServerReply* where) {
  const auto key = std::make_pair(job, server);
  uint64_t generation = 0;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && clock_->NowSeconds() < it->second.until_s) {
      *where = it->second.where;
      return absl::OkStatus();
    }
    generation = generation_;
    ++calls_;
  }
  v1::ResolveServerRequest request;
  request.set_job(job);
  request.set_server(server);
  v1::ResolveServerReply reply;
  absl::Status status = scheduler_->ResolveServer(request, &reply);
  if (!status.ok()) return status;
  *where = reply;
  MutexLock lock(&mu_);
  // An answer asked for before a Clear() may be the old scheduler's.
  if (ttl_s_ > 0 && generation == generation_) {
    entries_[key] = Entry{std::move(reply), clock_->NowSeconds() + ttl_s_};
  }
  return absl::OkStatus();
}

void ServerResolver::Forget(const std::string& job, const std::string& server) {
  MutexLock lock(&mu_);
  entries_.erase(std::make_pair(job, server));
}

void ServerResolver::Clear() {
  MutexLock lock(&mu_);
  entries_.clear();
  ++generation_;
}

int64_t ServerResolver::calls() const {
  MutexLock lock(&mu_);
  return calls_;
}

}  // namespace mlfabric::daemon
