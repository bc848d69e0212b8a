// FakeSchedulerClient: a SchedulerClient for unit tests of the daemon's
// parts. It records every request, answers from per-call hooks (OK with an
// empty reply by default), and serves one schedule stream fed by the test.
//
//   FakeSchedulerClient fake;
//   fake.submit_hook = [](const auto& r, auto* reply) { reply->set_transfer_id(7); return absl::OkStatus(); };
//   fake.PushCommand(command);          // what the next stream Read returns
//   EXPECT(fake.completions().size() == 1);
//
// Thread safety: every method may be called concurrently.
#ifndef MLFABRIC_DAEMON_CONTROL_FAKE_SCHEDULER_CLIENT_H_
#define MLFABRIC_DAEMON_CONTROL_FAKE_SCHEDULER_CLIENT_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/control/scheduler_client.h"

namespace mlfabric::daemon {

class FakeSchedulerClient final : public SchedulerClient {
 public:
  std::function<absl::Status(const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply*)> submit_hook;
  std::function<absl::Status(const v1::CompletionReport&)> completion_hook;
  std::function<absl::Status(const v1::ResolveServerRequest&, v1::ResolveServerReply*)>
      resolve_hook;

  absl::Status RegisterHost(const v1::RegisterHostRequest& request,
                            v1::RegisterHostReply* reply) override {
    reply->set_incarnation(1);
    // The daemon's own clock: its estimated offset is 0.
    reply->set_scheduler_time_s(request.daemon_time_s());
    return absl::OkStatus();
  }
  std::function<absl::Status(const v1::RegisterEntityRequest&, v1::RegisterEntityReply*)>
      register_hook;

