#include "aggregator/packet_pool.h"

#include "common/half.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace mlfabric::aggregator {
namespace {

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

template <typename T>
absl::Span<const std::byte> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

template <typename T>
absl::Span<std::byte> MutableBytes(std::vector<T>& v) {
  return {reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(T)};
}

// Elements [begin, end) of v as bytes.
template <typename T>
absl::Span<const std::byte> Slice(const std::vector<T>& v, size_t begin, size_t end) {
  return Bytes(v).subspan(begin * sizeof(T), (end - begin) * sizeof(T));
}

AggregationSpec Spec(DType dtype, uint64_t bytes, uint32_t packet_bytes, uint32_t expected) {
  AggregationSpec spec;
  spec.dtype = dtype;
  spec.bytes = bytes;
  spec.packet_bytes = packet_bytes;
  spec.expected_contributions = expected;
  return spec;
}

std::vector<uint32_t> ReadyOf(const PacketPool& pool, TransferId transfer) {
  auto ready = pool.ReadyPackets(transfer);
  REQUIRE(ready.ok());
  return {ready->begin(), ready->end()};
}

TEST_CASE("Three contributors, one standing for two pushes, on a 16-float grid") {
  PacketPool pool;
  std::vector<float> sum(40, -7.0f);  // packets of 16, 16, 8 floats; old bytes
  REQUIRE(pool.RegisterTransfer(7, Spec(DType::kFloat32, 160, 64, 4), MutableBytes(sum)).ok());
  REQUIRE(pool.AddContributor(7, 100).ok());
  REQUIRE(pool.AddContributor(7, 200, 1.0, 2).ok());
  CHECK(*pool.JoinedContributions(7) == 3);

  std::vector<float> a(40), b(40), c(40);
  for (int i = 0; i < 40; ++i) {
    a[i] = float(i);
    b[i] = float(2 * i);
    c[i] = float(1000 + i);
  }
  std::vector<uint32_t> ready;
  // Contributor 100 sends one range across all three packets.
  REQUIRE(pool.Add(7, 100, 0, Bytes(a), &ready).ok());
  CHECK(ready.empty());
  CHECK(pool.partial_packets() == 3);
  // Contributor 200 (count 2) sends the tail packet, then [0, 24).
  REQUIRE(pool.Add(7, 200, 32 * 4, Slice(b, 32, 40), &ready).ok());
  REQUIRE(pool.Add(7, 200, 0, Slice(b, 0, 24), &ready).ok());
  CHECK(ready.empty());  // 3 of 4 contributions: nothing is final yet
  // The last member joins after the others' data arrived.
  REQUIRE(pool.AddContributor(7, 300).ok());
  REQUIRE(pool.Add(7, 300, 16 * 4, Slice(c, 16, 40), &ready).ok());
  CHECK(ready == std::vector<uint32_t>{2});  // packet 1 still lacks b[24, 32)
  REQUIRE(pool.Add(7, 300, 0, Slice(c, 0, 16), &ready).ok());
  CHECK(ready == std::vector<uint32_t>{2, 0});
  CHECK(pool.partial_packets() == 1);
  CHECK_FALSE(*pool.Complete(7));
  REQUIRE(pool.Add(7, 200, 24 * 4, Slice(b, 24, 32), &ready).ok());
  CHECK(ready == std::vector<uint32_t>{2, 0, 1});
  CHECK(ReadyOf(pool, 7) == ready);
  CHECK(*pool.Complete(7));
  CHECK(pool.partial_packets() == 0);
  for (int i = 0; i < 40; ++i) {
    INFO("element " << i);
    CHECK(sum[i] == a[i] + b[i] + c[i]);
  }
  auto packet1 = pool.Packet(7, 1);
  REQUIRE(packet1.ok());
  CHECK(packet1->data() == MutableBytes(sum).data() + 64);
  CHECK(packet1->size() == 64);
  CHECK(pool.Packet(7, 2)->size() == 32);
  CHECK(pool.Packet(7, 3).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("Weights are applied as float for float32, as double for float64") {
  PacketPool pool;
  std::vector<float> sum32(8, 0.0f);
  std::vector<double> sum64(8, 0.0);
  REQUIRE(pool.RegisterTransfer(1, Spec(DType::kFloat32, 32, 16, 2), MutableBytes(sum32)).ok());
  REQUIRE(pool.RegisterTransfer(2, Spec(DType::kFloat64, 64, 16, 2), MutableBytes(sum64)).ok());
  REQUIRE(pool.AddContributor(1, 1, 0.1).ok());
  REQUIRE(pool.AddContributor(1, 2, -3.7).ok());
  REQUIRE(pool.AddContributor(2, 1, 0.1).ok());
  REQUIRE(pool.AddContributor(2, 2, -3.7).ok());
  std::vector<float> x32{1.5f, 2.25f, -7.0f, 1e-3f, 3.3f, 9e5f, -0.5f, 42.0f};
  std::vector<double> x64(x32.begin(), x32.end());
  std::vector<float> y32{0.3f, -1.0f, 2.0f, 5.5f, 7.7f, -2e4f, 1.0f, 0.0f};
  std::vector<double> y64(y32.begin(), y32.end());
  for (TransferId t : {1, 2}) {
    const bool f32 = t == 1;
    REQUIRE(pool.Add(t, 2, 0, f32 ? Bytes(y32) : Bytes(y64), nullptr).ok());
    REQUIRE(pool.Add(t, 1, 0, f32 ? Bytes(x32) : Bytes(x64), nullptr).ok());
    CHECK(*pool.Complete(t));
  }
  for (int i = 0; i < 8; ++i) {
    float r32 = 0.0f;
    r32 += float(-3.7) * y32[i];
    r32 += float(0.1) * x32[i];
    double r64 = 0.0;
    r64 += -3.7 * y64[i];
    r64 += 0.1 * x64[i];
    CHECK(std::memcmp(&sum32[i], &r32, sizeof(float)) == 0);
    CHECK(std::memcmp(&sum64[i], &r64, sizeof(double)) == 0);
  }
}

TEST_CASE("Integer sums wrap modulo 2^32 and 2^64") {
  PacketPool pool;
  std::vector<int32_t> sum32(4, 0);
  std::vector<int64_t> sum64(4, 0);
  REQUIRE(pool.RegisterTransfer(1, Spec(DType::kInt32, 16, 8, 2), MutableBytes(sum32)).ok());
  REQUIRE(pool.RegisterTransfer(2, Spec(DType::kInt64, 32, 16, 3), MutableBytes(sum64)).ok());
  const int32_t max32 = std::numeric_limits<int32_t>::max();
  const int32_t min32 = std::numeric_limits<int32_t>::min();
  const int64_t max64 = std::numeric_limits<int64_t>::max();
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  std::vector<int32_t> a32{max32, min32, -1, 5}, b32{1, -1, -1, -7};
  std::vector<int64_t> a64{max64, min64, -1, 5}, b64{1, -1, max64, -7};
  REQUIRE(pool.AddContributor(1, 10).ok());
  REQUIRE(pool.AddContributor(1, 11).ok());
  REQUIRE(pool.AddContributor(2, 10, 1.0, 2).ok());
  REQUIRE(pool.AddContributor(2, 11).ok());
  CHECK(pool.AddContributor(2, 12, 2.0).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(pool.Add(1, 10, 0, Bytes(a32), nullptr).ok());
  REQUIRE(pool.Add(1, 11, 0, Bytes(b32), nullptr).ok());
  REQUIRE(pool.Add(2, 10, 0, Bytes(a64), nullptr).ok());
  REQUIRE(pool.Add(2, 11, 0, Bytes(b64), nullptr).ok());
  CHECK(sum32 == std::vector<int32_t>{min32, max32, -2, -2});
  CHECK(sum64 == std::vector<int64_t>{min64, max64, max64 - 1, -2});
  CHECK(*pool.Complete(1));
  CHECK(*pool.Complete(2));
}

TEST_CASE("Integer-valued floats sum exactly in any order and any layout") {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    INFO("seed=" << seed);
    std::mt19937 rng(seed);
    const size_t n = 3000 + rng() % 5000;
    const uint32_t contributors = 1 + rng() % 6;
    // Not zeroed (a reused buffer): each packet's first contribution
    // initialises it, whole-packet copies and partial pieces alike.
    std::vector<float> sum(n, std::nanf(""));
    PacketPool pool;
    REQUIRE(pool.RegisterTransfer(5, Spec(DType::kFloat32, n * 4, 1024, contributors),
                                  MutableBytes(sum))
                .ok());
    std::vector<std::vector<float>> data(contributors, std::vector<float>(n));
    std::vector<double> exact(n, 0.0);
    struct Piece {
      ContributorId c;
      size_t begin, end;
    };
    std::vector<Piece> pieces;
    for (uint32_t c = 0; c < contributors; ++c) {
      const double weight = std::ldexp(1.0, int(rng() % 5) - 2);  // 1/4 .. 4: exact
      REQUIRE(pool.AddContributor(5, c, weight).ok());
      for (size_t i = 0; i < n; ++i) {
        data[c][i] = float(int(rng() % 20001) - 10000);
        exact[i] += weight * data[c][i];
      }
      for (size_t begin = 0; begin < n;) {
        const size_t end = std::min(n, begin + 1 + rng() % 700);
        pieces.push_back({c, begin, end});
        begin = end;
      }
    }
    std::shuffle(pieces.begin(), pieces.end(), rng);
    for (const Piece& p : pieces) {
      REQUIRE(pool.Add(5, p.c, p.begin * 4, Slice(data[p.c], p.begin, p.end), nullptr).ok());
    }
    REQUIRE(*pool.Complete(5));
    for (size_t i = 0; i < n; ++i) {
      if (double(sum[i]) != exact[i]) FAIL("element " << i << ": " << sum[i] << " != " << exact[i]);
    }
  }
}

// ------------------------------------------------------------------------
// Property test: random dtypes, sizes, grids and contributor layouts, random
// arrival order and join times, interleaved with every kind of invalid call.
// A model (scalar sums replayed in arrival order, byte coverage per element)
// predicts every result: the sum bit for bit, the ready packets of each Add
// in order, and that a rejected call changes nothing.

struct Segment {
  size_t contributor;  // index into the contributors
  uint64_t offset;
  uint64_t size;
};

struct ModelContributor {
  ContributorId id;
  double weight;
  uint32_t count;
  std::vector<std::byte> data;  // its whole contribution
  std::vector<Segment> segments;
  bool joined = false;
  std::vector<bool> covered;  // per element
};

// Cuts [0, bytes) as a sender would: a fixed packet size from the start, or
// per tensor (random tensor boundaries, each packetised from its own start,
// so segment boundaries are mostly off the aggregate's grid).
std::vector<std::pair<uint64_t, uint64_t>> Layout(std::mt19937& rng, uint64_t bytes,
                                                  size_t element) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  auto packetise = [&](uint64_t begin, uint64_t end, uint64_t packet) {
    for (uint64_t at = begin; at < end; at += packet) {
      ranges.push_back({at, std::min(packet, end - at)});
    }
  };
  switch (rng() % 4) {
    case 0: packetise(0, bytes, 4096); break;
    case 1: packetise(0, bytes, 32 * 1024); break;
    case 2: packetise(0, bytes, element * (16 + rng() % 3000)); break;
    default: {
      const uint64_t packet = element * (64 + rng() % 2000);
      for (uint64_t begin = 0; begin < bytes;) {
        const uint64_t end = std::min(bytes, begin + element * (1 + rng() % 20000));
        packetise(begin, end, packet);
        begin = end;
      }
    }
  }
  return ranges;
}

template <typename T>
void ModelAdd(std::byte* sum, const std::byte* src, double weight, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T s, x;
    std::memcpy(&s, sum + i * sizeof(T), sizeof(T));
    std::memcpy(&x, src + i * sizeof(T), sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      s += static_cast<T>(weight) * x;
    } else {
      s = static_cast<T>(s + x);  // T is unsigned here
    }
    std::memcpy(sum + i * sizeof(T), &s, sizeof(T));
  }
}

void ModelSum(DType dtype, std::byte* sum, const std::byte* src, double weight, size_t bytes) {
  switch (dtype) {
    case DType::kFloat32: ModelAdd<float>(sum, src, weight, bytes / 4); break;
    case DType::kFloat64: ModelAdd<double>(sum, src, weight, bytes / 8); break;
    case DType::kInt32: ModelAdd<uint32_t>(sum, src, weight, bytes / 4); break;
    case DType::kInt64: ModelAdd<uint64_t>(sum, src, weight, bytes / 8); break;
    case DType::kInt8:
    case DType::kUint8: ModelAdd<uint8_t>(sum, src, weight, bytes); break;
    case DType::kInt16:
    case DType::kUint16: ModelAdd<uint16_t>(sum, src, weight, bytes / 2); break;
    case DType::kFloat16: FAIL("float16 has no weighted model here"); break;
  }
}

struct Snapshot {
  std::vector<std::byte> sum;
  std::vector<uint32_t> ready;
  uint32_t joined;
  size_t partial;
  bool operator==(const Snapshot& o) const {
    return sum == o.sum && ready == o.ready && joined == o.joined && partial == o.partial;
  }
};

// Invalid calls made per kind, over all runs (each kind must be exercised).
int invalid_calls[9] = {};

void RunProperty(uint32_t seed) {
  INFO("seed=" << seed);
  std::mt19937 rng(seed);
  const DType dtype = static_cast<DType>(rng() % 4);
  const size_t element = DTypeBytes(dtype);
  const bool integer = dtype == DType::kInt32 || dtype == DType::kInt64;
  const uint64_t bytes = element * (1 + rng() % 60000);
  uint32_t packet_bytes = 0;
  switch (rng() % 3) {
    case 0: packet_bytes = 32 * 1024; break;
    case 1: packet_bytes = 4096; break;
    default: packet_bytes = static_cast<uint32_t>(element * (1 + rng() % 5000));
  }
  const uint32_t expected = 1 + rng() % 6;
  const uint64_t packets = PacketCount(Spec(dtype, bytes, packet_bytes, expected));
  INFO(DTypeName(dtype) << " bytes=" << bytes << " packet_bytes=" << packet_bytes
                        << " expected=" << expected);

  // Contributors: counts adding up to `expected`.
  std::vector<ModelContributor> contributors;
  for (uint32_t left = expected; left > 0;) {
    ModelContributor c;
    c.id = 1000 + rng() % 1000000 * 7 + contributors.size();  // unique by the low term
    c.count = 1 + rng() % left;
    left -= c.count;
    if (integer) {
      c.weight = 1.0;
    } else {
      const double weights[] = {1.0, 0.5, -0.25, 3.0, 0.1, -1.7};
      c.weight = (rng() % 2) ? weights[rng() % 6]
                             : std::uniform_real_distribution<double>(-2, 2)(rng);
    }
    c.data.resize(bytes);
    for (uint64_t i = 0; i < bytes; i += element) {
      if (dtype == DType::kFloat32) {
        float v = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng);
        std::memcpy(&c.data[i], &v, 4);
      } else if (dtype == DType::kFloat64) {
        double v = std::uniform_real_distribution<double>(-1e3, 1e3)(rng);
        std::memcpy(&c.data[i], &v, 8);
      } else {
        const uint64_t v = (uint64_t{rng()} << 32) | rng();  // full range: wraps
        std::memcpy(&c.data[i], &v, element);
      }
    }
    for (auto [offset, size] : Layout(rng, bytes, element)) {
      c.segments.push_back({contributors.size(), offset, size});
    }
    c.covered.assign(bytes / element, false);
    contributors.push_back(std::move(c));
  }

