#include "scheduler/core/network.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::core {
namespace {

Batch OneLinkBatch(std::vector<ProfilePoint> uplink_profile) {
  Batch batch;
  batch.now_s = 0;
  batch.server = "s";
  batch.hosts = {{"s", 1e9, 1e9, {}, {}}, {"w", 0, 1e9, std::move(uplink_profile), {}}};
  return batch;
}

TEST_CASE("t_en fills the residual bottleneck at every instant (Fig. 4(b))") {
  // 30 MB = 240 Mbit over a residual of 40, 20, then 50 Mbit/s: 80 + 60 Mbit
  // by t = 5 s, the remaining 100 Mbit take 2 s more: t_en = 7 s.
  Network net = Network::FromBatch(OneLinkBatch({{0, 40e6}, {2, 20e6}, {5, 50e6}})).value();
  const Path path = net.PathBetween(net.HostIndex("w"), net.HostIndex("s"));
  FillResult fill = net.Fill(path, 0, 240e6);
  REQUIRE(fill.feasible);
  CHECK(fill.end_s == Approx(7.0));
  REQUIRE(fill.segments.size() == 3);
  CHECK(fill.segments[1].from_s == Approx(2.0));
  CHECK(fill.segments[1].rate_bps == Approx(20e6));
  CHECK(SegmentBits(fill.segments) == Approx(240e6));
  CHECK(net.FillEnd(path, 0, 240e6) == fill.end_s);
  CHECK(net.FillEnd(path, 0, 240e6, /*reference=*/true) == fill.end_s);
}

TEST_CASE("NetUp subtracts the profile from every link of the path (Fig. 4(c))") {
  Batch batch;
  batch.server = "s";
  batch.hosts = {{"s", 1e9, 1e8, {}, {}}, {"a", 4e7, 1e9, {}, {}}, {"b", 1e9, 1e9, {}, {}}};
  Network net = Network::FromBatch(batch).value();
  const int s = net.HostIndex("s"), a = net.HostIndex("a"), b = net.HostIndex("b");
  FillResult first = net.Fill(net.PathBetween(a, s), 0, 4e7);  // 1 s at a's 40 Mbit/s
  CHECK(first.end_s == Approx(1.0));
  net.Reserve(net.PathBetween(a, s), first.segments);
  CHECK(net.link(net.DownlinkOf(s)).RateAt(0.5) == Approx(6e7));
  CHECK(net.link(net.DownlinkOf(s)).RateAt(1.5) == Approx(1e8));
  CHECK(net.link(net.UplinkOf(a)).RateAt(0.5) == 0);
  // b gets the 60 Mbit/s left for 1 s, then the whole 100 Mbit/s.
  FillResult second = net.Fill(net.PathBetween(b, s), 0, 1.6e8);
  CHECK(second.end_s == Approx(2.0));
  REQUIRE(second.segments.size() == 2);
  CHECK(second.segments[0].rate_bps == Approx(6e7));
}

TEST_CASE("A same-host transfer crosses no link: a copy in memory, nothing reserved") {
  Network net = Network::FromBatch(OneLinkBatch({{0, 1e6}})).value();
  const int s = net.HostIndex("s");
  const Path path = net.PathBetween(s, s);
  CHECK(path.links.empty());
  FillResult fill = net.Fill(path, 2.0, 8e9);
  REQUIRE(fill.feasible);
  REQUIRE(fill.segments.size() == 1);
  CHECK(fill.segments[0].from_s == 2.0);
  CHECK(fill.segments[0].rate_bps == kLocalCopyBps);
  CHECK(fill.end_s == Approx(2.0 + 8e9 / kLocalCopyBps));
  CHECK(SegmentBits(fill.segments) == Approx(8e9));
  CHECK(net.FillEnd(path, 2.0, 8e9, /*reference=*/true) == fill.end_s);
  net.Reserve(path, fill.segments);
  CHECK(net.link(net.UplinkOf(s)).RateAt(2.1) == Approx(1e9));
  CHECK(net.link(net.DownlinkOf(s)).RateAt(2.1) == Approx(1e9));
}

TEST_CASE("A path that never offers capacity is infeasible") {
  Network net = Network::FromBatch(OneLinkBatch({{0, 1e6}, {1, 0}})).value();
  const Path path = net.PathBetween(net.HostIndex("w"), net.HostIndex("s"));
  CHECK(net.Fill(path, 0, 0.5e6).feasible);
  CHECK_FALSE(net.Fill(path, 0, 2e6).feasible);
  CHECK(net.FillEnd(path, 0, 2e6) == kInfinity);
}

TEST_CASE("Rollback restores the network bit for bit") {
  Network net = Network::FromBatch(OneLinkBatch({{0, 4e7}, {2, 2e7}, {5, 5e7}})).value();
  net.BeginJournal();
  const Network before = net;
  const Path path = net.PathBetween(net.HostIndex("w"), net.HostIndex("s"));
  const size_t mark = net.JournalMark();
  for (int i = 0; i < 5; ++i) {
    FillResult fill = net.Fill(path, 0.3 * i, 3e7);
    net.Reserve(path, fill.segments);
  }
  CHECK(net.link(path.links[0]).times_s != before.link(path.links[0]).times_s);
  net.RollbackTo(mark);
  for (int l = 0; l < net.num_links(); ++l) {
    CHECK(net.link(l).times_s == before.link(l).times_s);
    CHECK(net.link(l).rates_bps == before.link(l).rates_bps);
    CHECK(net.link(l).first_open == before.link(l).first_open);
  }
}

TEST_CASE("Release gives reserved capacity back") {
  Network net = Network::FromBatch(OneLinkBatch({{0, 4e7}})).value();
  const Path path = net.PathBetween(net.HostIndex("w"), net.HostIndex("s"));
  FillResult fill = net.Fill(path, 0, 4e7);
  net.Reserve(path, fill.segments);
  CHECK(net.FillEnd(path, 0, 4e7) == Approx(2.0));
  net.Release(path, fill.segments);
  CHECK(net.FillEnd(path, 0, 4e7) == Approx(1.0));
}

TEST_CASE("An explicit topology link on a fixed path is shared") {
  Batch batch;
  batch.server = "s";
  batch.hosts = {{"s", 1e9, 1e9, {}, {}}, {"a", 1e9, 1e9, {}, {}}, {"b", 1e9, 1e9, {}, {}}};
  batch.links = {{"rack", 5e8, {}}};
  batch.paths = {{"a", "s", {"rack"}}, {"b", "s", {"rack"}}};
  Network net = Network::FromBatch(batch).value();
  const int s = net.HostIndex("s");
  const Path pa = net.PathBetween(net.HostIndex("a"), s);
  REQUIRE(pa.links.size() == 3);
  FillResult fill = net.Fill(pa, 0, 5e8);
  CHECK(fill.end_s == Approx(1.0));  // the rack link, not the NICs, limits
  net.Reserve(pa, fill.segments);
  CHECK(net.FillEnd(net.PathBetween(net.HostIndex("b"), s), 0, 5e8) == Approx(2.0));

  batch.paths = {{"a", "s", {"nowhere"}}};
  auto bad = Network::FromBatch(batch);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("paths[0].links[0]") != std::string::npos);
}

