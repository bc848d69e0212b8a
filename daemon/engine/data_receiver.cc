#include "daemon/engine/data_receiver.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/transport/framing.h"

namespace mlfabric::daemon {

namespace asio = boost::asio;
using asio::ip::tcp;
using transport::PacketHeader;

namespace {

// Asio puts a socket in non-blocking mode for every async wait; the
// handshake and a get reply (written by the sender loop) use it blocking,
// bounded by their own timeouts. Reads never wait (MSG_DONTWAIT).
void MakeBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) != 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

}  // namespace

// One accepted connection and its session.
struct DataReceiver::Session {
  Session(tcp::socket s, std::string peer_name, uint64_t max_transfer_bytes,
          const transport::DataKeys* keys)
      : socket(std::move(s)),
        peer(std::move(peer_name)),
        session(socket.native_handle(), peer, max_transfer_bytes, keys),
        handshake_deadline(socket.get_executor()) {}
  tcp::socket socket;
  const std::string peer;
  transport::DataSession session;
  // An authenticated session that has not started its handshake in time
  // is closed (it costs no thread meanwhile, but it holds a descriptor).
  asio::steady_timer handshake_deadline;
  bool closed = false;  // guarded by the receive lock
};

DataReceiver::DataReceiver(ReceiveLock* lock, const Clock* clock,
                           const std::atomic<bool>* stopping, transport::DataKeys* keys,
                           uint64_t max_transfer_bytes, Parts parts, int io_threads)
    : lock_(lock),
      clock_(clock),
      stopping_(stopping),
      keys_(keys),
      max_transfer_bytes_(max_transfer_bytes),
      parts_(parts),
      io_threads_(std::max(1, io_threads)) {}

DataReceiver::~DataReceiver() {
  StopAccepting();
  StopSessions();
  work_.reset();
  io_.stop();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  handshakes_.join();
  if (acceptor_) {
    boost::system::error_code ignored;
    acceptor_->close(ignored);
  }
}

absl::Status DataReceiver::Listen(const std::string& address, int port) {
  auto endpoint = transport::ParseEndpoint(absl::StrCat(address, ":1"));
  if (!endpoint.ok()) return endpoint.status();
  boost::system::error_code error;
  acceptor_ = std::make_unique<tcp::acceptor>(io_);
  tcp::endpoint bind_to(endpoint->address(), static_cast<uint16_t>(port));
  acceptor_->open(bind_to.protocol(), error);
  if (!error) acceptor_->set_option(tcp::acceptor::reuse_address(true), error);
  if (!error) acceptor_->bind(bind_to, error);
  if (!error) acceptor_->listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for data on ", address, ":", port, ": ", error.message()));
  }
  address_ = absl::StrCat(address, ":", acceptor_->local_endpoint().port());
  return absl::OkStatus();
}

void DataReceiver::Start(ModelServer* model_server, ModelFetcher* fetcher) {
  model_server_ = model_server;
  fetcher_ = fetcher;
  work_.emplace(asio::make_work_guard(io_));
  Accept();
  for (int i = 0; i < io_threads_; ++i) threads_.emplace_back([this] { io_.run(); });
}

void DataReceiver::StopAccepting() {
  if (closing_.exchange(true)) return;
  // Wakes the pending accept from any thread, without waiting for the I/O
  // thread (which may be waiting for the receive lock): the accept fails,
  // sees closing_ and is not issued again. The acceptor itself is closed
  // once the I/O threads are gone (~DataReceiver).
  if (acceptor_) ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
}

void DataReceiver::StopSessions() {
  // No new session starts now: shutting a socket down wakes its wait (or
  // the blocking handshake or get on it), and the session then ends.
  ReceiveLock::Hold lock(lock_);
  for (const auto& session : sessions_) {
    ::shutdown(session->socket.native_handle(), SHUT_RDWR);
  }
  if (threads_.empty()) return;
  while (!sessions_.empty()) lock_->Wait();
}