  // Arrival order: all segments shuffled; a contributor joins at a random
  // point before its first segment (after others' data may have arrived).
  std::vector<Segment> arrivals;
  for (const ModelContributor& c : contributors) {
    arrivals.insert(arrivals.end(), c.segments.begin(), c.segments.end());
  }
  std::shuffle(arrivals.begin(), arrivals.end(), rng);

  const TransferId transfer = 77;
  std::vector<uint64_t> sum_words((bytes + 7) / 8, 0);  // 8-byte aligned
  absl::Span<std::byte> sum(reinterpret_cast<std::byte*>(sum_words.data()), bytes);
  std::vector<std::byte> model(bytes, std::byte{0});
  std::vector<uint64_t> credit(packets, 0);
  std::vector<uint32_t> model_ready;
  PacketPool pool;
  REQUIRE(pool.RegisterTransfer(transfer, Spec(dtype, bytes, packet_bytes, expected), sum).ok());
  uint32_t joined = 0;
  size_t partial = 0;  // model: packets with 0 < credit < full

  auto snapshot = [&] {
    return Snapshot{{sum.begin(), sum.end()},
                    ReadyOf(pool, transfer),
                    *pool.JoinedContributions(transfer),
                    pool.partial_packets()};
  };
  std::vector<std::byte> misaligned;
  auto payload_of = [&](const ModelContributor& c, uint64_t offset, uint64_t size,
                        bool shift) -> absl::Span<const std::byte> {
    if (!shift) return absl::Span<const std::byte>(c.data).subspan(offset, size);
    misaligned.assign(size + 1, std::byte{0});
    std::memcpy(misaligned.data() + 1, c.data.data() + offset, size);
    return absl::Span<const std::byte>(misaligned).subspan(1, size);
  };
  // One invalid call; checks its code and that nothing changed.
  auto try_invalid = [&](size_t index) {
    const Snapshot before = snapshot();
    ModelContributor& c = contributors[index];
    std::vector<uint32_t> ready{12345};
    absl::Status status;
    absl::StatusCode want;
    const int kind = rng() % 9;
    const Segment& any = c.segments[rng() % c.segments.size()];
    switch (kind) {
      case 0:  // a segment already summed, or one overlapping it
      case 1: {
        if (!c.joined) return;
        const Segment* done = nullptr;
        for (int tries = 0; tries < 20 && done == nullptr; ++tries) {
          const Segment& s = c.segments[rng() % c.segments.size()];
          if (c.covered[s.offset / element]) done = &s;
        }
        if (done == nullptr) return;
        uint64_t offset = done->offset, size = done->size;
        if (kind == 1) {  // one element more in front or behind: still overlaps
          if (offset >= element && rng() % 2) {
            offset -= element;
            size += element;
          } else if (offset + size + element <= bytes) {
            size += element;
          }
        }
        status = pool.Add(transfer, c.id, offset, payload_of(c, offset, size, rng() % 2), &ready);
        want = absl::StatusCode::kAlreadyExists;
        break;
      }
      case 2: {  // outside the aggregate
        const std::vector<std::byte> junk(2 * element, std::byte{1});
        status = pool.Add(transfer, c.id, rng() % 2 ? bytes : bytes - element, junk, &ready);
        want = c.joined ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kNotFound;
        break;
      }
      case 3:  // not on element boundaries
        status = pool.Add(transfer, c.id, any.offset + 1 + rng() % (element - 1),
                          payload_of(c, any.offset, element, false), &ready);
        want = c.joined ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kNotFound;
        break;
      case 4:  // unknown contributor (or one that has not joined yet)
        status = pool.Add(transfer, c.joined ? 999 : c.id, any.offset,
                          payload_of(c, any.offset, any.size, false), &ready);
        want = absl::StatusCode::kNotFound;
        break;
      case 5:  // unknown transfer
        status = pool.Add(transfer + 1, c.id, any.offset, payload_of(c, any.offset, any.size, false),
                          &ready);
        want = absl::StatusCode::kNotFound;
        break;
      case 6:  // too many contributions
        status = pool.AddContributor(transfer, 5, 1.0, expected - joined + 1);
        want = absl::StatusCode::kFailedPrecondition;
        break;
      case 7:  // duplicate contributor id
        if (!c.joined) return;
        status = pool.AddContributor(transfer, c.id, 1.0, 1);
        want = absl::StatusCode::kAlreadyExists;
        break;
      default:  // count 0 or a bad weight
        status = (rng() % 2) ? pool.AddContributor(transfer, 6, 1.0, 0)
                             : pool.AddContributor(transfer, 6,
                                                   integer ? 0.5 : std::nan(""), 1);
        want = absl::StatusCode::kInvalidArgument;
        break;
    }
    ++invalid_calls[kind];
    INFO("invalid kind " << kind << ": " << status);
    CHECK(status.code() == want);
    CHECK(ready == std::vector<uint32_t>{12345});
    CHECK(snapshot() == before);
  };