TEST_CASE("Reference and optimised walks agree on random reservations") {
  uint64_t state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  for (int seed = 0; seed < 50; ++seed) {
    INFO("round " << seed);
    std::vector<ProfilePoint> profile;
    double t = -0.5;
    for (int i = 0; i < 6; ++i, t += 0.3 + next()) profile.push_back({t, 1e8 * (0.1 + next())});
    Network net = Network::FromBatch(OneLinkBatch(profile)).value();
    const Path path = net.PathBetween(net.HostIndex("w"), net.HostIndex("s"));
    for (int i = 0; i < 20; ++i) {
      const double t0 = 3 * next();
      const double bits = 1e8 * next();
      CHECK(net.FillEnd(path, t0, bits) == net.FillEnd(path, t0, bits, true));
      FillResult fill = net.Fill(path, t0, bits);
      REQUIRE(fill.feasible);
      CHECK(SegmentBits(fill.segments) == Approx(bits).epsilon(1e-9));
      net.Reserve(path, fill.segments);
    }
  }
}

// Random hosts with busy profiles (so links have stretches of no residual),
// a few behind one explicit link.
Batch BusyBatch(std::mt19937_64& rng, int hosts) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Batch batch;
  batch.now_s = 0;
  batch.server = "h0";
  auto profile = [&]() {
    std::vector<ProfilePoint> points;
    double t = 0;
    for (int i = 0; i < 6; ++i, t += 0.05 + 0.3 * unit(rng)) {
      points.push_back({t, unit(rng) < 0.3 ? 0.0 : 1e9 * (0.2 + unit(rng))});
    }
    points.push_back({t, 1e9});
    return points;
  };
  for (int h = 0; h < hosts; ++h) {
    batch.hosts.push_back({"h" + std::to_string(h), 0, 0, profile(), profile()});
  }
  batch.links = {{"rack", 0, profile()}};
  batch.paths = {{"h1", "h0", {"rack"}}, {"h2", "h0", {"rack"}}};
  return batch;
}