size_t DataReceiver::sessions() const {
  ReceiveLock::Hold lock(lock_);
  return sessions_.size();
}

void DataReceiver::Accept() {
  acceptor_->async_accept([this](const boost::system::error_code& error, tcp::socket socket) {
    if (error) {
      if (stopping_->load() || closing_.load() || error == asio::error::operation_aborted) return;
      // Out of descriptors or memory, or a connection reset while queued:
      // the next accept may work. Anything else ends the data plane.
      const int code = error.value();
      if (code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM ||
          code == ECONNABORTED || code == EINTR) {
        MLF_LOG(WARNING) << "data accept failed: " << error.message() << "; retrying";
        auto retry = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        retry->async_wait([this, retry](const boost::system::error_code&) {
          if (!closing_.load()) Accept();
        });
        return;
      }
      MLF_LOG(ERROR) << "data accept failed: " << error.message();
      return;
    }
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    const auto peer = socket.remote_endpoint(ignored);
    std::string peer_name = absl::StrCat(peer.address().to_string(), ":", peer.port());
    MLF_LOG(DEBUG) << "data session from " << peer_name;
    auto session = std::make_shared<Session>(std::move(socket), std::move(peer_name),
                                             max_transfer_bytes_, keys_);
    {
      ReceiveLock::Hold lock(lock_);
      sessions_.insert(session);
    }
    if (keys_ != nullptr && keys_->enabled()) {
      session->handshake_deadline.expires_after(
          std::chrono::seconds(transport::kHandshakeTimeoutS));
      session->handshake_deadline.async_wait([session](const boost::system::error_code& e) {
        // Not cancelled: the peer sent nothing in time; the wait below
        // wakes and the handshake fails at once.
        if (!e) ::shutdown(session->socket.native_handle(), SHUT_RDWR);
      });
      WhenReadable(session, &DataReceiver::HandshakeThen);
    } else {
      (void)session->session.Handshake(*this);  // no keys: nothing to exchange
      WhenReadable(session, &DataReceiver::Read);
    }
    if (!closing_.load()) Accept();
  });
}

void DataReceiver::WhenReadable(
    const std::shared_ptr<Session>& session,
    void (DataReceiver::*next)(const std::shared_ptr<Session>&)) {
  session->socket.async_wait(tcp::socket::wait_read,
                             [this, session, next](const boost::system::error_code& error) {
                               if (error) {
                                 // Cancelled or failed: the session ends
                                 // with what it read.
                                 session->session.End(*this, "");
                                 Close(session);
                                 return;
                               }
                               (this->*next)(session);
                             });
}

void DataReceiver::HandshakeThen(const std::shared_ptr<Session>& session) {
  session->handshake_deadline.cancel();
  // It blocks (bounded by its timeouts): on the handshake pool, not on an
  // I/O thread.
  MakeBlocking(session->socket.native_handle());
  asio::post(handshakes_, [this, session]() mutable {
    const bool open = session->session.Handshake(*this);
    asio::post(io_, [this, session = std::move(session), open] {
      if (open) {
        Read(session);
      } else {
        Close(session);
      }
    });
  });
}

void DataReceiver::Read(const std::shared_ptr<Session>& session) {
  switch (session->session.Pump(*this)) {
    case transport::DataSession::Step::kWouldBlock:
      WhenReadable(session, &DataReceiver::Read);
      return;
    case transport::DataSession::Step::kEnded:
      Close(session);
      return;
    case transport::DataSession::Step::kGetRequest:
      // The reply streams from the sender loop while the serving code
      // waits for it (up to a round's wait): not on an I/O thread.
      MakeBlocking(session->socket.native_handle());
      serving_.Run([this, session]() mutable {
        const bool open = session->session.ServeGet(*this);
        // The session moves into the posted handler: once it runs, this
        // thread holds nothing of the receiver's.
        asio::post(io_, [this, session = std::move(session), open] {
          if (open) {
            Read(session);
          } else {
            Close(session);
          }
        });
      });
      return;
  }
}

