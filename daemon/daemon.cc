#include "daemon/daemon.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <cerrno>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <deque>
#include <functional>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregator/reduce.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace mlfabric {

namespace asio = boost::asio;
using asio::ip::tcp;
using transport::PacketHeader;
using transport::PacketKind;

namespace {

constexpr int64_t kMaxTransferBytes = int64_t{64} << 30;
// A push of fewer packets per core is checksummed by one thread.
constexpr size_t kPacketsPerChecksumThread = 256;
// Connections kept for later gets, per server daemon.
constexpr size_t kMaxIdleGetConnections = 4;

std::string GrpcError(const grpc::Status& status) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  const char* name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
  return absl::StrCat(name, ": ", status.error_message());
}

std::unique_ptr<grpc::ClientContext> RpcContext(double timeout_s = 10) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  return context;
}

// Writes a packet: header and payload go out in one gather write, straight
// from the payload's buffer. `crc`, when given, is the payload's CRC-32C
// computed earlier.
absl::Status WritePacket(transport::SendWatchdog& watchdog, tcp::socket& socket,
                         PacketHeader header, const void* payload, uint32_t length,
                         std::optional<uint32_t> crc = std::nullopt) {
  uint8_t head[transport::kHeaderBytes];
  if (crc.has_value()) {
    header.length = length;
    header.crc32c = *crc;
    transport::EncodeHeader(header, head);
  } else {
    transport::EncodePacketHeader(header, payload, length, head);
  }
  iovec iov[2] = {{head, sizeof(head)}, {const_cast<void*>(payload), length}};
  return watchdog.SendAll(socket.native_handle(), iov, length > 0 ? 2 : 1);
}

// Transfer offsets and lengths of the packets ReleaseLocked cuts a push
// into: its tensors (or the whole buffer) in order, each split every
// `payload_bytes`, clipped to the buffer.
void PacketLayout(const std::vector<v1::TensorInfo>& tensors, uint64_t total,
                  uint64_t payload_bytes, std::vector<uint64_t>* offsets,
                  std::vector<uint32_t>* lengths) {
  auto add_tensor = [&](uint64_t start, uint64_t bytes) {
    const uint64_t end = std::min(total, start + bytes);
    for (uint64_t offset = start; offset < end; offset += payload_bytes) {
      offsets->push_back(offset);
      lengths->push_back(static_cast<uint32_t>(std::min(payload_bytes, end - offset)));
    }
  };
  if (tensors.empty()) {
    add_tensor(0, total);
    return;
  }
  uint64_t start = 0;
  for (const v1::TensorInfo& tensor : tensors) {
    add_tensor(start, static_cast<uint64_t>(std::max<int64_t>(0, tensor.bytes())));
    start += static_cast<uint64_t>(std::max<int64_t>(0, tensor.bytes()));
  }
}

// Reads Mercury frames from a blocking TCP socket. While data streams, a
// packet costs one system call instead of two: each payload read scatters
// whatever of the next header has already arrived into the header buffer.
class FrameReader {
 public:
  explicit FrameReader(tcp::socket& socket) : fd_(socket.native_handle()) {}

  // The next header; kUnavailable on a clean close before any byte of it.
  absl::StatusOr<PacketHeader> ReadHeader() {
    while (have_ < sizeof(head_)) {
      const ssize_t n = ::recv(fd_, head_ + have_, sizeof(head_) - have_, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n == 0 ? "closed" : std::strerror(errno);
        if (have_ == 0) return absl::UnavailableError(why);
        return absl::InvalidArgumentError(
            absl::StrCat("truncated frame: header cut after ", have_, " bytes (", why, ")"));
      }
      have_ += static_cast<size_t>(n);
    }
    have_ = 0;
    return transport::ParseHeader(head_, sizeof(head_), transport::kMaxPayloadBytes);
  }

  // Exactly `size` payload bytes into `out` (and maybe the start of the
  // next header).
  absl::Status ReadPayload(void* out, size_t size) {
    auto* dst = static_cast<uint8_t*>(out);
    size_t got = 0;
    while (got < size) {
      iovec iov[2] = {{dst + got, size - got}, {head_, sizeof(head_)}};
      msghdr message{};
      message.msg_iov = iov;
      message.msg_iovlen = 2;
      const ssize_t n = ::recvmsg(fd_, &message, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("truncated frame: payload cut after ", got, " of ", size, " bytes (",
                         n == 0 ? "closed" : std::strerror(errno), ")"));
      }
      const size_t bytes = static_cast<size_t>(n);
      if (bytes > size - got) {
        have_ = bytes - (size - got);
        got = size;
      } else {
        got += bytes;
      }
    }
    return absl::OkStatus();
  }

 private:
  const int fd_;
  uint8_t head_[transport::kHeaderBytes];
  size_t have_ = 0;  // bytes of the next header already read
};

absl::StatusOr<tcp::endpoint> ParseEndpoint(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not ip:port"));
  }
  boost::system::error_code error;
  auto ip = asio::ip::make_address(address.substr(0, colon), error);
  if (error) return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
  const int port = std::atoi(address.substr(colon + 1).c_str());
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", address, "'"));
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

}  // namespace

namespace {

daemon::JobPriorityPolicy MakeJobPriorityPolicy(const DaemonConfig& config) {
  daemon::JobPriorityOptions options;
  options.mode = daemon::ParseJobPriorityMode(config.job_priority).value_or(
      daemon::JobPriorityMode::kFifo);  // the config loader accepts only valid names
  options.rotation_period_s = config.job_priority_period_s;
  return daemon::JobPriorityPolicy(options);
}

}  // namespace

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)),
      send_watchdog_(std::make_unique<transport::SendWatchdog>(config_.send_timeout_s)),
      packet_queue_(MakeJobPriorityPolicy(config_)) {}

Daemon::~Daemon() { Stop(); }

std::optional<uint32_t> Daemon::PacketChecksums::Find(uint64_t offset, uint32_t length) const {
  auto it = std::lower_bound(offsets.begin(), offsets.end(), offset);
  if (it == offsets.end() || *it != offset) return std::nullopt;
  const size_t index = static_cast<size_t>(it - offsets.begin());
  const size_t part = index / part_size;
  if (part >= parts || index - part * part_size >= done[part].load(std::memory_order_acquire) ||
      lengths[index] != length) {
    return std::nullopt;
  }
  return crcs[index];
}

size_t Daemon::PacketChecksums::Ready() const {
  size_t total = 0;
  for (size_t p = 0; p < parts; ++p) total += done[p].load(std::memory_order_relaxed);
  return total;
}

std::string Daemon::ServerKey(uint32_t job_id, const std::string& server) {
  return absl::StrCat(job_id, "/", server);
}

Daemon::Stats Daemon::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

absl::Status Daemon::Start() {
  // Data plane first: its port is part of the registration.
  auto endpoint = ParseEndpoint(absl::StrCat(config_.listen_address, ":1"));
  if (!endpoint.ok()) return endpoint.status();
  boost::system::error_code error;
  data_acceptor_ = std::make_unique<tcp::acceptor>(io_);
  tcp::endpoint bind_to(endpoint->address(), static_cast<uint16_t>(config_.data_port));
  data_acceptor_->open(bind_to.protocol(), error);
  if (!error) data_acceptor_->set_option(tcp::acceptor::reuse_address(true), error);
  if (!error) data_acceptor_->bind(bind_to, error);
  if (!error) data_acceptor_->listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot listen for data on ",
                                               config_.listen_address, ":", config_.data_port,
                                               ": ", error.message()));
  }
  data_address_ = absl::StrCat(config_.listen_address, ":", data_acceptor_->local_endpoint().port());

  // Local applications.
  local_listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (config_.local_socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_socket path is too long: ", config_.local_socket));
  }
  std::strncpy(addr.sun_path, config_.local_socket.c_str(), sizeof(addr.sun_path) - 1);
  ::unlink(config_.local_socket.c_str());
  if (::bind(local_listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(local_listen_fd_, 64) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on local socket ",
                                               config_.local_socket, ": ", std::strerror(errno)));
  }

  if (config_.unscheduled_bps > 0) {
    auto bucket = daemon::TokenBucket::Create(
        config_.unscheduled_bps, 2.0 * static_cast<double>(config_.payload_bytes),
        clock_.NowSeconds());
    if (!bucket.ok()) return bucket.status();
    unscheduled_budget_.emplace(std::move(*bucket));
  }
  channel_ = grpc::CreateChannel(config_.scheduler, grpc::InsecureChannelCredentials());
  stub_ = v1::Scheduler::NewStub(channel_);
  if (auto status = RegisterHost(); !status.ok()) return status;

  if (auto status = StartMonitor(); !status.ok()) return status;
  threads_.emplace_back([this] { ScheduleStreamLoop(); });
  threads_.emplace_back([this] { SenderLoop(); });
  threads_.emplace_back([this] { ClockSyncLoop(); });
  threads_.emplace_back([this] { DataAcceptLoop(); });
  threads_.emplace_back([this] { LocalAcceptLoop(); });
  threads_.emplace_back([this] { FailureReporterLoop(); });
  MLF_LOG(INFO) << "host " << config_.host << " serving: data " << data_address_ << ", local "
                << config_.local_socket << ", scheduler " << config_.scheduler;
  return absl::OkStatus();
}

absl::Status Daemon::RegisterHost() {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(config_.register_timeout_s);
  std::string last_error;
  while (!stopping_.load()) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(config_.host);
    request.set_data_address(data_address_);
    request.set_uplink_bps(config_.uplink_bps);
    request.set_downlink_bps(config_.downlink_bps);
    const double sent_s = clock_.NowSeconds();
    request.set_daemon_time_s(sent_s);
    v1::RegisterHostReply reply;
    auto context = RpcContext(2);
    grpc::Status status = stub_->RegisterHost(context.get(), request, &reply);
    const double received_s = clock_.NowSeconds();
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      incarnation_ = reply.incarnation();
      // NTP-style: the reply was stamped halfway through the round trip.
      clock_offset_s_ = reply.scheduler_time_s() - (sent_s + received_s) / 2;
      MLF_LOG(INFO) << "registered with the scheduler (incarnation " << incarnation_
                    << ", clock offset " << clock_offset_s_ * 1e3 << " ms, rtt "
                    << (received_s - sent_s) * 1e3 << " ms)";
      return absl::OkStatus();
    }
    last_error = GrpcError(status);
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat("cannot register with the scheduler at ",
                                             config_.scheduler, ": ", last_error));
}

void Daemon::ClockSyncLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(config_.clock_sync_period_s),
                   [this] { return stopping_.load(); });
      if (stopping_.load()) return;
    }
    double best_rtt_s = 1e9, best_offset_s = 0;
    for (int sample = 0; sample < 3; ++sample) {
      v1::SyncClockRequest request;
      request.set_host(config_.host);
      v1::SyncClockReply reply;
      auto context = RpcContext(1);
      const double sent_s = clock_.NowSeconds();
      grpc::Status status = stub_->SyncClock(context.get(), request, &reply);
      const double received_s = clock_.NowSeconds();
      if (!status.ok()) break;
      if (received_s - sent_s < best_rtt_s) {
        best_rtt_s = received_s - sent_s;
        best_offset_s = reply.scheduler_time_s() - (sent_s + received_s) / 2;
      }
    }
    if (best_rtt_s == 1e9) continue;  // scheduler unreachable: the stream loop handles it
    std::lock_guard<std::mutex> lock(mu_);
    if (std::abs(best_offset_s - clock_offset_s_) > 1e-3) {
      MLF_LOG(INFO) << "clock offset " << clock_offset_s_ * 1e3 << " -> " << best_offset_s * 1e3
                    << " ms (rtt " << best_rtt_s * 1e3 << " ms)";
    }
    clock_offset_s_ = best_offset_s;
    for (auto& [id, outgoing] : outgoing_) outgoing.pacer->SetClockOffset(best_offset_s);
  }
}

