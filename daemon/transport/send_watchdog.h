// Bounded blocking writes for the daemon's data sockets.
//
// The daemon writes packets with plain blocking sendmsg calls: while the
// peer keeps up, the kernel sleeps inside the call until TCP_NOTSENT_LOWAT
// lets the next packet in, one system call per packet. A peer that stops
// reading (hung, stopped, a full receive window for ever) would hold such a
// call, and with it the daemon's single sender loop, for ever.
//
// SendWatchdog bounds that without a per-call timer: each write registers
// itself and stamps its progress when a call returns; a watchdog thread
// looks every timeout/4 (at most once a second) at the writes in progress,
// counts the peer's acknowledged bytes (TCP_INFO) as progress too, so one
// long call to a slow but live peer is not cut off, and shuts down the
// socket of a write that has made no progress for `timeout_s`, which wakes
// the blocked call.
// That write then fails with DeadlineExceeded, and the socket is dead (the
// caller drops it, failing what was sent over it). A kernel timer per call
// (SO_SNDTIMEO, or poll with a timeout) cost 8-15% of loopback goodput in
// daemon/bench:dataplane_benchmark; this costs two uncontended mutex
// round trips and a few clock reads per packet.
//
//   SendWatchdog watchdog(/*timeout_s=*/30);
//   iovec iov[2] = {{head, head_bytes}, {payload, payload_bytes}};
//   absl::Status sent = watchdog.SendAll(fd, iov, 2);  // may modify iov
//
// Thread safety: SendAll may be called from any number of threads at once,
// each with its own socket (writes to one socket must not interleave).
#ifndef MLFABRIC_DAEMON_TRANSPORT_SEND_WATCHDOG_H_
#define MLFABRIC_DAEMON_TRANSPORT_SEND_WATCHDOG_H_

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"

namespace mlfabric::transport {

class SendWatchdog {
 public:
  // `timeout_s` > 0: how long a write may take no bytes before it fails.
  explicit SendWatchdog(double timeout_s);
  ~SendWatchdog();
  SendWatchdog(const SendWatchdog&) = delete;
  SendWatchdog& operator=(const SendWatchdog&) = delete;

  double timeout_s() const { return timeout_s_; }

  // Writes all of iov[0..count) to the blocking socket `fd` (iov is
  // consumed). DeadlineExceeded, naming the timeout, if the peer took no
  // bytes for timeout_s (the socket is shut down then); Unavailable on any
  // other socket error.
  absl::Status SendAll(int fd, iovec* iov, int count);

  // Writes given up so far.
  int64_t timeouts() const { return timeouts_.load(); }

 private:
  // One write in progress: on the writer's stack, linked into writes_
  // while SendAll runs.
  struct Write {
    int fd = -1;
    std::atomic<int64_t> progress_ns{0};  // last time bytes were taken
    std::atomic<bool> timed_out{false};
    // The watchdog's own: the peer's acknowledged bytes when it last looked.
    bool acked_seen = false;
    uint64_t acked = 0;
    Write* prev = nullptr;
    Write* next = nullptr;
  };

  void Register(Write* write) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(Write* write) ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const double timeout_s_;
  const int64_t timeout_ns_;
  Mutex mu_;
  // Doubly linked list of writes in progress (their prev, next, acked_seen
  // and acked are under mu_ too).
  Write* writes_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar cv_;  // stopping_ was set
  std::atomic<int64_t> timeouts_{0};
  std::thread thread_;
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_SEND_WATCHDOG_H_
