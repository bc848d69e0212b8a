#include "daemon/control/completion_reporter.h"

#include <iterator>
#include <utility>
#include <vector>

#include "common/logging.h"

namespace mlfabric::daemon {

CompletionReporter::CompletionReporter(SchedulerClient* client, std::string host)
    : client_(client), host_(std::move(host)), thread_([this] { Loop(); }) {}

CompletionReporter::~CompletionReporter() { Stop(); }

void CompletionReporter::ReportFailure(uint64_t transfer_id, const std::string& error) {
  v1::CompletionReport report;
  report.set_host(host_);
  report.set_transfer_id(transfer_id);
  report.set_applied(false);
  report.set_error(error);
  Queue(std::move(report));
}

void CompletionReporter::ReportPartReady(uint64_t transfer_id) {
  v1::CompletionReport report;
  report.set_host(host_);
  report.set_transfer_id(transfer_id);
  report.set_part_ready(true);
  Queue(std::move(report));
}

void CompletionReporter::Report(v1::CompletionReport report) {
  report.set_host(host_);
  Queue(std::move(report));
}

void CompletionReporter::Queue(v1::CompletionReport report) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    queue_.push_back(std::move(report));
  }
  cv_.Signal();
}

void CompletionReporter::ReportNow(const v1::CompletionReport& report) {
  absl::Status status = client_->ReportCompletion(report);
  if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
    MLF_LOG(WARNING) << "cannot report completion of transfer " << report.transfer_id() << ": "
                     << RpcErrorText(status);
  }
}

void CompletionReporter::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void CompletionReporter::Loop() {
  while (true) {
    // Everything queued goes in one call: a shard's daemon reports a part
    // ready for every push to its group, and a call per report held each
    // behind the round trip of the one before.
    std::vector<v1::CompletionReport> reports;
    {
      MutexLock lock(&mu_);
      cv_.Await(&mu_,
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued was sent
      reports.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    if (reports.size() == 1) {
      ReportNow(reports[0]);
      continue;
    }
    const std::vector<absl::Status> results = client_->ReportCompletions(reports);
    for (size_t i = 0; i < reports.size() && i < results.size(); ++i) {
      if (!results[i].ok() && results[i].code() != absl::StatusCode::kNotFound) {
        MLF_LOG(WARNING) << "cannot report completion of transfer " << reports[i].transfer_id()
                         << ": " << RpcErrorText(results[i]);
      }
    }
  }
}

}  // namespace mlfabric::daemon