absl::Status Daemon::StartMonitor() {
  if (config_.monitor_interface.empty() && config_.monitor_trace.empty()) return absl::OkStatus();
  monitor::MonitorConfig mc;
  mc.interface = config_.monitor_interface;
  mc.trace = config_.monitor_trace;
  mc.tc_class = config_.monitor_tc_class;
  mc.capacity_up_bps = config_.uplink_bps > 0 ? config_.uplink_bps : 10e9;
  mc.capacity_down_bps = config_.downlink_bps > 0 ? config_.downlink_bps : 10e9;
  mc.period_s = config_.monitor_period_s;
  mc.ewma_tau_s = config_.monitor_ewma_tau_s;
  mc.report_lag_s = config_.report_lag_s;
  mc.report_threshold = config_.report_threshold;
  mc.report_max_interval_s = config_.report_max_interval_s;
  auto report = [this](double up_bps, double down_bps) {
    v1::BandwidthReport request;
    request.set_host(config_.host);
    request.set_uplink_bps(up_bps);
    request.set_downlink_bps(down_bps);
    v1::BandwidthAck ack;
    auto context = RpcContext(2);
    grpc::Status status = stub_->ReportBandwidth(context.get(), request, &ack);
    if (!status.ok()) {
      MLF_LOG(WARNING) << "cannot report bandwidth: " << GrpcError(status);
    }
  };
  // MLfabric's own data-plane bytes are not background load (DESIGN.md §6).
  auto own = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return monitor::OwnBytes{static_cast<uint64_t>(stats_.bytes_received),
                             static_cast<uint64_t>(stats_.bytes_sent)};
  };
  auto created = monitor::BandwidthMonitor::Create(mc, &clock_, report, own);
  if (!created.ok()) return created.status();
  monitor_ = std::move(*created);
  monitor_->Start();
  MLF_LOG(INFO) << "bandwidth monitor on "
                << (mc.trace.empty() ? "interface " + mc.interface : "trace " + mc.trace);
  return absl::OkStatus();
}

void Daemon::Stop() {
  if (stopping_.exchange(true)) return;
  if (monitor_) monitor_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_context_) stream_context_->TryCancel();
    for (const auto& app : apps_) app->channel->Shutdown();
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(reports_mu_);
    failure_reports_.clear();  // the scheduler marks this host down anyway
  }
  reports_cv_.notify_all();
  boost::system::error_code ignored;
  if (data_acceptor_) {
    // close() alone does not wake a thread blocked in accept(); shutdown does.
    ::shutdown(data_acceptor_->native_handle(), SHUT_RDWR);
    data_acceptor_->close(ignored);
  }
  if (local_listen_fd_ >= 0) ::shutdown(local_listen_fd_, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    for (auto& [address, socket] : peers_) socket->close(ignored);
  }
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  if (local_listen_fd_ >= 0) ::close(local_listen_fd_);
  ::unlink(config_.local_socket.c_str());
}

absl::Status Daemon::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopping_.load() || !fatal_.ok(); });
  return fatal_;
}

// ---------------------------------------------------------------- control

void Daemon::ScheduleStreamLoop() {
  while (!stopping_.load()) {
    v1::StreamSchedulesRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_host(config_.host);
      request.set_incarnation(incarnation_);
      stream_context_ = std::make_unique<grpc::ClientContext>();
    }
    auto reader = stub_->StreamSchedules(stream_context_.get(), request);
    v1::DaemonCommand command;
    while (reader->Read(&command)) HandleCommand(command);
    grpc::Status status = reader->Finish();
    if (stopping_.load()) break;
    MLF_LOG(WARNING) << "lost the scheduler's schedule stream: " << GrpcError(status)
                     << "; failing pending pushes and re-registering";
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, push] : pushes_) {
        v1::LocalMessage done;
        done.mutable_push_done()->set_request_id(push.request_id);
        done.mutable_push_done()->set_outcome(v1::OUTCOME_FAILED);
        done.mutable_push_done()->set_reason("the daemon lost its connection to the scheduler");
        (void)push.app->channel->Send(done);
      }
      pushes_.clear();
      for (const auto& [id, outgoing] : outgoing_) packet_queue_.RemoveTransfer(id);
      outgoing_.clear();
      release_at_.clear();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (auto status = RegisterHost(); !status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      fatal_ = status;
      cv_.notify_all();
      return;
    }
    // The scheduler may have restarted: registered applications register again.
    std::vector<std::shared_ptr<AppSession>> apps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      apps.assign(apps_.begin(), apps_.end());
    }
    for (const auto& app : apps) {
      if (!app->registered) continue;
      v1::RegisterEntityRequest entity;
      entity.set_job(app->job);
      entity.set_job_token(app->job_token);
      entity.set_role(app->role);
      entity.set_name(app->name);
      entity.set_host(config_.host);
      entity.set_round_size(app->registration.round_size());
      entity.set_delay_bound(app->registration.delay_bound());
      entity.set_divergence_bound(app->registration.divergence_bound());
      v1::RegisterEntityReply reply;
      auto context = RpcContext();
      (void)stub_->RegisterEntity(context.get(), entity, &reply);
    }
  }
}

void Daemon::HandleCommand(const v1::DaemonCommand& command) {
  // A push's commands can only follow its SubmitUpdate reply; taking
  // submit_mu_ lets a HandlePush that is still recording the reply finish.
  { std::lock_guard<std::mutex> wait_for_submits(submit_mu_); }
  std::lock_guard<std::mutex> lock(mu_);
  switch (command.command_case()) {
    case v1::DaemonCommand::kSend:
      ScheduleSendLocked(command.send());
      break;
    case v1::DaemonCommand::kAggregate:
      StartAggregationLocked(command.aggregate());
      break;
    case v1::DaemonCommand::kExpect: {
      const v1::ExpectDelivery& expect = command.expect();
      if (expect.round_size() > 0) {
        JoinRoundLocked(expect);
        break;
      }
      const std::string key = ServerKey(expect.job_id(), expect.server());
      ServerEndpoint& endpoint = servers_[key];
      Delivery& delivery = endpoint.expected[expect.sequence()];
      delivery.info = expect;
      if (endpoint.app == nullptr) {
        delivery.cancelled = true;
        delivery.cancel_reason = "server application is not connected";
        ReportFailureAsync(expect.transfer_id(),
                           absl::StrCat("server '", expect.server(), "' is not connected to ",
                                        config_.host, "'s daemon"));
      }
      TryDeliverLocked(expect.job_id(), expect.server());
      break;
    }
    case v1::DaemonCommand::kCancel: {
      const v1::CancelDelivery& cancel = command.cancel();
      if (cancel.release_hold()) {
        replica_holds_.erase(cancel.transfer_id());
        break;
      }
      if (cancel.fail_round()) {
        FailRoundLocked(RoundLocked(cancel.job_id(), cancel.server(), cancel.round()),
                        cancel.reason());
        break;
      }
      if (auto member = round_of_.find(cancel.transfer_id()); member != round_of_.end()) {
        FailRoundLocked(member->second, absl::StrCat("push ", cancel.transfer_id(),
                                                     " of the round failed: ", cancel.reason()));
        break;
      }
      if (aggregations_.count(cancel.transfer_id())) {
        DropAggregationLocked(cancel.transfer_id(), cancel.reason());
        break;
      }
      for (auto& [key, endpoint] : servers_) {
        auto it = endpoint.expected.find(cancel.sequence());
        if (it == endpoint.expected.end() ||
            it->second.info.transfer_id() != cancel.transfer_id()) {
          continue;
        }
        it->second.cancelled = true;
        it->second.cancel_reason = cancel.reason();
        incoming_.erase(cancel.transfer_id());
        TryDeliverLocked(it->second.info.job_id(), it->second.info.server());
        break;
      }
      break;
    }
    case v1::DaemonCommand::kOutcome: {
      const v1::PushOutcome& outcome = command.outcome();
      auto it = pushes_.find(outcome.transfer_id());
      if (it == pushes_.end()) break;
      v1::LocalMessage done;
      v1::LocalPushDone* body = done.mutable_push_done();
      body->set_request_id(it->second.request_id);
      body->set_outcome(outcome.outcome());
      body->set_reason(outcome.reason());
      body->set_applied_version(outcome.applied_version());
      body->set_delay(outcome.delay());
      (void)it->second.app->channel->Send(done);
      if (outcome.hold_for_replica()) replica_holds_[outcome.transfer_id()] = it->second;
      pushes_.erase(it);
      break;
    }
    default:
      MLF_LOG(WARNING) << "ignoring an unknown command from the scheduler";
  }
}

void Daemon::ReportFailureAsync(uint64_t transfer_id, const std::string& error) {
  v1::CompletionReport report;
  report.set_host(config_.host);
  report.set_transfer_id(transfer_id);
  report.set_applied(false);
  report.set_error(error);
  // Callers hold mu_: the report is queued for the reporter thread (one
  // thread however many failures come at once, e.g. a failed round).
  {
    std::lock_guard<std::mutex> lock(reports_mu_);
    failure_reports_.push_back(std::move(report));
  }
  reports_cv_.notify_one();
}

void Daemon::FailureReporterLoop() {
  while (true) {
    v1::CompletionReport report;
    {
      std::unique_lock<std::mutex> lock(reports_mu_);
      reports_cv_.wait(lock, [&] { return stopping_.load() || !failure_reports_.empty(); });
      if (failure_reports_.empty()) return;  // stopping
      report = std::move(failure_reports_.front());
      failure_reports_.pop_front();
    }
    ReportCompletion(report);
  }
}

void Daemon::ReportCompletion(const v1::CompletionReport& report) {
  v1::CompletionAck ack;
  auto context = RpcContext();
  grpc::Status status = stub_->ReportCompletion(context.get(), report, &ack);
  if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
    MLF_LOG(WARNING) << "cannot report completion of transfer " << report.transfer_id() << ": "
                     << GrpcError(status);
  }
}

// ------------------------------------------------------------ local apps

void Daemon::LocalAcceptLoop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(local_listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (!stopping_.load()) MLF_LOG(ERROR) << "local accept failed: " << std::strerror(errno);
      return;
    }
    auto app = std::make_shared<AppSession>();
    app->channel = std::make_shared<LocalChannel>(fd);
    std::lock_guard<std::mutex> lock(mu_);
    apps_.insert(app);
    std::thread([this, app] { AppLoop(app); }).detach();
  }
}

void Daemon::AppLoop(std::shared_ptr<AppSession> app) {
  while (!stopping_.load()) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = app->channel->Receive(&message, &fd);
    if (!status.ok()) {
      if (status.code() != absl::StatusCode::kUnavailable) {
        MLF_LOG(WARNING) << "closing local session of '" << app->name << "': " << status.message();
      }
      break;
    }
    switch (message.body_case()) {
      case v1::LocalMessage::kRegister:
        HandleRegister(app, message.register_());
        break;
      case v1::LocalMessage::kPush:
        HandlePush(app, message.push(), fd);
        fd = -1;
        break;
      case v1::LocalMessage::kGet:
        HandleGet(app, message.get());
        break;
      case v1::LocalMessage::kUpdateAck:
        HandleUpdateAck(message.update_ack());
        break;
      case v1::LocalMessage::kModelReply:
        HandleModelReply(message.model_reply(), fd);
        fd = -1;
        break;
      default:
        MLF_LOG(WARNING) << "unexpected local message " << message.body_case() << " from '"
                         << app->name << "'";
    }
    if (fd >= 0) ::close(fd);
  }
  AppGone(app);
}

