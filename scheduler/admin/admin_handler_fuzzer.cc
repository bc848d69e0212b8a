// libFuzzer target for the admin endpoint's request handling
// (admin_handler.h): any method, target, Authorization header and body
// must get a response with a 2xx/4xx status and never crash the scheduler.
// The input is split at the first three NUL bytes into method, target,
// authorization and body. Build and run with clang: tools/fuzz admin
// [seconds]; admin_handler_fuzzer_smoke_test runs it over the corpus.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "scheduler/admin/admin_handler.h"

namespace {

using namespace mlfabric;

// A backend with one job, one host and a little history, that accepts any
// valid update for job "demo" and host "w1".
class Backend : public admin::AdminBackend {
 public:
  Backend() {
    snap_.now_s = 10;
    HostView host;
    host.name = "w1";
    host.alive = true;
    snap_.hosts.push_back(host);
    JobView job;
    job.params.name = "demo";
    job.servers.push_back({"ps0", "w1", 3, 0, 1});
    WorkerTiming w;
    w.worker = "w1";
    w.iterations = 4;
    job.workers.push_back(w);
    snap_.jobs.push_back(job);
    BatchView batch;
    batch.id = 1;
    snap_.recent_batches.push_back(batch);
    snap_.delay_histogram.bounds = {0, 1};
    snap_.delay_histogram.counts = {1, 0, 1};
  }
  ClusterSnapshot Snapshot() const override { return snap_; }
  absl::Status UpdateJobParams(const std::string& job, const JobParamsUpdate&) override {
    return job == "demo" ? absl::OkStatus() : absl::NotFoundError("unknown job");
  }
  absl::Status DrainHost(const std::string& host, bool) override {
    return host == "w1" ? absl::OkStatus() : absl::NotFoundError("unknown host");
  }

 private:
  ClusterSnapshot snap_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Backend backend;
  static const admin::AdminHandler handler(&backend, {"secret"});
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string parts[4];
  size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t end = input.find('\0', at);
    if (end == std::string::npos) {
      parts[i] = input.substr(at);
      at = input.size();
      break;
    }
    parts[i] = input.substr(at, end - at);
    at = end + 1;
  }
  if (at < input.size()) parts[3] = input.substr(at);
  const admin::HttpResponse response = handler.Handle({parts[0], parts[1], parts[2], parts[3]});
  if (response.status < 200 || response.status >= 500) std::abort();
  return 0;
}
