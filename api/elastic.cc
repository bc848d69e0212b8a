#include "api/elastic.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mlfabric {
namespace {

// A name cut into text and digit runs; digit runs compare as numbers (by
// length first, then bytes: no overflow however long).
struct NamePart {
  bool digits = false;
  std::string text;
};

std::vector<NamePart> Parts(const std::string& name) {
  std::vector<NamePart> parts;
  for (size_t i = 0; i < name.size();) {
    const bool digits = std::isdigit(static_cast<unsigned char>(name[i])) != 0;
    size_t j = i;
    while (j < name.size() &&
           (std::isdigit(static_cast<unsigned char>(name[j])) != 0) == digits) {
      ++j;
    }
    std::string text = name.substr(i, j - i);
    if (digits) {
      const size_t nonzero = text.find_first_not_of('0');
      text = nonzero == std::string::npos ? "0" : text.substr(nonzero);
    }
    parts.push_back({digits, std::move(text)});
    i = j;
  }
  return parts;
}

bool RankBefore(const std::string& a, const std::string& b) {
  const std::vector<NamePart> pa = Parts(a), pb = Parts(b);
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    if (pa[i].digits != pb[i].digits) return pa[i].digits;  // digits first, as '0' < 'a'
    if (pa[i].digits && pa[i].text.size() != pb[i].text.size()) {
      return pa[i].text.size() < pb[i].text.size();
    }
    if (pa[i].text != pb[i].text) return pa[i].text < pb[i].text;
  }
  if (pa.size() != pb.size()) return pa.size() < pb.size();
  return a < b;  // equal by value ("rank01", "rank1"): bytewise, so the order is total
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

JobMembers Ordered(JobMembers members) {
  members.members = RankOrder(std::move(members.members));
  return members;
}

}  // namespace

bool IsMembershipChange(const absl::Status& status) {
  return !status.ok() && absl::StrContains(status.message(), "left the job") &&
         absl::StrContains(status.message(), "membership generation");
}

std::vector<std::string> RankOrder(std::vector<std::string> names) {
  std::sort(names.begin(), names.end(), RankBefore);
  return names;
}

ElasticAllReducer::ElasticAllReducer(AllReduceOptions options, std::string name,
                                     std::unique_ptr<Worker> asker)
    : options_(std::move(options)), name_(std::move(name)), asker_(std::move(asker)) {}

ElasticAllReducer::~ElasticAllReducer() {
  reducer_.reset();  // before the membership connection
  asker_.reset();
}

absl::StatusOr<std::unique_ptr<ElasticAllReducer>> ElasticAllReducer::Create(
    AllReduceOptions options, double wait_s) {
  if (options.backend != "mlfabric") {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticAllReducer: backend '", options.backend,
        "': only the mlfabric backend follows a changing membership"));
  }
  if (options.client.name.empty()) options.client.name = Env("MLFABRIC_WORKER_NAME");
  if (options.client.name.empty()) {
    return absl::InvalidArgumentError(
        "ElasticAllReducer: no worker name: set AllReduceOptions::client.name or "
        "MLFABRIC_WORKER_NAME (mlfabric-run's elastic mode sets it)");
  }
  if (const std::string job = Env("MLFABRIC_JOB"); !job.empty() && options.client.job == "demo") {
    options.client.job = job;
  }
  auto asker = Worker::Connect(options.client);
  if (!asker.ok()) return asker.status();
  std::string name = options.client.name;
  std::unique_ptr<ElasticAllReducer> elastic(
      new ElasticAllReducer(std::move(options), std::move(name), std::move(*asker)));
  // The ranks of a starting job register within moments; a joiner finds
  // the running ones at once.
  const int want = std::max(1, std::atoi(Env("MLFABRIC_SIZE").c_str()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  absl::StatusOr<JobMembers> members = elastic->Membership();
  while (members.ok() && static_cast<int>(members->members.size()) < want &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    members = elastic->Membership();
  }
  if (!members.ok()) return members.status();
  if (absl::Status built = elastic->Rebuild(*members); !built.ok()) return built;
  return elastic;
}

absl::StatusOr<JobMembers> ElasticAllReducer::Membership() {
  absl::StatusOr<JobMembers> members = asker_->Membership();
  if (!members.ok()) return members.status();
  return Ordered(std::move(*members));
}

absl::Status ElasticAllReducer::Rebuild(const JobMembers& members) {
  const JobMembers ordered = Ordered(members);
  const auto at = std::find(ordered.members.begin(), ordered.members.end(), name_);
  if (at == ordered.members.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", name_, "' is no member of its job at membership generation ",
                     ordered.generation, " (members: ", absl::StrJoin(ordered.members, ", "), ")"));
  }
  reducer_.reset();  // its root (if this rank ran it) lingers for late gets first
  AllReduceOptions options = options_;
  options.rank = static_cast<int>(at - ordered.members.begin());
  options.size = static_cast<int>(ordered.members.size());
  options.root_rank = 0;
  // Every rank in every round: a host's shared-memory group has a fixed
  // membership, and one rank's death there breaks it for the host's others.
  options.local_reduce = false;
  options.root_server = absl::StrCat(options.client.job, "-allreduce-root-g", ordered.generation);
  absl::StatusOr<std::unique_ptr<AllReducer>> reducer = MakeAllReducer(options);
  if (!reducer.ok()) return reducer.status();
  reducer_ = std::move(*reducer);
  members_ = ordered;
  ::setenv("MLFABRIC_RANK", std::to_string(options.rank).c_str(), 1);
  ::setenv("MLFABRIC_SIZE", std::to_string(options.size).c_str(), 1);
  return absl::OkStatus();
}

