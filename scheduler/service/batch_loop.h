// BatchLoop: the scheduler's one batching thread (docs/architecture.md §3 step 2): it
// runs a batch cycle every `interval_ms` on a steady schedule (a slow cycle
// delays the next, it never piles them up), and at once when woken (which
// leaves the schedule as it was).
//
//   BatchLoop loop(100, [&] { service.RunBatchCycle(); });
//   loop.Start();
//   loop.Wake();   // plan now, without waiting for the tick
//   loop.Stop();   // returns after the running cycle, if any, ended
//
// Thread safety: Start/Stop from one owner thread; Wake from any thread.
#ifndef MLFABRIC_SCHEDULER_SERVICE_BATCH_LOOP_H_
#define MLFABRIC_SCHEDULER_SERVICE_BATCH_LOOP_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace mlfabric {

class BatchLoop {
 public:
  BatchLoop(double interval_ms, std::function<void()> cycle);
  ~BatchLoop();
  BatchLoop(const BatchLoop&) = delete;
  BatchLoop& operator=(const BatchLoop&) = delete;

  void Start();
  void Stop();
  // Runs the next cycle as soon as the current one (if any) ends.
  void Wake();

 private:
  void Loop();

  const double interval_ms_;
  const std::function<void()> cycle_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool woken_ = false;
  std::thread thread_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_BATCH_LOOP_H_
