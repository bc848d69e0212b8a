#include "scheduler/service/command_outbox.h"

#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

v1::DaemonCommand Outcome(uint64_t id) {
  v1::DaemonCommand command;
  command.mutable_outcome()->set_transfer_id(id);
  return command;
}

using Result = CommandOutbox::PopResult;
constexpr std::chrono::milliseconds kNoWait{0};

TEST_CASE("commands reach the open incarnation's stream in order") {
  CommandOutbox outbox;
  outbox.Push("w1", Outcome(1));  // not open yet: dropped
  outbox.Open("w1", 3);
  outbox.Push("w1", Outcome(2));
  outbox.Push("w1", Outcome(3));
  CHECK(outbox.Queued("w1") == 2);
  v1::DaemonCommand out;
  REQUIRE(outbox.Pop("w1", 3, kNoWait, &out) == Result::kCommand);
  CHECK(out.outcome().transfer_id() == 2);
  REQUIRE(outbox.Pop("w1", 3, kNoWait, &out) == Result::kCommand);
  CHECK(out.outcome().transfer_id() == 3);
  CHECK(outbox.Pop("w1", 3, kNoWait, &out) == Result::kTimeout);
}

TEST_CASE("a new registration supersedes the old stream and drops what it had not read") {
  CommandOutbox outbox;
  outbox.Open("w1", 1);
  outbox.Push("w1", Outcome(1));
  outbox.Open("w1", 2);
  v1::DaemonCommand out;
  CHECK(outbox.Pop("w1", 1, kNoWait, &out) == Result::kSuperseded);
  CHECK(outbox.Pop("w1", 2, kNoWait, &out) == Result::kTimeout);
  outbox.Close("w1");
  CHECK(outbox.Pop("w1", 2, kNoWait, &out) == Result::kSuperseded);
  outbox.Push("w1", Outcome(9));  // closed: dropped
  CHECK(outbox.Queued("w1") == 0);
}

TEST_CASE("a waiting stream wakes for a push, a close and a stop") {
  CommandOutbox outbox;
  outbox.Open("w1", 1);
  v1::DaemonCommand out;
  Result result = Result::kTimeout;
  std::thread waiter([&] { result = outbox.Pop("w1", 1, std::chrono::seconds(30), &out); });
  outbox.Push("w1", Outcome(5));
  waiter.join();
  CHECK(result == Result::kCommand);
  CHECK(out.outcome().transfer_id() == 5);

  std::thread closed([&] { result = outbox.Pop("w1", 1, std::chrono::seconds(30), &out); });
  outbox.Close("w1");
  closed.join();
  CHECK(result == Result::kSuperseded);

  outbox.Open("w2", 1);
  std::thread stopped([&] { result = outbox.Pop("w2", 1, std::chrono::seconds(30), &out); });
  outbox.Stop();
  stopped.join();
  CHECK(result == Result::kStopped);
}

TEST_CASE("commands queued under a hold wake their streams when the last hold ends") {
  CommandOutbox outbox;
  outbox.Open("w1", 1);
  outbox.Open("w2", 1);
  v1::DaemonCommand out1, out2;
  Result result1 = Result::kTimeout, result2 = Result::kTimeout;
  std::thread waiter1([&] { result1 = outbox.Pop("w1", 1, std::chrono::seconds(30), &out1); });
  std::thread waiter2([&] { result2 = outbox.Pop("w2", 1, std::chrono::seconds(30), &out2); });
  {
    const CommandOutbox::WakeupHold batch(&outbox);
    {
      const CommandOutbox::WakeupHold nested(&outbox);
      outbox.Push("w1", Outcome(1));
    }
    outbox.Push("w2", Outcome(2));
    // Whether a waiter is already waiting here is up to the threads (one
    // that starts late finds its command without a wake-up), so nothing is
    // checked of the queues under the hold; the watcher test below does so
    // deterministically.
  }
  // Long before the waits run out: the release woke both.
  waiter1.join();
  waiter2.join();
  CHECK(result1 == Result::kCommand);
  CHECK(out1.outcome().transfer_id() == 1);
  CHECK(result2 == Result::kCommand);
  CHECK(out2.outcome().transfer_id() == 2);
  // No hold: a push wakes at once, as before.
  std::thread waiter3([&] { result1 = outbox.Pop("w1", 1, std::chrono::seconds(30), &out1); });
  outbox.Push("w1", Outcome(3));
  waiter3.join();
  CHECK(out1.outcome().transfer_id() == 3);
}

