#include "common/crc32c.h"

#include <array>
#include <cstring>

#include "common/crc32c_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Conventions. CRC-32C is a bit-reflected CRC: the first message bit is the
// least significant bit of the first byte and is the highest-degree
// coefficient. A 32-bit value `r` represents the polynomial whose x^(31-i)
// coefficient is bit i, so x^0 is 0x80000000 and multiplying by x is a right
// shift. The "raw state" is the register the crc32 instruction works on: the
// finished CRC is ~raw, and raw(prefix || m) = (m with raw(prefix) xored into
// its first 4 bytes) * x^32 mod P. Everything below is linear in the raw
// state, which is what lets independent pieces be combined.

namespace mlfabric {
namespace crc32c_internal {
namespace {

// P(x) = x^32 + ... (Castagnoli), without the x^32 term, bit-reflected.
constexpr uint32_t kPolynomial = 0x82F63B78u;

const std::array<uint32_t, 256>& ByteTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
      t[i] = crc;
    }
    return t;
  }();
  return table;
}

uint32_t SoftwareRaw(uint32_t raw, const uint8_t* p, size_t size) {
  const std::array<uint32_t, 256>& table = ByteTable();
  for (size_t i = 0; i < size; ++i) raw = table[(raw ^ p[i]) & 0xFF] ^ (raw >> 8);
  return raw;
}

// Slicing-by-8 (Kounavis and Berry, 2005): table k maps a byte followed by
// k zero bytes, so eight table lookups consume eight bytes at once.
struct SlicingTables {
  uint32_t table[8][256];
};

const SlicingTables& GetSlicingTables() {
  static const SlicingTables* const tables = [] {
    auto* t = new SlicingTables();
    const std::array<uint32_t, 256>& byte = ByteTable();
    for (int b = 0; b < 256; ++b) t->table[0][b] = byte[b];
    for (int k = 1; k < 8; ++k) {
      for (int b = 0; b < 256; ++b) {
        const uint32_t prev = t->table[k - 1][b];
        t->table[k][b] = (prev >> 8) ^ byte[prev & 0xFF];
      }
    }
    return t;
  }();
  return *tables;
}

uint32_t SlicingRaw(uint32_t raw, const uint8_t* p, size_t size) {
  const SlicingTables& s = GetSlicingTables();
  while (size >= 8) {
    // Byte by byte, so the result does not depend on the CPU's byte order.
    const uint32_t lo = raw ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                               uint32_t{p[3]} << 24);
    raw = s.table[7][lo & 0xFF] ^ s.table[6][(lo >> 8) & 0xFF] ^ s.table[5][(lo >> 16) & 0xFF] ^
          s.table[4][lo >> 24] ^ s.table[3][p[4]] ^ s.table[2][p[5]] ^ s.table[1][p[6]] ^
          s.table[0][p[7]];
    p += 8;
    size -= 8;
  }
  return SoftwareRaw(raw, p, size);
}

// A linear map on raw states, as the images of the 32 basis vectors.
struct Gf2Matrix {
  std::array<uint32_t, 32> column{};
};

uint32_t Apply(const Gf2Matrix& m, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) out ^= m.column[i];
  }
  return out;
}

Gf2Matrix Compose(const Gf2Matrix& outer, const Gf2Matrix& inner) {
  Gf2Matrix m;
  for (int i = 0; i < 32; ++i) m.column[i] = Apply(outer, inner.column[i]);
  return m;
}

// The operator "feed `zero_bytes` zero bytes": raw -> raw(raw || 0^n), i.e.
// multiplication by x^(8n) mod P. Built from the one-byte step by squaring.
Gf2Matrix ZeroBytesOperator(uint64_t zero_bytes) {
  Gf2Matrix power;  // x^(8 * 2^k) as k goes up
  for (int i = 0; i < 32; ++i) {
    const uint8_t zero = 0;
    power.column[i] = SoftwareRaw(uint32_t{1} << i, &zero, 1);
  }
  Gf2Matrix result;
  for (int i = 0; i < 32; ++i) result.column[i] = uint32_t{1} << i;  // identity
  while (zero_bytes != 0) {
    if (zero_bytes & 1) result = Compose(power, result);
    zero_bytes >>= 1;
    if (zero_bytes != 0) power = Compose(power, power);
  }
  return result;
}

