#include "daemon/transport/get_client.h"

#include <algorithm>
#include <iterator>
#include <map>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlfabric::transport {

using boost::asio::ip::tcp;

GetClient::GetClient(boost::asio::io_context& io, SendWatchdog& watchdog,
                     size_t max_idle_per_address, uint64_t max_model_bytes,
                     const DataKeys* keys, std::string my_host, double peer_timeout_s)
    : io_(io),
      watchdog_(watchdog),
      max_idle_per_address_(max_idle_per_address),
      max_model_bytes_(max_model_bytes),
      keys_(keys),
      my_host_(std::move(my_host)),
      peer_timeout_s_(peer_timeout_s) {}

absl::Status GetClient::Connect(const std::string& peer, const std::string& address,
                                const tcp::endpoint& endpoint, Connection* out) {
  out->socket = std::make_shared<tcp::socket>(io_);
  {
    MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("get: the daemon is stopping");
    // Forget the connections that are gone, then remember this one.
    opened_.erase(std::remove_if(opened_.begin(), opened_.end(),
                                 [](const auto& weak) { return weak.expired(); }),
                  opened_.end());
    opened_.push_back(out->socket);
  }
  boost::system::error_code error;
  out->socket->open(endpoint.protocol(), error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("get: cannot open a socket for ", peer, " at ",
                                               address, ": ", error.message()));
  }
  // Before the connect: a host cut off does not hold the connect either.
  RETURN_IF_ERROR(SetPeerTimeout(out->socket->native_handle(), peer_timeout_s_));
  out->socket->connect(endpoint, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("get: cannot reach ", peer, " at ", address, ": ",
                                               error.message()));
  }
  out->socket->set_option(tcp::no_delay(true), error);
  out->auth = SessionAuth();
  if (keys_ != nullptr) {
    auto auth = InitiatorHandshake(out->socket->native_handle(), *keys_, my_host_,
                                   absl::StrCat(peer, " at ", address));
    if (!auth.ok()) return absl::Status(auth.status().code(), absl::StrCat("get: ", auth.status().message()));
    out->auth = std::move(*auth);
  }
  return absl::OkStatus();
}

absl::StatusOr<PacketHeader> GetClient::Exchange(const PacketHeader& request,
                                                 const std::string& payload, Connection* out) {
  if (!out->auth.Allows(request.job)) {
    ASSIGN_OR_RETURN(std::string proof, JobProof(out->auth, *keys_, request.job));
    PacketHeader frame;
    frame.kind = PacketKind::kJobProof;
    frame.job = request.job;
    frame.length = static_cast<uint32_t>(proof.size());
    RETURN_IF_ERROR(WritePacket(watchdog_, out->socket->native_handle(), frame, proof.data(),
                                frame.length));
    out->auth.jobs.insert(request.job);
  }
  RETURN_IF_ERROR(WritePacket(watchdog_, out->socket->native_handle(), request, payload.data(),
                              static_cast<uint32_t>(payload.size())));
  out->reader.emplace(out->socket->native_handle());
  return out->reader->ReadHeader();
}

absl::Status GetClient::Request(const std::string& peer, const std::string& address,
                                const PacketHeader& request, const v1::DataGetRequest& body,
                                Connection* out) {
  auto endpoint = ParseEndpoint(address);
  if (!endpoint.ok()) return endpoint.status();
  out->address = address;
  out->contributions = 0;
  // A connection left by an earlier get to that daemon is reused (its
  // session there is waiting for the next request); a new one otherwise.
  {
    MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("get: the daemon is stopping");
    auto idle = idle_.find(address);
    if (idle != idle_.end()) {
      out->socket = std::move(idle->second.socket);
      out->auth = std::move(idle->second.auth);
      idle_.erase(idle);
    }
  }
  const bool reused = out->socket != nullptr;
  if (!reused) RETURN_IF_ERROR(Connect(peer, address, *endpoint, out));
  const std::string payload = body.SerializeAsString();
  absl::StatusOr<PacketHeader> reply = Exchange(request, payload, out);
  if (reply.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(absl::StrCat("get: ", reply.status().message()));
  }
  if (reused && !reply.ok()) {
    // The far end had closed the kept connection (its daemon restarted):
    // once more on a new one.
    RETURN_IF_ERROR(Connect(peer, address, *endpoint, out));
    reply = Exchange(request, payload, out);
  }
  if (!reply.ok()) return absl::UnavailableError(absl::StrCat("get: ", reply.status().message()));
  if (reply->kind != PacketKind::kGetReply || reply->transfer != request.transfer) {
    return absl::DataLossError(absl::StrCat("get: malformed reply from ", peer, "'s daemon"));
  }
  std::string bytes(reply->length, '\0');
  RETURN_IF_ERROR(out->reader->ReadPayload(bytes.data(), bytes.size()));
  RETURN_IF_ERROR(VerifyPayload(*reply, bytes.data()));
  if (!out->reply.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("get: malformed reply body from ", peer, "'s daemon"));
  }
  out->header = *reply;
  if (!out->reply.error().empty()) return absl::UnavailableError(out->reply.error());
  if (reply->offset > max_model_bytes_) {
    return absl::DataLossError(absl::StrCat("get: model size ", reply->offset, " from ", peer,
                                            "'s daemon is out of range"));
  }
  return absl::OkStatus();
}