  for (size_t k = 0; k < arrivals.size(); ++k) {
    const Segment& s = arrivals[k];
    ModelContributor& c = contributors[s.contributor];
    // Join: either just now, or earlier at a random point (others may join
    // in between).
    for (ModelContributor& other : contributors) {
      if (!other.joined && (&other == &c || rng() % 16 == 0)) {
        REQUIRE(pool.AddContributor(transfer, other.id, other.weight, other.count).ok());
        other.joined = true;
        joined += other.count;
      }
    }
    // About 30 invalid calls per run (each compares a snapshot of the sum).
    if (rng() % arrivals.size() < 30) try_invalid(rng() % contributors.size());

    std::vector<uint32_t> ready{999};  // Add appends
    REQUIRE(pool.Add(transfer, c.id, s.offset, payload_of(c, s.offset, s.size, rng() % 4 == 0),
                     &ready)
                .ok());
    // The model.
    ModelSum(dtype, model.data() + s.offset, c.data.data() + s.offset, c.weight, s.size);
    for (uint64_t i = s.offset / element; i < (s.offset + s.size) / element; ++i) {
      c.covered[i] = true;
    }
    std::vector<uint32_t> want{999};
    for (uint64_t p = s.offset / packet_bytes; p <= (s.offset + s.size - 1) / packet_bytes; ++p) {
      const uint64_t begin = p * packet_bytes;
      const uint64_t end = std::min<uint64_t>(begin + packet_bytes, bytes);
      const bool was_partial = credit[p] != 0;
      credit[p] += (std::min(end, s.offset + s.size) - std::max(begin, s.offset)) * c.count;
      const bool full = credit[p] == (end - begin) * expected;
      if (full) want.push_back(static_cast<uint32_t>(p));
      partial += int(!was_partial && !full) - int(was_partial && full);
    }
    REQUIRE(ready == want);
    model_ready.insert(model_ready.end(), want.begin() + 1, want.end());
    REQUIRE(pool.partial_packets() == partial);
  }
  // A final round of invalid calls against the complete aggregate.
  for (int i = 0; i < 10; ++i) try_invalid(rng() % contributors.size());

