// LocalReduceGroup across real processes (fork): exact sums of every type
// over several chunks, the leader's cross-host step and its errors,
// mismatched shapes, and the two faults -- a member that exits and one
// that never arrives -- ending every member's call with a reason.
// Children report through their exit code (and stderr); the parent alone
// uses Catch2, and kills children that outlive a generous bound.
#include "api/local_reduce.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "catch2/catch.hpp"
#include "common/half.h"

namespace mlfabric::internal {
namespace {

std::string UniqueName() {
  static int counter = 0;
  return "/mlfabric-local-reduce-test-" + std::to_string(::getpid()) + "-" +
         std::to_string(++counter);
}

// Runs fn(index) in `members` child processes; returns their exit codes
// (-1: killed after 120 s, so a hang fails the test instead of stalling it).
std::vector<int> RunMembers(int members, const std::function<int(int)>& fn) {
  std::vector<pid_t> pids;
  for (int i = 0; i < members; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 99;
      try {
        code = fn(i);
      } catch (...) {
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(members, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int left = members;
  while (left > 0) {
    for (int i = 0; i < members; ++i) {
      if (pids[i] == 0) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pids[i] = 0;
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : pids) {
        if (pid != 0) ::kill(pid, SIGKILL), ::waitpid(pid, nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

int Fail(int index, const std::string& what) {
  std::fprintf(stderr, "member %d: %s\n", index, what.c_str());
  return 1;
}

// Member i's integer-valued input for call `call`: exact in every type.
template <typename T>
std::vector<T> Input(int i, int call, size_t count, int range) {
  std::mt19937 rng(100 * i + call);
  std::uniform_int_distribution<int> dist(-range, range);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// a + b as the kernels sum: integers wrap (two's complement), computed in
// the unsigned type (signed overflow is undefined in C++).
template <typename T>
T WrappingSum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return static_cast<T>(a + b);
  }
}

template <typename T>
int CheckSum(LocalReduceGroup& g, ElementType type, int call, size_t count, int range) {
  std::vector<T> mine = Input<T>(g.index(), call, count, range);
  std::vector<T> expected(count, T{});
  for (int i = 0; i < g.members(); ++i) {
    std::vector<T> theirs = Input<T>(i, call, count, range);
    for (size_t e = 0; e < count; ++e) expected[e] = WrappingSum(expected[e], theirs[e]);
  }
  absl::Status status = g.AllReduce(mine.data(), count, type, nullptr, 30);
  if (!status.ok()) return Fail(g.index(), std::string(status.message()));
  if (mine != expected) return Fail(g.index(), "wrong sum in call " + std::to_string(call));
  return 0;
}

// The reduction of every member's input by `op`, computed here: min and max
// by comparison, products wrapping modulo 2^width (in a wide unsigned type).
template <typename T>
int CheckOp(LocalReduceGroup& g, ElementType type, aggregator::ReduceOp op, int call,
            size_t count, int range) {
  std::vector<T> mine = Input<T>(g.index(), call, count, range);
  std::vector<T> expected = Input<T>(0, call, count, range);
  for (int i = 1; i < g.members(); ++i) {
    std::vector<T> theirs = Input<T>(i, call, count, range);
    for (size_t e = 0; e < count; ++e) {
      T& x = expected[e];
      if (op == aggregator::ReduceOp::kMin) x = std::min(x, theirs[e]);
      if (op == aggregator::ReduceOp::kMax) x = std::max(x, theirs[e]);
      if (op == aggregator::ReduceOp::kProduct) {
        if constexpr (std::is_integral_v<T>) {
          x = static_cast<T>(static_cast<uint64_t>(x) * static_cast<uint64_t>(theirs[e]));
        } else {
          x = x * theirs[e];  // exact: three factors of at most 1000
        }
      }
    }
  }
  absl::Status status = g.AllReduce(mine.data(), count, type, nullptr, 30, op);
  if (!status.ok()) return Fail(g.index(), std::string(status.message()));
  if (mine != expected) {
    return Fail(g.index(), std::string("wrong ") + aggregator::ReduceOpName(op) + " in call " +
                               std::to_string(call));
  }
  return 0;
}

int CheckHalfSum(LocalReduceGroup& g, int call, size_t count) {
  std::vector<float> mine_f = Input<float>(g.index(), call, count, 8);
  std::vector<uint16_t> mine(count);
  for (size_t e = 0; e < count; ++e) mine[e] = FloatToHalf(mine_f[e]);
  std::vector<float> expected(count, 0);
  for (int i = 0; i < g.members(); ++i) {
    std::vector<float> theirs = Input<float>(i, call, count, 8);
    for (size_t e = 0; e < count; ++e) expected[e] += theirs[e];
  }
  absl::Status status = g.AllReduce(mine.data(), count, ElementType::kFloat16, nullptr, 30);
  if (!status.ok()) return Fail(g.index(), std::string(status.message()));
  for (size_t e = 0; e < count; ++e) {
    if (HalfToFloat(mine[e]) != expected[e]) return Fail(g.index(), "wrong float16 sum");
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<LocalReduceGroup>> JoinAs(const std::string& name, int index,
                                                        int members, size_t slot_bytes = 4096) {
  return LocalReduceGroup::Join(name, index, members, /*rank=*/10 + index, 30, slot_bytes);
}

TEST_CASE("Members sum every type exactly, over several chunks, to the same values") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3);  // 4 KiB slots: 3000 int32 take 3 chunks
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    LocalReduceGroup& g = **group;
    int failed = 0;
    failed += CheckSum<int32_t>(g, ElementType::kInt32, 1, 3000, 1 << 30);  // wraps
    failed += CheckSum<int64_t>(g, ElementType::kInt64, 2, 1025, 1 << 30);
    failed += CheckSum<float>(g, ElementType::kFloat32, 3, 2500, 1000);
    failed += CheckSum<double>(g, ElementType::kFloat64, 4, 700, 1000);
    failed += CheckHalfSum(g, 5, 4097);
    failed += CheckSum<float>(g, ElementType::kFloat32, 6, 1, 1000);
    failed += CheckSum<float>(g, ElementType::kFloat32, 7, 0, 1000);
    // 8- and 16-bit integers wrap as MPI_SUM does (values up to 127 / 30000).
    failed += CheckSum<int8_t>(g, ElementType::kInt8, 41, 9000, 127);
    failed += CheckSum<uint8_t>(g, ElementType::kUint8, 42, 5000, 255);
    failed += CheckSum<int16_t>(g, ElementType::kInt16, 43, 3000, 30000);
    failed += CheckSum<uint16_t>(g, ElementType::kUint16, 44, 3000, 65535);
    for (int call = 8; call < 40; ++call) {  // many small calls reuse the barrier
      failed += CheckSum<int32_t>(g, ElementType::kInt32, call, 17, 100);
    }
    return failed == 0 ? 0 : 2;
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("The leader's cross-host step reaches every member, and so does its error") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3, 1024);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    LocalReduceGroup& g = **group;
    // "Another host" holding twice this host's sum: the result is 3x.
    LocalReduceGroup::CrossHost triple;
    triple.reduce = [](void* data, size_t count, ElementType type, const std::vector<int64_t>*) {
      if (type != ElementType::kInt64) return absl::InternalError("type");
      auto* v = static_cast<int64_t*>(data);
      for (size_t e = 0; e < count; ++e) v[e] *= 3;
      return absl::OkStatus();
    };
    std::vector<int64_t> v(1000);
    for (size_t e = 0; e < v.size(); ++e) v[e] = static_cast<int64_t>(e) + i;
    absl::Status s = g.AllReduce(v.data(), v.size(), ElementType::kInt64, &triple, 30);
    if (!s.ok()) return Fail(i, std::string(s.message()));
    for (size_t e = 0; e < v.size(); ++e) {
      if (v[e] != 3 * (3 * static_cast<int64_t>(e) + 3)) return Fail(i, "wrong cross-host sum");
    }
    LocalReduceGroup::CrossHost refuse;
    refuse.reduce = [](void*, size_t, ElementType, const std::vector<int64_t>*) {
      return absl::UnavailableError("AllReduce round 7: the root is gone");
    };
    s = g.AllReduce(v.data(), v.size(), ElementType::kInt64, &refuse, 30);
    if (s.code() != absl::StatusCode::kUnavailable ||
        std::string(s.message()).find("the root is gone") == std::string::npos ||
        (i > 0 && std::string(s.message()).find("via rank 10") == std::string::npos)) {
      return Fail(i, "cross-host error not passed on: " + s.ToString());
    }
    // The group goes on after a failed cross-host step.
    return CheckSum<int32_t>(g, ElementType::kInt32, 3, 100, 100);
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("Min, max and product over several chunks; integer products wrap") {
  using aggregator::ReduceOp;
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    LocalReduceGroup& g = **group;
    int failed = 0;
    int call = 1;
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      failed += CheckOp<int8_t>(g, ElementType::kInt8, op, call++, 9000, 127);
      failed += CheckOp<uint8_t>(g, ElementType::kUint8, op, call++, 5000, 255);
      failed += CheckOp<int16_t>(g, ElementType::kInt16, op, call++, 3000, 30000);
      failed += CheckOp<uint16_t>(g, ElementType::kUint16, op, call++, 3000, 65535);
      failed += CheckOp<int64_t>(g, ElementType::kInt64, op, call++, 1025, 1 << 30);
      failed += CheckOp<double>(g, ElementType::kFloat64, op, call++, 700, 1000);
    }
    return failed == 0 ? 0 : 2;
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("Reduce ops that differ fail every member with FailedPrecondition naming both") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(2, [&](int i) {
    auto group = JoinAs(name, i, 2);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    std::vector<int32_t> v(10, 1);
    const auto op = i == 0 ? aggregator::ReduceOp::kMin : aggregator::ReduceOp::kMax;
    absl::Status s = (*group)->AllReduce(v.data(), v.size(), ElementType::kInt32, nullptr, 30, op);
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        std::string(s.message()).find("rank 10 passes 10 int32 (min), rank 11 passes 10 int32 "
                                      "(max)") == std::string::npos) {
      return Fail(i, "op mismatch not reported: " + s.ToString());
    }
    return CheckSum<int32_t>(**group, ElementType::kInt32, 1, 10, 10);
  });
  CHECK(codes == std::vector<int>({0, 0}));
}

TEST_CASE("Shapes that differ fail on every member, naming both, and the group goes on") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(2, [&](int i) {
    auto group = JoinAs(name, i, 2);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    std::vector<float> v(i == 0 ? 10 : 12, 1.0f);
    // Across hosts, the leader spoils the other hosts' round instead of
    // reducing: a shape left out there would desynchronise the rounds.
    bool spoiled = false, reduced = false;
    LocalReduceGroup::CrossHost cross;
    cross.reduce = [&](void*, size_t, ElementType, const std::vector<int64_t>*) {
      reduced = true;
      return absl::OkStatus();
    };
    cross.spoil = [&] { spoiled = true; };
    absl::Status s = (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, &cross, 30);
    if (reduced || spoiled != (i == 0)) return Fail(i, "the leader must spoil, not reduce");
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        std::string(s.message()).find(
            "rank 10 passes 10 float32 (sum), rank 11 passes 12 float32 (sum)") ==
            std::string::npos) {
      return Fail(i, "mismatch not reported: " + s.ToString());
    }
    return CheckSum<float>(**group, ElementType::kFloat32, 1, 10, 10);
  });
  CHECK(codes == std::vector<int>({0, 0}));
}

TEST_CASE("Tensor shapes: equal ones reach the cross-host step, differing ones fail all") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    std::vector<float> v(12, 1.0f);
    std::optional<std::vector<int64_t>> crossed;  // the shape the leader's step was given
    bool spoiled = false;
    LocalReduceGroup::CrossHost cross;
    cross.reduce = [&](void*, size_t, ElementType, const std::vector<int64_t>* shape) {
      crossed.reset();
      if (shape != nullptr) crossed = *shape;
      return absl::OkStatus();
    };
    cross.spoil = [&] { spoiled = true; };
    // Member 0 names none, which agrees with any: the host's shape is [2, 6].
    const std::vector<int64_t> two_six{2, 6}, twelve{12};
    absl::Status s = (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, &cross, 30,
                                         aggregator::ReduceOp::kSum, i == 0 ? nullptr : &two_six);
    if (!s.ok()) return Fail(i, "equal shapes: " + s.ToString());
    if (i == 0 && crossed != two_six) return Fail(i, "the host's shape did not reach the leader");
    // Member 2 names [12]: every member fails naming both, the leader spoils.
    s = (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, &cross, 30,
                            aggregator::ReduceOp::kSum, i == 2 ? &twelve : &two_six);
    if (spoiled != (i == 0)) return Fail(i, "the leader must spoil the other hosts' round");
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        std::string(s.message()).find("Mismatched AllReduce tensor shapes: rank 10 passed shape "
                                      "[2, 6] while rank 12 passed shape [12]") ==
            std::string::npos) {
      return Fail(i, "shape mismatch not reported: " + s.ToString());
    }
    // A scalar's [] differs from [1].
    const std::vector<int64_t> scalar{}, one{1};
    float x = 1.0f;
    s = (*group)->AllReduce(&x, 1, ElementType::kFloat32, nullptr, 30, aggregator::ReduceOp::kSum,
                            i == 1 ? &one : &scalar);
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        std::string(s.message()).find("passed shape [] while rank 11 passed shape [1]") ==
            std::string::npos) {
      return Fail(i, "[] against [1] not reported: " + s.ToString());
    }
    return CheckSum<float>(**group, ElementType::kFloat32, 1, 12, 10);
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("A member that exits breaks the group: the others' calls fail naming it") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    if (i == 2) return 0;  // exits instead of reducing
    std::vector<float> v(100, 1.0f);
    // Not the timeout: the exit is seen within milliseconds.
    absl::Status s = (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, nullptr, 600);
    if (s.code() != absl::StatusCode::kUnavailable ||
        std::string(s.message()).find("rank 12 (pid") == std::string::npos ||
        std::string(s.message()).find("exited") == std::string::npos) {
      return Fail(i, "exit not reported: " + s.ToString());
    }
    // Later calls fail at once, with the same reason.
    absl::Status again =
        (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, nullptr, 600);
    if (again != s) return Fail(i, "later call: " + again.ToString());
    return 0;
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("A member that never arrives: the others fail after the timeout, naming it") {
  const std::string name = UniqueName();
  const std::vector<int> codes = RunMembers(3, [&](int i) {
    auto group = JoinAs(name, i, 3);
    if (!group.ok()) return Fail(i, std::string(group.status().message()));
    std::vector<float> v(100, 1.0f);
    if (i == 1) std::this_thread::sleep_for(std::chrono::seconds(2));  // alive, but late
    absl::Status s = (*group)->AllReduce(v.data(), v.size(), ElementType::kFloat32, nullptr, 0.3);
    if (s.code() != absl::StatusCode::kUnavailable) return Fail(i, "late: " + s.ToString());
    // Whoever timed out first named rank 11; the late member sees the same.
    if (std::string(s.message()).find("rank 11 (pid") == std::string::npos ||
        std::string(s.message()).find("did not reach the AllReduce within 0.3 s") ==
            std::string::npos) {
      return Fail(i, "timeout not reported: " + s.ToString());
    }
    return 0;
  });
  CHECK(codes == std::vector<int>({0, 0, 0}));
}

TEST_CASE("Join: a bad name, a bad index and a leader that never comes are errors") {
  CHECK(LocalReduceGroup::Join("no-slash", 0, 2, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LocalReduceGroup::Join("/a", 2, 2, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto orphan = LocalReduceGroup::Join(UniqueName(), 1, 2, 0, 0.2);
  REQUIRE(orphan.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(orphan.status().message()).find("its leader did not create it") !=
        std::string::npos);
}

TEST_CASE("A leader that dies while the group forms leaves no name behind") {
  const std::string name = UniqueName();
  const pid_t leader = ::fork();
  if (leader == 0) {
    auto group = JoinAs(name, 0, 2);  // waits for member 1, which comes too late
    ::_exit(group.ok() ? 0 : 1);
  }
  // Once the leader has created the segment, it dies (SIGKILL: no cleanup).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int fd = -1;
  while (fd < 0 && std::chrono::steady_clock::now() < deadline) {
    fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(fd >= 0);
  ::close(fd);
  ::kill(leader, SIGKILL);
  ::waitpid(leader, nullptr, 0);
  // Member 1 joins (or times out, if the leader died before it was ready);
  // either way the name is gone afterwards, and a call fails naming the leader.
  auto member = LocalReduceGroup::Join(name, 1, 2, /*rank=*/11, 1.0, 4096);
  errno = 0;
  CHECK(::shm_open(name.c_str(), O_RDONLY, 0) < 0);
  CHECK(errno == ENOENT);
  if (member.ok()) {
    std::vector<float> v(100, 1.0f);
    const absl::Status s =
        (*member)->AllReduce(v.data(), v.size(), ElementType::kFloat32, nullptr, 5);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(s.message()).find("rank 10") != std::string::npos);
  }
}

}  // namespace
}  // namespace mlfabric::internal
