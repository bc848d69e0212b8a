#include "daemon/transport/data_session.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace mlfabric::transport {

DataSession::DataSession(int fd, std::string peer, uint64_t max_transfer_bytes,
                         const DataKeys* keys)
    : fd_(fd), peer_(std::move(peer)), max_transfer_bytes_(max_transfer_bytes), keys_(keys) {}

void DataSession::Run(DataSessionHandler& handler, const std::atomic<bool>& stopping) {
  if (!Handshake(handler)) return;
  while (true) {
    const Step step = Pump(handler);
    if (step == Step::kEnded) return;
    if (step == Step::kGetRequest) {
      if (!ServeGet(handler)) return;
      continue;
    }
    // Wait for bytes, looking at `stopping` now and then.
    while (true) {
      if (stopping.load()) {
        End(handler, "");
        return;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) != 0) break;  // readable, closed, or an error Pump will see
    }
  }
}

bool DataSession::Handshake(DataSessionHandler& handler) {
  if (keys_ != nullptr) {
    absl::StatusOr<SessionAuth> auth = AcceptorHandshake(fd_, *keys_, peer_);
    if (!auth.ok()) {
      ended_ = true;
      handler.Ended(peer_, begun_, std::string(auth.status().message()));
      return false;
    }
    auth_ = std::move(*auth);
    handler.Authenticated(peer_, auth_);
  }
  // Looked up once: the handshake attached it, or the session is plaintext.
  cipher_ = CipherOf(fd_);
  tag_size_ = cipher_ != nullptr ? kTagBytes : 0;
  return true;
}

void DataSession::End(DataSessionHandler& handler, const std::string& reason) {
  if (ended_) return;
  ended_ = true;
  buffer_.reset();
  DetachCipher(fd_);  // the owner closes the socket next
  handler.Ended(peer_, begun_, reason);
}

