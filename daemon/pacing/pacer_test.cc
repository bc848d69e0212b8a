#include "daemon/pacing/pacer.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

namespace mlfabric::daemon {
namespace {

constexpr uint64_t kPacket = 32 * 1024;

// A fake-time sender with an infinite backlog: it sleeps until
// NextSendTime and sends one packet, until local time `until_s`. Returns
// bytes sent in [from_s, until_s) local time.
struct SendLog {
  std::vector<std::pair<double, uint64_t>> sends;  // (local time, bytes)
  uint64_t BytesIn(double from_s, double to_s) const {
    uint64_t total = 0;
    for (const auto& [t, b] : sends) total += (t >= from_s && t < to_s) ? b : 0;
    return total;
  }
};

SendLog PunctualSender(TransferPacer& pacer, double now_s, double until_s,
                       uint64_t packet = kPacket) {
  SendLog log;
  for (;;) {
    double t = pacer.NextSendTime(packet, now_s);
    REQUIRE(t >= now_s);
    if (t >= until_s) break;
    now_s = t;
    REQUIRE(pacer.TryConsume(packet, now_s));
    log.sends.emplace_back(now_s, packet);
  }
  return log;
}

TEST_CASE("Rejects malformed schedules and options") {
  CHECK_FALSE(TransferPacer::Create({}, 0).ok());
  CHECK_FALSE(TransferPacer::Create({{1, 1, 1e9}}, 0).ok());
  CHECK_FALSE(TransferPacer::Create({{1, 2, -1}}, 0).ok());
  CHECK_FALSE(TransferPacer::Create({{1, 2, NAN}}, 0).ok());
  auto overlap = TransferPacer::Create({{1, 3, 1e9}, {2, 4, 1e9}}, 0);
  REQUIRE_FALSE(overlap.ok());
  CHECK(overlap.status().message().find("sorted and disjoint") != std::string::npos);
  CHECK_FALSE(TransferPacer::Create({{1, 2, 1e9}}, 0, {0.0, -1}).ok());
  CHECK_FALSE(TransferPacer::Create({{1, 2, 1e9}}, NAN).ok());
  CHECK_FALSE(TokenBucket::Create(-1, 100, 0).ok());
  CHECK_FALSE(TokenBucket::Create(1e6, 0, 0).ok());
}

TEST_CASE("Nothing is released before the transfer's start time") {
  auto pacer = TransferPacer::Create({{10.0, 12.0, 8e8}}, 0);  // 100 MB/s
  REQUIRE(pacer.ok());
  CHECK(pacer->start_local_s() == 10.0);
  for (double t : {0.0, 5.0, 9.999}) {
    CHECK(pacer->AvailableBytes(t) == 0);
    CHECK_FALSE(pacer->TryConsume(1, t));
  }
  // The first packet may go once it has accrued after the start.
  CHECK(pacer->NextSendTime(kPacket, 3.0) == Approx(10.0 + kPacket / 1e8));
  CHECK(pacer->AvailableBytes(10.0) == 0);
  CHECK(pacer->AvailableBytes(10.0001) == 10000);
}

TEST_CASE("Pacing accuracy: bytes per segment within one packet of rate * duration") {
  // Two segments with a gap, then a third: 1 Gbit/s, idle, 400 Mbit/s, 2 Gbit/s.
  std::vector<RateSegment> segments = {
      {0.0, 0.5, 1e9}, {0.7, 1.0, 4e8}, {1.0, 1.25, 2e9}};
  auto pacer = TransferPacer::Create(segments, 0, {2.0 * kPacket, 0.0});
  REQUIRE(pacer.ok());
  SendLog log = PunctualSender(*pacer, -1.0, 5.0);
  for (const RateSegment& s : segments) {
    INFO("segment [" << s.from_s << ", " << s.to_s << ")");
    const double expected = s.rate_bps * (s.to_s - s.from_s) / 8;
    CHECK(std::abs(double(log.BytesIn(s.from_s, s.to_s)) - expected) <= kPacket);
  }
  CHECK(log.BytesIn(0.5, 0.7) <= kPacket);  // the gap: at most one leftover
  CHECK(log.BytesIn(1.25, 5.0) <= kPacket);  // tail rate 0: stops
  CHECK(pacer->NextSendTime(kPacket, 5.0) == kNever);
  CHECK(pacer->bytes_consumed() == log.BytesIn(-1, 5));
  // Total over the schedule within a packet.
  CHECK(std::abs(double(log.BytesIn(-1, 5)) - pacer->ScheduledBytes(0, 2)) <= kPacket);
}

TEST_CASE("Property: a polling sender never runs ahead and lags by at most a burst") {
  const uint32_t seed = 2024;
  INFO("seed=" << seed);
  std::mt19937 rng(seed);
  std::vector<RateSegment> segments;
  double t = 1.0;
  for (int i = 0; i < 20; ++i) {
    double length = std::uniform_real_distribution<double>(0.01, 0.2)(rng);
    double rate = std::uniform_real_distribution<double>(0, 1e9)(rng);
    segments.push_back({t, t + length, rate});
    t += length + (i % 3 == 0 ? 0.05 : 0.0);
  }
  // At <= 1 Gbit/s a 4-packet burst takes >= 1 ms to fill; polls come at
  // most 0.5 ms apart, so no tokens overflow and the sender keeps up.
  const double burst = 4.0 * kPacket;
  auto pacer = TransferPacer::Create(segments, 0, {burst, 0.0});
  REQUIRE(pacer.ok());
  double now = 0;
  double sent = 0;
  while (now < t + 1) {
    now += std::uniform_real_distribution<double>(0, 0.0005)(rng);
    while (pacer->TryConsume(kPacket, now)) sent += kPacket;
    const double allowed = pacer->ScheduledBytes(0, now);
    REQUIRE(sent <= allowed + 1e-3);    // never ahead of the schedule
    REQUIRE(allowed - sent < kPacket);  // behind by less than one packet
  }
  CHECK(std::abs(sent - pacer->ScheduledBytes(0, t + 1)) < kPacket);
}

TEST_CASE("Burst limit caps accumulated tokens") {
  auto pacer = TransferPacer::Create({{0, 100, 8e6}}, 0, {10000.0, -1});  // 1 MB/s
  REQUIRE(pacer.ok());
  CHECK(pacer->AvailableBytes(50) == 10000);  // idle 50 s: still one burst
  CHECK(pacer->TryConsume(10000, 50));
  CHECK_FALSE(pacer->TryConsume(1, 50));
  CHECK(pacer->NextSendTime(20000, 50) == kNever);  // larger than the burst
  CHECK(pacer->NextSendTime(5000, 50) == Approx(50.005));
}

TEST_CASE("Refund gives back tokens taken and not sent, up to the burst") {
  auto pacer = TransferPacer::Create({{0, 100, 8e6}}, 0, {10000.0, -1});  // 1 MB/s
  REQUIRE(pacer.ok());
  REQUIRE(pacer->TryConsume(6000, 50));
  REQUIRE(pacer->TryConsume(4000, 50));
  CHECK(pacer->bytes_consumed() == 10000);
  pacer->Refund(4000);
  CHECK(pacer->bytes_consumed() == 6000);
  CHECK(pacer->AvailableBytes(50) == 4000);
  pacer->Refund(1 << 20);  // never above the burst, nor below nothing consumed
  CHECK(pacer->AvailableBytes(50) == 10000);
  CHECK(pacer->bytes_consumed() == 0);
  auto bucket = TokenBucket::Create(8e6, 10000, 0);
  REQUIRE(bucket.ok());
  REQUIRE(bucket->TryConsume(10000, 0));
  bucket->Refund(3000);
  CHECK(bucket->AvailableBytes(0) == 3000);
}

TEST_CASE("Clock offset maps local time to scheduler time") {
  // The daemon's clock is 2 s behind the scheduler: scheduler = local + 2.
  auto pacer = TransferPacer::Create({{10.0, 11.0, 8e8}}, 2.0, {64 * 1024, 0});
  REQUIRE(pacer.ok());
  CHECK(pacer->start_local_s() == 8.0);
  CHECK(pacer->AvailableBytes(7.99) == 0);
  CHECK(pacer->NextSendTime(kPacket, 0.0) == Approx(8.0 + kPacket / 1e8));
  SendLog log = PunctualSender(*pacer, 0.0, 8.5);
  CHECK(std::abs(double(log.BytesIn(8.0, 8.5)) - 0.5e8) <= kPacket);
  // A refreshed offset moves the remaining schedule in local time.
  pacer->SetClockOffset(2.25);
  CHECK(pacer->NextSendTime(kPacket, 8.5) >= 8.5);
  SendLog rest = PunctualSender(*pacer, 8.5, 20.0);
  // Scheduler time jumped 0.25 s forward: the skipped 0.25 s yields at
  // most one burst, then the remaining 0.25 s of the segment.
  CHECK(double(rest.BytesIn(0, 20)) <= 0.25e8 + 64 * 1024 + kPacket);
  CHECK(double(rest.BytesIn(0, 20)) >= 0.25e8 - kPacket);
  CHECK(rest.sends.back().first <= 8.75 + 1e-9);  // local end of the schedule
}

TEST_CASE("Tail rate: default continues at the last rate, 0 stops") {
  auto continuing = TransferPacer::Create({{0, 1, 8e6}}, 0);
  REQUIRE(continuing.ok());
  CHECK(continuing->NextSendTime(1000, 1.0) != kNever);
  SendLog log = PunctualSender(*continuing, 1.0, 2.0, 1000);
  CHECK(std::abs(double(log.BytesIn(1.0, 2.0)) - 1e6) <= 1000 + 64 * 1024);
  auto stopping = TransferPacer::Create({{0, 1, 8e6}}, 0, {64 * 1024, 0});
  REQUIRE(stopping.ok());
  CHECK(stopping->AvailableBytes(1.5) == 64 * 1024);  // burst from the segment
  CHECK(stopping->TryConsume(64 * 1024, 1.5));
  CHECK(stopping->NextSendTime(1, 1.5) == kNever);
  CHECK(stopping->ScheduledBytes(0.5, 3.0) == Approx(0.5e6));
}

TEST_CASE("Replacing segments (re-plan) applies the new rates from now on") {
  auto pacer = TransferPacer::Create({{0, 10, 8e8}}, 0, {2.0 * kPacket, 0});
  REQUIRE(pacer.ok());
  SendLog first = PunctualSender(*pacer, 0, 1.0);
  CHECK(std::abs(double(first.BytesIn(0, 1)) - 1e8) <= kPacket);
  REQUIRE(pacer->ReplaceSegments({{1.0, 2.0, 1.6e9}, {3.0, 4.0, 0}}, 1.0).ok());
  SendLog second = PunctualSender(*pacer, 1.0, 10.0);
  CHECK(std::abs(double(second.BytesIn(1, 2)) - 2e8) <= 2 * kPacket);
  CHECK(second.BytesIn(2, 10) <= kPacket);
  CHECK_FALSE(pacer->ReplaceSegments({}, 5).ok());
  // A re-plan that starts later releases nothing before its start.
  auto later = TransferPacer::Create({{0, 1, 8e8}}, 0, {2.0 * kPacket, 0});
  REQUIRE(later.ok());
  REQUIRE(later->ReplaceSegments({{5, 6, 8e8}}, 0.0).ok());
  CHECK(later->AvailableBytes(4.9) == 0);
  CHECK(later->NextSendTime(kPacket, 0) == Approx(5 + kPacket / 1e8));
}

TEST_CASE("Time going backwards neither creates nor destroys tokens") {
  auto pacer = TransferPacer::Create({{0, 10, 8e6}}, 0, {1e6, -1});
  REQUIRE(pacer.ok());
  CHECK(pacer->AvailableBytes(0.5) == 500000);
  CHECK(pacer->AvailableBytes(0.2) == 500000);
  CHECK(pacer->AvailableBytes(0.6) == 600000);
}

TEST_CASE("Unscheduled-traffic budget: constant-rate token bucket") {
  auto bucket = TokenBucket::Create(8e6, 20000, 0.0);  // 1 MB/s, 20 kB burst
  REQUIRE(bucket.ok());
  CHECK(bucket->AvailableBytes(0) == 20000);  // starts full
  CHECK(bucket->TryConsume(15000, 0));
  CHECK_FALSE(bucket->TryConsume(10000, 0));
  CHECK(bucket->NextSendTime(10000, 0) == Approx(0.005));
  CHECK(bucket->TryConsume(10000, 0.005));
  CHECK(bucket->NextSendTime(30000, 1) == kNever);
  // Sustained: bytes over 1 s of a punctual sender within one message.
  double now = 1.0;
  uint64_t sent = 0;
  CHECK(bucket->TryConsume(bucket->AvailableBytes(now), now));  // drain
  while (true) {
    double t = bucket->NextSendTime(1000, now);
    if (t >= 2.0) break;
    now = t;
    REQUIRE(bucket->TryConsume(1000, now));
    sent += 1000;
  }
  CHECK(std::abs(double(sent) - 1e6) <= 1000);
  REQUIRE(bucket->SetRate(0, now).ok());
  CHECK(bucket->NextSendTime(bucket->AvailableBytes(now) + 1, now) == kNever);
  CHECK_FALSE(bucket->SetRate(-5, now).ok());
}

}  // namespace
}  // namespace mlfabric::daemon