std::optional<JobMembers> ElasticAllReducer::MembershipChanged(const absl::Status& error,
                                                               double wait_s) {
  if (error.ok()) return std::nullopt;
  if (IsMembershipChange(error)) {
    absl::StatusOr<JobMembers> now = Membership();
    if (now.ok()) return *now;
    return std::nullopt;
  }
  if (members_.members.empty() || members_.members.front() == name_) return std::nullopt;
  const std::string& root_member = members_.members.front();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (true) {
    absl::StatusOr<JobMembers> now = Membership();
    if (now.ok()) {
      const auto& names = now->members;
      const bool root_gone = std::find(names.begin(), names.end(), root_member) == names.end();
      // A root replaced already (gone and back under its name) shows only
      // as a later generation.
      const bool replaced = now->generation != members_.generation;
      if ((root_gone || replaced) && std::find(names.begin(), names.end(), name_) != names.end()) {
        return *now;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

absl::StatusOr<std::optional<JobMembers>> ElasticAllReducer::CheckMembership() {
  // Rank 0's membership as "generation\nname\nname...", its length first.
  std::string text;
  if (reducer_->rank() == 0) {
    absl::StatusOr<JobMembers> now = Membership();
    if (!now.ok()) return now.status();
    text = absl::StrCat(now->generation, "\n", absl::StrJoin(now->members, "\n"));
  }
  int64_t length = static_cast<int64_t>(text.size());
  if (absl::Status s = reducer_->Broadcast(&length, 1, DataType::kInt64, 0); !s.ok()) return s;
  text.resize(static_cast<size_t>(length));
  if (absl::Status s = reducer_->Broadcast(text.data(), text.size(), DataType::kUint8, 0);
      !s.ok()) {
    return s;
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  JobMembers members;
  members.generation = std::strtoull(lines.front().c_str(), nullptr, 10);
  for (size_t i = 1; i < lines.size(); ++i) {
    if (!lines[i].empty()) members.members.push_back(lines[i]);
  }
  if (members.generation == members_.generation) return std::optional<JobMembers>();
  return std::optional<JobMembers>(Ordered(std::move(members)));
}

absl::StatusOr<int> ElasticAllReducer::SyncRoot(bool has_state) {
  std::vector<int32_t> flags(static_cast<size_t>(reducer_->size()), 0);
  flags[static_cast<size_t>(reducer_->rank())] = has_state ? 1 : 0;
  if (absl::Status s = reducer_->AllReduce(flags.data(), flags.size(), DataType::kInt32);
      !s.ok()) {
    return s;
  }
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] > 0) return static_cast<int>(r);
  }
  return 0;
}

}  // namespace mlfabric
