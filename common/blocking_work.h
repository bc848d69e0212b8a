// BlockingWork: runs work that blocks for an unknown time (a served get
// waits for its round and for its reply to stream out; an application's
// message may wait for the scheduler) on reused threads.
// A thread is started only when none is idle, so work never waits for
// other work to finish (no deadlock when one item waits for another's
// effects), and an idle thread ends after `idle_s`. The threads in use are
// as many as the items running at once, not one per item ever run: a
// thread's creation is paid once, not per get (it cost the daemon's I/O
// threads 0.1-0.3 ms per small AllReduce). No thread is detached: one
// that ended (idle) is joined by the next Run, the rest by the destructor.
//
//   BlockingWork work(/*idle_s=*/10);
//   work.Run([&] { ServeGet(); });   // returns at once
//   ...                               // ~BlockingWork waits for running items
//
// Thread safety: Run from any thread.
#ifndef MLFABRIC_COMMON_BLOCKING_WORK_H_
#define MLFABRIC_COMMON_BLOCKING_WORK_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace mlfabric {

class BlockingWork {
 public:
  explicit BlockingWork(double idle_s = 10.0) : idle_s_(idle_s) {}
  // Waits until every item handed to Run has finished and its thread ended.
  ~BlockingWork();
  BlockingWork(const BlockingWork&) = delete;
  BlockingWork& operator=(const BlockingWork&) = delete;

  // Runs `item` on an idle thread, or on a new one if none is idle.
  void Run(std::function<void()> item);

  // Threads alive now (running an item or idle), and started so far.
  size_t threads() const;
  size_t started() const;

 private:
  void Worker();
  // Joins the threads that ended since the last call.
  void JoinEndedLocked();

  const double idle_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stopping
  std::condition_variable ended_;    // a thread ended
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
  size_t threads_ = 0;
  size_t started_ = 0;
  bool stopping_ = false;
  std::map<std::thread::id, std::thread> running_;  // by id: alive, or ended not joined
  std::vector<std::thread::id> ended_ids_;          // ended, to join
};

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_BLOCKING_WORK_H_