  absl::Status RegisterEntity(const v1::RegisterEntityRequest& request,
                              v1::RegisterEntityReply* reply) override {
    return register_hook ? register_hook(request, reply) : absl::OkStatus();
  }
  absl::Status SubmitUpdate(const v1::SubmitUpdateRequest& request,
                            v1::SubmitUpdateReply* reply) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      submits_.push_back(request);
    }
    return submit_hook ? submit_hook(request, reply) : absl::OkStatus();
  }
  // With `defer_submits`, SubmitUpdateAsync only records the call (and its
  // request, as SubmitUpdate does); the test answers it with
  // CompleteSubmit, as a gRPC reply would, on the test's thread.
  bool defer_submits = false;
  void SubmitUpdateAsync(v1::SubmitUpdateRequest request, SubmitDone done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (defer_submits) {
        submits_.push_back(request);
        deferred_.push_back({std::move(request), std::move(done)});
        cv_.notify_all();
        return;
      }
    }
    SchedulerClient::SubmitUpdateAsync(std::move(request), std::move(done));
  }
  // Answers the oldest deferred submission through submit_hook (OK with an
  // empty reply without one); false if none is waiting.
  bool CompleteSubmit() {
    Deferred call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (deferred_.empty()) return false;
      call = std::move(deferred_.front());
      deferred_.pop_front();
    }
    v1::SubmitUpdateReply reply;
    absl::Status status = submit_hook ? submit_hook(call.request, &reply) : absl::OkStatus();
    call.done(std::move(status), std::move(reply));
    return true;
  }
  absl::Status ReportCompletion(const v1::CompletionReport& report) override {
    absl::Status status = completion_hook ? completion_hook(report) : absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    completions_.push_back(report);
    cv_.notify_all();
    return status;
  }
  // Recorded as the base class sends them (a ReportCompletion each), with
  // the size of every batch.
  std::vector<absl::Status> ReportCompletions(
      const std::vector<v1::CompletionReport>& reports) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      completion_batches_.push_back(reports.size());
    }
    return SchedulerClient::ReportCompletions(reports);
  }
  std::vector<size_t> completion_batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return completion_batches_;
  }
  absl::Status ReportBandwidth(const v1::BandwidthReport&) override { return absl::OkStatus(); }
  absl::Status ReportEntityGone(const v1::EntityGoneReport& report) override {
    std::lock_guard<std::mutex> lock(mu_);
    gone_.push_back(report);
    return absl::OkStatus();
  }
  absl::Status SyncClock(const v1::SyncClockRequest&, v1::SyncClockReply*) override {
    return absl::OkStatus();
  }
  absl::Status ResolveServer(const v1::ResolveServerRequest& request,
                             v1::ResolveServerReply* reply) override {
    if (resolve_hook) return resolve_hook(request, reply);
    return absl::NotFoundError("the fake knows no servers");
  }
  absl::Status PlanDistribution(const v1::PlanDistributionRequest&,
                                v1::PlanDistributionReply*) override {
    return absl::UnimplementedError("the fake plans no distribution");
  }
  std::function<absl::Status(const v1::QueryMembershipRequest&, v1::QueryMembershipReply*)>
      membership_hook;
  absl::Status QueryMembership(const v1::QueryMembershipRequest& request,
                               v1::QueryMembershipReply* reply) override {
    if (membership_hook) return membership_hook(request, reply);
    return absl::NotFoundError("the fake knows no jobs");
  }
  std::function<absl::Status(const v1::QueryOutcomesRequest&, v1::QueryOutcomesReply*)>
      query_hook;
  absl::Status QueryOutcomes(const v1::QueryOutcomesRequest& request,
                             v1::QueryOutcomesReply* reply) override {
    if (query_hook) return query_hook(request, reply);
    for (uint64_t uid : request.push_uids()) {  // the fake knows no pushes
      v1::PushState* push = reply->add_pushes();
      push->set_push_uid(uid);
      push->set_state(v1::PushState::STATE_UNKNOWN);
    }
    return absl::OkStatus();
  }
  absl::Status AwaitClock(const v1::AwaitClockRequest&, v1::AwaitClockReply*) override {
    return absl::OkStatus();  // no ssp job: never waits
  }
  std::unique_ptr<ScheduleStream> StreamSchedules(const v1::StreamSchedulesRequest&) override {
    return std::make_unique<Stream>(this);
  }

  // The next command every open stream's Read returns.
  void PushCommand(v1::DaemonCommand command) {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(command));
    cv_.notify_all();
  }
  std::vector<v1::CompletionReport> completions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return completions_;
  }
  std::vector<v1::EntityGoneReport> gone() const {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_;
  }
  std::vector<v1::SubmitUpdateRequest> submits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submits_;
  }
  // Waits until `count` completions were reported; false on timeout.
  bool WaitForCompletions(size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return completions_.size() >= count; });
  }
  // Waits until a completion of `transfer_id` was reported; false on timeout.
  bool WaitForCompletionOf(uint64_t transfer_id, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const v1::CompletionReport& report : completions_) {
        if (report.transfer_id() == transfer_id) return true;
      }
      return false;
    });
  }

 private:
  class Stream final : public ScheduleStream {
   public:
    explicit Stream(FakeSchedulerClient* fake) : fake_(fake) {}
    bool Read(v1::DaemonCommand* command) override {
      std::unique_lock<std::mutex> lock(fake_->mu_);
      fake_->cv_.wait(lock, [&] { return cancelled_ || !fake_->commands_.empty(); });
      if (cancelled_) return false;
      *command = std::move(fake_->commands_.front());
      fake_->commands_.pop_front();
      return true;
    }
    absl::Status Finish() override { return absl::CancelledError("stream cancelled"); }
    void Cancel() override {
      std::lock_guard<std::mutex> lock(fake_->mu_);
      cancelled_ = true;
      fake_->cv_.notify_all();
    }

   private:
    FakeSchedulerClient* fake_;
    bool cancelled_ = false;
  };

  struct Deferred {
    v1::SubmitUpdateRequest request;
    SubmitDone done;
  };

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Deferred> deferred_;
  std::deque<v1::DaemonCommand> commands_;
  std::vector<size_t> completion_batches_;
  std::vector<v1::CompletionReport> completions_;
  std::vector<v1::SubmitUpdateRequest> submits_;
  std::vector<v1::EntityGoneReport> gone_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_CONTROL_FAKE_SCHEDULER_CLIENT_H_
