// StreamWaker: runs wake-ups on a thread of its own, in the order they were
// posted, so that the thread posting one never runs it.
//
// The scheduler's schedule streams (grpc_service.cc) are woken by the
// CommandOutbox on the thread that queued their command, and that thread
// mostly holds the service's lock: the batch loop queuing a batch's
// commands, or the report of a group push's last part, which releases the
// push's part at each of its shards. A gRPC write started there sends on
// the socket before it returns, so the lock was held across a send per
// stream; at 96 shards one such report held it for about 2.3 ms of CPU
// (14 ms on average with both cores busy) and the batch loop waited behind
// it (testing/loadgen/README.md). Posted here, the queuing thread only
// appends the wake-up.
//
//   StreamWaker waker;
//   waker.Post([weak] { if (auto s = weak.lock()) Pump(s); });
//
// What is posted before the destructor runs still runs; the destructor
// waits for it. A wake-up must not destroy its StreamWaker.
//
// Thread safety: Post may be called from any thread, wake-ups included.
#ifndef MLFABRIC_SCHEDULER_SERVICE_STREAM_WAKER_H_
#define MLFABRIC_SCHEDULER_SERVICE_STREAM_WAKER_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlfabric {

class StreamWaker {
 public:
  StreamWaker();
  ~StreamWaker();
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;

  // Runs `wake` on the waker's thread, after the wake-ups posted before it.
  void Post(std::function<void()> wake);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> pending_;
  bool waiting_ = false;  // Run waits on cv_
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_STREAM_WAKER_H_
