#include "daemon/transport/data_session.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/transport/framing.h"

namespace mlfabric::transport {

void DataSession::Run(DataSessionHandler& handler, const std::atomic<bool>& stopping) {
  if (keys_ != nullptr) {
    absl::StatusOr<SessionAuth> auth = AcceptorHandshake(fd_, *keys_, peer_);
    if (!auth.ok()) {
      handler.Ended(peer_, begun_, std::string(auth.status().message()));
      return;
    }
    auth_ = std::move(*auth);
    handler.Authenticated(peer_, auth_);
  }
  FrameReader reader(fd_);
  std::string close_reason;
  while (!stopping.load()) {
    auto header = reader.ReadHeader();
    if (!header.ok()) {
      // A clean close before a header is Unavailable; anything else is malformed.
      if (header.status().code() != absl::StatusCode::kUnavailable) {
        close_reason = std::string(header.status().message());
      }
      break;
    }
    close_reason = [&]() -> std::string {
      const PacketHeader& h = *header;
      if (h.kind != PacketKind::kJobProof && !auth_.Allows(h.job)) {
        return absl::StrCat("a packet of job ", h.job, " from '", auth_.initiator,
                            "' before it proved it is in the job");
      }
      if (h.kind == PacketKind::kBegin) {
        if (h.length != 0 || h.offset == 0 || h.offset > max_transfer_bytes_) {
          return absl::StrCat("begin of transfer ", h.transfer, " has bad size ", h.offset);
        }
        if (begun_.count(h.transfer)) return absl::StrCat("transfer ", h.transfer, " begun twice");
        if (absl::Status begun = handler.Begin(h); !begun.ok()) return std::string(begun.message());
        begun_.insert(h.transfer);
        return "";
      }
      if (h.kind == PacketKind::kData) {
        if (!begun_.count(h.transfer)) return absl::StrCat("data for unknown transfer ", h.transfer);
        std::shared_ptr<SharedBuffer> buffer = handler.BufferFor(h);
        if (buffer == nullptr) {
          // Begun on this session and cancelled since (the scheduler's
          // cancel can overtake packets in flight): skip the payload.
          std::vector<uint8_t> skipped(h.length);
          absl::Status read = reader.ReadPayload(skipped.data(), skipped.size());
          return read.ok() ? "" : std::string(read.message());
        }
        const uint64_t total = buffer->size();
        if (h.offset > total || h.length > total - h.offset) {
          return absl::StrCat("packet [", h.offset, ", +", h.length, ") is outside transfer ",
                              h.transfer, " of ", total, " bytes");
        }
        // Zero-copy receive: the payload lands in the transfer's buffer.
        uint8_t* dst = buffer->data() + h.offset;
        if (absl::Status read = reader.ReadPayload(dst, h.length); !read.ok()) {
          return std::string(read.message());
        }
        if (absl::Status crc = VerifyPayload(h, dst); !crc.ok()) return std::string(crc.message());
        bool complete = false;
        if (absl::Status taken = handler.Arrived(h, std::move(buffer), &complete); !taken.ok()) {
          return std::string(taken.message());
        }
        if (complete) begun_.erase(h.transfer);
        return "";
      }
      // Control packets carry small payloads.
      std::string payload(h.length, '\0');
      if (absl::Status read = reader.ReadPayload(payload.data(), payload.size()); !read.ok()) {
        return std::string(read.message());
      }
      if (absl::Status crc = VerifyPayload(h, payload.data()); !crc.ok()) {
        return std::string(crc.message());
      }
      if (h.kind == PacketKind::kGetRequest) {
        v1::DataGetRequest body;
        if (!body.ParseFromString(payload) || body.server().empty()) {
          return "get request: malformed body (no server named)";
        }
        // offset = round + 1 asks for a synchronous round's sum.
        if (body.relay_batch() == 0 && h.offset > 0 &&
            h.offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return absl::StrCat("get request names round ", h.offset - 1, ", out of range");
        }
        absl::Status served = handler.GetRequest(fd_, h, body);
        return served.ok() ? "" : std::string(served.message());
      }
      if (h.kind == PacketKind::kJobProof) {
        if (!auth_.enabled) return "a job proof on a session that is not authenticated";
        absl::Status proven = AcceptJobProof(auth_, *keys_, h.job, payload);
        return proven.ok() ? "" : std::string(proven.message());
      }
      if (h.kind == PacketKind::kAbort) {
        if (begun_.erase(h.transfer)) handler.Aborted(h, payload);
        return "";
      }
      return absl::StrCat("unexpected packet kind ", static_cast<int>(h.kind));
    }();
    if (!close_reason.empty()) break;
  }
  DetachCipher(fd_);  // the owner closes the socket next
  handler.Ended(peer_, begun_, close_reason);
}

}  // namespace mlfabric::transport