TEST_CASE("a watcher is called after each wake-up, outside the lock, until it unwatches") {
  CommandOutbox outbox;
  outbox.Open("w1", 1);
  std::vector<uint64_t> seen;
  int calls = 0;
  // The watcher pops what is queued, as a callback stream does: it could
  // not if it ran under the outbox's lock.
  const uint64_t token = outbox.Watch("w1", [&] {
    ++calls;
    v1::DaemonCommand out;
    while (outbox.TryPop("w1", 1, &out) == Result::kCommand) {
      seen.push_back(out.outcome().transfer_id());
    }
  });
  outbox.Push("w1", Outcome(1));
  CHECK(seen == std::vector<uint64_t>{1});
  {
    const CommandOutbox::WakeupHold hold(&outbox);
    outbox.Push("w1", Outcome(2));
    outbox.Push("w1", Outcome(3));
    CHECK(seen.size() == 1);  // held: queued, no watcher called
    CHECK(outbox.Queued("w1") == 2);
    outbox.WakeWatchers();    // holds win over the safeguard too
    CHECK(seen.size() == 1);
  }
  CHECK(seen == std::vector<uint64_t>{1, 2, 3});
  outbox.Push("w2", Outcome(4));  // another host: not this watcher's
  const int before = calls;
  outbox.WakeWatchers();
  CHECK(calls == before + 1);
  outbox.Unwatch("w1", token);
  outbox.Push("w1", Outcome(5));
  outbox.WakeWatchers();
  CHECK(calls == before + 1);
  CHECK(outbox.Queued("w1") == 1);
}

TEST_CASE("the safeguard's wake-up finds what a missed wake-up left queued") {
  CommandOutbox outbox;
  outbox.Open("w1", 1);
  bool armed = false;  // a watcher that drops its first wake-up, as a lost one would be
  std::vector<uint64_t> seen;
  outbox.Watch("w1", [&] {
    if (!armed) {
      armed = true;
      return;
    }
    v1::DaemonCommand out;
    while (outbox.TryPop("w1", 1, &out) == Result::kCommand) {
      seen.push_back(out.outcome().transfer_id());
    }
  });
  outbox.Push("w1", Outcome(7));
  CHECK(seen.empty());
  CHECK(outbox.Queued("w1") == 1);
  outbox.WakeWatchers();
  CHECK(seen == std::vector<uint64_t>{7});
}

TEST_CASE("TryPop says superseded, stopped or nothing queued without waiting") {
  CommandOutbox outbox;
  v1::DaemonCommand out;
  outbox.Open("w1", 2);
  CHECK(outbox.TryPop("w1", 2, &out) == Result::kTimeout);
  CHECK(outbox.TryPop("w1", 1, &out) == Result::kSuperseded);
  int woken = 0;
  outbox.Watch("w1", [&] { ++woken; });
  outbox.Open("w1", 3);  // a new registration wakes the old stream to end it
  CHECK(woken == 1);
  CHECK(outbox.TryPop("w1", 2, &out) == Result::kSuperseded);
  outbox.Close("w1");
  CHECK(woken == 2);
  outbox.Stop();
  CHECK(woken == 3);
  CHECK(outbox.TryPop("w1", 3, &out) == Result::kStopped);
}