TEST_CASE("Merging runs of zero residual changes no fill, reservation or undo, to the bit") {
  // The same random reservations, releases and rollbacks on a network that
  // merges zero runs and on one that keeps every breakpoint: every fill
  // (end and segments) and every capacity must be identical, to the bit
  // until a release. A release over a merged run gives it back as one
  // segment where the other network has several of the same rate, so from
  // then on sums over them may differ in the last bits.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  size_t merged_points = 0, kept_points = 0;
  for (int round = 0; round < 40; ++round) {
    INFO("round " << round);
    const int hosts = 3 + static_cast<int>(rng() % 4);
    const Batch batch = BusyBatch(rng, hosts);
    Network merged = Network::FromBatch(batch).value();
    Network kept = merged;
    kept.set_merge_zero_runs(false);
    merged.BeginJournal();
    kept.BeginJournal();
    struct Reserved {
      Path path;
      std::vector<RateSegment> segments;
    };
    std::vector<Reserved> reserved;
    bool released = false;
    auto same = [&](double x, double y) {
      return released ? x == Approx(y).epsilon(1e-12).margin(1e-9) : x == y;
    };
    for (int step = 0; step < 60; ++step) {
      const int src = static_cast<int>(rng() % hosts), dst = static_cast<int>(rng() % hosts);
      const Path path = merged.PathBetween(src, dst);
      const double t0 = unit(rng), bits = 1e8 * unit(rng);
      FillResult a = merged.Fill(path, t0, bits);
      FillResult b = kept.Fill(path, t0, bits);
      REQUIRE(a.feasible == b.feasible);
      CHECK(same(a.end_s, b.end_s));
      if (!released) {
        REQUIRE(a.segments.size() == b.segments.size());
        for (size_t i = 0; i < a.segments.size(); ++i) {
          CHECK(a.segments[i].from_s == b.segments[i].from_s);
          CHECK(a.segments[i].to_s == b.segments[i].to_s);
          CHECK(a.segments[i].rate_bps == b.segments[i].rate_bps);
        }
      }
      const int what = static_cast<int>(rng() % 10);
      if (what < 6 && a.feasible) {  // reserve
        merged.Reserve(path, a.segments);
        kept.Reserve(path, b.segments);
        reserved.push_back({path, a.segments});
      } else if (what < 8 && a.feasible) {  // reserve, then undo it
        const size_t ma = merged.JournalMark(), mb = kept.JournalMark();
        const Network before = merged;
        merged.Reserve(path, a.segments);
        kept.Reserve(path, b.segments);
        merged.RollbackTo(ma);
        kept.RollbackTo(mb);
        for (int l = 0; l < merged.num_links(); ++l) {
          CHECK(merged.link(l).times_s == before.link(l).times_s);
          CHECK(merged.link(l).rates_bps == before.link(l).rates_bps);
          CHECK(merged.link(l).first_open == before.link(l).first_open);
        }
      } else if (!reserved.empty()) {  // give an earlier reservation back
        const size_t i = rng() % reserved.size();
        merged.Release(reserved[i].path, reserved[i].segments);
        kept.Release(reserved[i].path, reserved[i].segments);
        reserved.erase(reserved.begin() + static_cast<long>(i));
        released = true;
      }
      for (int l = 0; l < merged.num_links(); ++l) {
        const double from = unit(rng), to = from + unit(rng);
        CHECK(same(merged.CapacityBits(l, from, to), kept.CapacityBits(l, from, to)));
        CHECK(merged.OpenFrom(l) == kept.OpenFrom(l));
      }
    }
    for (int l = 0; l < merged.num_links(); ++l) {
      merged_points += merged.link(l).times_s.size();
      kept_points += kept.link(l).times_s.size();
    }
  }
  INFO(merged_points << " breakpoints merged against " << kept_points << " kept");
  CHECK(merged_points < kept_points * 9 / 10);  // the merge must happen
}

