// Internal: the individual CRC-32C implementations behind Crc32cExtend(),
// exposed so tests can check each against the reference and the benchmark
// can time each. Production code calls mlfabric::Crc32cExtend() only; it
// picks the fastest path the CPU supports once, at first use.
//
// Every Extend* function has Crc32cExtend()'s contract: `crc` is a finished
// CRC-32C (0 for an empty prefix), the result is the CRC-32C of prefix+data.
// Calling a hardware path on a CPU without its feature is undefined
// behaviour: check the matching Has*() first.
//
// Thread safety: pure functions; the constant tables are built on first use
// (function-local statics).
#ifndef MLFABRIC_COMMON_CRC32C_INTERNAL_H_
#define MLFABRIC_COMMON_CRC32C_INTERNAL_H_

#include <cstddef>
#include <cstdint>

namespace mlfabric {
namespace crc32c_internal {

// Byte-at-a-time table (Sarwate). The reference every other path must match.
uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t size);

// Eight bytes per step through eight tables: the fallback on non-x86 CPUs
// and x86 CPUs without SSE4.2. Portable (byte-order independent).
uint32_t ExtendSlicingBy8(uint32_t crc, const void* data, size_t size);

// True when the CPU has the SSE4.2 crc32 instruction (always false off x86).
bool HasSse42();
// True when the CPU (and OS) support AVX-512F/BW/VL with VPCLMULQDQ and the
// 3-way path needed for the remainder (always false off x86).
bool HasVpclmul();

// One dependency chain of the crc32 instruction (~8 bytes per 3 cycles).
uint32_t ExtendSse42Serial(uint32_t crc, const void* data, size_t size);

// Three independent crc32 chains over three equal blocks, combined with a
// "shift by L zero bytes" operator (Intel, "Fast CRC Computation for iSCSI
// Polynomial Using CRC32 Instruction", 2011). Requires HasSse42().
uint32_t ExtendSse42ThreeWay(uint32_t crc, const void* data, size_t size);

// AVX-512 carry-less multiply folding of 256-byte strides (Intel, "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ", 2009, widened to
// 512-bit lanes); the remainder goes through the 3-way path.
// Requires HasVpclmul().
uint32_t ExtendVpclmul(uint32_t crc, const void* data, size_t size);

// The CRC-32C of `crc`'s message followed by `zero_bytes` zero bytes,
// computed with the zero-extension operator (O(log zero_bytes) matrix
// products), not byte by byte. Exposed to test the combine operator.
uint32_t ExtendZeros(uint32_t crc, uint64_t zero_bytes);

// Name of the path Crc32cExtend() dispatches to on this CPU:
// "vpclmul", "sse42-3way" or "slicing-by-8".
const char* SelectedPathName();

}  // namespace crc32c_internal
}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_CRC32C_INTERNAL_H_