void Daemon::HandleRegister(const std::shared_ptr<AppSession>& app,
                            const v1::LocalRegister& request) {
  v1::LocalMessage reply;
  v1::LocalRegistered* body = reply.mutable_registered();
  if (app->registered) {
    body->set_error("this connection is already registered");
    (void)app->channel->Send(reply);
    return;
  }
  v1::RegisterEntityRequest entity;
  entity.set_job(request.job());
  entity.set_job_token(request.job_token());
  entity.set_role(request.role());
  entity.set_name(request.name());
  entity.set_host(config_.host);
  entity.set_round_size(request.round_size());
  entity.set_delay_bound(request.delay_bound());
  entity.set_divergence_bound(request.divergence_bound());
  v1::RegisterEntityReply entity_reply;
  auto context = RpcContext();
  grpc::Status status = stub_->RegisterEntity(context.get(), entity, &entity_reply);
  if (!status.ok()) {
    body->set_error(absl::StrCat("scheduler refused the registration: ", GrpcError(status)));
    (void)app->channel->Send(reply);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    app->job = request.job();
    app->job_token = request.job_token();
    app->name = request.name();
    app->role = request.role();
    app->job_id = entity_reply.job_id();
    app->registered = true;
    app->registration = request;
    if (request.role() == v1::ROLE_SERVER) {
      ServerEndpoint& endpoint = servers_[ServerKey(app->job_id, app->name)];
      endpoint.app = app;
    }
    // A hot-standby replica (§5.3) takes deliveries for "replica:<server>".
    if (request.role() == v1::ROLE_REPLICA) {
      ServerEndpoint& endpoint = servers_[ServerKey(app->job_id, "replica:" + app->name)];
      endpoint.app = app;
    }
  }
  body->set_model_version(entity_reply.model_version());
  (void)app->channel->Send(reply);
}

void Daemon::HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                        int fd) {
  auto fail = [&](const std::string& reason) {
    v1::LocalMessage done;
    done.mutable_push_done()->set_request_id(push.request_id());
    done.mutable_push_done()->set_outcome(v1::OUTCOME_FAILED);
    done.mutable_push_done()->set_reason(reason);
    (void)app->channel->Send(done);
  };
  if (fd < 0) {
    fail("push carries no shared-memory buffer");
    return;
  }
  auto buffer = SharedBuffer::Map(fd, static_cast<size_t>(std::max<int64_t>(push.bytes(), 0)));
  if (!buffer.ok()) {
    fail(std::string(buffer.status().message()));
    return;
  }
  if (!app->registered || app->role != v1::ROLE_WORKER) {
    fail("register as a worker before pushing");
    return;
  }
  v1::SubmitUpdateRequest request;
  request.set_job(app->job);
  request.set_src_host(config_.host);
  request.set_worker(app->name);
  request.set_server(push.server());
  request.set_bytes(push.bytes());
  request.set_version(push.version());
  request.set_norm(push.norm());
  *request.mutable_tensors() = push.tensors();
  request.set_dtype(push.dtype());
  std::unique_lock<std::mutex> submitting(submit_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_local_id(next_local_id_++);
    // Names the round a later get streams back, if the server runs rounds.
    app->last_round_push[push.server()] = push.version();
  }
  v1::SubmitUpdateReply reply;
  auto context = RpcContext();
  grpc::Status status = stub_->SubmitUpdate(context.get(), request, &reply);
  if (!status.ok()) {
    fail(absl::StrCat("scheduler refused the push: ", GrpcError(status)));
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  PendingPush& pending = pushes_[reply.transfer_id()];
  pending.app = app;
  pending.request_id = push.request_id();
  pending.buffer = std::make_shared<SharedBuffer>(std::move(*buffer));
  pending.tensors.assign(push.tensors().begin(), push.tensors().end());
  ++stats_.pushes;
  // Checksum the packets while the scheduler plans (see PacketChecksums).
  auto checksums = std::make_shared<PacketChecksums>();
  PacketLayout(pending.tensors, pending.buffer->size(), config_.payload_bytes,
               &checksums->offsets, &checksums->lengths);
  checksums->crcs.resize(checksums->offsets.size());
  // Large pushes are summed by up to one thread per core: before its
  // transfer starts the host's cores are otherwise idle, and the sooner all
  // packets are summed the fewer the sender must sum on the wire's path.
  const size_t packets = checksums->offsets.size();
  const size_t threads = std::clamp<size_t>(
      std::min<size_t>(std::thread::hardware_concurrency(), packets / kPacketsPerChecksumThread),
      1, 8);
  checksums->parts = threads;
  checksums->part_size = std::max<size_t>(1, (packets + threads - 1) / threads);
  checksums->done.reset(new std::atomic<size_t>[threads]);
  for (size_t p = 0; p < threads; ++p) checksums->done[p].store(0);
  pending.checksums = checksums;  // published complete: the sender may look now
  const std::shared_ptr<SharedBuffer> bytes = pending.buffer;
  const uint64_t transfer_id = reply.transfer_id();
  lock.unlock();
  submitting.unlock();  // the push is recorded: schedules may name it now
  auto sum_part = [checksums, bytes](size_t part) {
    const size_t begin = part * checksums->part_size;
    const size_t end = std::min(checksums->offsets.size(), begin + checksums->part_size);
    for (size_t i = begin; i < end; ++i) {
      if (checksums->sending.load(std::memory_order_relaxed)) return;
      checksums->crcs[i] = Crc32c(bytes->data() + checksums->offsets[i], checksums->lengths[i]);
      checksums->done[part].store(i + 1 - begin, std::memory_order_release);
    }
  };
  const double start_s = clock_.NowSeconds();
  std::vector<std::thread> helpers;
  for (size_t p = 1; p < threads; ++p) helpers.emplace_back(sum_part, p);
  sum_part(0);
  for (std::thread& helper : helpers) helper.join();
  MLF_LOG(DEBUG) << "checksummed push " << transfer_id << ": "
                 << checksums->Ready() << " of " << checksums->offsets.size() << " packets ahead of the sender ("
                 << threads << " threads) in "
                 << absl::StrFormat("%.3f", clock_.NowSeconds() - start_s) << " s, done at "
                 << absl::StrFormat("%.6f", clock_.NowSeconds());
}

void Daemon::HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) {
  if (!app->registered) {
    v1::LocalMessage done;
    done.mutable_get_done()->set_request_id(get.request_id());
    done.mutable_get_done()->set_error("register before calling get");
    (void)app->channel->Send(done);
    return;
  }
  const std::string job = app->job;
  std::lock_guard<std::mutex> lock(mu_);
  auto pushed = app->last_round_push.find(get.server());
  const int64_t round = pushed == app->last_round_push.end() ? -1 : pushed->second;
  // Session threads are detached: a finished thread is reclaimed at once
  // (kept joinable, one per get and per connection, they piled up until
  // thread creation failed), and at Stop() they end with the process.
  std::thread([this, app, get, job, round] {
    v1::LocalMessage done;
    v1::LocalGetDone* body = done.mutable_get_done();
    body->set_request_id(get.request_id());
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;
    absl::Status status = FetchModel(job, get.server(), &version, &model, round,
                                     static_cast<uint32_t>(std::max(0, get.priority())));
    if (!status.ok()) {
      body->set_error(std::string(status.message()));
      (void)app->channel->Send(done);
      return;
    }
    body->set_model_version(version);
    body->set_bytes(static_cast<int64_t>(model->size()));
    (void)app->channel->Send(done, model->fd());
  }).detach();
}

void Daemon::HandleUpdateAck(const v1::LocalUpdateAck& ack) {
  std::vector<v1::CompletionReport> round_reports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto delivery = round_deliveries_.find(ack.transfer_id());
    if (delivery != round_deliveries_.end()) {
      std::shared_ptr<Round> round = delivery->second;
      round_deliveries_.erase(delivery);
      if (round->reported) return;  // failed meanwhile; already reported
      round->reported = true;
      // A round advances the model by one version, whatever the callback
      // returned: it is the version the workers' gets already saw.
      for (const auto& [member, contributions] : round->members) {
        v1::CompletionReport report;
        report.set_host(config_.host);
        report.set_transfer_id(member);
        report.set_applied(ack.error().empty());
        report.set_model_version(round->round + 1);
        if (!ack.error().empty()) {
          report.set_error(absl::StrCat("server refused round ", round->round, ": ", ack.error()));
        }
        round_reports.push_back(std::move(report));
      }
    }
  }
  if (!round_reports.empty()) {
    for (const v1::CompletionReport& report : round_reports) ReportCompletion(report);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto done = awaiting_ack_.find(ack.transfer_id()); done != awaiting_ack_.end()) {
      RecycleLocked(std::move(done->second.second));
      awaiting_ack_.erase(done);
    }
  }
  v1::CompletionReport report;
  report.set_host(config_.host);
  report.set_transfer_id(ack.transfer_id());
  report.set_applied(ack.error().empty());
  report.set_model_version(ack.model_version());
  report.set_error(ack.error().empty() ? ""
                                       : absl::StrCat("server refused the update: ", ack.error()));
  ReportCompletion(report);
}

void Daemon::HandleModelReply(const v1::LocalModelReply& reply, int fd) {
  std::shared_ptr<SharedBuffer> buffer;
  std::string error = reply.error();
  if (error.empty()) {
    if (fd < 0) {
      error = "model reply carries no buffer";
    } else {
      auto mapped = SharedBuffer::Map(fd, static_cast<size_t>(std::max<int64_t>(reply.bytes(), 0)));
      fd = -1;
      if (mapped.ok()) {
        buffer = std::make_shared<SharedBuffer>(std::move(*mapped));
      } else {
        error = std::string(mapped.status().message());
      }
    }
  }
  if (fd >= 0) ::close(fd);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = model_replies_.find(reply.request_id());
  if (it == model_replies_.end()) return;  // the requester gave up
  it->second.done = true;
  it->second.error = error;
  it->second.version = reply.model_version();
  it->second.buffer = buffer;
  cv_.notify_all();
}

void Daemon::AppGone(const std::shared_ptr<AppSession>& app) {
  std::lock_guard<std::mutex> lock(mu_);
  apps_.erase(app);
  for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
    it = it->second.first == app ? awaiting_ack_.erase(it) : std::next(it);
  }
  if (app->role != v1::ROLE_SERVER && app->role != v1::ROLE_REPLICA) return;
  const std::string endpoint_name =
      app->role == v1::ROLE_REPLICA ? "replica:" + app->name : app->name;
  auto it = servers_.find(ServerKey(app->job_id, endpoint_name));
  if (it == servers_.end() || it->second.app != app) return;
  it->second.app = nullptr;
  MLF_LOG(WARNING) << "server '" << app->name << "' disconnected; failing "
                   << it->second.expected.size() << " expected update(s)";
  for (auto& [sequence, delivery] : it->second.expected) {
    if (delivery.cancelled) continue;
    delivery.cancelled = true;
    ReportFailureAsync(delivery.info.transfer_id(),
                       absl::StrCat("server '", app->name, "' disconnected before applying it"));
  }
  TryDeliverLocked(app->job_id, endpoint_name);
  const std::string key = ServerKey(app->job_id, app->name);
  for (auto& [round_key, round] : rounds_) {
    if (round_key.first == key && !round->reported) {
      FailRoundLocked(round, absl::StrCat("server '", app->name, "' disconnected"));
    }
  }
  for (auto& [id, reply] : model_replies_) {
    if (!reply.done && reply.server_app == app) {
      reply.done = true;
      reply.error = absl::StrCat("server '", app->name, "' disconnected");
    }
  }
  cv_.notify_all();
}

