// GetClient: the asking side of a model get between daemons (docs/architecture.md §3,
// mlfabric.md §10.3): one request on a data connection to the daemon that
// answers it (the server's, or a distributor's), the reply's header and
// body, then the model's packets.
//
//   GetClient client(io, watchdog);
//   GetClient::Connection c;
//   RETURN_IF_ERROR(client.Request("s1", "10.0.0.1:7001", header, body, &c));
//   // c.reply says: the model follows (c.header.offset bytes), or ask the
//   // distributor c.reply.relay_host() instead.
//   RETURN_IF_ERROR(client.Receive(c, buffer, [&](uint64_t begin, uint64_t end) {
//     ...  // [begin, end) of `buffer` has arrived and passed its CRC
//   }));
//   client.Keep(c);  // the next get to that daemon reuses the connection
//
// Errors name what went wrong: Unavailable when the daemon cannot be
// reached or the transfer is cut (or the reply carries an error: its
// text), DataLoss for a malformed reply or packet, Aborted (with the far
// end's reason) when the answering daemon gives up mid-transfer.
//
// With `keys` enabled, every new connection starts with the initiator's
// side of the authentication handshake (data_auth.h), and a get of job J
// is preceded, once per connection, by the proof that this host is in J
// (FailedPrecondition, nothing sent, when it holds no key for J).
//
// Thread safety: Request, Receive and Keep may be called from any thread,
// each Connection by one thread at a time; the kept connections have
// their own lock (a leaf).
#ifndef MLFABRIC_DAEMON_TRANSPORT_GET_CLIENT_H_
#define MLFABRIC_DAEMON_TRANSPORT_GET_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/send_watchdog.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::transport {

class GetClient {
 public:
  // One get's connection to the daemon that answers it, with its reader
  // and the reply's header (offset = the model's bytes) and body.
  struct Connection {
    std::string address;
    std::shared_ptr<boost::asio::ip::tcp::socket> socket;
    SessionAuth auth;  // the connection's handshake and proven jobs
    std::optional<FrameReader> reader;
    PacketHeader header;
    v1::DataGetReply reply;
    // Set by Receive: for a synchronous round's sum, the pushes it sums
    // (its packets' `tensor` field, packet.h); 0 for a model.
    uint32_t contributions = 0;
  };

  // Connections are kept per address, at most `max_idle_per_address`; a
  // model larger than `max_model_bytes` is refused as malformed. A get
  // whose answering host stops answering (cut off by a partition, or gone
  // without closing) fails Unavailable after about 3 × `peer_timeout_s`
  // (SetPeerTimeout, framing.h; 0: it waits for ever), so that a get of a
  // server that fails over moves on to its replica.
  GetClient(boost::asio::io_context& io, SendWatchdog& watchdog,
            size_t max_idle_per_address = 4, uint64_t max_model_bytes = uint64_t{64} << 30,
            const DataKeys* keys = nullptr, std::string my_host = "", double peer_timeout_s = 0);

  // Sends `body` as the get request `request` to the daemon of `peer` at
  // `address` (on a kept connection if there is one, once more on a new
  // one if that had been closed) and reads the reply's header and body.
  absl::Status Request(const std::string& peer, const std::string& address,
                       const PacketHeader& request, const v1::DataGetRequest& body,
                       Connection* out);
  // Reads the model that follows the reply into `buffer` (at least
  // `connection.header.offset` bytes), calling `arrived(begin, end)` after
  // each packet has passed its CRC.
  absl::Status Receive(Connection& connection, SharedBuffer& buffer,
                       const std::function<void(uint64_t begin, uint64_t end)>& arrived);
  // Keeps the connection for the next get to the same daemon (its session
  // there waits for the next request).
  void Keep(Connection& connection);

  // Connections kept now (for tests).
  size_t idle() const;

  // Shuts every connection down, kept or in use: a Request or Receive
  // blocked on a quiet daemon returns Unavailable, and every later Request
  // fails at once. For stopping the daemon.
  void Shutdown();

 private:
  // Request's steps: a new connection to `peer` at `address` (with its
  // handshake when keys_ is set) into `out`; and the request on it, after
  // the job's proof when the session has not proven it yet, up to the
  // reply's header.
  absl::Status Connect(const std::string& peer, const std::string& address,
                       const boost::asio::ip::tcp::endpoint& endpoint, Connection* out);
  absl::StatusOr<PacketHeader> Exchange(const PacketHeader& request, const std::string& payload,
                                        Connection* out);

  boost::asio::io_context& io_;
  SendWatchdog& watchdog_;
  const size_t max_idle_per_address_;
  const uint64_t max_model_bytes_;
  const DataKeys* const keys_;
  const std::string my_host_;
  const double peer_timeout_s_;
  struct Idle {
    std::shared_ptr<boost::asio::ip::tcp::socket> socket;
    SessionAuth auth;
  };
  mutable Mutex mu_;
  std::multimap<std::string, Idle> idle_ ABSL_GUARDED_BY(mu_);  // by address
  // Every connection opened, while it lives (Shutdown reaches them).
  std::vector<std::weak_ptr<boost::asio::ip::tcp::socket>> opened_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// The answering side: the header of a get's reply on socket `fd` (offset =
// the `bytes` of model that follow; payload = `body`), what Request reads.
absl::Status WriteGetReply(SendWatchdog& watchdog, int fd, const PacketHeader& request,
                           const v1::DataGetReply& body, int64_t bytes);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_GET_CLIENT_H_
