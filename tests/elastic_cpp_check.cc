// elastic_cpp_check: a rank of //tests:elastic_rejoin_cpp_test, the C++
// twin of tests/elastic_rejoin_check.py, under mlfabric-run's elastic mode:
// an ElasticAllReducer (api/elastic.h), a step counter and four doubles
// committed after every step, one AllReduce of ones per step (each step
// adds the size of its membership), a membership check at every commit.
// On a membership change it goes back to the last commit, rebuilds for
// the new members and takes the state of SyncRoot's rank. It trains at
// least STEPS steps and until the job has WANT members; it writes its pid
// to DIR/pid-<worker>, rank 0 its step to DIR/progress, and every rank its
// final state to DIR/final-<worker>: "step total size rank generation
// members".
//
//   elastic_cpp_check DIR STEPS WANT
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/elastic.h"

namespace {

using mlfabric::DataType;
using mlfabric::ElasticAllReducer;

struct State {
  int64_t step = 0;
  double total[4] = {0, 0, 0, 0};
};

void Write(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: elastic_cpp_check DIR STEPS WANT\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t steps = std::atoll(argv[2]);
  const int want = std::atoi(argv[3]);
  const char* env_name = std::getenv("MLFABRIC_WORKER_NAME");
  const std::string name = env_name != nullptr ? env_name : "";
  Write(absl::StrCat(dir, "/pid-", name), absl::StrCat(::getpid(), "\n"));

  mlfabric::AllReduceOptions options;
  options.backend = "mlfabric";
  options.timeout_s = 60;
  auto created = ElasticAllReducer::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "elastic_cpp_check %s: %s\n", name.c_str(),
                 std::string(created.status().message()).c_str());
    return 1;
  }
  ElasticAllReducer& elastic = **created;
  State state, committed;
  bool has_state = false;  // a joiner has none until it syncs

  // Every rank takes the state of the lowest rank that has one.
  auto sync = [&]() -> absl::Status {
    absl::StatusOr<int> root = elastic.SyncRoot(has_state);
    if (!root.ok()) return root.status();
    if (absl::Status s = elastic.reducer().Broadcast(&state.step, 1, DataType::kInt64, *root);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = elastic.reducer().Broadcast(state.total, 4, DataType::kFloat64, *root);
        !s.ok()) {
      return s;
    }
    committed = state;
    has_state = true;
    return absl::OkStatus();
  };
  // After `error`: back to the last commit, rebuilt for the new members,
  // synced; false (the error stands) if it was no membership change.
  auto recover = [&](absl::Status error) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      std::optional<mlfabric::JobMembers> next = elastic.MembershipChanged(error);
      if (!next.has_value()) break;
      // Worded as mlfabric.elastic's, which the test looks for.
      std::fprintf(stderr, "elastic_cpp_check %s: %s; %s: membership generation %llu, %zu "
                   "member(s) (%s); rebuilding\n",
                   name.c_str(), std::string(error.message()).c_str(),
                   mlfabric::IsMembershipChange(error) ? "a worker left the job"
                                                       : "rank 0 left the job",
                   static_cast<unsigned long long>(next->generation), next->members.size(),
                   absl::StrJoin(next->members, ", ").c_str());
      state = committed;
      error = elastic.Rebuild(*next);
      if (error.ok()) error = sync();
      if (error.ok()) return true;
    }
    std::fprintf(stderr, "elastic_cpp_check %s: %s\n", name.c_str(),
                 std::string(error.message()).c_str());
    return false;
  };

  if (absl::Status s = sync(); !s.ok() && !recover(s)) return 1;
  while (state.step < steps || elastic.reducer().size() < want) {
    double ones[4] = {1, 1, 1, 1};
    if (absl::Status s = elastic.reducer().AllReduce(ones, 4, DataType::kFloat64); !s.ok()) {
      if (!recover(s)) return 1;
      continue;
    }
    for (int i = 0; i < 4; ++i) state.total[i] += ones[i];
    ++state.step;
    if (elastic.reducer().rank() == 0) {
      Write(dir + "/progress", absl::StrCat(state.step, "\n"));
    }
    committed = state;
    has_state = true;
    auto changed = elastic.CheckMembership();
    if (!changed.ok()) {
      if (!recover(changed.status())) return 1;
    } else if (changed->has_value()) {
      // The wording of mlfabric.elastic's, which the test looks for.
      std::fprintf(stderr,
                   "elastic_cpp_check %s: the job's membership changed: generation %llu, %zu "
                   "member(s) (%s)\n",
                   name.c_str(), static_cast<unsigned long long>((*changed)->generation),
                   (*changed)->members.size(), absl::StrJoin((*changed)->members, ", ").c_str());
      absl::Status s = elastic.Rebuild(**changed);
      if (s.ok()) s = sync();
      if (!s.ok() && !recover(s)) return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The generation the ranks trained under last (agreed by CheckMembership),
  // not the job's membership now: a rank that finished first may have left.
  const mlfabric::JobMembers& trained = elastic.members();
  Write(absl::StrCat(dir, "/final-", name),
        absl::StrCat(state.step, " ", absl::StrJoin(state.total, state.total + 4, ","), " ",
                     elastic.reducer().size(), " ", elastic.reducer().rank(), " ",
                     trained.generation, " ", absl::StrJoin(trained.members, ","), "\n"));
  std::printf("elastic_cpp_check %s: rank %d of %d, step %lld\n", name.c_str(),
              elastic.reducer().rank(), elastic.reducer().size(),
              static_cast<long long>(state.step));
  return 0;
}