namespace {
// Free receive buffers kept for reuse: at most this many bytes, and this
// many buffers of one size.
constexpr size_t kMaxPooledBytes = size_t{2} << 30;
constexpr size_t kMaxPooledPerSize = 4;
}  // namespace

std::shared_ptr<SharedBuffer> Daemon::TakePooledLocked(size_t size) {
  auto it = buffer_pool_.find(size);
  if (it == buffer_pool_.end() || it->second.empty()) return nullptr;
  std::shared_ptr<SharedBuffer> buffer = std::move(it->second.back());
  it->second.pop_back();
  pooled_bytes_ -= size;
  return buffer;
}

void Daemon::RecycleLocked(std::shared_ptr<SharedBuffer> buffer) {
  // Only a buffer nobody else holds may be written again.
  if (buffer == nullptr || buffer.use_count() != 1) return;
  const size_t size = buffer->size();
  auto& free_list = buffer_pool_[size];
  if (free_list.size() >= kMaxPooledPerSize || pooled_bytes_ + size > kMaxPooledBytes) return;
  pooled_bytes_ += size;
  free_list.push_back(std::move(buffer));
}

void Daemon::TryDeliverLocked(uint32_t job_id, const std::string& server) {
  auto it = servers_.find(ServerKey(job_id, server));
  if (it == servers_.end()) return;
  ServerEndpoint& endpoint = it->second;
  while (!endpoint.expected.empty()) {
    auto next = endpoint.expected.begin();
    if (next->first < endpoint.next_sequence) {
      endpoint.expected.erase(next);
      continue;
    }
    if (next->first != endpoint.next_sequence) break;  // an earlier one is not announced yet
    Delivery& delivery = next->second;
    const uint64_t transfer_id = delivery.info.transfer_id();
    if (delivery.cancelled) {
      MLF_LOG(INFO) << "skipping update " << transfer_id << " (sequence " << next->first
                    << "): " << delivery.cancel_reason;
      incoming_.erase(transfer_id);
      endpoint.expected.erase(next);
      ++endpoint.next_sequence;
      continue;
    }
    auto incoming = incoming_.find(transfer_id);
    if (incoming == incoming_.end() || incoming->second.received < incoming->second.total) break;
    if (incoming->second.total != static_cast<uint64_t>(delivery.info.bytes())) {
      ReportFailureAsync(transfer_id, absl::StrCat("received ", incoming->second.total,
                                                   " bytes but the schedule said ",
                                                   delivery.info.bytes()));
      delivery.cancelled = true;
      continue;
    }
    v1::LocalMessage message;
    v1::LocalUpdate* update = message.mutable_update();
    update->set_transfer_id(transfer_id);
    update->set_worker(delivery.info.worker());
    update->set_version(delivery.info.version());
    update->set_norm(delivery.info.norm());
    update->set_bytes(delivery.info.bytes());
    update->set_sequence(next->first);
    update->set_count(std::max(1, delivery.info.constituents_size()));
    absl::Status sent = endpoint.app->channel->Send(message, incoming->second.buffer->fd());
    if (!sent.ok()) {
      ReportFailureAsync(transfer_id, absl::StrCat("cannot hand the update to server '", server,
                                                   "': ", sent.message()));
    } else {
      awaiting_ack_[transfer_id] = {endpoint.app, incoming->second.buffer};
    }
    ++stats_.deliveries;
    incoming_.erase(incoming);
    endpoint.expected.erase(next);
    ++endpoint.next_sequence;
  }
}

// ------------------------------------------------------ synchronous rounds

namespace {

// The grid the packet pool releases sums on (aggregator/packet_pool.h):
// what a worker's get can receive, or an aggregate can forward, as soon as
// it is final. It is the receiver's own, so senders may use any packet size.
constexpr uint64_t kRoundChunkBytes = 32 * 1024;

size_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return sizeof(float);
    case v1::DTYPE_FLOAT64: return sizeof(double);
    case v1::DTYPE_INT32: return sizeof(int32_t);
    case v1::DTYPE_INT64: return sizeof(int64_t);
    default: return 0;
  }
}

// The pool's element type for a round's or an aggregate's dtype.
std::optional<aggregator::DType> PoolType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return aggregator::DType::kFloat32;
    case v1::DTYPE_FLOAT64: return aggregator::DType::kFloat64;
    case v1::DTYPE_INT32: return aggregator::DType::kInt32;
    case v1::DTYPE_INT64: return aggregator::DType::kInt64;
    default: return std::nullopt;
  }
}

}  // namespace

std::shared_ptr<Daemon::Round> Daemon::RoundLocked(uint32_t job_id, const std::string& server,
                                                   int64_t round) {
  const std::string key = ServerKey(job_id, server);
  auto [it, created] = rounds_.try_emplace({key, round});
  if (!created) return it->second;
  it->second = std::make_shared<Round>();
  it->second->job_id = job_id;
  it->second->server = server;
  it->second->round = round;
  it->second->pool_id = (uint64_t{1} << 61) | next_local_id_++;
  // Keep the previous round for gets that come late; older ones go.
  for (auto old = rounds_.begin(); old != rounds_.end();) {
    if (old->first.first == key && old->first.second < round - 1) {
      if (!old->second->reported) {
        FailRoundLocked(old->second, absl::StrCat("round ", round, " began"));
      }
      for (const auto& [member, contributions] : old->second->members) round_of_.erase(member);
      (void)pool_.UnregisterTransfer(old->second->pool_id);
      old = rounds_.erase(old);
    } else {
      ++old;
    }
  }
  return it->second;
}

void Daemon::JoinRoundLocked(const v1::ExpectDelivery& expect) {
  std::shared_ptr<Round> round = RoundLocked(expect.job_id(), expect.server(), expect.version());
  const uint64_t transfer = expect.transfer_id();
  round_of_[transfer] = round;
  round->members[transfer] = expect.contributions();
  if (!round->failed.empty()) {
    ReportFailureAsync(transfer, absl::StrCat("round ", round->round, " failed: ", round->failed));
    return;
  }
  const std::optional<aggregator::DType> type = PoolType(expect.dtype());
  if (round->bytes < 0) {
    const size_t element = ElementBytes(expect.dtype());
    if (!type.has_value() || expect.bytes() <= 0 || expect.bytes() % element != 0) {
      FailRoundLocked(round, absl::StrCat("round of ", expect.bytes(), " bytes of ",
                                          v1::DType_Name(expect.dtype()),
                                          " cannot be summed element-wise"));
      return;
    }
    auto sum = SharedBuffer::Create(static_cast<size_t>(expect.bytes()));  // zero-filled
    if (!sum.ok()) {
      FailRoundLocked(round, std::string(sum.status().message()));
      return;
    }
    round->size = expect.round_size();
    round->bytes = expect.bytes();
    round->dtype = expect.dtype();
    round->sum = std::make_shared<SharedBuffer>(std::move(*sum));
    aggregator::AggregationSpec spec;
    spec.dtype = *type;
    spec.bytes = static_cast<uint64_t>(round->bytes);
    spec.packet_bytes = kRoundChunkBytes;
    spec.expected_contributions = static_cast<uint32_t>(std::max(0, round->size));
    round->packets = aggregator::PacketCount(spec);
    if (auto registered = pool_.RegisterTransfer(
            round->pool_id, spec,
            absl::Span<std::byte>(reinterpret_cast<std::byte*>(round->sum->data()),
                                  round->sum->size()));
        !registered.ok()) {
      FailRoundLocked(round, absl::StrCat("round ", round->round, ": ", registered.message()));
      return;
    }
    cv_.notify_all();  // gets waiting for the round to begin
  } else if (expect.round_size() != round->size || expect.bytes() != round->bytes ||
             expect.dtype() != round->dtype) {
    FailRoundLocked(round, absl::StrCat("push ", transfer, " (", expect.bytes(), " bytes of ",
                                        v1::DType_Name(expect.dtype()), ") does not match round ",
                                        round->round, " (", round->bytes, " bytes of ",
                                        v1::DType_Name(round->dtype), ")"));
    return;
  }
  round->contributions += expect.contributions();
  if (expect.contributions() <= 0) {
    FailRoundLocked(round, absl::StrCat("push ", transfer, " stands for ",
                                        expect.contributions(), " contributions"));
    return;
  }
  // The pool refuses more contributions than the round's size.
  if (auto joined = pool_.AddContributor(round->pool_id, transfer, 1.0,
                                         static_cast<uint32_t>(expect.contributions()));
      !joined.ok()) {
    FailRoundLocked(round, absl::StrCat("round ", round->round, " was sent ",
                                        round->contributions, " pushes for ", round->size, ": ",
                                        joined.message()));
    return;
  }
  auto server = servers_.find(ServerKey(expect.job_id(), expect.server()));
  if (server == servers_.end() || server->second.app == nullptr) {
    FailRoundLocked(round, absl::StrCat("server '", expect.server(), "' is not connected to ",
                                        config_.host, "'s daemon"));
    return;
  }
  // Packets that arrived before this announcement are summed now.
  auto incoming = incoming_.find(transfer);
  if (incoming != incoming_.end()) {
    if (incoming->second.total != static_cast<uint64_t>(expect.bytes())) {
      FailRoundLocked(round, absl::StrCat("push ", transfer, " arrived with ",
                                          incoming->second.total, " bytes, not ", expect.bytes()));
      return;
    }
    const auto ranges = std::move(incoming->second.unfolded);
    incoming->second.unfolded.clear();
    const std::shared_ptr<SharedBuffer> buffer = incoming->second.buffer;
    const bool complete = incoming->second.received == incoming->second.total;
    if (complete) incoming_.erase(incoming);
    for (const auto& [offset, length] : ranges) {
      FoldIntoRoundLocked(*round, transfer, buffer->data() + offset, offset, length);
    }
  }
}

void Daemon::FoldIntoRoundLocked(Round& round, uint64_t transfer, const uint8_t* data,
                                 uint64_t offset, uint32_t length) {
  if (!round.failed.empty() || round.complete || round.bytes < 0) return;
  // Summed packet by packet into the round's sum (aggregator::PacketPool);
  // a packet of the grid is final once all `size` pushes covered it. The
  // sum is kept under mu_: a 32 KiB add takes microseconds.
  const size_t ready_before = round.ready.size();
  absl::Status added = pool_.Add(
      round.pool_id, transfer, offset,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), length), &round.ready);
  if (!added.ok()) {
    auto self = rounds_.find({ServerKey(round.job_id, round.server), round.round});
    if (self != rounds_.end()) {
      FailRoundLocked(self->second, absl::StrCat("packet [", offset, ", +", length, ") of push ",
                                                 transfer, ": ", added.message()));
    }
    return;
  }
  const bool any_ready = round.ready.size() > ready_before;
  if (!any_ready) return;
  // Workers' gets stream the new chunks at once (Mercury PS).
  for (const auto& stream : round.streams) {
    for (size_t i = ready_before; i < round.ready.size(); ++i) {
      const uint64_t begin = uint64_t{round.ready[i]} * kRoundChunkBytes;
      QueueReplyLocked(*stream, begin,
                       std::min<uint64_t>(begin + kRoundChunkBytes, round.bytes));
    }
  }
  cv_.notify_all();
  if (round.ready.size() == round.packets) {
    round.complete = true;
    auto self = rounds_.find({ServerKey(round.job_id, round.server), round.round});
    if (self != rounds_.end()) DeliverRoundLocked(self->second);
  }
}