#if defined(__x86_64__)

// The same operator as four byte-indexed tables (by linearity, the image of
// a state is the xor of the images of its four bytes): 4 loads per shift.
struct ShiftTable {
  uint32_t byte[4][256];
};

ShiftTable MakeShiftTable(uint64_t zero_bytes) {
  const Gf2Matrix m = ZeroBytesOperator(zero_bytes);
  ShiftTable t;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t.byte[k][b] = Apply(m, b << (8 * k));
  }
  return t;
}

inline uint32_t Shift(const ShiftTable& t, uint32_t raw) {
  return t.byte[0][raw & 0xFF] ^ t.byte[1][(raw >> 8) & 0xFF] ^ t.byte[2][(raw >> 16) & 0xFF] ^
         t.byte[3][raw >> 24];
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Block lengths (bytes per chain) of the 3-way path, longest first. A 32 KiB
// packet is one 3 x 8 KiB round, two 3 x 1 KiB rounds, five 3 x 128 B rounds
// and 128 bytes on a single chain. Multiples of 8 (whole crc32q steps).
constexpr size_t kLongBlock = 8192;
constexpr size_t kMidBlock = 1024;
constexpr size_t kShortBlock = 128;

struct ThreeWayTables {
  ShiftTable long_shift = MakeShiftTable(kLongBlock);
  ShiftTable mid_shift = MakeShiftTable(kMidBlock);
  ShiftTable short_shift = MakeShiftTable(kShortBlock);
};

const ThreeWayTables& GetThreeWayTables() {
  static const ThreeWayTables* const tables = new ThreeWayTables();
  return *tables;
}

__attribute__((target("sse4.2"))) uint32_t SerialRaw(uint32_t raw, const uint8_t* p,
                                                     size_t size) {
  uint64_t c = raw;
  while (size >= 8) {
    c = __builtin_ia32_crc32di(c, Load64(p));
    p += 8;
    size -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (size > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p++);
    --size;
  }
  return c32;
}

// Consumes as many 3 x `block` rounds as fit. In each round the three
// chains run independently (the crc32 instruction has latency 3 and
// throughput 1, so three chains fill the pipeline); then
//   raw(A || B || C) = shift_L(shift_L(raw(A)) ^ raw0(B)) ^ raw0(C)
// where raw0 starts from state 0 and shift_L appends L zero bytes.
__attribute__((target("sse4.2"))) uint32_t ThreeWayRounds(uint32_t raw, const uint8_t** data,
                                                          size_t* size, size_t block,
                                                          const ShiftTable& shift) {
  const uint8_t* p = *data;
  size_t left = *size;
  while (left >= 3 * block) {
    uint64_t c0 = raw;
    uint64_t c1 = 0;
    uint64_t c2 = 0;
    const uint8_t* end = p + block;
    while (p < end) {
      c0 = __builtin_ia32_crc32di(c0, Load64(p));
      c1 = __builtin_ia32_crc32di(c1, Load64(p + block));
      c2 = __builtin_ia32_crc32di(c2, Load64(p + 2 * block));
      p += 8;
    }
    raw = Shift(shift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    raw = Shift(shift, raw) ^ static_cast<uint32_t>(c2);
    p += 2 * block;
    left -= 3 * block;
  }
  *data = p;
  *size = left;
  return raw;
}

__attribute__((target("sse4.2"))) uint32_t ThreeWayRaw(uint32_t raw, const uint8_t* p,
                                                       size_t size) {
  if (size >= 3 * kShortBlock) {
    const ThreeWayTables& t = GetThreeWayTables();
    raw = ThreeWayRounds(raw, &p, &size, kLongBlock, t.long_shift);
    raw = ThreeWayRounds(raw, &p, &size, kMidBlock, t.mid_shift);
    raw = ThreeWayRounds(raw, &p, &size, kShortBlock, t.short_shift);
  }
  return SerialRaw(raw, p, size);
}

// x^n mod P as a reflected 32-bit value.
uint32_t XPowMod(uint32_t n) {
  uint32_t r = 0x80000000u;  // x^0
  for (uint32_t i = 0; i < n; ++i) r = (r >> 1) ^ ((r & 1) ? kPolynomial : 0);
  return r;
}

// Folding (Intel PCLMULQDQ CRC paper, §3-4). A 128-bit lane loaded
// little-endian is the polynomial A = L*x^64 + H, L its low (earlier,
// higher-degree) qword and H its high qword, each with bit i <-> x^(63-i).
// Moving A forward by D bits:
//   A * x^D = L * x^(D+64) + H * x^D  (mod P),
// each product of degree < 96, so it xors into the lane D bits later.
// clmul of a 64-bit reflected operand with a constant whose bit j <-> x^(64-j)
// yields a 128-bit value with bit k <-> x^(127-k), i.e. exactly a lane. A
// constant congruent to x^e with that layout is x^33 * (x^(e-33) mod P): the
// reflected x^(e-33) mod P in the low 32 bits.
uint64_t FoldConstant(uint32_t exponent) { return XPowMod(exponent - 33); }

// Per-lane constants for moving a lane forward by `bits`: low qword for L,
// high qword for H (selected by the clmul immediates 0x00 and 0x11).
struct FoldPair {
  uint64_t for_low;
  uint64_t for_high;
};

FoldPair MakeFoldPair(uint32_t bits) { return {FoldConstant(bits + 64), FoldConstant(bits)}; }

struct FoldConstants {
  FoldPair by128 = MakeFoldPair(128);
  FoldPair by256 = MakeFoldPair(256);
  FoldPair by384 = MakeFoldPair(384);
  FoldPair by512 = MakeFoldPair(512);    // one zmm
  FoldPair by1024 = MakeFoldPair(1024);  // two zmm
  FoldPair by1536 = MakeFoldPair(1536);  // three zmm
  FoldPair by2048 = MakeFoldPair(2048);  // the 4-zmm (256-byte) stride
};

const FoldConstants& GetFoldConstants() {
  static const FoldConstants* const constants = new FoldConstants();
  return *constants;
}

// Below this the fold set-up and reduction cost more than they save.
constexpr size_t kVpclmulMinBytes = 256;

#define MLFABRIC_VPCLMUL_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.2")))

MLFABRIC_VPCLMUL_TARGET inline __m512i Broadcast(const FoldPair& k) {
  const auto high = static_cast<long long>(k.for_high);
  const auto low = static_cast<long long>(k.for_low);
  return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}

// acc * x^D + data, lane by lane.
MLFABRIC_VPCLMUL_TARGET inline __m512i Fold512(__m512i acc, __m512i k, __m512i data) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                   _mm512_clmulepi64_epi128(acc, k, 0x11), data, 0x96);
}

