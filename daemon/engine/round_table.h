// RoundTable: synchronous rounds at a Mercury-PS server's daemon
// (mercury.md §IV Key idea 3 "immediate PS aggregation"; mlfabric.md §6).
//
// The scheduler announces each push of a synchronous round as a member of
// round r of a server (ExpectDelivery with round_size > 0). The members'
// packets are summed into the round's sum as they arrive; the sum is cut
// into fixed chunks, and a chunk is final once every one of the round's
// `size` pushes has contributed all its bytes. Final chunks stream at once
// to the workers whose gets watch the round, so push and pull overlap; the
// complete sum goes to the server application once, as `size` updates, and
// when it acknowledges, every member is reported applied (or refused).
//
// The table owns the rounds, their sums and the packet pool they are summed
// in. It calls nothing outside itself: every call says what the daemon has
// to do next in an Effects (members to report failed, chunks to queue on
// which reply streams, sums to hand to the server):
//
//   RoundTable::Effects fx;
//   table.Join(expect, server_connected, &fx);     // a member is announced
//   table.Fold(transfer, data, offset, length, &fx);   // one of its packets
//   Carry out fx: report fx.failed, queue fx.chunks on their streams,
//   BeginDelivery(id) for each of fx.complete and hand the sum over.
//
// Rounds are named by the server's key ("<job id>/<server>") and the round
// number; the newest `rounds_kept` rounds of a server are kept for gets that
// come late, older ones go (failed if they had not ended).
//
// Sums come from a BufferPool when one is given (the daemon's): a round
// evicted after rounds_kept gives its sum back, if nobody holds it any
// more, and a new round takes one of its size and zeroes it, instead of a
// fresh memfd whose every page is allocated, zeroed and torn down again.
// The server application reads a round's sum only during its update
// callback (api/mlfabric.h), long before the round is evicted.
//
// Thread safety: every method may be called from any thread (own lock).
// The lock is a leaf (nothing outside the table but the BufferPool, whose
// lock is a leaf too, is called while it is held), so the daemon may call
// the table under its own lock.
#ifndef MLFABRIC_DAEMON_ENGINE_ROUND_TABLE_H_
#define MLFABRIC_DAEMON_ENGINE_ROUND_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "aggregator/packet_pool.h"
#include "common/mutex.h"
#include "ipc/buffer_pool.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class RoundTable {
 public:
  // `rounds_kept` >= 1; `chunk_bytes`: the grid sums are released on, a
  // positive multiple of 8.
  // `buffers`, if not null, must outlive the table.
  RoundTable(int64_t rounds_kept, uint64_t chunk_bytes, BufferPool* buffers = nullptr);

  // A byte range [begin, end) of a round's sum that became final, for the
  // reply stream `stream` (a watcher's id).
  struct Chunk {
    uint64_t stream = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
    // The pushes the round sums: final by the time any chunk is (a round
    // shrinks only before its first chunk is final).
    int32_t contributions = 0;
  };
  struct Effects {
    // Member pushes that cannot be applied: report each failed with its reason.
    std::vector<std::pair<uint64_t, std::string>> failed;
    // Final chunks to queue on watching reply streams.
    std::vector<Chunk> chunks;
    // Rounds whose sum is complete: BeginDelivery each.
    std::vector<std::pair<std::string, int64_t>> complete;
    // Something a waiting get may be waiting for changed: a round began,
    // failed or completed (RoundService::AwaitSum and AwaitBegunLocked).
    // Not set per final chunk: watching gets take chunks from `chunks`,
    // and a wake-up per packet of every thread waiting under the receive
    // lock cost a 1 M-float AllReduce's root hundreds of context switches.
    bool changed = false;
  };

  // Member expect.transfer_id() joins round expect.version() of server
  // expect.server() (the first member begins the round: its size, bytes
  // and dtype). A member that does not match the round, more pushes than
  // its size, or a server that is not connected fail the whole round.
  void Join(const v1::ExpectDelivery& expect, bool server_connected, Effects* fx);
  // The round (server key, number) `transfer` is a member of, if any.
  std::optional<std::pair<std::string, int64_t>> RoundOf(uint64_t transfer) const;
  // Sums bytes [offset, offset + length) of member `transfer` into its
  // round. A packet the pool refuses fails the round.
  void Fold(uint64_t transfer, const uint8_t* data, uint64_t offset, uint32_t length,
            Effects* fx);

  // Round `round` of `key` closes with `size` pushes, fewer than it was
  // announced with: a member left the job before it pushed and the job's
  // member_loss is shrink (docs/architecture.md §7). The chunks its members
  // announced so far have covered become final now, and the round may be
  // complete. A round not begun here is left alone (its members are
  // announced with the new size); one that ended, or a size that is not
  // lower, changes nothing; a size below the pushes already announced fails
  // the round, naming both.
  void Shrink(const std::string& key, int64_t round, int32_t size, const std::string& reason,
              Effects* fx);
  // Fails round `round` of `key` (created, to stay failed, if not known
  // yet); a round that ended is left as it is.
  void Fail(const std::string& key, int64_t round, const std::string& reason, Effects* fx);
  // Fails the round `transfer` is a member of; false if it is none's.
  bool FailMemberRound(uint64_t transfer, const std::string& reason, Effects* fx);
  // Fails every round of `key` that has not ended (its server went away).
  // `spare_delivering`: a round already handed to the application is left
  // to its acknowledgement (the application may have applied it).
  void FailServer(const std::string& key, const std::string& reason, Effects* fx,
                  bool spare_delivering = false);

  // Handing a complete round to the server application.
  struct Delivery {
    uint64_t id = 0;  // the LocalUpdate's transfer id: bit 63 set, never a transfer's
    int64_t round = 0;
    int32_t size = 0;
    int64_t bytes = 0;
    std::shared_ptr<SharedBuffer> sum;
    std::vector<uint64_t> members;  // the pushes it sums
  };
  // nullopt if the round is not complete or has ended.
  std::optional<Delivery> BeginDelivery(const std::string& key, int64_t round);
  // The application could not be handed delivery `id`: the round fails.
  void DeliveryFailed(uint64_t id, const std::string& reason, Effects* fx);
  // The application acknowledged delivery `id`. The round's members and its
  // number, to report; nullopt if `id` is no round's delivery, or its round
  // failed meanwhile (its members were reported then).
  struct Acknowledged {
    std::string key;  // the server's
    int64_t round = 0;
    std::vector<uint64_t> members;
  };
  std::optional<Acknowledged> Acknowledge(uint64_t id);
  bool IsDelivery(uint64_t id) const;

  // What a worker's get of round `round` finds.
  enum class GetState {
    kNotYet,  // not begun (no member announced yet)
    kBegun,   // its sum is being summed (or complete)
    kFailed,  // failed: `error` says why
    kGone,    // rounds_kept or more behind the newest round of `key`
  };
  // `bytes` (if not null) is set to the round's size when it has begun.
  GetState Lookup(const std::string& key, int64_t round, std::string* error,
                  int64_t* bytes = nullptr) const;
  // A reply stream `stream` watches a begun round: returns the sum buffer,
  // its bytes, its chunk grid and the chunks final so far (to queue now;
  // later ones come in Effects::chunks). nullopt if the round has not
  // begun or failed.
  struct Watch {
    std::shared_ptr<SharedBuffer> sum;
    int64_t bytes = 0;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // every chunk of the grid
    std::vector<std::pair<uint64_t, uint64_t>> ready;   // final so far
    int32_t contributions = 0;  // the round's size now (final once a chunk is)
  };
  std::optional<Watch> AddWatcher(const std::string& key, int64_t round, uint64_t stream);
  void RemoveWatcher(const std::string& key, int64_t round, uint64_t stream);
  // Why the round failed; empty if it has not (or is not known).
  std::string Failure(const std::string& key, int64_t round) const;
  // The round's whole sum once every chunk of it is final (null before,
  // and for a round that failed or is not known). The holder keeps the
  // buffer from going back to the pool while it reads it.
  std::shared_ptr<SharedBuffer> CompleteSum(const std::string& key, int64_t round) const;
  // The pushes the round sums (its announced size, or the size it shrank
  // to); 0 if it is not known or has not begun.
  int32_t Size(const std::string& key, int64_t round) const;

  size_t rounds() const;

 private:
  struct Round {
    int64_t round = 0;
    int32_t size = 0;      // pushes it sums
    int64_t bytes = -1;    // -1 until the first member is announced
    v1::DType dtype = v1::DTYPE_FLOAT32;
    std::shared_ptr<SharedBuffer> sum;
    uint64_t pool_id = 0;  // its transfer in pool_
    size_t packets = 0;    // of the pool's grid
    std::vector<uint32_t> ready;  // grid packets, in the order they completed
    std::map<uint64_t, int32_t> members;  // transfer -> contributions
    int32_t contributions = 0;
    bool complete = false;
    bool delivering = false;
    bool reported = false;  // members' outcomes sent (or failed)
    std::string failed;
    std::vector<uint64_t> watchers;  // reply streams
  };
  using Key = std::pair<std::string, int64_t>;

  Round& GetOrCreateLocked(const std::string& key, int64_t round, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const Key& key, Round& round, const std::string& reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::pair<uint64_t, uint64_t> ChunkRange(const Round& round, uint32_t chunk) const;
  // The round's packets from `ready_before` on became final: queued for
  // its watchers, and the round is complete once all are.
  void ReleaseLocked(const Key& key, Round& round, size_t ready_before, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t rounds_kept_;
  const uint64_t chunk_bytes_;
  BufferPool* const buffers_;
  mutable Mutex mu_;
  aggregator::PacketPool pool_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Key> round_of_ ABSL_GUARDED_BY(mu_);    // member transfer -> round
  std::map<uint64_t, Key> deliveries_ ABSL_GUARDED_BY(mu_);  // delivery id -> round
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_ROUND_TABLE_H_