void Daemon::DeliverRoundLocked(const std::shared_ptr<Round>& round) {
  auto server = servers_.find(ServerKey(round->job_id, round->server));
  if (server == servers_.end() || server->second.app == nullptr) {
    FailRoundLocked(round, absl::StrCat("server '", round->server, "' is not connected"));
    return;
  }
  // Its own id space: acks for rounds never collide with transfer ids.
  const uint64_t delivery = (uint64_t{1} << 63) | next_local_id_++;
  round_deliveries_[delivery] = round;
  v1::LocalMessage message;
  v1::LocalUpdate* update = message.mutable_update();
  update->set_transfer_id(delivery);
  update->set_worker(absl::StrCat("round of ", round->size));
  update->set_version(round->round);
  update->set_bytes(round->bytes);
  update->set_sequence(static_cast<uint64_t>(round->round) + 1);
  update->set_count(round->size);
  (void)pool_.UnregisterTransfer(round->pool_id);  // summed; the sum stays in round->sum
  absl::Status sent = server->second.app->channel->Send(message, round->sum->fd());
  if (!sent.ok()) {
    round_deliveries_.erase(delivery);
    FailRoundLocked(round, absl::StrCat("cannot hand round ", round->round, " to server '",
                                        round->server, "': ", sent.message()));
    return;
  }
  ++stats_.deliveries;
  ++stats_.rounds;
}

void Daemon::FailRoundLocked(const std::shared_ptr<Round>& round, const std::string& reason) {
  if (!round->failed.empty() || round->reported) return;
  round->failed = reason;
  round->reported = true;
  (void)pool_.UnregisterTransfer(round->pool_id);
  MLF_LOG(WARNING) << "round " << round->round << " of server '" << round->server
                   << "' failed: " << reason;
  for (const auto& [member, contributions] : round->members) {
    ReportFailureAsync(member, absl::StrCat("round ", round->round, " failed: ", reason));
  }
  cv_.notify_all();
}

absl::Status Daemon::ServeRoundGet(const std::shared_ptr<tcp::socket>& socket, const PacketHeader& request,
                                   const std::string& server, int64_t round_number) {
  const std::string key = ServerKey(request.job, server);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.round_wait_s));
  std::shared_ptr<Round> round;
  std::string error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto endpoint = servers_.find(key);
    if (endpoint == servers_.end() || endpoint->second.app == nullptr) {
      error = absl::StrCat("server '", server, "' is not connected to ", config_.host,
                           "'s daemon");
    } else {
      // The round begins when its first member is announced; a get may come
      // first (the worker pushed and asked at once).
      const bool begun = cv_.wait_until(lock, deadline, [&] {
        auto it = rounds_.find({key, round_number});
        return stopping_.load() ||
               (it != rounds_.end() && (it->second->bytes >= 0 || !it->second->failed.empty()));
      });
      auto it = rounds_.find({key, round_number});
      if (stopping_.load()) {
        error = "the daemon is stopping";
      } else if (!begun || it == rounds_.end()) {
        error = absl::StrCat("round ", round_number, " of server '", server,
                             "' did not begin within ", config_.round_wait_s,
                             " s (see --round_wait_s): did every worker push?");
      } else if (!it->second->failed.empty()) {
        error = absl::StrCat("round ", round_number, " failed: ", it->second->failed);
      } else {
        round = it->second;
      }
    }
  }
  // Reply header as for a model get: offset = bytes; payload = 8-byte
  // version (the round's result is version round + 1) + error text.
  const uint64_t version = static_cast<uint64_t>(round_number + 1);
  std::string payload(8, '\0');
  for (int i = 0; i < 8; ++i) payload[i] = static_cast<char>(version >> (8 * i));
  payload += error;
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.job = request.job;
  reply.transfer = request.transfer;
  reply.offset = round ? static_cast<uint64_t>(round->bytes) : 0;
  RETURN_IF_ERROR(WritePacket(*send_watchdog_, *socket, reply, payload.data(), payload.size()));
  if (!round) return absl::OkStatus();
  // The sum streams chunk by chunk as FoldIntoRoundLocked completes them.
  std::shared_ptr<ReplyStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t payload_bytes = static_cast<uint64_t>(config_.payload_bytes);
    size_t packets = 0;
    for (size_t chunk = 0; chunk < round->packets; ++chunk) {
      const uint64_t begin = chunk * kRoundChunkBytes;
      const uint64_t end = std::min<uint64_t>(begin + kRoundChunkBytes, round->bytes);
      packets += (end - begin + payload_bytes - 1) / payload_bytes;
    }
    stream = OpenReplyLocked(socket, request, round->sum, packets);
    for (uint32_t chunk : round->ready) {
      const uint64_t begin = uint64_t{chunk} * kRoundChunkBytes;
      QueueReplyLocked(*stream, begin, std::min<uint64_t>(begin + kRoundChunkBytes, round->bytes));
    }
    round->streams.push_back(stream);
  }
  absl::Status streamed = AwaitReply(
      stream,
      [&] {
        if (!round->failed.empty()) {
          return absl::StrCat("round ", round_number, " failed: ", round->failed);
        }
        return std::string();
      },
      deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& streams = round->streams;
    streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
  }
  if (streamed.ok() || !stream->error.empty()) return streamed;
  if (streamed.code() == absl::StatusCode::kDeadlineExceeded) {
    streamed = absl::DeadlineExceededError(
        absl::StrCat("round ", round_number, " of server '", server, "' was not complete within ",
                     config_.round_wait_s, " s"));
  }
  // The round failed or timed out: the worker's daemon is told why.
  PacketHeader abort;
  abort.kind = PacketKind::kAbort;
  abort.job = request.job;
  abort.transfer = request.transfer;
  const std::string reason(streamed.message());
  return WritePacket(*send_watchdog_, *socket, abort, reason.data(), reason.size());
}

// ------------------------------------------------------------ data plane

void Daemon::DataAcceptLoop() {
  while (!stopping_.load()) {
    auto socket = std::make_shared<tcp::socket>(io_);
    boost::system::error_code error;
    data_acceptor_->accept(*socket, error);
    if (error) {
      if (!stopping_.load()) MLF_LOG(ERROR) << "data accept failed: " << error.message();
      return;
    }
    socket->set_option(tcp::no_delay(true), error);
    std::lock_guard<std::mutex> lock(mu_);
    std::thread([this, socket] { DataSessionLoop(socket); }).detach();
  }
}

absl::Status Daemon::AcceptDataLocked(const PacketHeader& header, const uint8_t* dst,
                                      std::set<uint64_t>* begun) {
  stats_.bytes_received += header.length;
  auto it = incoming_.find(header.transfer);
  if (it == incoming_.end()) return absl::OkStatus();  // cancelled meanwhile
  if (it->second.first_packet_s < 0) it->second.first_packet_s = clock_.NowSeconds();
  it->second.received += header.length;
  if (it->second.received > it->second.total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", header.transfer, " received more than its ", it->second.total, " bytes"));
  }
  // Mercury PS: a member of a synchronous round is summed packet by
  // packet as it arrives (mercury.md §IV, Key idea 3).
  auto member = round_of_.find(header.transfer);
  auto aggregate = aggregate_of_.find(header.transfer);
  if (member != round_of_.end()) {
    FoldIntoRoundLocked(*member->second, header.transfer, dst, header.offset, header.length);
  } else if (aggregate != aggregate_of_.end()) {
    // A constituent of this host's aggregate (§5.2), summed packet by packet.
    if (it->second.total != static_cast<uint64_t>(aggregations_[aggregate->second].task.bytes())) {
      FailAggregationLocked(aggregate->second,
                            absl::StrCat("constituent ", header.transfer, " has ",
                                         it->second.total, " bytes, the aggregate ",
                                         aggregations_[aggregate->second].task.bytes()));
      return absl::OkStatus();
    }
    if (!FoldIntoAggregateLocked(aggregate->second, header.transfer, dst, header.offset,
                                 header.length)) {
      return absl::OkStatus();
    }
  } else {
    it->second.unfolded.emplace_back(header.offset, header.length);
  }
  if (it->second.received < it->second.total) return absl::OkStatus();
  begun->erase(header.transfer);
  // Machine-readable arrival trace (CLOCK_MONOTONIC, comparable across
  // the daemons of one machine): the preemption test and benchmark
  // read it at --log_level debug.
  MLF_LOG(DEBUG) << "received transfer " << header.transfer << " bytes " << it->second.total
                 << " priority " << header.priority << " first_packet_s "
                 << absl::StrFormat("%.6f", it->second.first_packet_s) << " complete_s "
                 << absl::StrFormat("%.6f", clock_.NowSeconds());
  if (member != round_of_.end()) {  // summed already; nothing to deliver
    incoming_.erase(it);
    return absl::OkStatus();
  }
  if (FoldLocked(header.transfer)) return absl::OkStatus();
  std::vector<std::pair<uint32_t, std::string>> endpoints;
  for (const auto& [key, endpoint] : servers_) {
    for (const auto& [sequence, delivery] : endpoint.expected) {
      if (delivery.info.transfer_id() == header.transfer) {
        endpoints.emplace_back(delivery.info.job_id(), delivery.info.server());
      }
    }
  }
  for (const auto& [job_id, server] : endpoints) TryDeliverLocked(job_id, server);
  return absl::OkStatus();
}

