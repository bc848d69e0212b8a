#include "scheduler/core/ordering.h"

#include <algorithm>

#include <catch2/catch.hpp>

#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/mlfabric_planner.h"
#include "scheduler/core/planner.h"

namespace mlfabric::core {
namespace {

struct Ordered {
  OrderingResult result;
  std::vector<std::string> ids;
  std::vector<std::pair<std::string, std::string>> drops;
};

Ordered Order(const Batch& batch, bool reference = false) {
  Network net = Network::FromBatch(batch).value();
  PreparedBatch prepared = PrepareBatch(batch, net).value();
  PlannerOptions options;
  options.reference = reference;
  Ordered out;
  out.result = OrderUpdates(prepared, &net, options);
  for (int u : out.result.order) out.ids.push_back(batch.updates[u].id);
  for (const auto& [u, reason] : out.result.drops) out.drops.push_back({batch.updates[u].id, reason});
  return out;
}

// Fig. 5: w1 sits behind a 10 Mbit/s link, the server's downlink has
// 100 Mbit/s. g1 (deadline 1) alone takes 10 s; g2 (deadline 5) would take
// 1.1 s on the 90 Mbit/s left. Looking ahead, g2 finishes first, so g1 is
// dropped at its worker and g2 goes first at the full rate.
TEST_CASE("Fig. 5: the look-ahead drops the slow deadline-forced update") {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 5;
  batch.v_init = 10;
  batch.hosts = {{"s", 1e9, 1e8, {}, {}}, {"w1", 1e7, 1e9, {}, {}}, {"w2", 1e9, 1e9, {}, {}}};
  batch.updates = {{"g1", "w1", 12500000, 6, 1.0, {}},    // dl = 6 + 5 - 10 = 1; 100 Mbit
                   {"g2", "w2", 12375000, 10, 1.0, {}}};  // dl = 5; 99 Mbit
  for (bool reference : {false, true}) {
    Ordered o = Order(batch, reference);
    CHECK(o.ids == std::vector<std::string>{"g2"});
    REQUIRE(o.drops.size() == 1);
    CHECK(o.drops[0] == std::make_pair(std::string("g1"), std::string("deadline_lookahead")));
    CHECK(o.result.arrival_s[0] == Approx(0.99));
  }
  // Without the deadline pressure g1 would simply be scheduled (second).
  batch.updates[0].version = 10;
  Ordered relaxed = Order(batch);
  CHECK(relaxed.ids == std::vector<std::string>{"g2", "g1"});
  CHECK(relaxed.drops.empty());
}

TEST_CASE("A deadline-forced update that still finishes first is kept") {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 5;
  batch.v_init = 10;
  batch.hosts = {{"s", 1e9, 1e8, {}, {}}, {"w1", 1e8, 1e9, {}, {}}, {"w2", 1e9, 1e9, {}, {}}};
  // g1 is larger (so SJF would put it second) but due at position 1.
  batch.updates = {{"g1", "w1", 20000000, 6, 1.0, {}}, {"g2", "w2", 10000000, 10, 1.0, {}}};
  Ordered o = Order(batch);
  CHECK(o.ids == std::vector<std::string>{"g1", "g2"});
  CHECK(o.drops.empty());
}

// Fig. 1: N' = 6 pending updates; update j was computed 4 versions before
// the others and has delay tau_max - u with u = 2 (deadline position 2); it
// is also the largest, so its transfer would complete last.
TEST_CASE("Fig. 1: the oldest update's delay under each strategy") {
  const int64_t tau_max = 10, v_st = 100;
  Batch batch;
  batch.server = "s";
  batch.tau_max = tau_max;
  batch.v_init = v_st;
  batch.hosts.push_back({"s", 1e10, 1e10, {}, {}});
  const int n = 6, u = 2;
  for (int i = 0; i < n; ++i) {
    const std::string w = "w" + std::to_string(i);
    batch.hosts.push_back({w, 1e10, 1e10, {}, {}});
    const bool oldest = i == 3;
    // d_i < tau_max - N' for the others; d_j = tau_max - u for j.
    const int64_t delay = oldest ? tau_max - u : 1;
    batch.updates.push_back(
        {oldest ? "j" : "g" + std::to_string(i), w, (oldest ? 90 : 10 + 10 * i) * 1000000,
         v_st - delay, 1.0, {}});
  }
  // (a) Today: concurrent fair sharing; j, the largest, completes last and is
  // applied at version v_st + N' - 1 (delay counted from its own version).
  const int64_t delay_today = (v_st + n - 1) - (v_st - (tau_max - u));
  CHECK(delay_today == tau_max + (n - u) - 1);
  CHECK(delay_today > tau_max);
  // (b) Server-side buffering holds j's delay at exactly tau_max but stalls
  // every update behind it; (c) in-network control: j goes among the first u.
  Ordered o = Order(batch);
  CHECK(o.drops.empty());
  const auto pos = std::find(o.ids.begin(), o.ids.end(), "j") - o.ids.begin();
  CHECK(pos + 1 <= u);
  const int64_t delay_mlfabric = (v_st + pos) - (v_st - (tau_max - u));
  CHECK(delay_mlfabric <= tau_max);
  // (b) Server-side buffering: j is applied right after the first u, so its
  // delay is exactly tau_max, but the updates that arrived meanwhile wait for
  // j: until t_N' (when the last byte of the batch is in, the same for every
  // time-shared schedule) only versions up to v_st + u are available.
  const int64_t delay_buffered = (v_st + u) - (v_st - (tau_max - u));
  CHECK(delay_buffered == tau_max);
  const double t_end = o.result.arrival_s.back();
  int fresh_before_end = 0;
  for (size_t i = 0; i + 1 < o.result.arrival_s.size(); ++i) {
    fresh_before_end += o.result.arrival_s[i] < t_end;
  }
  // (c) In-network ordering publishes N' - 1 new versions before t_N' (b: u).
  CHECK(fresh_before_end == n - 1);
  CHECK(fresh_before_end > u);
  // The others follow shortest-transfer-first.
  std::vector<std::string> rest;
  for (const std::string& id : o.ids) if (id != "j") rest.push_back(id);
  CHECK(rest == std::vector<std::string>{"g0", "g1", "g2", "g4", "g5"});
}

TEST_CASE("Updates past their deadline are dropped as stale") {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 2;
  batch.v_init = 10;
  batch.hosts = {{"s", 1e9, 1e9, {}, {}}, {"w", 1e9, 1e9, {}, {}}};
  batch.updates = {{"old", "w", 1000, 7, 1, {}},   // dl = -1
                   {"a", "w", 1000, 9, 1, {}},     // dl = 1
                   {"b", "w", 1000, 9, 1, {}},     // dl = 1: only one fits position 1
                   {"c", "w", 5000, 11, 1, {}}};   // dl = 3
  Ordered o = Order(batch);
  CHECK(o.ids == std::vector<std::string>{"a", "c"});
  CHECK(o.drops == std::vector<std::pair<std::string, std::string>>{{"old", "stale"}, {"b", "stale"}});
}

TEST_CASE("Shortest transfer first without deadline pressure") {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 100;
  batch.v_init = 0;
  batch.hosts = {{"s", 1e10, 1e10, {}, {}}, {"slow", 1e9, 1e9, {}, {}}, {"fast", 9e9, 1e10, {}, {}}};
  batch.updates = {{"big_fast", "fast", 50000000, 0, 1, {}},   // 44.4 ms
                   {"small_slow", "slow", 10000000, 0, 1, {}},  // 80 ms alone
                   {"tiny_fast", "fast", 1000000, 0, 1, {}}};   // 0.9 ms
  Ordered o = Order(batch);
  CHECK(o.ids == std::vector<std::string>{"tiny_fast", "big_fast", "small_slow"});
  // small_slow used the 1 Gbit/s the fast worker left and is not delayed by it.
  CHECK(o.result.arrival_s[2] == Approx(0.08));
}

TEST_CASE("Multi-server updates reserve all components; t_en is the max (§10.2)") {
  Batch batch;
  batch.server = "s1";
  batch.tau_max = 100;
  batch.hosts = {{"s1", 1e10, 1e10, {}, {}}, {"s2", 1e10, 1e9, {}, {}}, {"w", 1e10, 1e10, {}, {}},
                 {"v", 1e10, 1e10, {}, {}}};
  batch.updates = {{"g", "w", 10000000, 0, 1, {{"s2", 10000000}}},   // s2 part: 80 ms at 1 Gbit/s
                   {"h", "v", 40000000, 0, 1, {{"s2", 1000000}}}};  // 32 ms to s1, s2 part after g's
  Ordered o = Order(batch);
  REQUIRE(o.ids.size() == 2);
  CHECK(o.ids[0] == "h");
  CHECK(o.result.direct[0].size() == 2);
  // h's s2 part queues behind its s1 part on v's uplink: 32 ms + 8 ms.
  CHECK(o.result.arrival_s[0] == Approx(0.040));
  // g's s1 part waits for h's (32-40 ms); its s2 part (80 Mbit at 1 Gbit/s)
  // loses 32-40 ms to h's: 88 ms, the max over its parts.
  CHECK(o.result.direct[1][0].end_s == Approx(0.040));
  CHECK(o.result.arrival_s[1] == Approx(0.088));
}

TEST_CASE("An update whose path has no capacity is dropped, not scheduled") {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 100;
  batch.hosts = {{"s", 1e9, 1e9, {}, {}}, {"dead", 0, 1e9, {{0, 1e6}, {0.001, 0}}, {}},
                 {"w", 1e9, 1e9, {}, {}}};
  batch.updates = {{"lost", "dead", 100000000, 0, 1, {}}, {"ok", "w", 1000, 0, 1, {}}};
  Ordered o = Order(batch);
  CHECK(o.ids == std::vector<std::string>{"ok"});
  CHECK(o.drops == std::vector<std::pair<std::string, std::string>>{{"lost", "no_bandwidth"}});
}

// The ordering key of a sharded update is what its parts could do alone
// (ordering.h), not eq. 18's t_en with the parts reserved in turn. g's
// second part could finish by 0.1 s on its own, but after its first part
// has held the uplink until then, s2's downlink is down to 10 Mbit/s: its
// t_en is 10.1 s against h's 0.25 s. Ordered by t_en, h would go first;
// ordered by the key (0.2 s: both parts through g's 1 Gbit/s uplink), g does.
TEST_CASE("A sharded update is ordered by its parts alone, not by eq. 18's t_en") {
  Batch batch;
  batch.server = "s1";
  batch.tau_max = 100;
  batch.hosts = {{"s1", 1e10, 1e10, {}, {}}, {"s2", 1e10, 0, {}, {{0, 1e9}, {0.1, 1e7}}},
                 {"w", 1e9, 1e10, {}, {}}, {"v", 1e9, 1e10, {}, {}}};
  batch.updates = {{"g", "w", 12500000, 0, 1, {{"s2", 12500000}}},  // 100 + 100 Mbit
                   {"h", "v", 31250000, 0, 1, {}}};                 // 250 Mbit
  for (bool reference : {false, true}) {
    Ordered o = Order(batch, reference);
    REQUIRE(o.ids == std::vector<std::string>{"g", "h"});
    CHECK(o.result.key_s[0] == Approx(0.2));
    CHECK(o.result.arrival_s[0] == Approx(10.1));
    CHECK(o.result.key_s[1] == Approx(0.25));
    CHECK(o.result.arrival_s[1] == Approx(0.25));
  }
}

// A batch's clock may start below zero: keys are times on it, not durations.
TEST_CASE("Keys are times on the batch's clock, which may start below zero") {
  Batch batch;
  batch.server = "s1";
  batch.now_s = -10;
  batch.tau_max = 100;
  batch.hosts = {{"s1", 1e10, 1e10, {}, {}}, {"s2", 1e10, 1e10, {}, {}},
                 {"w", 1e9, 1e10, {}, {}}, {"v", 1e9, 1e10, {}, {}}};
  batch.updates = {{"big", "w", 12500000, 0, 1, {{"s2", 12500000}}},  // 200 Mbit from w
                   {"small", "v", 6250000, 0, 1, {{"s2", 6250000}}}};  // 100 Mbit from v
  for (bool reference : {false, true}) {
    Ordered o = Order(batch, reference);
    REQUIRE(o.ids == std::vector<std::string>{"small", "big"});
    CHECK(o.result.key_s[0] == Approx(-9.9));
    CHECK(o.result.key_s[1] == Approx(-9.8));
  }
}

// Where a link's capacity ends, parts that each fit alone (and together
// through the uplink) may not fit one after another: g's first part holds
// w's uplink until 0.8 s and s2's downlink closes at 1 s. g is picked (its
// key, 1.6 s, is the least), cannot be reserved, and is dropped; its first
// part's reservation on s1's downlink is undone, so h still runs from 0.
TEST_CASE("A picked sharded update whose parts do not fit in turn is dropped and undone") {
  Batch batch;
  batch.server = "s1";
  batch.tau_max = 100;
  batch.hosts = {{"s1", 1e10, 1e9, {}, {}}, {"s2", 1e10, 0, {}, {{0, 1e9}, {1, 0}}},
                 {"w", 0, 1e10, {{0, 1e9}, {2, 0}}, {}}, {"v", 1e9, 1e10, {}, {}}};
  batch.updates = {{"g", "w", 100000000, 0, 1, {{"s2", 100000000}}},  // 800 + 800 Mbit
                   {"h", "v", 250000000, 0, 1, {}}};                  // 2 Gbit to s1
  for (bool reference : {false, true}) {
    Ordered o = Order(batch, reference);
    CHECK(o.ids == std::vector<std::string>{"h"});
    CHECK(o.drops == std::vector<std::pair<std::string, std::string>>{{"g", "no_bandwidth"}});
    REQUIRE(o.result.arrival_s.size() == 1);
    CHECK(o.result.arrival_s[0] == Approx(2.0));
  }
}

// The lazy queue rests on two properties of the key, checked here on the
// simulator's kind of sharded batch (busy links, equal parts, machines
// with several updates) and on mixed layouts: without deadline pressure
// the keys of successive picks never fall (a reservation never lowers a
// key, and each pick is the least), and no update arrives before its key.
// Both implementations give the same order.
TEST_CASE("Sharded keys: never below an earlier pick's, never after the arrival") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    internal::RandomBatchOptions o;
    o.seed = seed;
    o.updates = 5 + static_cast<int>(seed % 25);
    o.workers = std::max(1, 2 * o.updates / 3);
    o.shards = 1 + static_cast<int>(seed % 8);
    o.equal_shards = seed % 2 == 0;
    o.busy_points = seed % 3 == 0 ? 0 : 8;
    o.mixed_shards = seed % 5 == 0;
    o.profiles = seed % 7 == 0;
    Batch batch = internal::RandomBatch(o);
    batch.tau_max += 1000000;  // every deadline far beyond the batch's end
    INFO("seed " << seed);
    REQUIRE(ValidateBatch(batch).ok());
    const Ordered fast = Order(batch);
    const Ordered slow = Order(batch, true);
    CHECK(fast.ids == slow.ids);
    CHECK(fast.drops == slow.drops);
    CHECK(fast.result.key_s == slow.result.key_s);
    for (size_t i = 0; i < fast.result.key_s.size(); ++i) {
      if (i > 0) CHECK(fast.result.key_s[i] >= fast.result.key_s[i - 1]);
      CHECK(fast.result.key_s[i] <= fast.result.arrival_s[i] * (1 + 1e-12));
    }
  }
}

}  // namespace
}  // namespace mlfabric::core
