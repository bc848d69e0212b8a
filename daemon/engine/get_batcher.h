// GetBatcher: the gets a server's daemon answers, in batches that share one
// model snapshot (mlfabric.md §10.3, docs/architecture.md §3 "The server's link is the
// scarce resource").
//
// Gets for one server ("<job id>/<server>") that arrive while its previous
// batch is still leaving (its replies still being sent) form one batch; the
// batch takes one snapshot from the server application once the previous
// one has left, and every get of the batch is answered with that model and
// its version. A get that arrives while nothing is leaving opens a batch and
// asks at once; gets that arrive while that snapshot is being taken join it.
//
//   GetBatcher::Ticket ticket = batcher.Join(key, requester_host);
//   if (ticket.ask) {                       // exactly one get of each batch
//     wait until batcher.MayAsk(ticket.batch) (or a bound passes);
//     ask the application, request id ticket.batch;  its answer:
//     batcher.Answer(ticket.batch, {version, model, error});
//   }
//   wait until batcher.Result(ticket.batch);
//   if (ticket.ask) plan a tree for batcher.Requesters(batch), SetRoutes;
//   wait until batcher.RouteOf(ticket.batch, ticket.member);
//   send the model, or tell the get which distributor forwards it;
//   batcher.Leave(ticket.batch);            // always, once per Join
//
// Counters (stats()) say how many snapshots served how many gets.
//
// Thread safety: every method may be called from any thread (own lock).
// The lock is a leaf: nothing outside the batcher is called while it is
// held, so the daemon calls it under its own lock and waits on its own
// condition variable, re-checking MayAsk/Result.
#ifndef MLFABRIC_DAEMON_ENGINE_GET_BATCHER_H_
#define MLFABRIC_DAEMON_ENGINE_GET_BATCHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

class GetBatcher {
 public:
  struct Snapshot {
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;  // shared by every get of the batch; read-only
    std::string error;                    // non-empty: the batch's gets fail with it
  };
  struct Ticket {
    uint64_t batch = 0;  // also the snapshot request's id
    bool ask = false;    // this get takes the snapshot for its batch
    int member = 0;      // its position in the batch (join order)
    // Joined a batch already answered and routed, as a leaf of its tree
    // (see SetRoutes): no snapshot to wait for, its route is set.
    bool late = false;
  };
  // How one get of a batch receives the model (§10.3 distribution tree).
  struct Route {
    std::string via_host;     // empty: from this daemon directly
    std::string via_address;  // the distributor's data address
    // As the scheduler planned it (0 = no bandwidth view): the rate of this
    // member's stream, its uplink, and the members it forwards to.
    double rate_bps = 0;
    double uplink_bps = 0;
    int children = 0;
  };

  // A get for `key` from the daemon of host `requester` ("" = unknown)
  // arrives: joins the batch that has no snapshot yet, or opens one
  // (ask = true).
  // `address` is its daemon's data address ("" = it cannot forward).
  Ticket Join(const std::string& key, const std::string& requester = "",
              const std::string& address = "");
  // The requesting hosts of `batch`, one per member, in join order. Fixed
  // once the batch is answered.
  std::vector<std::string> Requesters(uint64_t batch) const;
  // The answered batch's routes, one per member (fewer: the rest direct).
  // With late_joins_per_member > 0, a get for the same server that comes
  // while this batch's copies are still leaving and no newer batch is open
  // joins this batch (same model and version) as a leaf below one of its
  // members (one that gave its data address at Join), each taking at most
  // that many: it spares the server a copy and waits for no snapshot.
  // Where the routes carry the scheduler's rates, the leaf goes below the
  // member where it would be fastest, min(its stream's rate, its uplink
  // shared by its children and late leaves plus this one), and only if
  // that is at least `min_late_bps`; otherwise it waits for the next batch
  // (a slow uplink is not made to forward, N3). Without rates, below the
  // member with the fewest late leaves.
  void SetRoutes(uint64_t batch, std::vector<Route> routes, int late_joins_per_member = 0,
                 double min_late_bps = 0);
  // How many members of a routed batch this daemon sends the model to
  // itself (the copies that share its uplink); 0 for an unknown batch.
  int DirectCopies(uint64_t batch) const;
  // A member's route once SetRoutes was called (or the batch failed or is
  // unknown: then direct).
  std::optional<Route> RouteOf(uint64_t batch, int member) const;
  // Whether `batch` may take its snapshot now: the previous batch of its key
  // has left. True for a batch that is not known.
  bool MayAsk(uint64_t batch) const;
  // The application's answer for `batch` (ignored if it is not waiting for one).
  void Answer(uint64_t batch, Snapshot snapshot);
  // Every batch of `key` still waiting for a snapshot ends with `error`.
  void FailKey(const std::string& key, const std::string& error);
  // The batch's snapshot, once answered.
  std::optional<Snapshot> Result(uint64_t batch) const;
  // One get of `batch` has sent its reply, or gave up.
  void Leave(uint64_t batch);

  struct Stats {
    int64_t gets = 0;       // Joins
    int64_t snapshots = 0;  // batches answered with a model
    int64_t late_joins = 0;  // gets that joined a leaving batch's tree
  };
  Stats stats() const;
  // Batches not yet left (for tests).
  size_t batches() const;

 private:
  struct Batch {
    std::string key;
    int64_t members = 0;
    int64_t left = 0;
    bool answered = false;
    std::vector<std::string> requesters;  // per member
    std::vector<std::string> addresses;   // per member
    std::vector<int> late_children;       // per member
    int late_joins_per_member = 0;
    double min_late_bps = 0;
    bool routed = false;
    std::vector<Route> routes;  // per member, once routed
    Snapshot snapshot;
  };
  struct Key {
    uint64_t open = 0;     // the batch that has no snapshot yet
    uint64_t leaving = 0;  // the last answered batch, until all its gets left
  };

  void EraseIfLeftLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member of `b` a late get from `requester` goes below, or -1.
  static int LateParent(const Batch& b, const std::string& requester);

  mutable Mutex mu_;
  std::map<uint64_t, Batch> batches_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Key> keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_GET_BATCHER_H_