void DataReceiver::Close(const std::shared_ptr<Session>& session) {
  ReceiveLock::Hold lock(lock_);
  if (session->closed) return;
  session->closed = true;
  boost::system::error_code ignored;
  session->handshake_deadline.cancel();
  session->socket.close(ignored);
  sessions_.erase(session);
  lock_->NotifyAll();  // StopSessions() waits for the last session
}

absl::Status DataReceiver::AcceptLocked(const PacketHeader& header, const uint8_t* dst,
                                        bool* complete) {
  bytes_received_.fetch_add(header.length);
  Incoming* incoming = parts_.incoming->Find(header.transfer);
  if (incoming == nullptr) return absl::OkStatus();  // cancelled meanwhile
  if (incoming->first_packet_s < 0) incoming->first_packet_s = clock_->NowSeconds();
  // Bytes sent twice would complete the transfer without the bytes that
  // never came: a malformed session.
  RETURN_IF_ERROR(incoming->Receive(header.transfer, header.offset, header.length));
  // Mercury PS: a member of a synchronous round is summed packet by
  // packet as it arrives (mercury.md §IV, Key idea 3).
  const bool round_member = parts_.rounds->IsMemberLocked(header.transfer);
  const std::optional<uint64_t> aggregate =
      round_member ? std::nullopt : parts_.aggregation->AggregateOf(header.transfer);
  if (round_member) {
    parts_.rounds->FoldPacketLocked(header.transfer, dst, header.offset, header.length);
  } else if (aggregate.has_value()) {
    // A constituent of this host's aggregate (§5.2), summed packet by packet.
    if (!parts_.aggregation->FoldPacketLocked(*aggregate, header.transfer, incoming->total, dst,
                                              header.offset, header.length)) {
      return absl::OkStatus();
    }
  } else {
    incoming->unfolded.emplace_back(header.offset, header.length);
  }
  // A round's effects or a failed aggregate may have let go of it.
  incoming = parts_.incoming->Find(header.transfer);
  if (incoming == nullptr || incoming->received < incoming->total) return absl::OkStatus();
  *complete = true;
  // Machine-readable arrival trace (CLOCK_MONOTONIC, comparable across
  // the daemons of one machine): the preemption test and benchmark
  // read it at --log_level debug.
  MLF_LOG(DEBUG) << "received transfer " << header.transfer << " bytes " << incoming->total
                 << " priority " << header.priority << " first_packet_s "
                 << absl::StrFormat("%.6f", incoming->first_packet_s) << " complete_s "
                 << absl::StrFormat("%.6f", clock_->NowSeconds());
  if (round_member) {  // summed already; nothing to deliver
    parts_.incoming->Recycle(header.transfer);
    return absl::OkStatus();
  }
  if (parts_.aggregation->FinishLocked(header.transfer)) return absl::OkStatus();
  parts_.deliveries->ArrivedLocked(header.transfer);
  return absl::OkStatus();
}

absl::Status DataReceiver::Begin(const PacketHeader& header) {
  return BeginTransfer(header, /*with_buffer=*/true);
}