  CHECK(*pool.Complete(transfer));
  CHECK(pool.partial_packets() == 0);
  std::vector<uint32_t> got = ReadyOf(pool, transfer);
  CHECK(got == model_ready);
  std::sort(got.begin(), got.end());
  std::vector<uint32_t> all(packets);
  for (uint32_t p = 0; p < packets; ++p) all[p] = p;
  CHECK(got == all);  // each packet exactly once
  CHECK(std::memcmp(sum.data(), model.data(), bytes) == 0);
  REQUIRE(pool.UnregisterTransfer(transfer).ok());
  CHECK_FALSE(pool.HasTransfer(transfer));
}

TEST_CASE("Property: random grids, layouts, orders, joins and invalid calls") {
  const uint32_t base = std::random_device{}();
  for (uint32_t i = 0; i < 100; ++i) {
    // Fixed seeds first (reproducible coverage), then fresh ones.
    RunProperty(i < 50 ? i + 1 : base + i);
  }
  for (int kind = 0; kind < 9; ++kind) {
    INFO("invalid kind " << kind);
    CHECK(invalid_calls[kind] >= 20);
  }
}

// ------------------------------------------------------------------------

TEST_CASE("Spec validation names the field") {
  PacketPool pool;
  std::vector<float> sum(16, 0.0f);
  auto reg = [&](AggregationSpec spec, absl::Span<std::byte> buffer) {
    return pool.RegisterTransfer(1, spec, buffer);
  };
  auto bytes = MutableBytes(sum);
  absl::Status s = reg(Spec(DType::kFloat32, 0, 16, 1), bytes);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "bytes 0 must be a positive multiple"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 62, 16, 1), bytes), "bytes 62"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 64, 6, 1), bytes), "packet_bytes 6"));
  CHECK(Contains(reg(Spec(DType::kFloat64, 64, 12, 1), bytes), "packet_bytes 12"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 64, 0, 1), bytes), "packet_bytes 0"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 64, 16, 0), bytes), "expected_contributions"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 60, 16, 1), bytes),
                 "sum buffer is 64 bytes, spec.bytes is 60"));
  CHECK(Contains(reg(Spec(DType::kFloat32, 60, 16, 1), bytes.subspan(1, 60)), "not aligned"));
  CHECK(Contains(reg(Spec(static_cast<DType>(9), 64, 16, 1), bytes), "not a DType"));
  CHECK_FALSE(pool.HasTransfer(1));
  REQUIRE(reg(Spec(DType::kFloat32, 64, 16, 1), bytes).ok());
  CHECK(reg(Spec(DType::kFloat32, 64, 16, 1), bytes).code() == absl::StatusCode::kAlreadyExists);
}