absl::Status GetClient::Receive(Connection& connection, SharedBuffer& buffer,
                                const std::function<void(uint64_t, uint64_t)>& arrived) {
  const uint64_t total = connection.header.offset;
  if (!connection.reader.has_value() || buffer.size() < total) {
    return absl::InvalidArgumentError(absl::StrCat("get: a buffer of ", buffer.size(),
                                                   " bytes for a model of ", total));
  }
  FrameReader& reader = *connection.reader;
  uint64_t received = 0;
  // The ranges written so far (begin -> end, merged): a byte that came
  // twice would let `received` reach `total` with a hole left unwritten,
  // and the buffer may be a reused one (its old bytes would show through).
  std::map<uint64_t, uint64_t> covered;
  while (received < total) {
    auto data = reader.ReadHeader();
    if (!data.ok()) {
      return absl::UnavailableError(
          absl::StrCat("get: model transfer cut: ", data.status().message()));
    }
    if (data->kind == PacketKind::kAbort && data->length <= kMaxControlBytes) {
      std::string reason(data->length, '\0');
      RETURN_IF_ERROR(reader.ReadPayload(reason.data(), reason.size()));
      return absl::AbortedError(reason);
    }
    if (data->kind != PacketKind::kData || data->offset > total ||
        data->length > total - data->offset) {
      return absl::DataLossError("get: malformed model packet");
    }
    const uint64_t begin = data->offset, end = data->offset + data->length;
    auto next = covered.upper_bound(begin);
    if ((next != covered.end() && next->first < end) ||
        (next != covered.begin() && std::prev(next)->second > begin)) {
      return absl::DataLossError(absl::StrCat("get: bytes [", begin, ", ", end,
                                              ") of the model arrived twice"));
    }
    if (data->tensor != 0 && connection.contributions != 0 &&
        data->tensor != connection.contributions) {
      return absl::DataLossError(absl::StrCat("get: packets of one sum say it sums ",
                                              connection.contributions, " and ", data->tensor,
                                              " pushes"));
    }
    if (data->tensor != 0) connection.contributions = data->tensor;
    uint8_t* dst = buffer.data() + data->offset;
    RETURN_IF_ERROR(reader.ReadPayload(dst, data->length));
    RETURN_IF_ERROR(VerifyPayload(*data, dst));
    received += data->length;
    if (end > begin) {
      uint64_t merged_begin = begin, merged_end = end;
      if (next != covered.begin() && std::prev(next)->second == begin) {
        merged_begin = std::prev(next)->first;
        covered.erase(std::prev(next));
      }
      if (next != covered.end() && next->first == end) {
        merged_end = next->second;
        covered.erase(next);
      }
      covered[merged_begin] = merged_end;
    }
    if (arrived) arrived(data->offset, data->offset + data->length);
  }
  return absl::OkStatus();
}

void GetClient::Keep(Connection& connection) {
  if (!connection.socket) return;
  MutexLock lock(&mu_);
  if (!shut_down_ && idle_.count(connection.address) < max_idle_per_address_) {
    idle_.emplace(connection.address,
                  Idle{std::move(connection.socket), std::move(connection.auth)});
  }
}

void GetClient::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  boost::system::error_code ignored;
  for (const auto& weak : opened_) {
    if (std::shared_ptr<tcp::socket> socket = weak.lock()) {
      socket->shutdown(tcp::socket::shutdown_both, ignored);
    }
  }
  idle_.clear();
}

size_t GetClient::idle() const {
  MutexLock lock(&mu_);
  return idle_.size();
}

absl::Status WriteGetReply(SendWatchdog& watchdog, int fd, const PacketHeader& request,
                           const v1::DataGetReply& body, int64_t bytes) {
  const std::string payload = body.SerializeAsString();
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.job = request.job;
  reply.transfer = request.transfer;
  reply.offset = static_cast<uint64_t>(std::max<int64_t>(bytes, 0));
  return WritePacket(watchdog, fd, reply, payload.data(), static_cast<uint32_t>(payload.size()));
}

}  // namespace mlfabric::transport