absl::Status DataReceiver::BeginTransfer(const PacketHeader& header, bool with_buffer) {
  std::shared_ptr<SharedBuffer> pooled;
  {
    ReceiveLock::Hold lock(lock_);
    if (parts_.incoming->Contains(header.transfer)) {
      return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
    }
    // Sent on a round grant whose push ended: its packets are skipped.
    if (parts_.incoming->Discarded(header.transfer)) return absl::OkStatus();
    if (with_buffer) pooled = parts_.pool->Take(header.offset);
  }
  if (with_buffer) {
    MLF_LOG(DEBUG) << "transfer " << header.transfer << " of " << header.offset
                   << " bytes: " << (pooled ? "reusing a pooled" : "new") << " receive buffer";
  }
  if (with_buffer && pooled == nullptr) {
    auto buffer = SharedBuffer::Create(header.offset);
    if (!buffer.ok()) return buffer.status();
    pooled = std::make_shared<SharedBuffer>(std::move(*buffer));
  }
  ReceiveLock::Hold lock(lock_);
  if (parts_.incoming->Contains(header.transfer)) {
    parts_.pool->Recycle(std::move(pooled));
    return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
  }
  if (parts_.incoming->Discarded(header.transfer)) {
    parts_.pool->Recycle(std::move(pooled));
    return absl::OkStatus();
  }
  // A session may carry only the jobs it proved (transport/data_auth.h);
  // a transfer this host already expects must come as its own job's.
  // (One expected later is checked where it joins: JobMismatch.)
  if (std::optional<uint32_t> expected = ExpectedJobLocked(header.transfer);
      expected.has_value() && *expected != header.job) {
    parts_.pool->Recycle(std::move(pooled));
    return absl::PermissionDeniedError(absl::StrCat("transfer ", header.transfer, " is job ",
                                                    *expected, "'s; the packet says job ",
                                                    header.job));
  }
  parts_.incoming->Add(header.transfer, header.job, header.offset, std::move(pooled));
  return absl::OkStatus();
}

absl::Status DataReceiver::DeliverLocal(const PacketHeader& begin, const SharedBuffer& data,
                                        uint32_t packet_bytes) {
  if (begin.offset != data.size() || packet_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("local transfer ", begin.transfer, " of ",
                                                   begin.offset, " bytes from a buffer of ",
                                                   data.size()));
  }
  // A member of a round this host sums is summed straight from the push's
  // buffer (below): a receive buffer would only take a pooled one from the
  // transfers that need it (at a root, one per round).
  bool member = false;
  {
    ReceiveLock::Hold lock(lock_);
    member = parts_.rounds->IsMemberLocked(begin.transfer);
  }
  RETURN_IF_ERROR(BeginTransfer(begin, /*with_buffer=*/!member));
  // Accepts the bytes at `base` in packet-sized pieces, as if they had
  // arrived on a session.
  auto accept = [&](const uint8_t* base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) {
    PacketHeader piece = begin;
    piece.kind = transport::PacketKind::kData;
    uint64_t offset = 0;
    do {
      piece.offset = offset;
      piece.length =
          static_cast<uint32_t>(std::min<uint64_t>(packet_bytes, data.size() - offset));
      bool complete = false;
      RETURN_IF_ERROR(AcceptLocked(piece, base + offset, &complete));
      // AcceptLocked counts bytes received on sessions; these were not.
      bytes_received_.fetch_sub(piece.length);
      offset += piece.length;
      if (parts_.incoming->Find(begin.transfer) == nullptr) break;  // ended (or cancelled)
    } while (offset < data.size());
    local_transfers_.fetch_add(1);
    local_bytes_.fetch_add(static_cast<int64_t>(data.size()));
    return absl::OkStatus();
  };
  std::shared_ptr<SharedBuffer> buffer;
  {
    ReceiveLock::Hold lock(lock_);
    // A member of a round this host sums (an AllReduce's root, Mercury PS)
    // is summed straight from the push's buffer, which the caller holds,
    // under one hold of the lock: its bytes are never read again. Anything
    // else (a delivery, an aggregate's part, a member whose round has not
    // been announced yet) keeps its bytes in its receive buffer.
    if (parts_.rounds->IsMemberLocked(begin.transfer)) return accept(data.data());
    const Incoming* incoming = parts_.incoming->Find(begin.transfer);
    if (incoming == nullptr) return absl::OkStatus();  // cancelled meanwhile
    if (incoming->buffer == nullptr) {
      // Begun as a member, and its round went since (evicted by newer
      // rounds, which fails it): its bytes are of no use.
      parts_.incoming->Erase(begin.transfer);
      return absl::FailedPreconditionError(absl::StrCat(
          "local transfer ", begin.transfer, ": its round ended before its bytes were summed"));
    }
    buffer = incoming->buffer;
  }
  // One copy, without the lock (nobody else writes a transfer's buffer
  // before its bytes are accepted below).
  std::memcpy(buffer->data(), data.data(), data.size());
  const uint8_t* base = buffer->data();
  ReceiveLock::Hold lock(lock_);
  // As in Arrived: the incoming transfer holds the buffer while it is
  // incoming; once it is not, AcceptLocked does not touch it.
  buffer.reset();
  return accept(base);
}