TEST_CASE("Contributor errors name what was wrong") {
  PacketPool pool;
  std::vector<float> sum(16, 0.0f);
  REQUIRE(pool.RegisterTransfer(3, Spec(DType::kFloat32, 64, 16, 3), MutableBytes(sum)).ok());
  absl::Status s = pool.AddContributor(4, 1);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "transfer 4 not registered"));
  REQUIRE(pool.AddContributor(3, 1, 1.0, 2).ok());
  s = pool.AddContributor(3, 2, 1.0, 2);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(s, "brings the contributions to 4, more than the 3 expected"));
  s = pool.AddContributor(3, 1);
  CHECK(s.code() == absl::StatusCode::kAlreadyExists);
  CHECK(Contains(s, "contributor 1 already added"));
  CHECK(Contains(pool.AddContributor(3, 2, 1.0, 0), "count 0"));
  CHECK(Contains(pool.AddContributor(3, 2, INFINITY), "weight inf"));
  CHECK(Contains(pool.AddContributor(3, 2, 1e300), "not a finite float32"));
  CHECK(*pool.JoinedContributions(3) == 2);

  std::vector<float> data(16, 1.0f);
  s = pool.Add(3, 2, 0, Bytes(data), nullptr);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "contributor 2 was not added"));
  s = pool.Add(8, 1, 0, Bytes(data), nullptr);
  CHECK(Contains(s, "unknown transfer 8"));
  s = pool.Add(3, 1, 4, Bytes(data), nullptr);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "range [4, 68) is outside the 64-byte aggregate"));
  s = pool.Add(3, 1, 2, Slice(data, 0, 2), nullptr);
  CHECK(Contains(s, "element boundaries"));
  s = pool.Add(3, 1, 0, Bytes(data).subspan(0, 6), nullptr);
  CHECK(Contains(s, "range [0, 6) does not start and end on float32 element boundaries"));
  REQUIRE(pool.Add(3, 1, 16, Slice(data, 0, 8), nullptr).ok());
  s = pool.Add(3, 1, 40, Slice(data, 0, 4), nullptr);
  CHECK(s.code() == absl::StatusCode::kAlreadyExists);
  CHECK(Contains(s, "range [40, 56) overlaps its earlier [16, 48)"));
  s = pool.Add(3, 1, 0, Slice(data, 0, 5), nullptr);
  CHECK(Contains(s, "range [0, 20) overlaps its earlier [16, 48)"));
  CHECK(pool.Add(3, 1, 0, {}, nullptr).ok());  // empty: a no-op
  REQUIRE(pool.Add(3, 1, 0, Slice(data, 0, 4), nullptr).ok());   // adjacent below
  REQUIRE(pool.Add(3, 1, 48, Slice(data, 0, 4), nullptr).ok());  // adjacent above
  s = pool.Add(3, 1, 60, Slice(data, 0, 1), nullptr);
  CHECK(Contains(s, "overlaps its earlier [0, 64)"));  // merged into one range
  CHECK(pool.partial_packets() == 4);
  CHECK(ReadyOf(pool, 3).empty());
}

