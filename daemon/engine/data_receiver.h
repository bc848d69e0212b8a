// DataReceiver: the receive side of this daemon's data plane (docs/architecture.md
// §5): it accepts other daemons' TCP connections and drives one
// transport::DataSession per connection, as that session's handler, from a
// small fixed set of I/O threads (Options::io_threads): a session takes a
// thread only while it has bytes to read. An authenticated session's
// handshake runs on a fixed pool of its own (it blocks, bounded by its
// timeouts) once the peer has sent something; a connection that sends
// nothing costs no thread and is closed after the handshake timeout. A get
// request is served on a thread of BlockingWork (the reply streams from
// the sender loop and the serving code waits for it): one per get being
// served at once, reused, not one per get. A CRC-checked data packet is summed into its
// synchronous round (RoundService) or in-network aggregate
// (NetworkAggregation), or kept until the transfer is whole and delivered
// in commit order (Deliveries). Get requests go to the model server (a
// model), the round service (a round's sum) or the model fetcher (a copy
// this host forwards as a distributor).
//
//   DataReceiver receiver(&lock, clock, &stopping, &keys, parts);
//   RETURN_IF_ERROR(receiver.Listen("10.0.0.1", 0));   // receiver.address()
//   receiver.Start(&model_server, &fetcher);
//   ...
//   receiver.StopAccepting();   // then, once nothing writes to sessions:
//   receiver.StopSessions();    // shuts them down and waits for the last
//
// Malformed input closes just its session (logged, counted); the transfers
// it carried are reported failed, nothing else is touched.
//
// Thread safety: the handler methods run on the I/O threads (and a get's
// own thread) and take the receive side's lock (receive_lock.h) for
// bookkeeping only.
#ifndef MLFABRIC_DAEMON_ENGINE_DATA_RECEIVER_H_
#define MLFABRIC_DAEMON_ENGINE_DATA_RECEIVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <optional>

#include <boost/asio.hpp>

#include "absl/status/status.h"
#include "common/clock.h"
#include "daemon/control/completion_reporter.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/model_fetcher.h"
#include "daemon/engine/model_server.h"
#include "common/blocking_work.h"
#include "daemon/engine/deliveries.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/network_aggregation.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/round_service.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/data_session.h"

namespace mlfabric::daemon {

class DataReceiver : public transport::DataSessionHandler {
 public:
  // What packets and requests are handed to; all must outlive this.
  struct Parts {
    IncomingTransfers* incoming ABSL_PT_GUARDED_BY(receive_side) = nullptr;
    RoundService* rounds = nullptr;
    NetworkAggregation* aggregation = nullptr;
    Deliveries* deliveries = nullptr;
    CompletionReporter* reporter = nullptr;
    BufferPool* pool = nullptr;
  };
  // `keys` may be null (no authentication); `max_transfer_bytes` bounds
  // what a session accepts.
  // `io_threads` (>= 1) read every session's sockets.
  DataReceiver(ReceiveLock* lock, const Clock* clock, const std::atomic<bool>* stopping,
               transport::DataKeys* keys, uint64_t max_transfer_bytes, Parts parts,
               int io_threads = 1);
  ~DataReceiver() override;
  DataReceiver(const DataReceiver&) = delete;
  DataReceiver& operator=(const DataReceiver&) = delete;

  // Binds `address`:`port` (0: any free port) and listens.
  absl::Status Listen(const std::string& address, int port);
  // "<address>:<port>" once listening.
  const std::string& address() const { return address_; }
  // Accepts connections from now on; gets are answered by `model_server`
  // and `fetcher` (which must outlive this).
  void Start(ModelServer* model_server, ModelFetcher* fetcher);
  // No connection is accepted after this.
  void StopAccepting();
  // Shuts every session's socket down and waits until the last ended.
  void StopSessions();

  int64_t bytes_received() const { return bytes_received_.load(); }
  // Sessions open now (accepted, not yet ended).
  size_t sessions() const;
  int64_t malformed_sessions() const { return malformed_sessions_.load(); }

  // A transfer whose source is this host too (a push to a server or a
  // round root here, a replica copy or a group part for this host): its
  // bytes `data` are taken as if they had arrived on a session, in
  // `packet_bytes` pieces (so rounds and aggregates sum them on the same
  // grid), but never cross a socket. Must be called without the lock. An
  // error (begun twice, another job's transfer) is the transfer's failure.
  absl::Status DeliverLocal(const transport::PacketHeader& begin, const SharedBuffer& data,
                            uint32_t packet_bytes);
  // Transfers and bytes delivered that way.
  int64_t local_transfers() const { return local_transfers_.load(); }
  int64_t local_bytes() const { return local_bytes_.load(); }

  // transport::DataSessionHandler.
  absl::Status Begin(const transport::PacketHeader& header) override;
  // Begin's work; without `with_buffer` the transfer gets no receive
  // buffer (a same-host round member, summed straight from its push's).
  std::shared_ptr<SharedBuffer> BufferFor(const transport::PacketHeader& header) override;
  absl::Status Arrived(const transport::PacketHeader& header,
                       std::shared_ptr<SharedBuffer> buffer, bool* complete) override;
  void Authenticated(const std::string& peer, const transport::SessionAuth& auth) override;
  absl::Status GetRequest(int fd, const transport::PacketHeader& header,
                          const v1::DataGetRequest& body) override;
  void Aborted(const transport::PacketHeader& header, const std::string& reason) override;
  void Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
             const std::string& close_reason) override;

 private:
  absl::Status BeginTransfer(const transport::PacketHeader& header, bool with_buffer);
  struct Session;
  void Accept();
  // Waits (without a thread) until the session's socket is readable, then
  // runs `next` on an I/O thread.
  void WhenReadable(const std::shared_ptr<Session>& session, void (DataReceiver::*next)(
                                                                 const std::shared_ptr<Session>&));
  void HandshakeThen(const std::shared_ptr<Session>& session);
  void Read(const std::shared_ptr<Session>& session);
  void Close(const std::shared_ptr<Session>& session);
  // A CRC-checked data packet: summed into its round or aggregate or kept;
  // a transfer complete is summed or delivered (*complete). An error closes
  // the session.
  absl::Status AcceptLocked(const transport::PacketHeader& header, const uint8_t* dst,
                            bool* complete) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The job a transfer is expected for (a round member, an aggregate's
  // constituent or a delivery), if this host expects it yet.
  std::optional<uint32_t> ExpectedJobLocked(uint64_t transfer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  ReceiveLock* const lock_;
  const Clock* const clock_;
  const std::atomic<bool>* const stopping_;
  transport::DataKeys* const keys_;
  const uint64_t max_transfer_bytes_;
  const Parts parts_;
  ModelServer* model_server_ = nullptr;
  ModelFetcher* fetcher_ = nullptr;
  const int io_threads_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;       // io_threads_ running io_
  boost::asio::thread_pool handshakes_{2};  // authenticated sessions' handshakes
  BlockingWork serving_;                    // served gets, on reused threads
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  std::string address_;
  std::atomic<bool> closing_{false};  // StopAccepting() was called
  // The sessions open now (guarded by the lock).
  std::set<std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(receive_side);
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> malformed_sessions_{0};
  std::atomic<int64_t> local_transfers_{0};
  std::atomic<int64_t> local_bytes_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_DATA_RECEIVER_H_