TEST_CASE("A host-to-host fill skips stretches of no residual exactly") {
  // The two-link walk jumps over a link's zero stretch; the general walk
  // (three links: the same two plus one that never limits) steps through
  // every breakpoint. Same ends and segments, to the bit.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int round = 0; round < 40; ++round) {
    INFO("round " << round);
    Batch batch = BusyBatch(rng, 4);
    batch.links.push_back({"wide", 1e15, {}});
    batch.paths.push_back({"h3", "h0", {"wide"}});
    Network net = Network::FromBatch(batch).value();
    net.set_merge_zero_runs(round % 2 == 0);
    const int h3 = net.HostIndex("h3"), h0 = net.HostIndex("h0");
    Path two;
    two.links.push_back(net.UplinkOf(h3));
    two.links.push_back(net.DownlinkOf(h0));
    const Path three = net.PathBetween(h3, h0);
    REQUIRE(three.links.size() == 3);
    for (int step = 0; step < 40; ++step) {
      const double t0 = unit(rng), bits = 1e8 * unit(rng);
      FillResult a = net.Fill(two, t0, bits);
      FillResult b = net.Fill(three, t0, bits);
      REQUIRE(a.end_s == b.end_s);
      REQUIRE(a.segments.size() == b.segments.size());
      for (size_t i = 0; i < a.segments.size(); ++i) {
        CHECK(a.segments[i].from_s == b.segments[i].from_s);
        CHECK(a.segments[i].to_s == b.segments[i].to_s);
      }
      // Reserve on the two hosts' links and on some other paths, so the
      // profiles grow zero stretches of their own.
      if (a.feasible) net.Reserve(two, a.segments);
      const Path other = net.PathBetween(static_cast<int>(rng() % 4), static_cast<int>(rng() % 4));
      FillResult c = net.Fill(other, unit(rng), 1e8 * unit(rng));
      if (c.feasible) net.Reserve(other, c.segments);
    }
  }
}

}  // namespace
}  // namespace mlfabric::core

TEST_CASE("RateAt sums the segments in force; ResidualProfile subtracts them from capacity") {
  using mlfabric::core::RateSegment;
  const std::vector<RateSegment> reserved = {{1.0, 3.0, 2e9}, {2.0, 4.0, 3e9}, {0.0, 0.5, 9e9}};
  CHECK(mlfabric::core::RateAt(reserved, 0.9) == 0);
  CHECK(mlfabric::core::RateAt(reserved, 1.0) == 2e9);  // [from, to): from included
  CHECK(mlfabric::core::RateAt(reserved, 2.5) == 5e9);
  CHECK(mlfabric::core::RateAt(reserved, 3.0) == 3e9);  // to excluded
  const auto profile = mlfabric::core::ResidualProfile(10e9, 0.75, reserved);
  // The segment that ended before now is ignored; equal neighbours merge.
  const std::vector<mlfabric::core::ProfilePoint> expected = {
      {0.75, 10e9}, {1.0, 8e9}, {2.0, 5e9}, {3.0, 7e9}, {4.0, 10e9}};
  CHECK(profile == expected);
  // Never negative, even when reservations exceed the (re-measured) capacity.
  const auto over = mlfabric::core::ResidualProfile(4e9, 2.5, reserved);
  CHECK(over.front() == mlfabric::core::ProfilePoint{2.5, 0.0});
}

TEST_CASE("ResidualProfile equals capacity minus RateAt at every point, bit for bit") {
  using mlfabric::core::ProfilePoint;
  using mlfabric::core::RateSegment;
  std::mt19937_64 random(777);
  std::uniform_real_distribution<double> unit(0, 1);
  auto next = [&] { return unit(random); };
  for (int round = 0; round < 200; ++round) {
    INFO("round " << round);
    // Segments that overlap, share boundaries, lie wholly in the past or
    // are empty, with rates that do not sum exactly in floating point.
    std::vector<RateSegment> reserved;
    const int n = 1 + static_cast<int>(next() * 40);
    for (int i = 0; i < n; ++i) {
      const double from = std::floor(next() * 20) / 4 - 1;
      const double to = next() < 0.1 ? from : from + std::floor(1 + next() * 12) / 4;
      reserved.push_back({from, to, 1e9 * (0.1 + next())});
    }
    const double now = next() * 3;
    const double capacity = 1e9 * (5 + 10 * next());
    const std::vector<ProfilePoint> profile =
        mlfabric::core::ResidualProfile(capacity, now, reserved);
    // The definition: a point at now and at every later boundary, its rate
    // capacity - RateAt (never negative), equal neighbours merged.
    std::vector<double> times = {now};
    for (const RateSegment& s : reserved) {
      if (s.to_s <= now) continue;
      if (s.from_s > now) times.push_back(s.from_s);
      times.push_back(s.to_s);
    }
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    std::vector<ProfilePoint> expected;
    for (double t : times) {
      const double rate = std::max(0.0, capacity - mlfabric::core::RateAt(reserved, t));
      if (!expected.empty() && expected.back().second == rate) continue;
      expected.push_back({t, rate});
    }
    CHECK(profile == expected);
  }
}
