// CRC-32C (Castagnoli), the checksum in every Mercury packet header
// (DESIGN.md §5). Uses the SSE4.2 crc32 instruction when the CPU has it and
// a table otherwise; both give identical results.
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