void Daemon::DataSessionLoop(std::shared_ptr<tcp::socket> socket) {
  std::set<uint64_t> begun;  // transfers this session announced
  boost::system::error_code ignored;
  const auto peer = socket->remote_endpoint(ignored);
  const std::string peer_name = absl::StrCat(peer.address().to_string(), ":", peer.port());
  MLF_LOG(DEBUG) << "data session from " << peer_name;
  std::string close_reason;
  FrameReader reader(*socket);
  while (!stopping_.load()) {
    auto header = reader.ReadHeader();
    if (!header.ok()) {
      if (header.status().code() != absl::StatusCode::kUnavailable) {
        close_reason = std::string(header.status().message());
      }
      break;
    }
    if (header->kind == PacketKind::kBegin) {
      if (header->length != 0 || header->offset == 0 ||
          header->offset > static_cast<uint64_t>(kMaxTransferBytes)) {
        close_reason = absl::StrCat("begin of transfer ", header->transfer, " has bad size ",
                                    header->offset);
        break;
      }
      std::shared_ptr<SharedBuffer> pooled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pooled = TakePooledLocked(header->offset);
      }
      MLF_LOG(DEBUG) << "transfer " << header->transfer << " of " << header->offset
                     << " bytes: " << (pooled ? "reusing a pooled" : "new") << " receive buffer";
      if (pooled == nullptr) {
        auto buffer = SharedBuffer::Create(header->offset);
        if (!buffer.ok()) {
          close_reason = std::string(buffer.status().message());
          break;
        }
        pooled = std::make_shared<SharedBuffer>(std::move(*buffer));
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (incoming_.count(header->transfer)) {
        close_reason = absl::StrCat("transfer ", header->transfer, " begun twice");
        break;
      }
      Incoming& incoming = incoming_[header->transfer];
      incoming.job_id = header->job;
      incoming.total = header->offset;
      incoming.buffer = std::move(pooled);
      begun.insert(header->transfer);
      continue;
    }
    if (header->kind == PacketKind::kData) {
      std::shared_ptr<SharedBuffer> buffer;
      uint64_t total = 0;
      bool discard = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = incoming_.find(header->transfer);
        if (!begun.count(header->transfer)) {
          close_reason = absl::StrCat("data for unknown transfer ", header->transfer);
          break;
        }
        if (it == incoming_.end()) {
          // Begun on this session and cancelled since (the scheduler's
          // cancel can overtake packets in flight): skip the payload.
          discard = true;
        } else {
          buffer = it->second.buffer;
          total = it->second.total;
        }
      }
      if (discard) {
        std::vector<uint8_t> skipped(header->length);
        if (auto status = reader.ReadPayload(skipped.data(), skipped.size()); !status.ok()) {
          close_reason = std::string(status.message());
          break;
        }
        continue;
      }
      if (header->offset > total || header->length > total - header->offset) {
        close_reason = absl::StrCat("packet [", header->offset, ", +", header->length,
                                    ") is outside transfer ", header->transfer, " of ", total,
                                    " bytes");
        break;
      }
      // Zero-copy receive: the payload lands in the transfer's shared buffer.
      uint8_t* dst = buffer->data() + header->offset;
      if (auto status = reader.ReadPayload(dst, header->length); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      if (auto status = transport::VerifyPayload(*header, dst); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      absl::Status accepted;
      {
        std::lock_guard<std::mutex> lock(mu_);
        accepted = AcceptDataLocked(*header, dst, &begun);
        // Let go of the buffer before the lock: the server's acknowledgement
        // recycles it only if nobody else holds it (RecycleLocked), and it
        // may come the moment the lock is free.
        buffer.reset();
      }
      if (!accepted.ok()) {
        close_reason = std::string(accepted.message());
        break;
      }
      continue;
    }
    // Control packets carry small payloads.
    std::string payload(header->length, '\0');
    if (auto status = reader.ReadPayload(payload.data(), payload.size()); !status.ok()) {
      close_reason = std::string(status.message());
      break;
    }
    if (auto status = transport::VerifyPayload(*header, payload.data()); !status.ok()) {
      close_reason = std::string(status.message());
      break;
    }
    if (header->kind == PacketKind::kGetRequest) {
      // offset = round + 1 asks for a synchronous round's sum; 0 = the model.
      if (header->offset > 0) {
        if (header->offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          close_reason = absl::StrCat("get request names round ", header->offset - 1,
                                      ", out of range");
          break;
        }
        if (auto status = ServeRoundGet(socket, *header, payload,
                                        static_cast<int64_t>(header->offset - 1));
            !status.ok()) {
          close_reason = std::string(status.message());
          break;
        }
        continue;
      }
      if (auto status = ServeGetRequest(socket, *header, payload); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      continue;
    }
    if (header->kind == PacketKind::kAbort) {
      std::lock_guard<std::mutex> lock(mu_);
      if (begun.erase(header->transfer)) {
        incoming_.erase(header->transfer);
        ReportFailureAsync(header->transfer, absl::StrCat("sender aborted: ", payload));
      }
      continue;
    }
    close_reason = absl::StrCat("unexpected packet kind ", static_cast<int>(header->kind));
    break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!close_reason.empty()) {
    ++stats_.malformed_sessions;
    MLF_LOG(WARNING) << "closing data session from " << peer_name << ": " << close_reason;
  }
  for (uint64_t transfer : begun) {
    if (incoming_.erase(transfer)) {
      ReportFailureAsync(transfer,
                         absl::StrCat("data session from ", peer_name, " ended mid-transfer",
                                      close_reason.empty() ? "" : ": " + close_reason));
    }
  }
  socket->close(ignored);
}

bool Daemon::ConsumeUnscheduled(uint32_t bytes, double now, double* next_s) {
  std::lock_guard<std::mutex> lock(unscheduled_mu_);
  if (!unscheduled_budget_.has_value()) return true;
  if (unscheduled_budget_->TryConsume(bytes, now)) return true;
  *next_s = unscheduled_budget_->NextSendTime(bytes, now);
  return false;
}

std::shared_ptr<Daemon::ReplyStream> Daemon::OpenReplyLocked(
    const std::shared_ptr<tcp::socket>& socket, const PacketHeader& request,
    std::shared_ptr<SharedBuffer> buffer, size_t total_packets) {
  auto stream = std::make_shared<ReplyStream>();
  stream->id = (uint64_t{1} << 62) | next_local_id_++;
  stream->socket = socket;
  stream->job_id = request.job;
  stream->request = request.transfer;
  stream->priority = request.priority;
  stream->buffer = std::move(buffer);
  stream->total_packets = total_packets;
  if (!packet_queue_.policy().HasJob(request.job)) {
    (void)packet_queue_.AddJob(request.job, static_cast<double>(request.job));
  }
  replies_[stream->id] = stream;
  return stream;
}

void Daemon::QueueReplyLocked(ReplyStream& stream, uint64_t begin, uint64_t end) {
  daemon::TensorRef ref;
  ref.job_id = stream.job_id;
  ref.transfer_id = stream.id;
  ref.tensor_priority = stream.priority;
  auto split = daemon::SplitTensor(
      ref,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(stream.buffer->data() + begin),
                                  end - begin),
      static_cast<uint32_t>(config_.payload_bytes));
  if (!split.ok()) {  // cannot happen for a non-empty range; fail the stream, not the daemon
    stream.error = absl::StrCat("cannot packetise the reply: ", split.status().message());
    cv_.notify_all();
    return;
  }
  for (const daemon::PacketDescriptor& packet : *split) {
    (void)packet_queue_.Push(packet);  // the job was registered when the stream opened
    ++stream.queued;
  }
  cv_.notify_all();  // the sender loop
}

absl::Status Daemon::AwaitReply(const std::shared_ptr<ReplyStream>& stream,
                                const std::function<std::string()>& failed,
                                std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  std::string why;
  const bool ended = cv_.wait_until(lock, deadline, [&] {
    if (stream->sent == stream->total_packets || !stream->error.empty() || stopping_.load()) {
      return true;
    }
    why = failed();
    return !why.empty();
  });
  // Nothing more of it goes out; a packet being written is finished first,
  // so the caller may write to the socket again.
  packet_queue_.RemoveTransfer(stream->id);
  replies_.erase(stream->id);
  cv_.wait(lock, [&] { return !stream->writing; });
  if (!stream->error.empty()) return absl::UnavailableError(stream->error);
  if (stream->sent == stream->total_packets) return absl::OkStatus();
  if (stopping_.load()) return absl::UnavailableError("the daemon is stopping");
  if (!why.empty()) return absl::AbortedError(why);
  if (!ended) return absl::DeadlineExceededError("the reply was not complete in time");
  return absl::OkStatus();
}

absl::Status Daemon::ServeGetRequest(const std::shared_ptr<tcp::socket>& socket,
                                     const PacketHeader& request,
                                     const std::string& server) {
  uint64_t request_id = 0;
  std::string error;
  std::shared_ptr<SharedBuffer> model;
  int64_t version = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = servers_.find(ServerKey(request.job, server));
    if (it == servers_.end() || it->second.app == nullptr) {
      error = absl::StrCat("server '", server, "' is not connected to ", config_.host,
                           "'s daemon");
    } else {
      request_id = next_local_id_++;
      model_replies_[request_id].server_app = it->second.app;
      v1::LocalMessage ask;
      ask.mutable_model_request()->set_request_id(request_id);
      auto app = it->second.app;
      lock.unlock();
      absl::Status sent = app->channel->Send(ask);
      lock.lock();
      if (!sent.ok()) {
        error = absl::StrCat("cannot reach server '", server, "': ", sent.message());
      } else if (!cv_.wait_for(lock, std::chrono::duration<double>(config_.get_timeout_s), [&] {
                   return model_replies_[request_id].done || stopping_.load();
                 })) {
        error = absl::StrCat("server '", server, "' did not answer within ",
                             config_.get_timeout_s, " s");
      } else {
        ModelReply& reply = model_replies_[request_id];
        error = reply.error;
        version = reply.version;
        model = reply.buffer;
      }
      model_replies_.erase(request_id);
    }
  }
  // Reply header: offset = model bytes; payload = 8-byte version + error text.
  std::string payload(8, '\0');
  for (int i = 0; i < 8; ++i) payload[i] = static_cast<char>(static_cast<uint64_t>(version) >> (8 * i));
  payload += error;
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.job = request.job;
  reply.transfer = request.transfer;
  reply.offset = error.empty() && model ? model->size() : 0;
  if (auto status =
          WritePacket(*send_watchdog_, *socket, reply, payload.data(), payload.size());
      !status.ok()) {
    return status;
  }
  if (!error.empty() || !model || model->size() == 0) return absl::OkStatus();
  // The model's packets go out through the priority queue (ReplyStream).
  std::shared_ptr<ReplyStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t payload_bytes = static_cast<size_t>(config_.payload_bytes);
    stream = OpenReplyLocked(socket, request, model,
                             (model->size() + payload_bytes - 1) / payload_bytes);
    QueueReplyLocked(*stream, 0, model->size());
  }
  return AwaitReply(
      stream, [] { return std::string(); }, std::chrono::steady_clock::time_point::max());
}

absl::Status Daemon::FetchModel(const std::string& job, const std::string& server,
                                int64_t* version, std::shared_ptr<SharedBuffer>* model,
                                int64_t round, uint32_t priority) {
  v1::ResolveServerRequest resolve;
  resolve.set_job(job);
  resolve.set_server(server);
  v1::ResolveServerReply where;
  auto context = RpcContext();
  grpc::Status status = stub_->ResolveServer(context.get(), resolve, &where);
  if (!status.ok()) return absl::UnavailableError(absl::StrCat("get: ", GrpcError(status)));
  auto endpoint = ParseEndpoint(where.data_address());
  if (!endpoint.ok()) return endpoint.status();
  // A connection left by an earlier get to that daemon is reused (its
  // session there is waiting for the next request); a new one otherwise.
  std::unique_ptr<tcp::socket> connection;
  {
    std::lock_guard<std::mutex> lock(idle_gets_mu_);
    auto idle = idle_get_connections_.find(where.data_address());
    if (idle != idle_get_connections_.end()) {
      connection = std::move(idle->second);
      idle_get_connections_.erase(idle);
    }
  }
  const bool reused = connection != nullptr;
  auto connect = [&]() -> absl::Status {
    connection = std::make_unique<tcp::socket>(io_);
    boost::system::error_code error;
    connection->connect(*endpoint, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("get: cannot reach ", where.host(), " at ",
                                                 where.data_address(), ": ", error.message()));
    }
    connection->set_option(tcp::no_delay(true), error);
    return absl::OkStatus();
  };
  if (!reused) RETURN_IF_ERROR(connect());
  PacketHeader request;
  request.kind = PacketKind::kGetRequest;
  request.job = where.job_id();
  request.priority = static_cast<uint16_t>(std::min<uint32_t>(priority, 65535));
  // A synchronous-round server answers a worker that pushed round r with
  // that round's sum, streamed as its chunks complete (Mercury PS).
  if (where.round_size() > 0 && round >= 0) request.offset = static_cast<uint64_t>(round) + 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.transfer = next_local_id_++;
  }
  absl::Status sent =
      WritePacket(*send_watchdog_, *connection, request, server.data(), server.size());
  std::optional<FrameReader> reader;
  absl::StatusOr<PacketHeader> reply = absl::UnavailableError("not sent");
  if (sent.ok()) {
    reader.emplace(*connection);
    reply = reader->ReadHeader();
  }
  if (reused && (!sent.ok() || !reply.ok())) {
    // The far end had closed the kept connection (its daemon restarted):
    // once more on a new one.
    RETURN_IF_ERROR(connect());
    sent = WritePacket(*send_watchdog_, *connection, request, server.data(),
                       server.size());
    if (sent.ok()) {
      reader.emplace(*connection);
      reply = reader->ReadHeader();
    }
  }
  if (!sent.ok()) return sent;
  if (!reply.ok()) return absl::UnavailableError(absl::StrCat("get: ", reply.status().message()));
  if (reply->kind != PacketKind::kGetReply || reply->transfer != request.transfer ||
      reply->length < 8) {
    return absl::DataLossError("get: malformed reply from the server's daemon");
  }
  std::string payload(reply->length, '\0');
  if (auto read = reader->ReadPayload(payload.data(), payload.size()); !read.ok()) return read;
  if (auto crc = transport::VerifyPayload(*reply, payload.data()); !crc.ok()) return crc;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(payload[i])) << (8 * i);
  if (payload.size() > 8) return absl::UnavailableError(payload.substr(8));
  if (reply->offset > static_cast<uint64_t>(kMaxTransferBytes)) {
    return absl::DataLossError("get: model size out of range");
  }
  auto buffer = SharedBuffer::Create(reply->offset);
  if (!buffer.ok()) return buffer.status();
  uint64_t received = 0;
  while (received < reply->offset) {
    auto data = reader->ReadHeader();
    if (!data.ok()) {
      return absl::UnavailableError(absl::StrCat("get: model transfer cut: ", data.status().message()));
    }
    if (data->kind == PacketKind::kAbort && data->length <= transport::kMaxControlBytes) {
      std::string reason(data->length, '\0');
      if (auto read = reader->ReadPayload(reason.data(), reason.size()); !read.ok()) return read;
      return absl::AbortedError(reason);
    }
    if (data->kind != PacketKind::kData || data->offset > reply->offset ||
        data->length > reply->offset - data->offset) {
      return absl::DataLossError("get: malformed model packet");
    }
    uint8_t* dst = buffer->data() + data->offset;
    if (auto read = reader->ReadPayload(dst, data->length); !read.ok()) return read;
    if (auto crc = transport::VerifyPayload(*data, dst); !crc.ok()) return crc;
    received += data->length;
  }
  *version = static_cast<int64_t>(v);
  *model = std::make_shared<SharedBuffer>(std::move(*buffer));
  {
    std::lock_guard<std::mutex> lock(idle_gets_mu_);
    if (idle_get_connections_.count(where.data_address()) < kMaxIdleGetConnections) {
      idle_get_connections_.emplace(where.data_address(), std::move(connection));
    }
  }
  return absl::OkStatus();
}

