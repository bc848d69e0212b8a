// Element types of the tensors the daemon sums (rounds, aggregates): their
// width and the packet pool's name for them (aggregator/packet_pool.h).
#ifndef MLFABRIC_DAEMON_ENGINE_ELEMENT_TYPES_H_
#define MLFABRIC_DAEMON_ENGINE_ELEMENT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "aggregator/packet_pool.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// Bytes per element; 0 for an unknown type.
inline size_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return sizeof(float);
    case v1::DTYPE_FLOAT64: return sizeof(double);
    case v1::DTYPE_INT32: return sizeof(int32_t);
    case v1::DTYPE_INT64: return sizeof(int64_t);
    case v1::DTYPE_FLOAT16: return sizeof(uint16_t);
    case v1::DTYPE_INT8: return sizeof(int8_t);
    case v1::DTYPE_UINT8: return sizeof(uint8_t);
    case v1::DTYPE_INT16: return sizeof(int16_t);
    case v1::DTYPE_UINT16: return sizeof(uint16_t);
    default: return 0;
  }
}

// The pool's element type for a round's or an aggregate's dtype.
inline std::optional<aggregator::DType> PoolType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return aggregator::DType::kFloat32;
    case v1::DTYPE_FLOAT64: return aggregator::DType::kFloat64;
    case v1::DTYPE_INT32: return aggregator::DType::kInt32;
    case v1::DTYPE_INT64: return aggregator::DType::kInt64;
    case v1::DTYPE_FLOAT16: return aggregator::DType::kFloat16;
    case v1::DTYPE_INT8: return aggregator::DType::kInt8;
    case v1::DTYPE_UINT8: return aggregator::DType::kUint8;
    case v1::DTYPE_INT16: return aggregator::DType::kInt16;
    case v1::DTYPE_UINT16: return aggregator::DType::kUint16;
    default: return std::nullopt;
  }
}

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_ELEMENT_TYPES_H_
