#include "daemon/pacing/pacer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mlfabric::daemon {
namespace {

// Floating-point slack when comparing tokens with a request, so that a
// sender waking exactly at NextSendTime() is never refused by rounding.
constexpr double kSlackBytes = 1e-6;

absl::Status ValidateSegments(const std::vector<RateSegment>& segments) {
  if (segments.empty()) return absl::InvalidArgumentError("no rate segments");
  for (size_t i = 0; i < segments.size(); ++i) {
    const RateSegment& s = segments[i];
    if (!std::isfinite(s.from_s) || !std::isfinite(s.to_s) ||
        !std::isfinite(s.rate_bps) || !(s.from_s < s.to_s) || s.rate_bps < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rate segment ", i, " [", s.from_s, ", ", s.to_s, ", ", s.rate_bps,
          " bps] needs finite from_s < to_s and rate_bps >= 0"));
    }
    if (i > 0 && s.from_s < segments[i - 1].to_s) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rate segment ", i, " starts at ", s.from_s,
          " before segment ", i - 1, " ends at ", segments[i - 1].to_s,
          " (segments must be sorted and disjoint)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBurst(double burst_bytes) {
  if (!(burst_bytes > 0) || !std::isfinite(burst_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("burst_bytes must be positive and finite, got ", burst_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransferPacer> TransferPacer::Create(
    std::vector<RateSegment> segments, double clock_offset_s,
    PacerOptions options) {
  if (absl::Status s = ValidateSegments(segments); !s.ok()) return s;
  if (absl::Status s = ValidateBurst(options.burst_bytes); !s.ok()) return s;
  if (!std::isfinite(clock_offset_s)) {
    return absl::InvalidArgumentError("clock_offset_s must be finite");
  }
  if (!std::isfinite(options.tail_rate_bps)) {
    return absl::InvalidArgumentError("tail_rate_bps must be finite");
  }
  return TransferPacer(std::move(segments), clock_offset_s, options);
}

TransferPacer::TransferPacer(std::vector<RateSegment> segments,
                             double clock_offset_s, PacerOptions options)
    : segments_(std::move(segments)),
      clock_offset_s_(clock_offset_s),
      options_(options),
      last_s_(segments_.front().from_s) {}

double TransferPacer::TailRateBps() const {
  return options_.tail_rate_bps < 0 ? segments_.back().rate_bps
                                    : options_.tail_rate_bps;
}

double TransferPacer::ScheduledBytes(double from_s, double to_s) const {
  if (!(from_s < to_s)) return 0;
  double bits = 0;
  for (const RateSegment& s : segments_) {
    const double a = std::max(from_s, s.from_s);
    const double b = std::min(to_s, s.to_s);
    if (a < b) bits += (b - a) * s.rate_bps;
  }
  const double tail_from = std::max(from_s, segments_.back().to_s);
  if (tail_from < to_s) bits += (to_s - tail_from) * TailRateBps();
  return bits / 8;
}

void TransferPacer::Advance(double scheduler_s) {
  if (!(scheduler_s > last_s_)) return;
  // Rates are >= 0, so tokens grow monotonically and capping once at the
  // end equals capping continuously.
  tokens_ = std::min(options_.burst_bytes,
                     tokens_ + ScheduledBytes(last_s_, scheduler_s));
  last_s_ = scheduler_s;
}

uint64_t TransferPacer::AvailableBytes(double now_s) {
  Advance(now_s + clock_offset_s_);
  return static_cast<uint64_t>(std::floor(tokens_ + kSlackBytes));
}

bool TransferPacer::TryConsume(uint64_t bytes, double now_s) {
  Advance(now_s + clock_offset_s_);
  if (tokens_ + kSlackBytes < static_cast<double>(bytes)) return false;
  tokens_ = std::max(0.0, tokens_ - static_cast<double>(bytes));
  bytes_consumed_ += bytes;
  return true;
}

void TransferPacer::Refund(uint64_t bytes) {
  bytes = std::min(bytes, bytes_consumed_);
  tokens_ = std::min(options_.burst_bytes, tokens_ + static_cast<double>(bytes));
  bytes_consumed_ -= bytes;
}

double TransferPacer::NextSendTime(uint64_t bytes, double now_s) {
  Advance(now_s + clock_offset_s_);
  const double need = static_cast<double>(bytes) - tokens_;
  if (need <= kSlackBytes) return now_s;
  if (static_cast<double>(bytes) > options_.burst_bytes + kSlackBytes) return kNever;
  // Walk the schedule from last_s_ (>= now in scheduler time, equal unless
  // before the start or the clock went back) until `need` bytes accrue.
  double t = last_s_;
  double remaining_bits = need * 8;
  for (const RateSegment& s : segments_) {
    if (s.to_s <= t || s.rate_bps <= 0) continue;
    const double a = std::max(t, s.from_s);
    const double capacity_bits = (s.to_s - a) * s.rate_bps;
    if (capacity_bits >= remaining_bits) {
      return a + remaining_bits / s.rate_bps - clock_offset_s_;
    }
    remaining_bits -= capacity_bits;
  }
  const double tail = TailRateBps();
  if (tail <= 0) return kNever;
  const double a = std::max(t, segments_.back().to_s);
  return a + remaining_bits / tail - clock_offset_s_;
}

absl::Status TransferPacer::ReplaceSegments(std::vector<RateSegment> segments,
                                            double now_s) {
  if (absl::Status s = ValidateSegments(segments); !s.ok()) return s;
  Advance(now_s + clock_offset_s_);
  segments_ = std::move(segments);
  // Accounting continues from now (or from the new start if later).
  last_s_ = std::max(last_s_, segments_.front().from_s);
  return absl::OkStatus();
}

absl::StatusOr<TokenBucket> TokenBucket::Create(double rate_bps,
                                                double burst_bytes, double now_s) {
  if (!std::isfinite(rate_bps) || rate_bps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate_bps must be finite and >= 0, got ", rate_bps));
  }
  if (absl::Status s = ValidateBurst(burst_bytes); !s.ok()) return s;
  return TokenBucket(rate_bps, burst_bytes, now_s);
}

void TokenBucket::Advance(double now_s) {
  if (!(now_s > last_s_)) return;
  tokens_ = std::min(burst_bytes_, tokens_ + (now_s - last_s_) * rate_bps_ / 8);
  last_s_ = now_s;
}

uint64_t TokenBucket::AvailableBytes(double now_s) {
  Advance(now_s);
  return static_cast<uint64_t>(std::floor(tokens_ + kSlackBytes));
}

bool TokenBucket::TryConsume(uint64_t bytes, double now_s) {
  Advance(now_s);
  if (tokens_ + kSlackBytes < static_cast<double>(bytes)) return false;
  tokens_ = std::max(0.0, tokens_ - static_cast<double>(bytes));
  return true;
}

void TokenBucket::Refund(uint64_t bytes) {
  tokens_ = std::min(burst_bytes_, tokens_ + static_cast<double>(bytes));
}

double TokenBucket::NextSendTime(uint64_t bytes, double now_s) {
  Advance(now_s);
  const double need = static_cast<double>(bytes) - tokens_;
  if (need <= kSlackBytes) return now_s;
  if (static_cast<double>(bytes) > burst_bytes_ + kSlackBytes || rate_bps_ <= 0) {
    return kNever;
  }
  return last_s_ + need * 8 / rate_bps_;
}

absl::Status TokenBucket::SetRate(double rate_bps, double now_s) {
  if (!std::isfinite(rate_bps) || rate_bps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate_bps must be finite and >= 0, got ", rate_bps));
  }
  Advance(now_s);
  rate_bps_ = rate_bps;
  return absl::OkStatus();
}

}  // namespace mlfabric::daemon