TEST_CASE("float16 sums in float, rounded to half per addition, with weight 1 only") {
  PacketPool pool;
  std::vector<uint16_t> sum(8, 0);
  REQUIRE(pool.RegisterTransfer(4, Spec(DType::kFloat16, 16, 8, 2), MutableBytes(sum)).ok());
  CHECK(Contains(pool.AddContributor(4, 1, 0.5), "float16 sums take weight 1 only"));
  REQUIRE(pool.AddContributor(4, 1).ok());
  REQUIRE(pool.AddContributor(4, 2).ok());
  std::vector<uint16_t> a(8, FloatToHalf(1.5f)), b(8, FloatToHalf(2048.0f));
  a[0] = FloatToHalf(1.0f);
  REQUIRE(pool.Add(4, 1, 0, Bytes(a), nullptr).ok());
  REQUIRE(pool.Add(4, 2, 0, Bytes(b), nullptr).ok());
  CHECK(*pool.Complete(4));
  CHECK(HalfToFloat(sum[0]) == 2048.0f);  // 2049 is not a half: ties to the even 2048
  CHECK(HalfToFloat(sum[1]) == 2050.0f);  // 2049.5 rounds to 2050
}

TEST_CASE("8- and 16-bit integer sums wrap as Open MPI's MPI_SUM does") {
  std::vector<int8_t> a = {127, -128, 100, -1}, b = {1, -1, 100, 1};
  SumInto(DType::kInt8, a.data(), b.data(), 1.0, a.size());
  CHECK(a == std::vector<int8_t>{-128, 127, -56, 0});
  std::vector<uint8_t> ua = {255, 0, 200}, ub = {1, 0, 100};
  SumInto(DType::kUint8, ua.data(), ub.data(), 1.0, ua.size());
  CHECK(ua == std::vector<uint8_t>{0, 0, 44});
  std::vector<int16_t> c = {32767, -32768}, d = {1, -1};
  SumInto(DType::kInt16, c.data(), d.data(), 1.0, c.size());
  CHECK(c == std::vector<int16_t>{-32768, 32767});
  std::vector<uint16_t> uc = {65535, 40000}, ud = {2, 40000};
  SumInto(DType::kUint16, uc.data(), ud.data(), 1.0, uc.size());
  CHECK(uc == std::vector<uint16_t>{1, 14464});
  CHECK(DTypeBytes(DType::kInt8) == 1);
  CHECK(DTypeBytes(DType::kUint16) == 2);
  CHECK(std::string(DTypeName(DType::kUint8)) == "uint8");
  CHECK(IsIntegerDType(DType::kInt16));
  CHECK(!IsIntegerDType(DType::kFloat16));
}