void Daemon::ScheduleSendLocked(const v1::SendTransfer& send) {
  // A replica copy (§5.3) sends the bytes of another push of this host.
  const uint64_t source = send.source_transfer_id() != 0 ? send.source_transfer_id()
                                                         : send.transfer_id();
  auto push = pushes_.find(source);
  if (push != pushes_.end()) {
    ScheduleOutgoingLocked(send, push->second.buffer, push->second.tensors,
                           push->second.checksums);
    return;
  }
  auto held = replica_holds_.find(source);
  if (held != replica_holds_.end() && send.source_transfer_id() != 0) {
    ScheduleOutgoingLocked(send, held->second.buffer, held->second.tensors,
                           held->second.checksums);
    replica_holds_.erase(held);  // the outgoing transfer keeps the bytes alive
    return;
  }
  ReportFailureAsync(send.transfer_id(),
                     absl::StrCat("no pushed data on ", config_.host, " for push ", source));
}

void Daemon::ScheduleOutgoingLocked(const v1::SendTransfer& send,
                                    std::shared_ptr<SharedBuffer> buffer,
                                    std::vector<v1::TensorInfo> tensors,
                                    std::shared_ptr<const PacketChecksums> checksums) {
  if (static_cast<int64_t>(buffer->size()) != send.bytes()) {
    ReportFailureAsync(send.transfer_id(), absl::StrCat("schedule says ", send.bytes(),
                                                        " bytes, the data has ", buffer->size()));
    return;
  }
  std::vector<daemon::RateSegment> segments;
  for (const auto& segment : send.segments()) {
    segments.push_back({segment.from_s(), segment.to_s(), segment.rate_bps()});
  }
  if (segments.empty()) {
    // An unpaced transfer: everything may go from its start time on.
    segments.push_back({send.start_s(), send.start_s() + 1e-3, 1e13});
  }
  daemon::PacerOptions options;
  options.burst_bytes = 2.0 * static_cast<double>(config_.payload_bytes);
  auto pacer = daemon::TransferPacer::Create(std::move(segments), clock_offset_s_, options);
  if (!pacer.ok()) {
    ReportFailureAsync(send.transfer_id(),
                       absl::StrCat("unusable rate segments: ", pacer.status().message()));
    return;
  }
  Outgoing& outgoing = outgoing_[send.transfer_id()];
  outgoing.send = send;
  outgoing.buffer = std::move(buffer);
  outgoing.tensors = std::move(tensors);
  outgoing.checksums = std::move(checksums);
  outgoing.pacer.emplace(std::move(*pacer));
  release_at_.emplace(outgoing.pacer->start_local_s(), send.transfer_id());
  cv_.notify_all();
}

void Daemon::StartAggregationLocked(const v1::AggregateTask& task) {
  const std::optional<aggregator::DType> type = PoolType(task.dtype());
  if (!type.has_value() || task.dtype() == v1::DTYPE_INT32 || task.dtype() == v1::DTYPE_INT64) {
    ReportFailureAsync(task.aggregate_id(),
                       absl::StrCat("cannot aggregate updates of type ", v1::DType_Name(task.dtype()),
                                    " (weighted sums need float32 or float64)"));
    return;
  }
  const size_t element = ElementBytes(task.dtype());
  if (task.bytes() <= 0 || task.bytes() % element != 0 || task.constituents_size() == 0) {
    ReportFailureAsync(task.aggregate_id(), "malformed aggregation task");
    return;
  }
  auto sum = SharedBuffer::Create(static_cast<size_t>(task.bytes()));  // zero-filled
  if (!sum.ok()) {
    ReportFailureAsync(task.aggregate_id(), std::string(sum.status().message()));
    return;
  }
  auto buffer = std::make_shared<SharedBuffer>(std::move(*sum));
  // Packet by packet (§5.2 with Mercury's immediate aggregation): each
  // constituent's packets are summed as they arrive, and a packet of the
  // aggregate leaves as soon as every constituent covered it and the
  // aggregate's scheduled start has come.
  aggregator::AggregationSpec spec;
  spec.dtype = *type;
  spec.bytes = static_cast<uint64_t>(task.bytes());
  spec.packet_bytes = static_cast<uint32_t>(config_.payload_bytes);
  spec.expected_contributions = static_cast<uint32_t>(task.constituents_size());
  absl::Status registered = pool_.RegisterTransfer(
      task.aggregate_id(), spec,
      absl::Span<std::byte>(reinterpret_cast<std::byte*>(buffer->data()), buffer->size()));
  for (int i = 0; registered.ok() && i < task.constituents_size(); ++i) {
    const double weight = i < task.weights_size() ? task.weights(i) : 1.0;
    registered = pool_.AddContributor(task.aggregate_id(), task.constituents(i), weight);
  }
  if (!registered.ok()) {
    (void)pool_.UnregisterTransfer(task.aggregate_id());
    ReportFailureAsync(task.aggregate_id(),
                       absl::StrCat("aggregation task: ", registered.message()));
    return;
  }
  v1::SendTransfer send;
  send.set_transfer_id(task.aggregate_id());
  send.set_job_id(task.job_id());
  send.set_dst_host(task.dst_host());
  send.set_dst_address(task.dst_address());
  send.set_start_s(task.start_s());
  *send.mutable_segments() = task.segments();
  send.set_bytes(task.bytes());
  ScheduleOutgoingLocked(send, buffer, {});
  auto outgoing = outgoing_.find(task.aggregate_id());
  if (outgoing == outgoing_.end()) {  // refused (reported)
    (void)pool_.UnregisterTransfer(task.aggregate_id());
    return;
  }
  outgoing->second.gated = true;
  Aggregation& aggregation = aggregations_[task.aggregate_id()];
  aggregation.task = task;
  aggregation.sum = buffer;
  for (int i = 0; i < task.constituents_size(); ++i) {
    const double weight = i < task.weights_size() ? task.weights(i) : 1.0;
    aggregation.waiting[task.constituents(i)] = weight;
    aggregate_of_[task.constituents(i)] = task.aggregate_id();
  }
  // Constituents may have (partly) arrived before the task did.
  for (int i = 0; i < task.constituents_size(); ++i) {
    const uint64_t constituent = task.constituents(i);
    auto incoming = incoming_.find(constituent);
    if (incoming == incoming_.end()) continue;
    if (incoming->second.total != static_cast<uint64_t>(task.bytes())) {
      FailAggregationLocked(task.aggregate_id(),
                            absl::StrCat("constituent ", constituent, " has ",
                                         incoming->second.total, " bytes, the aggregate ",
                                         task.bytes()));
      return;
    }
    const auto ranges = std::move(incoming->second.unfolded);
    incoming->second.unfolded.clear();
    const std::shared_ptr<SharedBuffer> data = incoming->second.buffer;
    const bool complete = incoming->second.received == incoming->second.total;
    for (const auto& [offset, length] : ranges) {
      if (!FoldIntoAggregateLocked(task.aggregate_id(), constituent, data->data() + offset,
                                   offset, length)) {
        return;
      }
    }
    if (complete) FoldLocked(constituent);
  }
}

bool Daemon::FoldIntoAggregateLocked(uint64_t aggregate_id, uint64_t transfer,
                                     const uint8_t* data, uint64_t offset, uint32_t length) {
  std::vector<uint32_t> ready;
  absl::Status added = pool_.Add(
      aggregate_id, transfer, offset,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), length), &ready);
  if (!added.ok()) {
    FailAggregationLocked(aggregate_id, absl::StrCat("packet [", offset, ", +", length,
                                                     ") of constituent ", transfer, ": ",
                                                     added.message()));
    return false;
  }
  auto outgoing = outgoing_.find(aggregate_id);
  if (outgoing != outgoing_.end() && outgoing->second.released) {
    for (uint32_t index : ready) QueueAggregatePacketLocked(outgoing->second, index);
  }
  return true;
}

void Daemon::QueueAggregatePacketLocked(Outgoing& outgoing, uint32_t index) {
  const uint64_t grid = static_cast<uint64_t>(config_.payload_bytes);
  const uint64_t offset = uint64_t{index} * grid;
  daemon::PacketDescriptor packet;
  packet.job_id = outgoing.send.job_id();
  packet.transfer_id = outgoing.send.transfer_id();
  packet.offset_bytes = offset;
  packet.length_bytes = static_cast<uint32_t>(std::min<uint64_t>(grid, outgoing.buffer->size() - offset));
  packet.payload = reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset);
  (void)packet_queue_.Push(packet);  // the job is registered at release
  cv_.notify_all();
}

bool Daemon::FoldLocked(uint64_t transfer_id) {
  auto member = aggregate_of_.find(transfer_id);
  if (member == aggregate_of_.end()) return false;
  const uint64_t aggregate_id = member->second;
  aggregate_of_.erase(member);
  incoming_.erase(transfer_id);  // its bytes are in the sum
  auto it = aggregations_.find(aggregate_id);
  if (it == aggregations_.end()) return true;
  Aggregation& aggregation = it->second;
  aggregation.waiting.erase(transfer_id);
  ++aggregation.folded;
  if (!aggregation.waiting.empty()) return true;
  ++stats_.aggregates;
  MLF_LOG(INFO) << "aggregate " << aggregate_id << ": summed " << aggregation.folded
                << " updates packet by packet, forwarding to " << aggregation.task.dst_host();
  (void)pool_.UnregisterTransfer(aggregate_id);  // complete; the outgoing sends the sum
  aggregations_.erase(it);
  return true;
}

