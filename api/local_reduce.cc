#include "api/local_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregator/packet_pool.h"

namespace mlfabric::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x4d4c46616c727631ull;  // "MLFalrv1"
constexpr size_t kPage = 4096;
// Arrivals checked in a busy loop before sleeping on the futex: a barrier
// whose last member is running on another core is met within a few
// microseconds; with more members than cores, sleeping at once is better.
constexpr int kSpins = 2000;
// A sleeping member wakes this often to check that its peers live.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(20);

std::optional<aggregator::DType> PoolType(ElementType type);

// The name of a call's element type as a member recorded it.
const char* TypeName(int32_t type) {
  const std::optional<aggregator::DType> pool = PoolType(static_cast<ElementType>(type));
  return pool.has_value() ? aggregator::DTypeName(*pool) : "opaque";
}

std::optional<aggregator::DType> PoolType(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: return aggregator::DType::kFloat32;
    case ElementType::kFloat64: return aggregator::DType::kFloat64;
    case ElementType::kInt32: return aggregator::DType::kInt32;
    case ElementType::kInt64: return aggregator::DType::kInt64;
    case ElementType::kFloat16: return aggregator::DType::kFloat16;
    case ElementType::kInt8: return aggregator::DType::kInt8;
    case ElementType::kUint8: return aggregator::DType::kUint8;
    case ElementType::kInt16: return aggregator::DType::kInt16;
    case ElementType::kUint16: return aggregator::DType::kUint16;
    case ElementType::kOpaque: return std::nullopt;
  }
  return std::nullopt;
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Not FUTEX_PRIVATE_FLAG: the word is in memory other processes map.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Whether process `pid` has ended (gone, or a zombie its parent has not
// reaped yet).
bool Exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string Errno(const char* what, const std::string& name) {
  return absl::StrCat(what, " '", name, "': ", std::strerror(errno));
}

// When LocalReduceGroup::Join gives up (now + its timeout_s).
using Deadline = decltype(Clock::now() + std::chrono::duration<double>(0));

// LocalReduceGroup::Join: the group's shared memory of `total` bytes, open
// for reading and writing; the leader (index 0) creates and sizes it, the
// others wait until it has.
absl::StatusOr<int> OpenShared(const std::string& name, int index, size_t total,
                               Deadline deadline, double timeout_s) {
  int fd = -1;
  if (index == 0) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return absl::InternalError(Errno("cannot create shared memory", name));
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      const std::string error = Errno("cannot size shared memory", name);
      ::close(fd);
      ::shm_unlink(name.c_str());
      return absl::InternalError(error);
    }
    return fd;
  }
  // The leader may not have created it yet, or not sized it.
  while (true) {
    fd = ::shm_open(name.c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == total) return fd;
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (Clock::now() >= deadline) {
      // A leader that died between creating and sizing it leaves the name.
      ::shm_unlink(name.c_str());
      return absl::DeadlineExceededError(absl::StrCat(
          "host-local AllReduce group '", name, "': its leader did not create it within ",
          timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

struct MemberInfo {
  std::atomic<int32_t> pid;        // 0 until the member has joined
  int32_t rank;
  std::atomic<uint64_t> arrivals;  // barriers it has reached
  // The shape of its calls, by the call's parity: a member that returns
  // early from a call (shapes differ) may write its next call's shape
  // while the others still read this one's.
  uint64_t count[2];
  int32_t type[2];
  int32_t op[2];  // aggregator::ReduceOp
  // The tensor shape the call named: its number of dimensions (-1: none)
  // and the first kMaxShapeDims of them.
  int32_t dims[2];
  int64_t shape[2][LocalReduceGroup::kMaxShapeDims];
};

struct LocalReduceGroup::Header {
  std::atomic<uint64_t> magic;  // kMagic once the leader has set the rest
  uint32_t members;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;  // the futex word
  alignas(64) std::atomic<uint32_t> claimed;     // a Break owns `reason`
  std::atomic<uint32_t> broken;                  // `reason` is written
  char reason[512];
  int32_t cross_code;  // the leader's cross-host step, as absl::StatusCode
  char cross_message[1024];
  MemberInfo member[kMaxMembers];
};

LocalReduceGroup::LocalReduceGroup(int index, int members, uint8_t* base, size_t mapped,
                                   size_t slot_bytes)
    : index_(index),
      members_(members),
      base_(base),
      mapped_(mapped),
      slot_bytes_(slot_bytes),
      header_(reinterpret_cast<Header*>(base)) {}

LocalReduceGroup::~LocalReduceGroup() { ::munmap(base_, mapped_); }

uint8_t* LocalReduceGroup::Slot(int i) const {
  return base_ + RoundUp(sizeof(Header), kPage) + static_cast<size_t>(i) * slot_bytes_;
}

absl::StatusOr<std::unique_ptr<LocalReduceGroup>> LocalReduceGroup::Join(
    const std::string& name, int index, int members, int rank, double timeout_s,
    size_t slot_bytes) {
  if (members < 1 || members > kMaxMembers || index < 0 || index >= members) {
    return absl::InvalidArgumentError(absl::StrCat("host-local AllReduce group '", name,
                                                   "': member ", index, " of ", members,
                                                   " (at most ", kMaxMembers, ")"));
  }
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-local AllReduce group name '", name, "' must be \"/\" + a file name"));
  }
  slot_bytes = RoundUp(std::max<size_t>(slot_bytes, 64), 64);
  const size_t total = RoundUp(sizeof(Header), kPage) + (members + 1) * slot_bytes;
  const Deadline deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  absl::StatusOr<int> fd = OpenShared(name, index, total, deadline, timeout_s);
  if (!fd.ok()) return fd.status();
  void* mapped = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  ::close(*fd);
  if (mapped == MAP_FAILED) {
    if (index == 0) ::shm_unlink(name.c_str());
    return absl::InternalError(Errno("cannot map shared memory", name));
  }
  auto* base = static_cast<uint8_t*>(mapped);
  std::unique_ptr<LocalReduceGroup> group(
      new LocalReduceGroup(index, members, base, total, slot_bytes));
  Header* h = group->header_;
  if (index == 0) {
    new (h) Header();  // the object is zero-filled; this makes it so in C++ terms too
    h->members = static_cast<uint32_t>(members);
    h->slot_bytes = slot_bytes;
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    while (h->magic.load(std::memory_order_acquire) != kMagic) {
      if (Clock::now() >= deadline) {
        ::shm_unlink(name.c_str());
        return absl::DeadlineExceededError(absl::StrCat(
            "host-local AllReduce group '", name, "' was never initialised by its leader"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (h->members != static_cast<uint32_t>(members) || h->slot_bytes != slot_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host-local AllReduce group '", name, "' has ", h->members, " members of ",
          h->slot_bytes, " bytes; this member expected ", members, " of ", slot_bytes));
    }
  }
  h->member[index].rank = rank;
  h->member[index].pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  const double left_s =
      std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
  absl::Status joined = group->Barrier(left_s);
  // Every member removes the name once the group formed or failed to (the
  // first succeeds, the rest find it gone): it must not outlive a leader
  // that died while the others were joining.
  ::shm_unlink(name.c_str());
  if (!joined.ok()) {
    return absl::Status(joined.code(), absl::StrCat("joining the host-local AllReduce group '",
                                                    name, "': ", joined.message()));
  }
  return group;
}

void LocalReduceGroup::Break(const std::string& reason) {
  Header* h = header_;
  uint32_t expected = 0;
  if (h->claimed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::snprintf(h->reason, sizeof(h->reason), "%s", reason.c_str());
    h->broken.store(1, std::memory_order_release);
  }
  FutexWakeAll(&h->generation);
}

absl::Status LocalReduceGroup::BrokenStatus() const {
  // A Break claims the reason before it publishes it: wait for the text.
  while (header_->broken.load(std::memory_order_acquire) == 0) std::this_thread::yield();
  return absl::UnavailableError(
      absl::StrCat("host-local AllReduce group broken: ", header_->reason));
}

absl::Status LocalReduceGroup::Barrier(double timeout_s) {
  Header* h = header_;
  if (h->broken.load(std::memory_order_acquire) != 0) return BrokenStatus();
  const uint32_t generation = h->generation.load(std::memory_order_acquire);
  const uint64_t mine = h->member[index_].arrivals.fetch_add(1, std::memory_order_relaxed) + 1;
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(members_)) {
    // The last to arrive opens the barrier. `arrived` is reset before the
    // generation moves, so nobody can arrive at the next barrier first.
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&h->generation);
    return absl::OkStatus();
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  for (int spin = 0;; ++spin) {
    // A completed barrier counts even if the group broke just after.
    if (h->generation.load(std::memory_order_acquire) != generation) return absl::OkStatus();
    if (h->broken.load(std::memory_order_acquire) != 0) return BrokenStatus();
    if (spin < kSpins) {
      CpuRelax();
      continue;
    }
    for (int j = 0; j < members_; ++j) {
      const int32_t pid = h->member[j].pid.load(std::memory_order_acquire);
      if (j != index_ && pid > 0 && Exited(pid)) {
        // It may have opened this barrier and then exited (its last call
        // done) since the generation was read: a completed barrier counts.
        if (h->generation.load(std::memory_order_acquire) != generation) return absl::OkStatus();
        Break(absl::StrCat("rank ", h->member[j].rank, " (pid ", pid,
                           ") exited while the ranks on its host were reducing"));
        return BrokenStatus();
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      if (h->generation.load(std::memory_order_acquire) != generation) return absl::OkStatus();
      std::string missing;
      for (int j = 0; j < members_; ++j) {
        if (h->member[j].arrivals.load(std::memory_order_relaxed) < mine) {
          absl::StrAppend(&missing, missing.empty() ? "" : ", ", "rank ", h->member[j].rank);
          const int32_t pid = h->member[j].pid.load(std::memory_order_acquire);
          if (pid > 0) absl::StrAppend(&missing, " (pid ", pid, ")");
        }
      }
      Break(absl::StrCat(missing.empty() ? "a rank" : missing, " did not reach the AllReduce within ",
                         timeout_s, " s"));
      return BrokenStatus();
    }
    FutexWait(&h->generation, generation, std::min<Clock::duration>(kLivenessPeriod, deadline - now));
  }
}

absl::Status LocalReduceGroup::AllReduce(void* data, size_t count, ElementType type,
                                         const CrossHost* cross, double timeout_s,
                                         aggregator::ReduceOp op,
                                         const std::vector<int64_t>* shape) {
  Header* h = header_;
  if (h->broken.load(std::memory_order_acquire) != 0) return BrokenStatus();
  const std::optional<aggregator::DType> sum_type = PoolType(type);
  if (!sum_type.has_value()) {
    return absl::InvalidArgumentError("AllReduce cannot sum opaque bytes: name an element type");
  }
  const size_t element = aggregator::DTypeBytes(*sum_type);
  MemberInfo& me = h->member[index_];
  const int parity = static_cast<int>(calls_++ % 2);
  me.count[parity] = count;
  me.type[parity] = static_cast<int32_t>(type);
  me.op[parity] = static_cast<int32_t>(op);
  me.dims[parity] = shape != nullptr ? static_cast<int32_t>(shape->size()) : -1;
  if (shape != nullptr) {
    const size_t kept = std::min<size_t>(shape->size(), kMaxShapeDims);
    std::copy(shape->begin(), shape->begin() + static_cast<std::ptrdiff_t>(kept),
              me.shape[parity]);
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t chunk_elements = slot_bytes_ / element;
  const size_t chunks = std::max<size_t>(1, (count + chunk_elements - 1) / chunk_elements);
  const bool leader = index_ == 0;
  uint8_t* result = Slot(members_);

  // The host's sum, chunk by chunk: to every member, or (across hosts) to
  // the leader's buffer only.
  for (size_t k = 0; k < chunks; ++k) {
    const size_t first = k * chunk_elements;
    const size_t n = std::min(chunk_elements, count - std::min(count, first));
    // A call of no elements still meets the others at the barriers; its
    // `data` may be null, which memcpy may not be given even for 0 bytes.
    if (n > 0) std::memcpy(Slot(index_), bytes + first * element, n * element);
    if (auto status = Barrier(timeout_s); !status.ok()) return status;
    if (k == 0) {
      if (auto same = CheckSameInputs(parity, cross); !same.ok()) return same;
    }
    // This member's slice of the chunk, summed over the slots in member
    // order: the same bits whichever member sums which slice.
    const size_t begin = n * index_ / members_;
    const size_t end = n * (index_ + 1) / members_;
    if (end > begin) {
      std::memcpy(result + begin * element, Slot(0) + begin * element, (end - begin) * element);
      for (int j = 1; j < members_; ++j) {
        aggregator::ReduceInto(op, *sum_type, result + begin * element,
                               Slot(j) + begin * element, end - begin);
      }
    }
    if (auto status = Barrier(timeout_s); !status.ok()) return status;
    if ((cross == nullptr || leader) && n > 0) {
      std::memcpy(bytes + first * element, result, n * element);
    }
  }
  if (cross == nullptr || count == 0) return absl::OkStatus();
  return CrossHostReduce(data, count, type, *cross, timeout_s, chunks, chunk_elements, element);
}

absl::Status LocalReduceGroup::CheckSameInputs(int parity, const CrossHost* cross) {
  Header* h = header_;
  const bool leader = index_ == 0;
  // Every member reads the same shapes, so all return here or none.
  for (int j = 1; j < members_; ++j) {
    const MemberInfo& a = h->member[0];
    const MemberInfo& b = h->member[j];
    if (a.count[parity] != b.count[parity] || a.type[parity] != b.type[parity] ||
        a.op[parity] != b.op[parity]) {
      if (cross != nullptr && leader && cross->spoil) cross->spoil();
      const auto op_name = [](int32_t op) {
        return aggregator::ReduceOpName(static_cast<aggregator::ReduceOp>(op));
      };
      return absl::FailedPreconditionError(absl::StrCat(
          "AllReduce inputs differ across ranks: rank ", a.rank, " passes ", a.count[parity],
          " ", TypeName(a.type[parity]), " (", op_name(a.op[parity]), "), rank ", b.rank,
          " passes ", b.count[parity], " ", TypeName(b.type[parity]), " (",
          op_name(b.op[parity]), ")"));
    }
  }
  absl::Status shapes = AgreedShape(parity, &agreed_shape_);
  if (!shapes.ok() && cross != nullptr && leader && cross->spoil) cross->spoil();
  return shapes;
}

absl::Status LocalReduceGroup::AgreedShape(int parity,
                                           std::optional<std::vector<int64_t>>* agreed) const {
  const Header* h = header_;
  agreed->reset();
  int first = -1;  // the first member that named a shape
  const auto text = [&](int j) {
    const MemberInfo& m = h->member[j];
    const int kept = std::min<int>(m.dims[parity], kMaxShapeDims);
    std::string out = absl::StrCat(
        "[", absl::StrJoin(m.shape[parity], m.shape[parity] + kept, ", "));
    if (m.dims[parity] > kept) absl::StrAppend(&out, ", ...");
    return out + "]";
  };
  for (int j = 0; j < members_; ++j) {
    const MemberInfo& b = h->member[j];
    if (b.dims[parity] < 0) continue;
    if (first < 0) {
      first = j;
      continue;
    }
    const MemberInfo& a = h->member[first];
    const int kept = std::min<int>(a.dims[parity], kMaxShapeDims);
    if (a.dims[parity] != b.dims[parity] ||
        !std::equal(a.shape[parity], a.shape[parity] + kept, b.shape[parity])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Mismatched AllReduce tensor shapes: rank ", a.rank, " passed shape ", text(first),
          " while rank ", b.rank, " passed shape ", text(j), " (ranks on one host)"));
    }
  }
  if (first >= 0) {
    const MemberInfo& a = h->member[first];
    const int kept = std::min<int>(a.dims[parity], kMaxShapeDims);
    agreed->emplace(a.shape[parity], a.shape[parity] + kept);
  }
  return absl::OkStatus();
}

absl::Status LocalReduceGroup::CrossHostReduce(void* data, size_t count, ElementType type,
                                               const CrossHost& cross, double timeout_s,
                                               size_t chunks, size_t chunk_elements,
                                               size_t element) {
  Header* h = header_;
  auto* bytes = static_cast<uint8_t*>(data);
  const bool leader = index_ == 0;
  uint8_t* result = Slot(members_);
  // The leader's step, its status to every member, then the result back
  // through the result slot.
  if (leader) {
    const absl::Status status =
        cross.reduce ? cross.reduce(data, count, type,
                                    agreed_shape_.has_value() ? &*agreed_shape_ : nullptr)
                     : absl::InternalError("no cross-host step");
    h->cross_code = static_cast<int32_t>(status.code());
    std::snprintf(h->cross_message, sizeof(h->cross_message), "%s",
                  std::string(status.message()).c_str());
  }
  if (auto status = Barrier(1.5 * timeout_s + 10); !status.ok()) return status;
  if (h->cross_code != 0) {
    std::string message = h->cross_message;
    if (!leader) absl::StrAppend(&message, " (via rank ", h->member[0].rank, ", this host's leader)");
    return absl::Status(static_cast<absl::StatusCode>(h->cross_code), message);
  }
  for (size_t k = 0; k < chunks; ++k) {
    const size_t first = k * chunk_elements;
    const size_t n = std::min(chunk_elements, count - std::min(count, first));
    if (leader && n > 0) std::memcpy(result, bytes + first * element, n * element);
    if (auto status = Barrier(timeout_s); !status.ok()) return status;
    if (!leader && n > 0) std::memcpy(bytes + first * element, result, n * element);
    // The leader refills the result slot only after every member read it
    // (the next call's first write to it comes after two barriers anyway).
    if (k + 1 < chunks) {
      if (auto status = Barrier(timeout_s); !status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace mlfabric::internal
