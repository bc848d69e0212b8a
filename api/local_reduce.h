// The host-local stage of a hierarchical AllReduce (python/README.md
// "AllReduce", api/allreduce.cc): the ranks that share one daemon -- one
// machine -- sum in shared memory, with no socket, no scheduler and no
// daemon in the way; only one rank per host (the group's leader) takes
// the host's sum across the network, through the scheduler-planned round
// (mlfabric.md §6), and hands the result back the same way. Horovod's
// hierarchical AllReduce and NCCL's intra-node rings split the work the
// same way: the scheduler's plan is for transfers that cross links.
//
//   // every member, with the same name and member count; index 0 leads
//   ASSIGN_OR_RETURN(auto group, LocalReduceGroup::Join(name, index, members, rank, 10.0));
//   RETURN_IF_ERROR(group->AllReduce(grad, count, ElementType::kFloat32, /*cross=*/nullptr, 300.0));
//
// The segment is a POSIX shared-memory object: a header (a process-shared
// barrier on a futex, each member's pid, rank and call shape) and one slot
// per member plus a result slot, `slot_bytes` each. A call copies each
// chunk of at most `slot_bytes` into the member's slot; after a barrier
// every member sums its own slice of the chunk over all slots, in member
// order (so every member receives the same bits); after a second barrier
// every member copies the result out. With `cross`, the leader first
// gathers the host's sum, calls `cross` on it (the other hosts' sum) and
// then hands the result back chunk by chunk; its status reaches every
// member.
//
// Faults end a call, never hang it: a member that exited (its pid is
// gone) or that does not arrive within the call's timeout breaks the group,
// and every member's call fails with a reason naming that rank; the group
// stays broken (later calls fail at once with the same reason). Calls whose
// element count, dtype or reduce op differ across members fail on every
// member with FailedPrecondition naming both ranks and values, and the
// group goes on; so do calls whose named tensor shapes differ (a member
// that names none agrees with any), with Horovod's "Mismatched AllReduce
// tensor shapes" naming both ranks and shapes.
//
// Thread safety: one call at a time per member (as AllReducer).
#ifndef MLFABRIC_API_LOCAL_REDUCE_H_
#define MLFABRIC_API_LOCAL_REDUCE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregator/packet_pool.h"
#include "api/mlfabric.h"

namespace mlfabric::internal {

class LocalReduceGroup {
 public:
  // The chunk size per member and call (the segment holds members + 1
  // slots of it; pages are only backed once touched).
  static constexpr size_t kDefaultSlotBytes = size_t{16} << 20;
  static constexpr int kMaxMembers = 64;

  // The leader (index 0) creates the shared-memory object `name` (a
  // leading "/" and no other, as shm_open wants); the others open it. Each
  // waits until all `members` have mapped it, up to `timeout_s`; then the
  // name is removed, so nothing is left behind if a member dies later.
  // `rank` is the member's rank in the job (for error messages).
  static absl::StatusOr<std::unique_ptr<LocalReduceGroup>> Join(
      const std::string& name, int index, int members, int rank, double timeout_s,
      size_t slot_bytes = kDefaultSlotBytes);
  ~LocalReduceGroup();
  LocalReduceGroup(const LocalReduceGroup&) = delete;
  LocalReduceGroup& operator=(const LocalReduceGroup&) = delete;

  // The most dimensions a call's shape may name.
  static constexpr int kMaxShapeDims = 64;

  // The leader's steps across hosts.
  struct CrossHost {
    // Between the host's sum and the result: in place, `count` elements
    // (the host's sum in, every host's out). `shape`: the tensor shape the
    // host's members agreed on (the first one named), nullptr when none
    // named one; the other hosts' rounds compare it.
    std::function<absl::Status(void* data, size_t count, ElementType type,
                               const std::vector<int64_t>* shape)>
        reduce;
    // Instead of `reduce` when this host's ranks passed differing shapes:
    // takes part in the other hosts' round so that it fails for them too
    // (they must not sum a round this host left).
    std::function<void()> spoil;
  };

  // In place on every member: `data` receives the reduction by `op` (sum
  // by default) over the group (and over the other hosts when `cross` is
  // not null; only the leader's is called, the others must pass one too so
  // that all take the same steps). `type` is a float or integer type
  // (kOpaque cannot be reduced). `shape`: the tensor's dimensions when the
  // caller named them (dimensions after the first kMaxShapeDims are not
  // compared; AllReducer refuses such shapes), nullptr when not. A member not at the barrier
  // within `timeout_s` breaks the group; while the leader's `cross` runs,
  // the others wait up to 1.5 * timeout_s + 10 s (it has `timeout_s` of
  // its own).
  absl::Status AllReduce(void* data, size_t count, ElementType type, const CrossHost* cross,
                         double timeout_s, aggregator::ReduceOp op = aggregator::ReduceOp::kSum,
                         const std::vector<int64_t>* shape = nullptr);

  int index() const { return index_; }
  int members() const { return members_; }

 private:
  struct Header;
  LocalReduceGroup(int index, int members, uint8_t* base, size_t mapped, size_t slot_bytes);

  // Waits until every member has arrived; an error if the group is (or
  // becomes) broken, a member exited, or `timeout_s` passes.
  absl::Status Barrier(double timeout_s);
  // Marks the group broken with `reason` (the first reason wins) and wakes
  // every member.
  void Break(const std::string& reason);
  absl::Status BrokenStatus() const;
  uint8_t* Slot(int i) const;
  // AllReduce: every member's call has the same count, type and op as the
  // leader's (call parity `parity`); else the leader spoils `cross`'s round.
  // Also their named shapes, the first one named kept in agreed_shape_.
  absl::Status CheckSameInputs(int parity, const CrossHost* cross);
  // The shapes the members named for call parity `parity`: the first one
  // named (by member index) into *agreed, or FailedPrecondition naming two
  // members whose shapes differ.
  absl::Status AgreedShape(int parity, std::optional<std::vector<int64_t>>* agreed) const;
  // AllReduce across hosts, once the host's sum is in the leader's `data`
  // (`chunks` of `chunk_elements` elements of `element` bytes).
  absl::Status CrossHostReduce(void* data, size_t count, ElementType type, const CrossHost& cross,
                               double timeout_s, size_t chunks, size_t chunk_elements,
                               size_t element);

  const int index_;
  const int members_;
  uint8_t* const base_;
  const size_t mapped_;
  const size_t slot_bytes_;
  Header* const header_;
  uint64_t calls_ = 0;  // AllReduce calls so far (the same on every member)
  // The current call's shape as its members agreed (CheckSameInputs).
  std::optional<std::vector<int64_t>> agreed_shape_;
};

}  // namespace mlfabric::internal

#endif  // MLFABRIC_API_LOCAL_REDUCE_H_
