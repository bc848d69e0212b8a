// CRC-32C (Castagnoli), the checksum in every Mercury packet header
// (docs/architecture.md §5). Picks the fastest path the CPU has, once, at first use:
// AVX-512 VPCLMULQDQ folding (~110 GB/s on a cache-hot 32 KiB packet on
// Sapphire Rapids), three interleaved SSE4.2 crc32 chains (~28 GB/s), or
// slicing-by-8 tables elsewhere. All paths give identical results
// (common/crc32c_internal.h exposes them; crc32c_benchmark measures them).
//
//   uint32_t crc = Crc32c(data, size);
//   uint32_t more = Crc32cExtend(crc, next, next_size);  // streaming
//
// Thread safety: pure functions.
#ifndef MLFABRIC_COMMON_CRC32C_H_
#define MLFABRIC_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace mlfabric {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_CRC32C_H_