TEST_CASE("Min, max and product per element; integer products wrap") {
  std::vector<int16_t> a = {3, -7, 300, 5}, b = {-2, 4, 300, 5};
  std::vector<int16_t> lo = a, hi = a, prod = a;
  ReduceInto(ReduceOp::kMin, DType::kInt16, lo.data(), b.data(), a.size());
  ReduceInto(ReduceOp::kMax, DType::kInt16, hi.data(), b.data(), a.size());
  ReduceInto(ReduceOp::kProduct, DType::kInt16, prod.data(), b.data(), a.size());
  CHECK(lo == std::vector<int16_t>{-2, -7, 300, 5});
  CHECK(hi == std::vector<int16_t>{3, 4, 300, 5});
  // 300 * 300 = 90000 = 24464 modulo 2^16.
  CHECK(prod == std::vector<int16_t>{-6, -28, 24464, 25});
  std::vector<uint16_t> u = {65535}, v = {65535};
  ReduceInto(ReduceOp::kProduct, DType::kUint16, u.data(), v.data(), 1);
  CHECK(u[0] == 1);  // (2^16 - 1)^2 = 1 modulo 2^16, with no signed overflow on the way
  std::vector<uint8_t> x = {200, 3}, y = {100, 250};
  ReduceInto(ReduceOp::kMin, DType::kUint8, x.data(), y.data(), 2);
  CHECK(x == std::vector<uint8_t>{100, 3});
  std::vector<double> f = {1.5, -2.0}, g = {-3.0, 0.25};
  ReduceInto(ReduceOp::kProduct, DType::kFloat64, f.data(), g.data(), 2);
  CHECK(f == std::vector<double>{-4.5, -0.5});
  std::vector<uint16_t> h = {FloatToHalf(2.0f), FloatToHalf(-1.0f)};
  const std::vector<uint16_t> k = {FloatToHalf(3.0f), FloatToHalf(-4.0f)};
  ReduceInto(ReduceOp::kMax, DType::kFloat16, h.data(), k.data(), 2);
  CHECK(HalfToFloat(h[0]) == 3.0f);
  CHECK(HalfToFloat(h[1]) == -1.0f);
  ReduceInto(ReduceOp::kProduct, DType::kFloat16, h.data(), k.data(), 2);
  CHECK(HalfToFloat(h[0]) == 9.0f);
  CHECK(HalfToFloat(h[1]) == 4.0f);
  std::vector<int32_t> s = {5}, t = {6};
  ReduceInto(ReduceOp::kSum, DType::kInt32, s.data(), t.data(), 1);
  CHECK(s[0] == 11);
  CHECK(std::string(ReduceOpName(ReduceOp::kProduct)) == "product");
}

