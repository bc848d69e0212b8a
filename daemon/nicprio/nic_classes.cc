#include "daemon/nicprio/nic_classes.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace mlfabric::nicprio {
namespace {

// A class-0 job of the list always ranks before a class-1 job; within a
// class, list order (the same rule as the daemon's queue, which breaks
// ties by job id, config order).
constexpr double kClassWeight = 4294967296.0;

// The longest a TLs-RR wait trusts the clock without looking again.
constexpr double kMaxWaitS = 1.0;

}  // namespace

NicClasses::NicClasses(Options options, daemon::JobPriorityPolicy policy, const Clock* clock,
                       Runner run)
    : options_(std::move(options)),
      clock_(clock),
      run_(std::move(run)),
      policy_(std::move(policy)),
      classes_(options_.jobs.size(), 0) {}

double NicClasses::RankKey(size_t job, int32_t priority_class) const {
  return priority_class * kClassWeight + static_cast<double>(job);
}

absl::StatusOr<std::unique_ptr<NicClasses>> NicClasses::Start(Options options,
                                                              const Clock* clock, Runner run) {
  if (options.priority.mode == daemon::JobPriorityMode::kFifo) {
    return absl::InvalidArgumentError(
        "NIC priorities need a job ranking: job_priority one or rr, not fifo");
  }
  absl::StatusOr<daemon::JobPriorityPolicy> policy =
      daemon::JobPriorityPolicy::Create(options.priority);
  if (!policy.ok()) return policy.status();
  for (size_t i = 0; i < options.jobs.size(); ++i) {
    if (absl::Status s = policy->AddJob(i, static_cast<double>(i)); !s.ok()) return s;
  }
  std::unique_ptr<NicClasses> classes(
      new NicClasses(std::move(options), *std::move(policy), clock, std::move(run)));
  std::vector<size_t> ranking;
  {
    MutexLock lock(&classes->mu_);
    ranking = classes->RankingLocked(clock->NowSeconds());
  }
  const Options& o = classes->options_;
  // Until set-up has succeeded there is nothing for Stop() to remove.
  auto abandon = [&classes](absl::Status status) {
    MutexLock lock(&classes->mu_);
    classes->stopped_ = true;
    return status;
  };
  absl::StatusOr<std::vector<TcCommand>> setup = SetupCommands(o.nic, o.jobs, ranking);
  if (!setup.ok()) return abandon(setup.status());
  // The first command creates the root qdisc: if it fails, nothing of
  // ours exists, and the NIC's own qdisc must not be deleted.
  if (absl::Status s = classes->run_({setup->front()}); !s.ok()) {
    return abandon(absl::Status(
        s.code(), absl::StrCat(s.message(), "; nothing was changed on ", o.nic.interface)));
  }
  if (absl::Status s = classes->run_({setup->begin() + 1, setup->end()}); !s.ok()) {
    (void)classes->run_(TeardownCommands(o.nic));
    return abandon(absl::Status(s.code(), absl::StrCat(s.message(), "; what was installed on ",
                                                       o.nic.interface, " was removed")));
  }
  {
    MutexLock lock(&classes->mu_);
    classes->installed_ = ranking;
  }
  std::vector<std::string> names;
  for (size_t i : ranking) names.push_back(o.jobs[i].name);
  MLF_LOG(INFO) << "NIC priorities on " << o.nic.interface << " ("
                << daemon::JobPriorityModeName(o.priority.mode) << "): "
                << absl::StrJoin(names, " > ");
  classes->thread_ = std::thread([c = classes.get()] { c->Loop(); });
  return classes;
}

NicClasses::~NicClasses() { Stop(); }

std::vector<size_t> NicClasses::RankingLocked(double now_s) const {
  std::vector<size_t> ranking;
  for (daemon::JobId job : policy_.Ranking(now_s)) ranking.push_back(static_cast<size_t>(job));
  return ranking;
}

bool NicClasses::SetJobClass(absl::string_view name, int32_t priority_class) {
  for (size_t i = 0; i < options_.jobs.size(); ++i) {
    if (options_.jobs[i].name != name) continue;
    MutexLock lock(&mu_);
    if (classes_[i] == priority_class) return true;
    classes_[i] = priority_class;
    (void)policy_.SetRankKey(i, RankKey(i, priority_class));
    dirty_ = true;
    changed_.SignalAll();
    return true;
  }
  return false;
}

void NicClasses::Loop() {
  MutexLock lock(&mu_);
  std::vector<size_t> failed;  // a ranking tc refused, not retried until something changes
  while (!stopping_) {
    const double now_s = clock_->NowSeconds();
    std::vector<size_t> ranking = RankingLocked(now_s);
    const bool changed = dirty_;
    dirty_ = false;
    if (ranking != installed_ && (changed || ranking != failed)) {
      absl::StatusOr<std::vector<TcCommand>> commands =
          RankCommands(options_.nic, options_.jobs, ranking);
      lock.Unlock();
      absl::Status status = commands.ok() ? run_(*commands) : commands.status();
      lock.Lock();
      std::vector<std::string> names;
      for (size_t i : ranking) names.push_back(options_.jobs[i].name);
      if (status.ok()) {
        installed_ = ranking;
        failed.clear();
        ++rerankings_;
        MLF_LOG(INFO) << "NIC priorities on " << options_.nic.interface << ": "
                      << absl::StrJoin(names, " > ");
      } else {
        failed = ranking;
        MLF_LOG(WARNING) << "cannot re-rank the NIC priorities on " << options_.nic.interface
                         << " as " << absl::StrJoin(names, " > ") << ": " << status.message()
                         << "; the old ranking stays until the next change";
      }
      continue;  // look again: a class may have changed meanwhile
    }
    const double next_s = policy_.NextChangeTime(now_s);
    if (std::isinf(next_s)) {
      while (!dirty_ && !stopping_) changed_.Wait(&mu_);
    } else {
      const double wait_s = std::clamp(next_s - now_s, 0.001, kMaxWaitS);
      (void)changed_.WaitWithTimeout(&mu_, std::chrono::duration<double>(wait_s));
    }
  }
}

void NicClasses::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (absl::Status s = run_(TeardownCommands(options_.nic)); !s.ok()) {
    MLF_LOG(WARNING) << "cannot remove the NIC priorities on " << options_.nic.interface << ": "
                     << s.message();
  } else {
    MLF_LOG(INFO) << "NIC priorities on " << options_.nic.interface << " removed";
  }
}

std::vector<std::string> NicClasses::Installed() const {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (size_t i : installed_) names.push_back(options_.jobs[i].name);
  return names;
}

int64_t NicClasses::rerankings() const {
  MutexLock lock(&mu_);
  return rerankings_;
}

}  // namespace mlfabric::nicprio
