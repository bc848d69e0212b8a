// One incoming data session between daemons: the receive side of the
// Mercury data plane (mercury.md §IV; DESIGN.md §5).
//
//   class Receiver : public transport::DataSessionHandler { ... };
//   transport::DataSession session(socket_fd, peer_name, max_transfer_bytes);
//   session.Run(receiver, stopping);   // returns when the session ends
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
// Thread safety: a session belongs to the thread that runs it; the
// handler is called from that thread and must be thread-safe across
// sessions.
#ifndef MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_
#define MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "daemon/transport/data_auth.h"
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
  // `keys` may be null (no authentication) and must outlive Run.
  DataSession(int fd, std::string peer, uint64_t max_transfer_bytes,
              const DataKeys* keys = nullptr)
      : fd_(fd), peer_(std::move(peer)), max_transfer_bytes_(max_transfer_bytes), keys_(keys) {}

  // Reads until the session ends, then calls handler.Ended once.
  void Run(DataSessionHandler& handler, const std::atomic<bool>& stopping);

 private:
  const int fd_;
  const std::string peer_;
  const uint64_t max_transfer_bytes_;
  const DataKeys* const keys_;
  SessionAuth auth_;
  std::set<uint64_t> begun_;  // begun on this session, not finished
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_DATA_SESSION_H_
