#include "daemon/engine/data_receiver.h"

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

DataReceiver::DataReceiver(ReceiveLock* lock, const Clock* clock,
                           const std::atomic<bool>* stopping, transport::DataKeys* keys,
                           uint64_t max_transfer_bytes, Parts parts)
    : lock_(lock),
      clock_(clock),
      stopping_(stopping),
      keys_(keys),
      max_transfer_bytes_(max_transfer_bytes),
      parts_(parts) {}

DataReceiver::~DataReceiver() {
  StopAccepting();
  StopSessions();
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
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void DataReceiver::StopAccepting() {
  closing_.store(true);
  if (acceptor_) {
    // close() alone does not wake a thread blocked in accept(); shutdown does.
    boost::system::error_code ignored;
    ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
    acceptor_->close(ignored);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
}

void DataReceiver::StopSessions() {
  // No new session starts now: a read blocked on a quiet peer returns once
  // its socket is shut down.
  std::unique_lock<std::mutex> lock(lock_->mu);
  for (const auto& socket : sessions_) ::shutdown(socket->native_handle(), SHUT_RDWR);
  lock_->cv.wait(lock, [this] { return sessions_.empty(); });
}

void DataReceiver::AcceptLoop() {
  while (!stopping_->load() && !closing_.load()) {
    auto socket = std::make_shared<tcp::socket>(io_);
    boost::system::error_code error;
    acceptor_->accept(*socket, error);
    if (error) {
      if (stopping_->load() || closing_.load()) return;
      // Out of descriptors or memory, or a connection reset while queued:
      // the next accept may work. Anything else ends the data plane.
      const int code = error.value();
      if (code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM ||
          code == ECONNABORTED || code == EINTR) {
        MLF_LOG(WARNING) << "data accept failed: " << error.message() << "; retrying";
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      MLF_LOG(ERROR) << "data accept failed: " << error.message();
      return;
    }
    socket->set_option(tcp::no_delay(true), error);
    std::lock_guard<std::mutex> lock(lock_->mu);
    sessions_.insert(socket);
    // Detached: a finished session is reclaimed at once; StopSessions()
    // shuts the sessions' sockets down and waits until none is left.
    std::thread([this, socket = std::move(socket)]() mutable {
      SessionLoop(std::move(socket));
    }).detach();
  }
}

void DataReceiver::SessionLoop(std::shared_ptr<tcp::socket> socket) {
  boost::system::error_code ignored;
  const auto peer = socket->remote_endpoint(ignored);
  const std::string peer_name = absl::StrCat(peer.address().to_string(), ":", peer.port());
  MLF_LOG(DEBUG) << "data session from " << peer_name;
  transport::DataSession session(socket->native_handle(), peer_name, max_transfer_bytes_, keys_);
  session.Run(*this, *stopping_);
  std::lock_guard<std::mutex> lock(lock_->mu);
  socket->close(ignored);
  sessions_.erase(socket);
  // The last reference, let go under the lock: once StopSessions() sees
  // no session, none touches io_ any more.
  socket.reset();
  lock_->cv.notify_all();  // StopSessions() waits for the last session
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
  std::shared_ptr<SharedBuffer> pooled;
  {
    std::lock_guard<std::mutex> lock(lock_->mu);
    if (parts_.incoming->Contains(header.transfer)) {
      return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
    }
    pooled = parts_.pool->Take(header.offset);
  }
  MLF_LOG(DEBUG) << "transfer " << header.transfer << " of " << header.offset
                 << " bytes: " << (pooled ? "reusing a pooled" : "new") << " receive buffer";
  if (pooled == nullptr) {
    auto buffer = SharedBuffer::Create(header.offset);
    if (!buffer.ok()) return buffer.status();
    pooled = std::make_shared<SharedBuffer>(std::move(*buffer));
  }
  std::lock_guard<std::mutex> lock(lock_->mu);
  if (parts_.incoming->Contains(header.transfer)) {
    parts_.pool->Recycle(std::move(pooled));
    return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
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
  RETURN_IF_ERROR(Begin(begin));
  std::shared_ptr<SharedBuffer> buffer = BufferFor(begin);
  if (buffer == nullptr) return absl::OkStatus();  // cancelled meanwhile
  // One copy, without the lock (nobody else writes a transfer's buffer
  // before its bytes are accepted below).
  std::memcpy(buffer->data(), data.data(), data.size());
  const uint8_t* base = buffer->data();
  std::lock_guard<std::mutex> lock(lock_->mu);
  // As in Arrived: the incoming transfer holds the buffer while it is
  // incoming; once it is not, AcceptLocked does not touch it.
  buffer.reset();
  PacketHeader piece = begin;
  piece.kind = transport::PacketKind::kData;
  uint64_t offset = 0;
  do {
    piece.offset = offset;
    piece.length = static_cast<uint32_t>(std::min<uint64_t>(packet_bytes, data.size() - offset));
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
}

std::optional<uint32_t> DataReceiver::ExpectedJobLocked(uint64_t transfer) const {
  if (auto job = parts_.rounds->JobOfLocked(transfer)) return job;
  if (auto aggregate = parts_.aggregation->AggregateOf(transfer)) {
    return parts_.aggregation->JobOf(*aggregate);
  }
  return parts_.deliveries->JobExpectingLocked(transfer);
}

std::shared_ptr<SharedBuffer> DataReceiver::BufferFor(const PacketHeader& header) {
  std::lock_guard<std::mutex> lock(lock_->mu);
  const Incoming* incoming = parts_.incoming->Find(header.transfer);
  return incoming == nullptr ? nullptr : incoming->buffer;
}

absl::Status DataReceiver::Arrived(const PacketHeader& header,
                                   std::shared_ptr<SharedBuffer> buffer, bool* complete) {
  const uint8_t* dst = buffer->data() + header.offset;
  std::lock_guard<std::mutex> lock(lock_->mu);
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
  std::lock_guard<std::mutex> lock(lock_->mu);
  parts_.incoming->Erase(header.transfer);
  parts_.reporter->ReportFailure(header.transfer, absl::StrCat("sender aborted: ", reason));
}

void DataReceiver::Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
                         const std::string& close_reason) {
  std::lock_guard<std::mutex> lock(lock_->mu);
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
