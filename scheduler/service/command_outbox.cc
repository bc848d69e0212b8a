#include "scheduler/service/command_outbox.h"

#include <utility>

namespace mlfabric {

std::condition_variable& CommandOutbox::WakeupLocked(const std::string& host) {
  std::unique_ptr<std::condition_variable>& wakeup = wakeups_[host];
  if (wakeup == nullptr) wakeup = std::make_unique<std::condition_variable>();
  return *wakeup;
}

void CommandOutbox::WakeLocked(const std::string& host,
                               std::vector<std::function<void()>>* wake) {
  WakeupLocked(host).notify_all();
  if (auto it = watchers_.find(host); it != watchers_.end()) {
    for (const auto& [token, watcher] : it->second) wake->push_back(watcher);
  }
}

void CommandOutbox::Call(const std::vector<std::function<void()>>& wake) {
  for (const std::function<void()>& watcher : wake) watcher();
}

uint64_t CommandOutbox::Watch(const std::string& host, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t token = next_watch_++;
  watchers_[host][token] = std::move(wake);
  return token;
}

void CommandOutbox::Unwatch(const std::string& host, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watchers_.find(host);
  if (it == watchers_.end()) return;
  it->second.erase(token);
  if (it->second.empty()) watchers_.erase(it);
}

void CommandOutbox::Open(const std::string& host, uint64_t incarnation) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Queue& queue = queues_[host];
    queue.incarnation = incarnation;
    queue.commands.clear();
    queue.keyed.clear();
    // Every class, 0 too: a daemon registering again may hold a class a
    // restarted scheduler no longer gives the job.
    for (const auto& [job, cls] : job_classes_) {
      queue.commands.push_back(JobPriorityCommand(job, cls.name, cls.priority_class));
    }
    WakeLocked(host, &wake);  // a stream of the old incarnation is superseded
  }
  Call(wake);
}

void CommandOutbox::Close(const std::string& host) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_.erase(host);
    WakeLocked(host, &wake);
  }
  Call(wake);
}

namespace {

// The job a command is about (0: none, or not said).
uint32_t JobOf(const v1::DaemonCommand& command) {
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend:
      return command.send().job_id();
    case v1::DaemonCommand::kExpect:
      return command.expect().job_id();
    case v1::DaemonCommand::kAggregate:
      return command.aggregate().job_id();
    case v1::DaemonCommand::kCancel:
      return command.cancel().job_id();
    case v1::DaemonCommand::kShrinkRound:
      return command.shrink_round().job_id();
    default:
      return 0;
  }
}

}  // namespace

void CommandOutbox::SetJobKeys(std::map<uint32_t, std::string> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  job_keys_ = std::move(keys);
}

v1::DaemonCommand CommandOutbox::JobPriorityCommand(uint32_t job, const std::string& name,
                                                    int32_t priority_class) {
  v1::DaemonCommand command;
  command.mutable_job_priority()->set_job_id(job);
  command.mutable_job_priority()->set_job(name);
  command.mutable_job_priority()->set_priority_class(priority_class);
  return command;
}

void CommandOutbox::KeyLocked(Queue& queue, uint32_t job) {
  if (job == 0 || queue.keyed.count(job)) return;
  queue.keyed.insert(job);
  if (auto key = job_keys_.find(job); key != job_keys_.end()) {
    v1::DaemonCommand command;
    command.mutable_job_key()->set_job_id(job);
    command.mutable_job_key()->set_key(key->second);
    queue.commands.push_back(std::move(command));
  }
}

void CommandOutbox::SetJobClass(uint32_t job, const std::string& name, int32_t priority_class) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto known = job_classes_.find(job);
    const bool changed = known == job_classes_.end()
                             ? priority_class != 0
                             : known->second.priority_class != priority_class;
    job_classes_[job] = JobClass{name, priority_class};
    if (!changed) return;
    for (auto& [host, queue] : queues_) {
      queue.commands.push_back(JobPriorityCommand(job, name, priority_class));
      NotifyLocked(host, &wake);
    }
  }
  Call(wake);
}

void CommandOutbox::NotifyLocked(const std::string& host,
                                 std::vector<std::function<void()>>* wake) {
  if (holds_ > 0) {
    held_wakeups_.insert(host);
    return;
  }
  WakeLocked(host, wake);
}

void CommandOutbox::EnsureJobKey(const std::string& host, uint32_t job) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = queues_.find(host);
    if (it == queues_.end()) return;
    KeyLocked(it->second, job);
    NotifyLocked(host, &wake);
  }
  Call(wake);
}

void CommandOutbox::Push(const std::string& host, v1::DaemonCommand command) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = queues_.find(host);
    if (it == queues_.end()) return;
    KeyLocked(it->second, JobOf(command));
    it->second.commands.push_back(std::move(command));
    NotifyLocked(host, &wake);
  }
  Call(wake);
}

void CommandOutbox::HoldWakeups() {
  std::lock_guard<std::mutex> lock(mu_);
  ++holds_;
}

void CommandOutbox::ReleaseWakeups() {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (holds_ == 0 || --holds_ > 0) return;
    for (const std::string& host : held_wakeups_) WakeLocked(host, &wake);
    held_wakeups_.clear();
  }
  Call(wake);
}

CommandOutbox::PopResult CommandOutbox::Pop(const std::string& host, uint64_t incarnation,
                                            std::chrono::milliseconds wait,
                                            v1::DaemonCommand* out) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::condition_variable& wakeup = WakeupLocked(host);  // never erased
  bool waited_out = false;
  while (true) {
    if (stopped_) return PopResult::kStopped;
    auto it = queues_.find(host);
    if (it == queues_.end() || it->second.incarnation != incarnation) {
      return PopResult::kSuperseded;
    }
    if (!it->second.commands.empty()) {
      *out = std::move(it->second.commands.front());
      it->second.commands.pop_front();
      return PopResult::kCommand;
    }
    // Looked once more after the wait ran out: a command pushed just then counts.
    if (waited_out) return PopResult::kTimeout;
    waited_out = wakeup.wait_until(lock, deadline) == std::cv_status::timeout;
  }
}

void CommandOutbox::Stop() {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (auto& [host, wakeup] : wakeups_) wakeup->notify_all();
    for (const auto& [host, watchers] : watchers_) {
      for (const auto& [token, watcher] : watchers) wake.push_back(watcher);
    }
  }
  Call(wake);
}

void CommandOutbox::WakeWatchers() {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (holds_ > 0) return;
    for (const auto& [host, watchers] : watchers_) {
      for (const auto& [token, watcher] : watchers) wake.push_back(watcher);
    }
  }
  Call(wake);
}

CommandOutbox::PopResult CommandOutbox::TryPop(const std::string& host, uint64_t incarnation,
                                               v1::DaemonCommand* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return PopResult::kStopped;
  auto it = queues_.find(host);
  if (it == queues_.end() || it->second.incarnation != incarnation) {
    return PopResult::kSuperseded;
  }
  if (it->second.commands.empty()) return PopResult::kTimeout;
  *out = std::move(it->second.commands.front());
  it->second.commands.pop_front();
  return PopResult::kCommand;
}

size_t CommandOutbox::Queued(const std::string& host) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(host);
  return it == queues_.end() ? 0 : it->second.commands.size();
}

}  // namespace mlfabric