MLFABRIC_VPCLMUL_TARGET inline __m128i Fold128(__m128i acc, const FoldPair& k, __m128i data) {
  const __m128i kv =
      _mm_set_epi64x(static_cast<long long>(k.for_high), static_cast<long long>(k.for_low));
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, kv, 0x00),
                                     _mm_clmulepi64_si128(acc, kv, 0x11)),
                       data);
}

MLFABRIC_VPCLMUL_TARGET uint32_t VpclmulRaw(uint32_t raw, const uint8_t* p, size_t size) {
  if (size < kVpclmulMinBytes) return ThreeWayRaw(raw, p, size);
  const FoldConstants& k = GetFoldConstants();
  // Four accumulators, each folding 2048 bits forward per step, keep four
  // independent clmul chains in flight.
  __m512i x0 = _mm512_loadu_si512(p);
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  x0 = _mm512_xor_si512(x0, _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, raw));
  p += 256;
  size -= 256;
  const __m512i k2048 = Broadcast(k.by2048);
  while (size >= 256) {
    x0 = Fold512(x0, k2048, _mm512_loadu_si512(p));
    x1 = Fold512(x1, k2048, _mm512_loadu_si512(p + 64));
    x2 = Fold512(x2, k2048, _mm512_loadu_si512(p + 128));
    x3 = Fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    size -= 256;
  }
  x3 = Fold512(x2, Broadcast(k.by512), x3);
  x3 = Fold512(x1, Broadcast(k.by1024), x3);
  x3 = Fold512(x0, Broadcast(k.by1536), x3);
  const __m512i k512 = Broadcast(k.by512);
  while (size >= 64) {
    x3 = Fold512(x3, k512, _mm512_loadu_si512(p));
    p += 64;
    size -= 64;
  }
  // Four lanes -> one: lane i moves forward by (3 - i) * 128 bits.
  // (Through memory: GCC 12's extract/broadcast intrinsics trip
  // -Wmaybe-uninitialized on their undefined pass-through operand.)
  alignas(64) uint8_t lanes[64];
  _mm512_store_si512(lanes, x3);
  __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 48));
  a = Fold128(_mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 32)), k.by128, a);
  a = Fold128(_mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 16)), k.by256, a);
  a = Fold128(_mm_load_si128(reinterpret_cast<const __m128i*>(lanes)), k.by384, a);
  // a is congruent to the processed bytes (with the initial state folded
  // in) mod P, so feeding its 16 bytes to crc32 from state 0 yields
  // a * x^32 mod P: the raw state after those bytes.
  uint64_t c = __builtin_ia32_crc32di(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
  c = __builtin_ia32_crc32di(c, static_cast<uint64_t>(_mm_extract_epi64(a, 1)));
  return ThreeWayRaw(static_cast<uint32_t>(c), p, size);
}

