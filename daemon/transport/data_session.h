// One incoming data session between daemons: the receive side of the
// Mercury data plane (mercury.md §IV; docs/architecture.md §5).
//
//   class Receiver : public transport::DataSessionHandler { ... };
//   transport::DataSession session(socket_fd, peer_name, max_transfer_bytes);
//   session.Run(receiver, stopping);   // returns when the session ends
//
// or, driven by readiness (an I/O thread per many sessions):
//   if (!session.Handshake(receiver)) drop it;
//   on readable: switch (session.Pump(receiver)) { kWouldBlock: wait again;
//                kGetRequest: session.ServeGet(receiver) elsewhere; kEnded: drop }
//
// The session reads frames until the peer closes, `stopping` is set or the
// input is malformed, and checks everything that is a matter of the
// protocol: a kBegin announces a transfer once, with a size in (0, max];
// data names a transfer this session began and lies inside it; every
// payload's CRC-32C is right; control packets parse. Payloads land where
// the handler says (zero copy into the transfer's buffer). Malformed input
// closes just this session with a reason (logged by the handler); the
// transfers it began and did not finish are handed to SessionEnded, so
// each fails exactly once. What a transfer is for (a round, an aggregate,
// a delivery) is the handler's business.
//
// With `keys` enabled the session first runs the acceptor's side of the
// authentication handshake (data_auth.h) and then takes a packet of job J
// only after a valid kJobProof for J; anything else closes the session
// with a reason that names the job and the peer.
//
// Thread safety: one thread at a time drives a session (Run, or the
// daemon's I/O thread that owns it between Pump calls); the handler is
// called from that thread and must be thread-safe across sessions.
#ifndef MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_
#define MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/payload_cipher.h"
#include "daemon/transport/packet.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::transport {

class DataSessionHandler {
 public:
  virtual ~DataSessionHandler() = default;

  // kBegin of transfer `header.transfer`, `header.offset` bytes, not begun
  // on this session before. An error closes the session with its message
  // (e.g. the transfer is already being received).
  virtual absl::Status Begin(const PacketHeader& header) = 0;
  // Where kData's payload goes: the transfer's buffer, or null when the
  // transfer was cancelled since it began (the payload is skipped).
  virtual std::shared_ptr<SharedBuffer> BufferFor(const PacketHeader& header) = 0;
  // The payload is at `buffer->data() + header.offset`, its CRC checked.
  // Sets *complete when the transfer has all its bytes. An error closes
  // the session.
  virtual absl::Status Arrived(const PacketHeader& header, std::shared_ptr<SharedBuffer> buffer,
                               bool* complete) = 0;
  // A get request (model, round sum or a distributor's copy); it may write
  // its reply on `fd`. An error closes the session.
  virtual absl::Status GetRequest(int fd, const PacketHeader& header,
                                  const v1::DataGetRequest& body) = 0;
  // The sender gave up transfer `header.transfer`, begun on this session.
  virtual void Aborted(const PacketHeader& header, const std::string& reason) = 0;
  // The handshake succeeded (keys enabled): who the peer says it is, and
  // whether its payloads are sealed.
  virtual void Authenticated(const std::string& peer, const SessionAuth& auth) {}
  // The session ended: `unfinished` are the transfers it began and did not
  // complete or abort; `close_reason` is empty on a clean close.
  virtual void Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
                     const std::string& close_reason) = 0;
};

class DataSession {
 public:
  // `keys` may be null (no authentication) and must outlive the session.
  DataSession(int fd, std::string peer, uint64_t max_transfer_bytes,
              const DataKeys* keys = nullptr);

  // Blocking use: reads until the session ends, then calls handler.Ended
  // once. (Tests and tools; the daemon drives sessions from its I/O
  // threads with the calls below.)
  void Run(DataSessionHandler& handler, const std::atomic<bool>& stopping);

  // ---- event-driven use (the daemon's DataReceiver)
  // The acceptor's side of the handshake when keys are enabled (blocking,
  // bounded by the handshake's own timeouts; call it once the socket has
  // bytes to read). False: the session ended (handler.Ended was called).
  bool Handshake(DataSessionHandler& handler);
  enum class Step {
    kWouldBlock,  // the socket holds no more bytes: wait until readable, Pump again
    kGetRequest,  // a get request was read: ServeGet (may block), then Pump again
    kEnded,       // handler.Ended was called; the caller closes the socket
  };
  // Reads whatever the socket holds now, never waiting (MSG_DONTWAIT: the
  // socket itself stays blocking for the get replies written on it), and
  // handles every whole frame. A frame cut by the socket running dry is
  // resumed by the next call, from where it stopped.
  Step Pump(DataSessionHandler& handler);
  // Serves the get request Pump returned. False: the session ended.
  bool ServeGet(DataSessionHandler& handler);
  // Ends the session from outside (the daemon stops): handler.Ended once,
  // with `reason` (empty: a clean close). No-op once ended.
  void End(DataSessionHandler& handler, const std::string& reason);
  bool ended() const { return ended_; }

 private:
  // The frame being read: its header, then its body (payload, and the
  // tag of a sealed packet) into `body_`.
  enum class Phase { kHeader, kBody };
  // Reads into the current target without waiting; bytes beyond the body
  // (the next header) land in head_. Ok(false): nothing more now.
  absl::StatusOr<bool> ReadSome();
  // A whole header is in head_: checks it and sets the body's target, or
  // handles a frame that has no body. Empty string: fine.
  std::string StartFrame(DataSessionHandler& handler);
  // The body is whole: checks it and hands it to the handler.
  std::string FinishFrame(DataSessionHandler& handler, bool* get_request);

  const int fd_;
  const std::string peer_;
  const uint64_t max_transfer_bytes_;
  const DataKeys* const keys_;
  SessionAuth auth_;
  std::shared_ptr<SessionCipher> cipher_;  // after the handshake; null: plaintext
  std::set<uint64_t> begun_;               // begun on this session, not finished
  bool ended_ = false;

  Phase phase_ = Phase::kHeader;
  uint8_t head_[kHeaderBytes];
  size_t have_ = 0;                        // bytes of head_ read
  PacketHeader header_;                    // the frame being read
  uint8_t sealed_head_[kHeaderBytes];      // its header, for the tag (sealed)
  uint8_t* body_ = nullptr;                // where its payload goes
  size_t body_size_ = 0;
  uint8_t tag_[kTagBytes];
  size_t tag_size_ = 0;                    // kTagBytes on a sealed session
  size_t got_ = 0;                         // of body_size_ + tag_size_
  enum class Body { kNone, kData, kSkip, kControl } body_kind_ = Body::kNone;
  std::shared_ptr<SharedBuffer> buffer_;   // a data packet's transfer buffer
  std::string scratch_;                    // a control payload, or one skipped
  // A get request read and not yet served.
  PacketHeader get_header_;
  v1::DataGetRequest get_body_;
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_