std::optional<uint32_t> DataReceiver::ExpectedJobLocked(uint64_t transfer) const {
  if (auto job = parts_.rounds->JobOfLocked(transfer)) return job;
  if (auto aggregate = parts_.aggregation->AggregateOf(transfer)) {
    return parts_.aggregation->JobOf(*aggregate);
  }
  return parts_.deliveries->JobExpectingLocked(transfer);
}

std::shared_ptr<SharedBuffer> DataReceiver::BufferFor(const PacketHeader& header) {
  ReceiveLock::Hold lock(lock_);
  const Incoming* incoming = parts_.incoming->Find(header.transfer);
  return incoming == nullptr ? nullptr : incoming->buffer;
}

absl::Status DataReceiver::Arrived(const PacketHeader& header,
                                   std::shared_ptr<SharedBuffer> buffer, bool* complete) {
  const uint8_t* dst = buffer->data() + header.offset;
  ReceiveLock::Hold lock(lock_);
  // Let go of the buffer first: a buffer is recycled only if nobody else
  // holds it, by the server's acknowledgement (the moment the lock is
  // free) or, for a summed round or aggregate member, inside
  // AcceptLocked. While the transfer is incoming it holds the buffer, so
  // `dst` stays valid; once it is not, AcceptLocked does not touch `dst`.
  buffer.reset();
  return AcceptLocked(header, dst, complete);
}

void DataReceiver::Authenticated(const std::string& peer, const transport::SessionAuth& auth) {
  MLF_LOG(INFO) << "authenticated the data session of " << auth.initiator << " at " << peer
                << (auth.sealed ? ", payloads encrypted" : "");
}

absl::Status DataReceiver::GetRequest(int fd, const PacketHeader& header,
                                      const v1::DataGetRequest& body) {
  // A distributor's copy (a model batch or a round's sum) forwarded.
  if (body.relay_batch() != 0) return fetcher_->ServeRelay(fd, header, body);
  // offset = round + 1 asks for a synchronous round's sum; 0 = the model
  // (the session checked the range).
  if (header.offset > 0) {
    return parts_.rounds->ServeGet(fd, header, body, static_cast<int64_t>(header.offset - 1));
  }
  return model_server_->Serve(fd, header, body);
}

void DataReceiver::Aborted(const PacketHeader& header, const std::string& reason) {
  ReceiveLock::Hold lock(lock_);
  parts_.incoming->Erase(header.transfer);
  parts_.reporter->ReportFailure(header.transfer, absl::StrCat("sender aborted: ", reason));
}

void DataReceiver::Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
                         const std::string& close_reason) {
  ReceiveLock::Hold lock(lock_);
  if (!close_reason.empty()) {
    malformed_sessions_.fetch_add(1);
    MLF_LOG(WARNING) << "closing data session from " << peer << ": " << close_reason;
  }
  for (uint64_t transfer : unfinished) {
    if (parts_.incoming->Erase(transfer)) {
      parts_.reporter->ReportFailure(
          transfer, absl::StrCat("data session from ", peer, " ended mid-transfer",
                                 close_reason.empty() ? "" : ": " + close_reason));
    }
  }
}

}  // namespace mlfabric::daemon