#undef MLFABRIC_VPCLMUL_TARGET

#endif  // defined(__x86_64__)

using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);

ExtendFn SelectExtend() {
  if (HasVpclmul()) return &ExtendVpclmul;
  if (HasSse42()) return &ExtendSse42ThreeWay;
  return &ExtendSlicingBy8;
}

}  // namespace

uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t size) {
  return ~SoftwareRaw(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendSlicingBy8(uint32_t crc, const void* data, size_t size) {
  return ~SlicingRaw(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendZeros(uint32_t crc, uint64_t zero_bytes) {
  return ~Apply(ZeroBytesOperator(zero_bytes), ~crc);
}

#if defined(__x86_64__)

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

bool HasVpclmul() {
  // libgcc's cpu model only reports AVX-512 features when XCR0 shows the OS
  // saves the zmm state.
  static const bool has = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
                          __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq");
  return has;
}

uint32_t ExtendSse42Serial(uint32_t crc, const void* data, size_t size) {
  return ~SerialRaw(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendSse42ThreeWay(uint32_t crc, const void* data, size_t size) {
  return ~ThreeWayRaw(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t ExtendVpclmul(uint32_t crc, const void* data, size_t size) {
  return ~VpclmulRaw(~crc, static_cast<const uint8_t*>(data), size);
}

#else  // !defined(__x86_64__): no hardware paths; slicing-by-8 stands in.

bool HasSse42() { return false; }
bool HasVpclmul() { return false; }

uint32_t ExtendSse42Serial(uint32_t crc, const void* data, size_t size) {
  return ExtendSlicingBy8(crc, data, size);
}
uint32_t ExtendSse42ThreeWay(uint32_t crc, const void* data, size_t size) {
  return ExtendSlicingBy8(crc, data, size);
}
uint32_t ExtendVpclmul(uint32_t crc, const void* data, size_t size) {
  return ExtendSlicingBy8(crc, data, size);
}

#endif  // defined(__x86_64__)

const char* SelectedPathName() {
  if (HasVpclmul()) return "vpclmul";
  if (HasSse42()) return "sse42-3way";
  return "slicing-by-8";
}

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  static const crc32c_internal::ExtendFn extend = crc32c_internal::SelectExtend();
  return extend(crc, data, size);
}

}  // namespace mlfabric