v1::DaemonCommand Send(uint32_t job) {
  v1::DaemonCommand command;
  command.mutable_send()->set_job_id(job);
  return command;
}

TEST_CASE("every host gets each job's priority class when its stream opens, and every change at once") {
  CommandOutbox outbox;
  outbox.SetJobKeys({{7, "key-of-7"}});
  outbox.SetJobClass(7, "jobA", 3);
  outbox.SetJobClass(8, "jobB", 0);
  outbox.Open("w1", 1);
  outbox.Open("w2", 1);
  v1::DaemonCommand out;
  // Both hosts, whether or not they carry the job's pushes (a daemon ranks
  // the job's NIC traffic too): every job's class comes first, with the
  // job's name, 0 included (a daemon may hold a class from a scheduler
  // that restarted since).
  for (const char* host : {"w1", "w2"}) {
    REQUIRE(outbox.Pop(host, 1, kNoWait, &out) == Result::kCommand);
    REQUIRE(out.has_job_priority());
    CHECK(out.job_priority().job_id() == 7);
    CHECK(out.job_priority().job() == "jobA");
    CHECK(out.job_priority().priority_class() == 3);
    REQUIRE(outbox.Pop(host, 1, kNoWait, &out) == Result::kCommand);
    CHECK(out.job_priority().job_id() == 8);
    CHECK(out.job_priority().priority_class() == 0);
    CHECK(outbox.Queued(host) == 0);
  }
  outbox.Push("w1", Send(7));
  REQUIRE(outbox.Pop("w1", 1, kNoWait, &out) == Result::kCommand);
  CHECK(out.has_job_key());
  REQUIRE(outbox.Pop("w1", 1, kNoWait, &out) == Result::kCommand);
  CHECK(out.has_send());
  // Job 8 has class 0 and no key: its send comes alone.
  outbox.Push("w2", Send(8));
  REQUIRE(outbox.Pop("w2", 1, kNoWait, &out) == Result::kCommand);
  CHECK(out.has_send());

  // A change reaches every open host.
  outbox.SetJobClass(7, "jobA", 1);
  outbox.SetJobClass(7, "jobA", 1);  // unchanged: nothing more
  outbox.SetJobClass(8, "jobB", 5);
  for (const char* host : {"w1", "w2"}) {
    REQUIRE(outbox.Pop(host, 1, kNoWait, &out) == Result::kCommand);
    CHECK(out.job_priority().job_id() == 7);
    CHECK(out.job_priority().priority_class() == 1);
    REQUIRE(outbox.Pop(host, 1, kNoWait, &out) == Result::kCommand);
    CHECK(out.job_priority().job_id() == 8);
    CHECK(out.job_priority().job() == "jobB");
    CHECK(out.job_priority().priority_class() == 5);
    CHECK(outbox.Queued(host) == 0);
  }
  // Back to 0 is a change too.
  outbox.SetJobClass(8, "jobB", 0);
  REQUIRE(outbox.Pop("w2", 1, kNoWait, &out) == Result::kCommand);
  CHECK(out.job_priority().priority_class() == 0);
  // A host registering again is introduced afresh, with the current
  // classes.
  outbox.Open("w1", 2);
  REQUIRE(outbox.Pop("w1", 2, kNoWait, &out) == Result::kCommand);
  CHECK(out.job_priority().job_id() == 7);
  CHECK(out.job_priority().priority_class() == 1);
  REQUIRE(outbox.Pop("w1", 2, kNoWait, &out) == Result::kCommand);
  CHECK(out.job_priority().job_id() == 8);
  CHECK(out.job_priority().priority_class() == 0);
  CHECK(outbox.Queued("w1") == 0);
  outbox.Push("w1", Send(7));
  REQUIRE(outbox.Pop("w1", 2, kNoWait, &out) == Result::kCommand);
  CHECK(out.has_job_key());
}

}  // namespace
}  // namespace mlfabric
