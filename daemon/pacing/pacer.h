// Time-sliced rate enforcement for the daemon (docs/architecture.md §5 "Pacing";
// mlfabric.md §5: the scheduler reserves bandwidth per transfer as rate
// segments, and a transfer must neither start early nor exceed them, or it
// eats bandwidth reserved for another transfer).
//
// TransferPacer: a token bucket whose fill rate is the transfer's
// piecewise-constant schedule [from_s, to_s) -> rate_bps, in SCHEDULER
// time. The daemon works in its own clock; scheduler_s = local_s +
// clock_offset_s, the offset estimated at registration and refreshed
// (SetClockOffset). No tokens exist before the first segment starts, so
// nothing is released before the transfer's start time; between segments
// the rate is 0; after the last segment the rate is `tail_rate_bps` (by
// default the last segment's rate, so a transfer whose size the scheduler
// underestimated still finishes instead of stalling forever; set 0 to stop
// hard at the end of the reservation). Tokens never exceed `burst_bytes`,
// which bounds how far a sender that fell behind may catch up in one go
// (it must be at least one packet).
//
// TokenBucket: the same at a constant rate, for unscheduled traffic
// (control messages, `get` replies), which has its own budget.
//
// Time is always a parameter (seconds, doubles): no clock is read here.
// Times that go backwards are ignored (no tokens are created or lost).
//
//   auto pacer = TransferPacer::Create({{10.0, 10.5, 8e9}, {10.5, 11.0, 4e9}},
//                                      /*clock_offset_s=*/-0.002,
//                                      {/*burst_bytes=*/64 * 1024});
//   // in the send loop, with now_s = local clock:
//   if (pacer->TryConsume(packet_bytes, now_s)) Send(packet);
//   else WakeAt(pacer->NextSendTime(packet_bytes, now_s));
//
// Thread safety: none (one send loop owns each pacer); const methods may
// run concurrently when nothing mutates.
#ifndef MLFABRIC_DAEMON_PACING_PACER_H_
#define MLFABRIC_DAEMON_PACING_PACER_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mlfabric::daemon {

// `rate_bps` (bits per second) holds on [from_s, to_s), scheduler time.
struct RateSegment {
  double from_s = 0;
  double to_s = 0;
  double rate_bps = 0;
};

inline constexpr double kNever = std::numeric_limits<double>::infinity();

struct PacerOptions {
  // Token cap. Default: two 32 KiB Mercury packets.
  double burst_bytes = 64 * 1024;
  // Rate after the last segment; negative means "the last segment's rate".
  double tail_rate_bps = -1;
};

class TransferPacer {
 public:
  // Segments must be non-empty, finite, from_s < to_s, rate_bps >= 0, and
  // sorted without overlap (gaps allowed). burst_bytes must be > 0.
  static absl::StatusOr<TransferPacer> Create(std::vector<RateSegment> segments,
                                              double clock_offset_s,
                                              PacerOptions options = {});

  // Bytes that may be sent at local time now_s (whole bytes).
  uint64_t AvailableBytes(double now_s);
  // Takes `bytes` tokens if available at now_s; false (and no change)
  // otherwise.
  bool TryConsume(uint64_t bytes, double now_s);
  // Gives back `bytes` taken by TryConsume and not sent after all (up to
  // the burst).
  void Refund(uint64_t bytes);
  // Earliest local time >= now_s at which `bytes` may be sent; kNever if
  // never (bytes > burst_bytes, or the schedule has ended with no tail).
  double NextSendTime(uint64_t bytes, double now_s);

  // Schedule change (the scheduler re-planned the transfer). Tokens held
  // are kept (up to the burst); the new segments apply from now on.
  absl::Status ReplaceSegments(std::vector<RateSegment> segments, double now_s);
  // Clock offset refresh. Takes effect from the next call: if scheduler
  // time jumps forward the skipped interval fills the bucket (bounded by
  // the burst); if it jumps back, no tokens accrue until it catches up.
  void SetClockOffset(double clock_offset_s) { clock_offset_s_ = clock_offset_s; }

  // Local time of the first byte's release.
  double start_local_s() const { return segments_.front().from_s - clock_offset_s_; }
  double clock_offset_s() const { return clock_offset_s_; }
  uint64_t bytes_consumed() const { return bytes_consumed_; }
  // Bytes the schedule allows over [from_s, to_s) scheduler time, ignoring
  // the burst cap (what a perfectly punctual sender would send).
  double ScheduledBytes(double from_s, double to_s) const;

 private:
  TransferPacer(std::vector<RateSegment> segments, double clock_offset_s,
                PacerOptions options);
  void Advance(double scheduler_s);
  double TailRateBps() const;

  std::vector<RateSegment> segments_;
  double clock_offset_s_;
  PacerOptions options_;
  double tokens_ = 0;
  double last_s_;  // scheduler time tokens_ is accounted up to
  uint64_t bytes_consumed_ = 0;
};

class TokenBucket {
 public:
  // rate_bps >= 0 and finite, burst_bytes > 0. Starts full at now_s.
  static absl::StatusOr<TokenBucket> Create(double rate_bps, double burst_bytes,
                                            double now_s);

  uint64_t AvailableBytes(double now_s);
  bool TryConsume(uint64_t bytes, double now_s);
  // Gives back `bytes` taken by TryConsume and not sent (up to the burst).
  void Refund(uint64_t bytes);
  // kNever if bytes > burst_bytes or the rate is 0 and tokens are short.
  double NextSendTime(uint64_t bytes, double now_s);
  // Changes the rate from now_s on (tokens accrued so far are kept).
  absl::Status SetRate(double rate_bps, double now_s);

  double rate_bps() const { return rate_bps_; }
  double burst_bytes() const { return burst_bytes_; }

 private:
  TokenBucket(double rate_bps, double burst_bytes, double now_s)
      : rate_bps_(rate_bps), burst_bytes_(burst_bytes), tokens_(burst_bytes),
        last_s_(now_s) {}
  void Advance(double now_s);

  double rate_bps_;
  double burst_bytes_;
  double tokens_;
  double last_s_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_PACING_PACER_H_