absl::StatusOr<bool> DataSession::ReadSome() {
  iovec iov[3];
  int count = 0;
  size_t want = 0;
  if (phase_ == Phase::kHeader) {
    iov[count++] = {head_ + have_, sizeof(head_) - have_};
    want = sizeof(head_) - have_;
  } else {
    // The rest of the body and tag, and the start of the next header: one
    // system call per packet while data streams.
    if (got_ < body_size_) iov[count++] = {body_ + got_, body_size_ - got_};
    const size_t tag_got = got_ > body_size_ ? got_ - body_size_ : 0;
    if (tag_got < tag_size_) iov[count++] = {tag_ + tag_got, tag_size_ - tag_got};
    want = body_size_ + tag_size_ - got_;
    iov[count++] = {head_, sizeof(head_)};
  }
  msghdr message{};
  message.msg_iov = iov;
  message.msg_iovlen = static_cast<size_t>(count);
  ssize_t n;
  do {
    n = ::recvmsg(fd_, &message, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n <= 0) {
    const std::string why = n == 0 ? "closed" : std::strerror(errno);
    if (phase_ == Phase::kHeader) {
      if (have_ == 0) return absl::UnavailableError(why);
      return absl::InvalidArgumentError(
          absl::StrCat("truncated frame: header cut after ", have_, " bytes (", why, ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated frame: ", body_kind_ == Body::kData ? "payload" : "body", " cut after ", got_,
        " of ", body_size_ + tag_size_, " bytes (", why, ")"));
  }
  const size_t bytes = static_cast<size_t>(n);
  if (phase_ == Phase::kHeader) {
    have_ += bytes;
  } else if (bytes > want) {
    got_ += want;
    have_ = bytes - want;  // the next header's first bytes
  } else {
    got_ += bytes;
  }
  return true;
}

DataSession::Step DataSession::Pump(DataSessionHandler& handler) {
  if (ended_) return Step::kEnded;
  while (true) {
    if (phase_ == Phase::kHeader && have_ == sizeof(head_)) {
      have_ = 0;
      const std::string reason = StartFrame(handler);
      if (!reason.empty()) {
        End(handler, reason);
        return Step::kEnded;
      }
      if (phase_ == Phase::kHeader) continue;  // a frame with no body, handled
    }
    if (phase_ == Phase::kBody && got_ == body_size_ + tag_size_) {
      bool get_request = false;
      const std::string reason = FinishFrame(handler, &get_request);
      phase_ = Phase::kHeader;
      if (!reason.empty()) {
        End(handler, reason);
        return Step::kEnded;
      }
      if (get_request) return Step::kGetRequest;
      continue;
    }
    absl::StatusOr<bool> read = ReadSome();
    if (!read.ok()) {
      // A clean close before a header is Unavailable; anything else is malformed.
      End(handler, read.status().code() == absl::StatusCode::kUnavailable
                       ? ""
                       : std::string(read.status().message()));
      return Step::kEnded;
    }
    if (!*read) return Step::kWouldBlock;
  }
}

std::string DataSession::StartFrame(DataSessionHandler& handler) {
  absl::StatusOr<PacketHeader> parsed = ParseHeader(head_, sizeof(head_), kMaxPayloadBytes);
  if (!parsed.ok()) return std::string(parsed.status().message());
  header_ = *parsed;
  const PacketHeader& h = header_;
  const bool sealed = (h.flags & kFlagSealed) != 0;
  if (cipher_ == nullptr && sealed) {
    return "a sealed packet on a session that is not encrypted (is data_plane_encryption the "
           "same at both ends?)";
  }
  if (cipher_ != nullptr && !sealed) return "a plaintext packet on an encrypted session";
  if (cipher_ != nullptr) std::memcpy(sealed_head_, head_, sizeof(head_));
  if (h.kind != PacketKind::kJobProof && !auth_.Allows(h.job)) {
    return absl::StrCat("a packet of job ", h.job, " from '", auth_.initiator,
                        "' before it proved it is in the job");
  }
  body_ = nullptr;
  body_size_ = 0;
  got_ = 0;
  body_kind_ = Body::kNone;
  buffer_.reset();
  if (h.kind == PacketKind::kData) {
    if (!begun_.count(h.transfer)) return absl::StrCat("data for unknown transfer ", h.transfer);
    buffer_ = handler.BufferFor(h);
    if (buffer_ == nullptr) {
      // Begun on this session and cancelled since (the scheduler's cancel
      // can overtake packets in flight): read the payload and drop it.
      scratch_.resize(h.length);
      body_ = reinterpret_cast<uint8_t*>(scratch_.data());
      body_kind_ = Body::kSkip;
    } else {
      const uint64_t total = buffer_->size();
      if (h.offset > total || h.length > total - h.offset) {
        buffer_.reset();
        return absl::StrCat("packet [", h.offset, ", +", h.length, ") is outside transfer ",
                            h.transfer, " of ", total, " bytes");
      }
      // Zero-copy receive: the payload lands in the transfer's buffer.
      body_ = buffer_->data() + h.offset;
      body_kind_ = Body::kData;
    }
    body_size_ = h.length;
  } else if (h.kind != PacketKind::kBegin) {
    // Control packets carry small payloads.
    scratch_.resize(h.length);
    body_ = reinterpret_cast<uint8_t*>(scratch_.data());
    body_size_ = h.length;
    body_kind_ = Body::kControl;
  }
  phase_ = Phase::kBody;
  // A kBegin has no payload; sealed, its tag still follows and vouches for
  // the header, so it is handled once the tag is in (FinishFrame).
  return "";
}

std::string DataSession::FinishFrame(DataSessionHandler& handler, bool* get_request) {
  const PacketHeader& h = header_;
  if (cipher_ != nullptr) {
    absl::Status opened = cipher_->receive.Open(
        std::string_view(reinterpret_cast<const char*>(sealed_head_), kHeaderBytes), body_,
        body_size_, tag_);
    if (!opened.ok()) return std::string(opened.message());
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
  if (body_kind_ == Body::kSkip) return "";
  if (cipher_ == nullptr) {
    if (absl::Status crc = VerifyPayload(h, body_); !crc.ok()) return std::string(crc.message());
  }
  if (body_kind_ == Body::kData) {
    bool complete = false;
    absl::Status taken = handler.Arrived(h, std::move(buffer_), &complete);
    buffer_.reset();
    if (!taken.ok()) return std::string(taken.message());
    if (complete) begun_.erase(h.transfer);
    return "";
  }
  if (h.kind == PacketKind::kGetRequest) {
    v1::DataGetRequest body;
    if (!body.ParseFromString(scratch_) || body.server().empty()) {
      return "get request: malformed body (no server named)";
    }
    // offset = round + 1 asks for a synchronous round's sum.
    if (body.relay_batch() == 0 && h.offset > 0 &&
        h.offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::StrCat("get request names round ", h.offset - 1, ", out of range");
    }
    get_header_ = h;
    get_body_ = std::move(body);
    *get_request = true;
    return "";
  }
  if (h.kind == PacketKind::kJobProof) {
    if (!auth_.enabled) return "a job proof on a session that is not authenticated";
    absl::Status proven = AcceptJobProof(auth_, *keys_, h.job, scratch_);
    return proven.ok() ? "" : std::string(proven.message());
  }
  if (h.kind == PacketKind::kAbort) {
    if (begun_.erase(h.transfer)) handler.Aborted(h, scratch_);
    return "";
  }
  return absl::StrCat("unexpected packet kind ", static_cast<int>(h.kind));
}

bool DataSession::ServeGet(DataSessionHandler& handler) {
  if (ended_) return false;
  absl::Status served = handler.GetRequest(fd_, get_header_, get_body_);
  if (!served.ok()) {
    End(handler, std::string(served.message()));
    return false;
  }
  return true;
}

}  // namespace mlfabric::transport
