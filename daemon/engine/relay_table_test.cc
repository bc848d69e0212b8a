#include "daemon/engine/relay_table.h"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mlfabric::daemon {
namespace {

using Range = RelayTable::Range;

std::shared_ptr<SharedBuffer> Buffer(size_t size) {
  auto buffer = SharedBuffer::Create(size);
  REQUIRE(buffer.ok());
  return std::make_shared<SharedBuffer>(std::move(*buffer));
}

TEST_CASE("RelayTable: a watcher gets what arrived, then each packet as it arrives") {
  RelayTable table;
  RelayTable::Effects effects;
  auto model = Buffer(100);
  CHECK(table.StateOf("1/ps", 7) == RelayTable::State::kUnknown);
  REQUIRE(table.Begin("1/ps", 7, 42, model, &effects));
  CHECK(effects.fail.empty());
  CHECK(table.Arrived("1/ps", 7, 0, 30).forward.empty());  // nobody watches yet
  CHECK(table.Arrived("1/ps", 7, 30, 60).forward.empty());

  RelayTable::Watch watch = table.AddWatcher("1/ps", 7, 1001);
  CHECK(watch.state == RelayTable::State::kReceiving);
  CHECK(watch.version == 42);
  CHECK(watch.model == model);
  CHECK(watch.ready == std::vector<Range>{{0, 60}});  // consecutive packets merge

  RelayTable::Effects next = table.Arrived("1/ps", 7, 60, 90);
  REQUIRE(next.forward.size() == 1);
  CHECK(next.forward[0] == std::pair<uint64_t, Range>{1001, {60, 90}});
  next = table.Arrived("1/ps", 7, 90, 100);
  REQUIRE(next.forward.size() == 1);
  RelayTable::Effects done = table.Finish("1/ps", 7, "");
  CHECK(done.complete == std::vector<uint64_t>{1001});
  CHECK(done.fail.empty());

  // A watcher that comes after the end gets the whole copy at once.
  RelayTable::Watch late = table.AddWatcher("1/ps", 7, 1002);
  CHECK(late.state == RelayTable::State::kDone);
  CHECK(late.ready == std::vector<Range>{{0, 100}});
  CHECK(table.stats().forwards == 2);
}

TEST_CASE("RelayTable: a failed copy fails its watchers and names why") {
  RelayTable table;
  RelayTable::Effects effects;
  REQUIRE(table.Begin("1/ps", 3, 1, Buffer(64), &effects));
  table.AddWatcher("1/ps", 3, 11);
  table.AddWatcher("1/ps", 3, 12);
  table.RemoveWatcher("1/ps", 3, 12);
  RelayTable::Effects failed = table.Finish("1/ps", 3, "model transfer cut");
  REQUIRE(failed.fail.size() == 1);
  CHECK(failed.fail[0].first == 11);
  CHECK(failed.fail[0].second == "model transfer cut");
  std::string why;
  CHECK(table.StateOf("1/ps", 3, &why) == RelayTable::State::kFailed);
  CHECK(why == "model transfer cut");
  RelayTable::Watch watch = table.AddWatcher("1/ps", 3, 13);
  CHECK(watch.state == RelayTable::State::kFailed);
  CHECK(watch.model == nullptr);
  // Ranges after the end change nothing.
  CHECK(table.Arrived("1/ps", 3, 0, 64).forward.empty());
  // A failed copy may be begun again.
  CHECK(table.Begin("1/ps", 3, 1, Buffer(64), &effects));
}

TEST_CASE("RelayTable: a second get of the same copy does not take it over") {
  RelayTable table;
  RelayTable::Effects effects;
  auto first = Buffer(10);
  REQUIRE(table.Begin("1/ps", 5, 9, first, &effects));
  table.AddWatcher("1/ps", 5, 21);
  CHECK_FALSE(table.Begin("1/ps", 5, 9, Buffer(10), &effects));
  CHECK(effects.fail.empty());
  CHECK(table.AddWatcher("1/ps", 5, 22).model == first);
}

TEST_CASE("RelayTable: a finished copy is kept until the next copy of its server begins") {
  RelayTable table;
  RelayTable::Effects effects;
  std::shared_ptr<SharedBuffer> first = Buffer(8);
  REQUIRE(table.Begin("1/ps", 1, 1, first, &effects));
  REQUIRE(table.Begin("2/ps", 1, 1, Buffer(8), &effects));  // another job's server
  table.Finish("1/ps", 1, "");
  table.Finish("2/ps", 1, "");
  // Finished, and no newer copy yet: a requester routed here still gets it.
  RelayTable::Watch late = table.AddWatcher("1/ps", 1, 31);
  CHECK(late.state == RelayTable::State::kDone);
  CHECK(late.model == first);
  // Batch 2 is received while batch 3 begins (two gets of one host): the
  // finished batch 1 goes, with its buffer for the pool; batch 2 stays.
  REQUIRE(table.Begin("1/ps", 2, 2, Buffer(8), &effects));
  REQUIRE(effects.dropped.size() == 1);
  CHECK(effects.dropped[0] == first);
  CHECK(effects.fail.empty());
  CHECK(table.StateOf("1/ps", 1) == RelayTable::State::kGone);
  CHECK(table.AddWatcher("1/ps", 1, 32).state == RelayTable::State::kGone);
  table.AddWatcher("1/ps", 2, 33);
  effects = {};
  REQUIRE(table.Begin("1/ps", 3, 3, Buffer(8), &effects));
  CHECK(effects.dropped.empty());
  CHECK(effects.fail.empty());  // its watcher keeps its copy coming
  CHECK(table.StateOf("1/ps", 2) == RelayTable::State::kReceiving);
  CHECK(table.StateOf("1/ps", 3) == RelayTable::State::kReceiving);
  CHECK(table.StateOf("2/ps", 1) == RelayTable::State::kDone);  // other servers untouched
  CHECK(table.copies() == 3);
  // Batch 2 finishes after batch 3 began: kept until a newer copy begins.
  effects = table.Finish("1/ps", 2, "");
  CHECK(effects.complete == std::vector<uint64_t>{33});
  CHECK(table.StateOf("1/ps", 2) == RelayTable::State::kDone);
  effects = {};
  REQUIRE(table.Begin("1/ps", 4, 4, Buffer(8), &effects));
  CHECK(effects.dropped.size() == 1);  // batch 2, finished and older
  CHECK(table.StateOf("1/ps", 2) == RelayTable::State::kGone);
  CHECK(table.StateOf("1/ps", 3) == RelayTable::State::kReceiving);
  CHECK(table.StateOf("1/ps", 5) == RelayTable::State::kUnknown);  // not yet
  CHECK(table.copies() == 3);  // 1/ps batches 3 and 4, 2/ps batch 1
}

}  // namespace
}  // namespace mlfabric::daemon
