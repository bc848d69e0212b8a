// RelayTable: the model copies this daemon receives for its own gets, kept
// so that it can forward them as a distributor (mlfabric.md §10.3,
// docs/architecture.md §3 "The server's link is the scarce resource").
//
// A server's daemon answers a batch of gets through a distribution tree:
// some requesters get the model from it, the others are told to ask one of
// those (a distributor) for its copy of the batch. The distributor passes
// every packet on the moment it has arrived (cut-through): never the whole
// model first. A copy is named by its server ("<job id>/<server>") and the
// server daemon's batch id.
//
//   table.Begin(key, batch, version, buffer);   // our own get's reply header
//   Effects e = table.Arrived(key, batch, begin, end);   // per packet
//   Effects e = table.Finish(key, batch, error);         // "" = complete
//
//   RelayTable::Watch w = table.AddWatcher(key, batch, stream_id);
//   queue w.ready; apply every Effects: queue `forward` ranges to their
//   streams, `complete` streams have nothing more to come, `fail` streams
//   end with the error; table.RemoveWatcher(key, batch, stream_id);
//
// A finished copy is kept until the next copy of its server begins (a
// requester routed here may ask after our own get has ended, but not after
// our next one began: it is told where to go as our get is answered).
// Copies still being received are kept. So a server costs one model's
// buffer here between gets, not several: an AllReduce of 64 MiB used to
// pin four finished sums per root server, and to reach that state the
// daemon first-touched four fresh 64 MiB buffers.
//
// Thread safety: every method may be called from any thread (own lock).
// The lock is a leaf: nothing outside the table is called while it is held;
// the daemon applies the returned Effects under its own lock.
#ifndef MLFABRIC_DAEMON_ENGINE_RELAY_TABLE_H_
#define MLFABRIC_DAEMON_ENGINE_RELAY_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

class RelayTable {
 public:
  using Range = std::pair<uint64_t, uint64_t>;  // [begin, end) bytes
  struct Effects {
    std::vector<std::pair<uint64_t, Range>> forward;   // (stream, range) to queue
    std::vector<uint64_t> complete;                   // streams with all ranges queued
    std::vector<std::pair<uint64_t, std::string>> fail;  // (stream, why)
    // Copies let go of: their buffers may serve again (a BufferPool keeps
    // one only once nobody else, e.g. the application, holds it).
    std::vector<std::shared_ptr<SharedBuffer>> dropped;
    // A round's sum: the pushes it sums, for the forwarded packets (0: a model).
    uint32_t contributions = 0;
  };

  // kGone: not kept, and a later copy of the same server is (it was
  // dropped, or will never come).
  enum class State { kUnknown, kReceiving, kDone, kFailed, kGone };
  struct Watch {
    State state = State::kUnknown;
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;  // read-only for watchers
    std::vector<Range> ready;  // arrived so far; queue these first
    std::string error;         // kFailed: why
    uint32_t contributions = 0;  // a round's sum: the pushes it sums
  };

  // Our own get of `batch` has its reply header: `model` will be filled.
  // Returns false, changing nothing, when another get of this daemon is
  // already receiving (or has) that copy (two workers on one host): only
  // the get that began it reports Arrived and Finish. A failed copy is
  // replaced.
  bool Begin(const std::string& key, uint64_t batch, int64_t version,
             std::shared_ptr<SharedBuffer> model, Effects* effects);
  // Bytes [begin, end) of the copy have arrived; `contributions` > 0: the
  // copy is a round's sum of that many pushes (their packets said so).
  Effects Arrived(const std::string& key, uint64_t batch, uint64_t begin, uint64_t end,
                  uint32_t contributions = 0);
  // Our own get ended: complete (error empty) or failed.
  Effects Finish(const std::string& key, uint64_t batch, const std::string& error);

  // The copy's state; the stream is added as a watcher while it is still
  // being received (kReceiving). Stream 0 only looks.
  Watch AddWatcher(const std::string& key, uint64_t batch, uint64_t stream);
  State StateOf(const std::string& key, uint64_t batch, std::string* error = nullptr) const;
  void RemoveWatcher(const std::string& key, uint64_t batch, uint64_t stream);

  struct Stats {
    int64_t copies = 0;    // Begin calls
    int64_t forwards = 0;  // watchers added (requesters served from here)
  };
  Stats stats() const;
  size_t copies() const;  // kept now (for tests)

 private:
  struct Copy {
    State state = State::kReceiving;
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;
    std::vector<Range> arrived;
    uint32_t contributions = 0;
    std::string error;
    std::set<uint64_t> watchers;
    uint64_t order = 0;  // Begin order: a newer copy of the key drops older finished ones
  };
  using Id = std::pair<std::string, uint64_t>;

  // Drops the finished copies of `key` older than the copy of Begin order
  // `newest`.
  void EvictLocked(const std::string& key, uint64_t newest, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::map<Id, Copy> copies_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_RELAY_TABLE_H_