void Daemon::FailAggregationLocked(uint64_t aggregate_id, const std::string& reason) {
  DropAggregationLocked(aggregate_id, reason);
  ReportFailureAsync(aggregate_id, absl::StrCat("aggregation failed: ", reason));
}

void Daemon::DropAggregationLocked(uint64_t aggregate_id, const std::string& reason) {
  auto it = aggregations_.find(aggregate_id);
  if (it == aggregations_.end()) return;
  MLF_LOG(INFO) << "dropping aggregation " << aggregate_id << ": " << reason;
  for (const auto& [constituent, weight] : it->second.waiting) {
    aggregate_of_.erase(constituent);
    incoming_.erase(constituent);
  }
  aggregations_.erase(it);
  (void)pool_.UnregisterTransfer(aggregate_id);
  auto outgoing = outgoing_.find(aggregate_id);
  if (outgoing == outgoing_.end()) return;
  packet_queue_.RemoveTransfer(aggregate_id);
  // Part of it may be at the next hop already: tell it to drop the rest.
  if (outgoing->second.begun) aborts_.emplace_back(outgoing->second.send, reason);
  outgoing_.erase(outgoing);
  cv_.notify_all();
}

void Daemon::ReleaseLocked(uint64_t transfer_id) {
  auto it = outgoing_.find(transfer_id);
  if (it == outgoing_.end()) return;
  Outgoing& outgoing = it->second;
  const uint32_t job = outgoing.send.job_id();
  // Rank by the scheduler's job id (config order), so that TLs-One/RR rank
  // co-located jobs the same way on every daemon, whatever order their
  // traffic first reached each one.
  if (!packet_queue_.policy().HasJob(job)) {
    (void)packet_queue_.AddJob(job, static_cast<double>(job));
  }
  if (outgoing.gated) {
    // An aggregate: its packets enter the queue as the pool completes them
    // (those complete by now at once), in the order they complete.
    outgoing.released = true;
    const uint64_t grid = static_cast<uint64_t>(config_.payload_bytes);
    outgoing.packets_left = static_cast<size_t>((outgoing.buffer->size() + grid - 1) / grid);
    if (aggregations_.count(transfer_id) == 0) {  // every constituent is in
      for (uint32_t i = 0; i < outgoing.packets_left; ++i) QueueAggregatePacketLocked(outgoing, i);
      return;
    }
    auto ready = pool_.ReadyPackets(transfer_id);
    if (ready.ok()) {
      for (uint32_t index : *ready) QueueAggregatePacketLocked(outgoing, index);
    }
    return;
  }
  // Tensor layout: consecutive regions in tensor order. Within a released
  // transfer the queue sends the most urgent tensor first (Mercury §IV).
  std::vector<v1::TensorInfo> tensors = outgoing.tensors;
  if (tensors.empty()) {
    v1::TensorInfo whole;
    whole.set_bytes(outgoing.buffer->size());
    tensors.push_back(whole);
  }
  uint64_t offset = 0;
  size_t packets = 0;
  for (const v1::TensorInfo& tensor : tensors) {
    daemon::TensorRef ref;
    ref.job_id = job;
    ref.transfer_id = transfer_id;
    ref.tensor_id = tensor.tensor_id();
    ref.tensor_priority = static_cast<daemon::TensorPriority>(std::max(0, tensor.priority()));
    auto split = daemon::SplitTensor(
        ref,
        absl::Span<const std::byte>(
            reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset), tensor.bytes()),
        static_cast<uint32_t>(config_.payload_bytes));
    offset += tensor.bytes();
    if (!split.ok()) {
      packet_queue_.RemoveTransfer(transfer_id);
      ReportFailureAsync(transfer_id, absl::StrCat("cannot packetise: ", split.status().message()));
      outgoing_.erase(it);
      return;
    }
    for (const daemon::PacketDescriptor& packet : *split) {
      (void)packet_queue_.Push(packet);  // the job is registered above
      ++packets;
    }
  }
  outgoing.packets_left = packets;
}

void Daemon::FailOutgoingLocked(const std::string& dst_address, const std::string& reason) {
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->second.send.dst_address() != dst_address || it->second.packets_left == 0) {
      ++it;
      continue;
    }
    packet_queue_.RemoveTransfer(it->first);
    ReportFailureAsync(it->first, absl::StrCat("sending to ", it->second.send.dst_host(),
                                               " failed: ", reason));
    it = outgoing_.erase(it);
  }
}

void Daemon::SenderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_.load()) {
    while (!aborts_.empty()) {
      const auto [send, reason] = aborts_.front();
      aborts_.erase(aborts_.begin());
      lock.unlock();
      auto socket = PeerSocket(send);
      if (socket.ok()) {
        PacketHeader abort;
        abort.kind = PacketKind::kAbort;
        abort.job = send.job_id();
        abort.transfer = send.transfer_id();
        const std::string text = reason.substr(0, transport::kMaxControlBytes);
        (void)WritePacket(*send_watchdog_, **socket, abort, text.data(),
                          static_cast<uint32_t>(text.size()));
      }
      lock.lock();
    }
    const double now = clock_.NowSeconds();
    while (!release_at_.empty() && release_at_.begin()->first <= now) {
      const uint64_t id = release_at_.begin()->second;
      release_at_.erase(release_at_.begin());
      ReleaseLocked(id);
    }
    double wake = release_at_.empty() ? daemon::kNever : release_at_.begin()->first;
    std::optional<daemon::PacketDescriptor> packet = packet_queue_.Peek(now);
    if (packet.has_value()) {
      auto it = outgoing_.find(packet->transfer_id);
      if (it == outgoing_.end()) {
        auto reply = replies_.find(packet->transfer_id);
        if (reply == replies_.end()) {  // failed meanwhile
          packet_queue_.RemoveTransfer(packet->transfer_id);
          continue;
        }
        double next_s = now;
        if (ConsumeUnscheduled(packet->length_bytes, now, &next_s)) {
          packet_queue_.Pop(now);
          const std::shared_ptr<ReplyStream> stream = reply->second;
          stream->writing = true;
          lock.unlock();
          PacketHeader data;
          data.kind = PacketKind::kData;
          data.job = stream->job_id;
          data.transfer = stream->request;
          data.priority = static_cast<uint16_t>(std::min<uint32_t>(stream->priority, 65535));
          const auto* payload = reinterpret_cast<const uint8_t*>(packet->payload);
          data.offset = static_cast<uint64_t>(payload - stream->buffer->data());
          absl::Status status =
              WritePacket(*send_watchdog_, *stream->socket, data, payload, packet->length_bytes);
          lock.lock();
          stream->writing = false;
          if (status.ok()) {
            ++stream->sent;
            stats_.bytes_sent += packet->length_bytes;
          } else {
            stream->error = absl::StrCat("sending the get reply failed: ", status.message());
            MLF_LOG(WARNING) << "get reply " << stream->request << " (job " << stream->job_id
                             << ", " << stream->sent << " of " << stream->total_packets
                             << " packets sent): " << status.message();
            packet_queue_.RemoveTransfer(stream->id);
          }
          cv_.notify_all();  // AwaitReply
          continue;
        }
        wake = std::min(wake, next_s);
        packet.reset();
      }
    }
    if (packet.has_value()) {
      auto it = outgoing_.find(packet->transfer_id);
      Outgoing& outgoing = it->second;
      if (outgoing.pacer->TryConsume(packet->length_bytes, now)) {
        packet_queue_.Pop(now);
        const bool begin = !outgoing.begun;
        if (begin) {
          MLF_LOG(DEBUG) << "sending transfer " << packet->transfer_id << " from "
                         << absl::StrFormat("%.6f", now);
          if (outgoing.checksums != nullptr) outgoing.checksums->sending.store(true);
        }
        outgoing.begun = true;
        const v1::SendTransfer send = outgoing.send;
        const std::shared_ptr<SharedBuffer> buffer = outgoing.buffer;  // keeps the payload alive
        std::optional<uint32_t> crc;
        if (outgoing.checksums != nullptr) {
          crc = outgoing.checksums->Find(
              static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(packet->payload) -
                                    buffer->data()),
              packet->length_bytes);
        }
        lock.unlock();
        absl::Status status = WriteToPeer(send, begin, *packet, buffer->data(), crc);
        lock.lock();
        if (!status.ok()) {
          MLF_LOG(WARNING) << "transfer " << send.transfer_id() << " to " << send.dst_host()
                           << " failed: " << status.message();
          FailOutgoingLocked(send.dst_address(), std::string(status.message()));
          continue;
        }
        stats_.bytes_sent += packet->length_bytes;
        auto done = outgoing_.find(send.transfer_id());
        if (done != outgoing_.end() && --done->second.packets_left == 0) outgoing_.erase(done);
        continue;
      }
      wake = std::min(wake, outgoing.pacer->NextSendTime(packet->length_bytes, now));
    }
    if (wake == daemon::kNever) {
      cv_.wait(lock);
    } else {
      cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, wake - now)));
    }
  }
}

absl::StatusOr<std::shared_ptr<tcp::socket>> Daemon::PeerSocket(const v1::SendTransfer& send) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto& peer = peers_[send.dst_address()];
  if (peer == nullptr || !peer->is_open()) {
    auto endpoint = ParseEndpoint(send.dst_address());
    if (!endpoint.ok()) return endpoint.status();
    peer = std::make_shared<tcp::socket>(io_);
    boost::system::error_code error;
    peer->connect(*endpoint, error);
    if (error) {
      peer.reset();
      return absl::UnavailableError(absl::StrCat("cannot connect to ", send.dst_host(), " at ",
                                                 send.dst_address(), ": ", error.message()));
    }
    peer->set_option(tcp::no_delay(true), error);
    // Priorities act only on packets still in the daemon's queue: cap
    // what the kernel holds unsent at about two packets, so an urgent
    // tensor does not wait behind a megabyte of socket buffer (measured in
    // daemon/README.md: unpaced preemption 38 -> 8.7 packet-times).
    const int lowat = 2 * (static_cast<int>(config_.payload_bytes) +
                           static_cast<int>(transport::kHeaderBytes));
    ::setsockopt(peer->native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
  }
  return peer;
}

absl::Status Daemon::WriteToPeer(const v1::SendTransfer& send, bool begin,
                                 const daemon::PacketDescriptor& packet, const uint8_t* base,
                                 std::optional<uint32_t> crc) {
  auto peer_socket = PeerSocket(send);
  if (!peer_socket.ok()) return peer_socket.status();
  std::shared_ptr<tcp::socket> socket = std::move(*peer_socket);
  absl::Status status;
  if (begin) {
    PacketHeader header;
    header.kind = PacketKind::kBegin;
    header.job = send.job_id();
    header.transfer = send.transfer_id();
    header.offset = static_cast<uint64_t>(send.bytes());
    status = WritePacket(*send_watchdog_, *socket, header, nullptr, 0);
  }
  if (status.ok()) {
    const auto* payload = reinterpret_cast<const uint8_t*>(packet.payload);
    PacketHeader header;
    header.kind = PacketKind::kData;
    header.job = send.job_id();
    header.transfer = send.transfer_id();
    header.tensor = packet.tensor_id;
    header.priority = static_cast<uint16_t>(std::min<uint32_t>(packet.tensor_priority, 65535));
    header.offset = static_cast<uint64_t>(payload - base);  // offset within the transfer
    status = WritePacket(*send_watchdog_, *socket, header, payload, packet.length_bytes, crc);
  }
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    boost::system::error_code ignored;
    socket->close(ignored);
    peers_.erase(send.dst_address());
  }
  return status;
}

}  // namespace mlfabric
