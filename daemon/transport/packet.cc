#include "daemon/transport/packet.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace mlfabric::transport {
namespace {

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<uint8_t>(value >> (8 * i));
}

template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[at + i]) << (8 * i);
  return value;
}

}  // namespace

void EncodeHeader(const PacketHeader& h, uint8_t* out) {
  Put<uint32_t>(out, 0, kPacketMagic);
  out[4] = h.version;
  out[5] = static_cast<uint8_t>(h.kind);
  Put<uint16_t>(out, 6, h.flags);
  Put<uint16_t>(out, 8, h.priority);
  Put<uint16_t>(out, 10, 0);
  Put<uint32_t>(out, 12, h.job);
  Put<uint64_t>(out, 16, h.transfer);
  Put<uint32_t>(out, 24, h.tensor);
  Put<uint32_t>(out, 28, h.length);
  Put<uint64_t>(out, 32, h.offset);
  Put<uint32_t>(out, 40, h.crc32c);
}

void EncodePacketHeader(PacketHeader header, const void* payload, uint32_t length,
                        uint8_t* out) {
  header.length = length;
  header.crc32c = Crc32c(payload, length);
  EncodeHeader(header, out);
}

absl::StatusOr<PacketHeader> ParseHeader(const uint8_t* data, size_t size,
                                         uint32_t max_payload_bytes) {
  if (size < kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated header: ", size, " of ", kHeaderBytes, " bytes"));
  }
  const uint32_t magic = Get<uint32_t>(data, 0);
  if (magic != kPacketMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bad magic 0x", absl::Hex(magic)));
  }
  PacketHeader h;
  h.version = data[4];
  if (h.version != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported protocol version ",
                                                   static_cast<int>(h.version), " (want ",
                                                   static_cast<int>(kProtocolVersion), ")"));
  }
  if (data[5] > kMaxPacketKind) {
    return absl::InvalidArgumentError(absl::StrCat("unknown packet kind ", static_cast<int>(data[5])));
  }
  h.kind = static_cast<PacketKind>(data[5]);
  h.flags = Get<uint16_t>(data, 6);
  h.priority = Get<uint16_t>(data, 8);
  if (Get<uint16_t>(data, 10) != 0) {
    return absl::InvalidArgumentError("reserved header bits are set");
  }
  h.job = Get<uint32_t>(data, 12);
  h.transfer = Get<uint64_t>(data, 16);
  h.tensor = Get<uint32_t>(data, 24);
  h.length = Get<uint32_t>(data, 28);
  h.offset = Get<uint64_t>(data, 32);
  h.crc32c = Get<uint32_t>(data, 40);
  const uint32_t limit = h.kind == PacketKind::kData ? max_payload_bytes : kMaxControlBytes;
  if (h.length > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload length ", h.length, " exceeds the limit of ", limit, " bytes"));
  }
  if (h.offset > (uint64_t{1} << 48)) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", h.offset, " is out of range"));
  }
  return h;
}

absl::Status VerifyPayload(const PacketHeader& header, const void* payload) {
  if (header.flags & kFlagSealed) return absl::OkStatus();
  const uint32_t crc = Crc32c(payload, header.length);
  if (crc != header.crc32c) {
    return absl::DataLossError(absl::StrCat("payload CRC32C mismatch on transfer ", header.transfer,
                                            " offset ", header.offset));
  }
  return absl::OkStatus();
}

}  // namespace mlfabric::transport