TEST_CASE("Unregistering forgets the transfer and its partial packets") {
  PacketPool pool;
  std::vector<double> a(10, 0.0), b(10, 0.0);
  REQUIRE(pool.RegisterTransfer(1, Spec(DType::kFloat64, 80, 16, 2), MutableBytes(a)).ok());
  REQUIRE(pool.RegisterTransfer(2, Spec(DType::kFloat64, 80, 16, 1), MutableBytes(b)).ok());
  REQUIRE(pool.AddContributor(1, 5).ok());
  REQUIRE(pool.AddContributor(2, 5).ok());
  std::vector<double> x(10, 2.0);
  std::vector<uint32_t> ready;
  REQUIRE(pool.Add(1, 5, 0, Slice(x, 0, 5), &ready).ok());
  REQUIRE(pool.Add(2, 5, 8, Slice(x, 0, 4), &ready).ok());
  CHECK(ready == std::vector<uint32_t>{1});  // transfer 2's packet [16, 32)
  CHECK(pool.partial_packets() == 3 + 2);
  REQUIRE(pool.UnregisterTransfer(1).ok());
  CHECK(pool.partial_packets() == 2);
  CHECK(pool.UnregisterTransfer(1).code() == absl::StatusCode::kNotFound);
  CHECK(pool.Add(1, 5, 40, Slice(x, 0, 1), nullptr).code() == absl::StatusCode::kNotFound);
  CHECK(pool.ReadyPackets(1).status().code() == absl::StatusCode::kNotFound);
  CHECK(pool.Complete(1).status().code() == absl::StatusCode::kNotFound);
  // The same ids can be registered again, fresh.
  std::fill(a.begin(), a.end(), 0.0);
  REQUIRE(pool.RegisterTransfer(1, Spec(DType::kFloat64, 80, 16, 1), MutableBytes(a)).ok());
  REQUIRE(pool.AddContributor(1, 5, 0.5).ok());
  REQUIRE(pool.Add(1, 5, 0, Bytes(x), nullptr).ok());
  CHECK(*pool.Complete(1));
  CHECK(a == std::vector<double>(10, 1.0));
  CHECK(ReadyOf(pool, 1) == std::vector<uint32_t>{0, 1, 2, 3, 4});
}

TEST_CASE("Lowering the expected count releases the packets the joined contributors covered") {
  // A round of 3 members on a 16-float grid; the third leaves before it
  // pushes, so the sum closes with the two that joined.
  PacketPool pool;
  std::vector<int32_t> sum(40, 0);  // packets of 16, 16, 8 elements
  REQUIRE(pool.RegisterTransfer(9, Spec(DType::kInt32, 160, 64, 3), MutableBytes(sum)).ok());
  REQUIRE(pool.AddContributor(9, 100).ok());
  std::vector<int32_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) {
    a[i] = i;
    b[i] = 1000 * i;
  }
  std::vector<uint32_t> ready;
  REQUIRE(pool.Add(9, 100, 0, Bytes(a), &ready).ok());
  // Below the contributions joined: refused, nothing changes.
  REQUIRE(pool.AddContributor(9, 200).ok());
  CHECK(pool.LowerExpected(9, 1, &ready).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool.LowerExpected(9, 0, &ready).code() == absl::StatusCode::kInvalidArgument);
  CHECK(pool.LowerExpected(9, 4, &ready).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(pool.LowerExpected(8, 2, &ready).code() == absl::StatusCode::kNotFound);
  REQUIRE(pool.Add(9, 200, 16 * 4, Slice(b, 16, 40), &ready).ok());
  CHECK(ready.empty());
  CHECK(pool.partial_packets() == 3);

  REQUIRE(pool.LowerExpected(9, 2, &ready).ok());
  CHECK(ready == std::vector<uint32_t>{1, 2});  // packet 0 still lacks b[0, 16)
  CHECK(pool.partial_packets() == 1);
  CHECK_FALSE(*pool.Complete(9));
  // A third contributor no longer fits.
  CHECK(pool.AddContributor(9, 300).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(pool.Add(9, 200, 0, Slice(b, 0, 16), &ready).ok());
  CHECK(ready == std::vector<uint32_t>{1, 2, 0});
  CHECK(ReadyOf(pool, 9) == ready);
  CHECK(*pool.Complete(9));
  CHECK(pool.partial_packets() == 0);
  for (int i = 0; i < 40; ++i) {
    INFO("element " << i);
    CHECK(sum[i] == a[i] + b[i]);
  }
  // Lowering to the count it has is a no-op.
  ready.clear();
  REQUIRE(pool.LowerExpected(9, 2, &ready).ok());
  CHECK(ready.empty());
}

}  // namespace
}  // namespace mlfabric::aggregator
