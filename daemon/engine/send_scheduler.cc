#include "daemon/engine/send_scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace mlfabric::daemon {

using transport::PacketHeader;
using transport::PacketKind;

namespace {

// How long the loop waits at most for a peer whose connection had not
// drained before it looks at its queue again.
constexpr double kPeerBusyRetryS = 0.001;

// The largest token bucket, in packets (Options::pacing_quantum_s).
constexpr double kMaxBurstPackets = 64;

// The most a Mercury header's priority field holds.
uint16_t HeaderPriority(uint32_t priority) {
  return static_cast<uint16_t>(std::min<uint32_t>(priority, 65535));
}

}  // namespace

SendScheduler::SendScheduler(Options options, const Clock* clock,
                             transport::PacketWriter* writer, AggregationTable* aggregations,
                             FailureSink on_failure)
    : options_(std::move(options)),
      clock_(clock),
      writer_(writer),
      aggregations_(aggregations),
      on_failure_(std::move(on_failure)),
      queue_(options_.job_priority) {
  if (options_.unscheduled_bps > 0) {
    auto bucket = TokenBucket::Create(options_.unscheduled_bps,
                                      BurstBytes(options_.unscheduled_bps), clock_->NowSeconds());
    if (bucket.ok()) unscheduled_.emplace(std::move(*bucket));
  }
}

double SendScheduler::BurstBytes(double rate_bps) const {
  const double packet = static_cast<double>(options_.payload_bytes);
  const double quantum = rate_bps / 8.0 * std::max(0.0, options_.pacing_quantum_s);
  return std::clamp(quantum, 2.0 * packet, kMaxBurstPackets * packet);
}

SendScheduler::~SendScheduler() { Stop(); }

absl::Status SendScheduler::Start() {
  {
    MutexLock lock(&mu_);
    if (options_.unscheduled_bps > 0 && !unscheduled_.has_value()) {
      return TokenBucket::Create(options_.unscheduled_bps, BurstBytes(options_.unscheduled_bps),
                                 clock_->NowSeconds())
          .status();
    }
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void SendScheduler::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  replies_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void SendScheduler::SetClockOffset(double offset_s) {
  MutexLock lock(&mu_);
  clock_offset_s_ = offset_s;
  for (auto& [id, outgoing] : outgoing_) outgoing.pacer->SetClockOffset(offset_s);
}

double SendScheduler::JobRankKeyLocked(uint32_t job) const {
  auto cls = job_classes_.find(job);
  const double priority_class = cls == job_classes_.end() ? 0 : cls->second;
  return priority_class * 4294967296.0 + static_cast<double>(job);
}

void SendScheduler::EnsureJobLocked(uint32_t job) {
  // Rank by the scheduler's priority class, then its job id (config
  // order), so that TLs-One/RR rank co-located jobs the same way on every
  // daemon, whatever order their traffic first reached each one.
  if (!queue_.policy().HasJob(job)) (void)queue_.AddJob(job, JobRankKeyLocked(job));
}

bool SendScheduler::SetJobPriorityClass(uint32_t job, int32_t priority_class) {
  MutexLock lock(&mu_);
  auto known = job_classes_.find(job);
  if ((known == job_classes_.end() ? 0 : known->second) == priority_class) return false;
  if (priority_class == 0) {
    job_classes_.erase(job);
  } else {
    job_classes_[job] = priority_class;
  }
  if (queue_.policy().HasJob(job)) (void)queue_.SetJobRankKey(job, JobRankKeyLocked(job));
  cv_.SignalAll();  // the loop may pick another packet first now
  return true;
}

std::vector<uint32_t> SendScheduler::JobRanking(double now_s) const {
  MutexLock lock(&mu_);
  std::vector<uint32_t> jobs;
  for (JobId job : queue_.policy().Ranking(now_s)) jobs.push_back(static_cast<uint32_t>(job));
  return jobs;
}

absl::Status SendScheduler::Schedule(const v1::SendTransfer& send,
                                     std::shared_ptr<SharedBuffer> buffer,
                                     std::vector<v1::TensorInfo> tensors,
                                     std::shared_ptr<const transport::PacketChecksums> checksums,
                                     bool gated) {
  if (buffer == nullptr || static_cast<int64_t>(buffer->size()) != send.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule says ", send.bytes(),
                                                   " bytes, the data has ",
                                                   buffer == nullptr ? 0 : buffer->size()));
  }
  std::vector<RateSegment> segments;
  for (const auto& segment : send.segments()) {
    segments.push_back({segment.from_s(), segment.to_s(), segment.rate_bps()});
  }
  if (segments.empty()) {
    // An unpaced transfer: everything may go from its start time on.
    segments.push_back({send.start_s(), send.start_s() + 1e-3, 1e13});
  }
  double peak_bps = 0;
  for (const RateSegment& segment : segments) peak_bps = std::max(peak_bps, segment.rate_bps);
  PacerOptions pacing;
  pacing.burst_bytes = BurstBytes(peak_bps);
  MutexLock lock(&mu_);
  auto pacer = TransferPacer::Create(std::move(segments), clock_offset_s_, pacing);
  if (!pacer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unusable rate segments: ", pacer.status().message()));
  }
  if (outgoing_.count(send.transfer_id()) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", send.transfer_id(), " is already scheduled here"));
  }
  Outgoing& outgoing = outgoing_[send.transfer_id()];
  outgoing.send = send;
  outgoing.buffer = std::move(buffer);
  outgoing.tensors = std::move(tensors);
  outgoing.checksums = std::move(checksums);
  outgoing.pacer.emplace(std::move(*pacer));
  outgoing.gated = gated;
  release_at_.emplace(outgoing.pacer->start_local_s(), send.transfer_id());
  cv_.SignalAll();
  return absl::OkStatus();
}

void SendScheduler::QueueAggregatePackets(uint64_t id, const std::vector<uint32_t>& ready) {
  if (ready.empty()) return;
  MutexLock lock(&mu_);
  auto it = outgoing_.find(id);
  if (it == outgoing_.end() || !it->second.released) return;  // release queues what is ready
  for (uint32_t index : ready) QueueAggregatePacketLocked(it->second, index);
}

void SendScheduler::QueueAggregatePacketLocked(Outgoing& outgoing, uint32_t index) {
  if (index >= outgoing.queued.size() || outgoing.queued[index]) return;
  outgoing.queued[index] = true;
  const uint64_t grid = options_.payload_bytes;
  const uint64_t offset = uint64_t{index} * grid;
  PacketDescriptor packet;
  packet.job_id = outgoing.send.job_id();
  packet.transfer_id = outgoing.send.transfer_id();
  packet.offset_bytes = offset;
  packet.length_bytes =
      static_cast<uint32_t>(std::min<uint64_t>(grid, outgoing.buffer->size() - offset));
  packet.payload = reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset);
  (void)queue_.Push(packet);  // the job is registered at release
  cv_.SignalAll();
}

bool SendScheduler::Cancel(uint64_t id, const std::string& reason) {
  MutexLock lock(&mu_);
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return false;
  queue_.RemoveTransfer(id);
  // Part of it may be at the next hop already: tell it to drop the rest.
  if (it->second.begun) aborts_.emplace_back(it->second.send, reason);
  outgoing_.erase(it);
  cv_.SignalAll();
  return true;
}

void SendScheduler::DropAll() {
  MutexLock lock(&mu_);
  for (const auto& [id, outgoing] : outgoing_) queue_.RemoveTransfer(id);
  outgoing_.clear();
  release_at_.clear();
}

bool SendScheduler::Has(uint64_t id) const {
  MutexLock lock(&mu_);
  return outgoing_.count(id) > 0;
}

size_t SendScheduler::queued_packets() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void SendScheduler::ReleaseLocked(uint64_t id) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return;
  Outgoing& outgoing = it->second;
  EnsureJobLocked(outgoing.send.job_id());
  const uint64_t grid = options_.payload_bytes;
  if (outgoing.gated) {
    // An aggregate: its packets enter the queue as the packet pool
    // completes them (those complete by now at once), in that order.
    outgoing.released = true;
    outgoing.packets_left = static_cast<size_t>((outgoing.buffer->size() + grid - 1) / grid);
    outgoing.queued.assign(outgoing.packets_left, false);
    if (aggregations_ == nullptr || !aggregations_->Active(id)) {  // every constituent is in
      for (uint32_t i = 0; i < outgoing.packets_left; ++i) QueueAggregatePacketLocked(outgoing, i);
      return;
    }
    for (uint32_t index : aggregations_->ReadyPackets(id)) {
      QueueAggregatePacketLocked(outgoing, index);
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
    TensorRef ref;
    ref.job_id = outgoing.send.job_id();
    ref.transfer_id = id;
    ref.tensor_id = tensor.tensor_id();
    ref.tensor_priority = static_cast<TensorPriority>(std::max(0, tensor.priority()));
    auto split = SplitTensor(
        ref,
        absl::Span<const std::byte>(
            reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset), tensor.bytes()),
        options_.payload_bytes);
    offset += tensor.bytes();
    if (!split.ok()) {
      queue_.RemoveTransfer(id);
      on_failure_(id, absl::StrCat("cannot packetise: ", split.status().message()));
      outgoing_.erase(it);
      return;
    }
    for (const PacketDescriptor& packet : *split) {
      (void)queue_.Push(packet);  // the job is registered above
      ++packets;
    }
  }
  outgoing.packets_left = packets;
}

void SendScheduler::FailDestinationLocked(const std::string& dst_address,
                                          const std::string& reason) {
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->second.send.dst_address() != dst_address || it->second.packets_left == 0) {
      ++it;
      continue;
    }
    queue_.RemoveTransfer(it->first);
    on_failure_(it->first,
                absl::StrCat("sending to ", it->second.send.dst_host(), " failed: ", reason));
    it = outgoing_.erase(it);
  }
}

// ---------------------------------------------------------------- replies

uint64_t SendScheduler::ReserveReplyId() {
  MutexLock lock(&mu_);
  return (uint64_t{1} << 62) | next_reply_++;
}

void SendScheduler::OpenReply(uint64_t id, int fd, const PacketHeader& request,
                              std::shared_ptr<SharedBuffer> buffer, size_t total_packets) {
  MutexLock lock(&mu_);
  Reply& reply = replies_[id];
  reply.fd = fd;
  reply.job_id = request.job;
  reply.request = request.transfer;
  reply.priority = request.priority;
  reply.buffer = std::move(buffer);
  reply.total_packets = total_packets;
  EnsureJobLocked(request.job);
}

void SendScheduler::SetReplyBuffer(uint64_t id, std::shared_ptr<SharedBuffer> buffer,
                                   size_t total_packets) {
  MutexLock lock(&mu_);
  auto it = replies_.find(id);
  if (it == replies_.end()) return;
  it->second.buffer = std::move(buffer);
  it->second.total_packets = total_packets;
  replies_cv_.SignalAll();
}

void SendScheduler::QueueReply(uint64_t id, uint64_t begin, uint64_t end,
                               uint32_t contributions) {
  MutexLock lock(&mu_);
  auto it = replies_.find(id);
  if (it == replies_.end() || it->second.buffer == nullptr) return;
  Reply& reply = it->second;
  if (contributions > 0) reply.contributions = contributions;
  TensorRef ref;
  ref.job_id = reply.job_id;
  ref.transfer_id = id;
  ref.tensor_priority = reply.priority;
  auto split = SplitTensor(
      ref,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(reply.buffer->data() + begin),
                                  end - begin),
      options_.payload_bytes);
  if (!split.ok()) {  // cannot happen for a non-empty range; fail the reply, not the daemon
    reply.error = absl::StrCat("cannot packetise the reply: ", split.status().message());
    replies_cv_.SignalAll();
    return;
  }
  for (const PacketDescriptor& packet : *split) {
    (void)queue_.Push(packet);  // the job was registered when the reply opened
    ++reply.queued;
  }
  cv_.SignalAll();  // the sender loop
}

void SendScheduler::EndReply(uint64_t id) {
  MutexLock lock(&mu_);
  if (auto it = replies_.find(id); it != replies_.end()) {
    it->second.total_packets = it->second.queued;
    replies_cv_.SignalAll();
  }
}

void SendScheduler::FailReply(uint64_t id, const std::string& why) {
  MutexLock lock(&mu_);
  if (auto it = replies_.find(id); it != replies_.end() && it->second.failed.empty()) {
    it->second.failed = why;
    cv_.SignalAll();  // the loop drops its packets
    replies_cv_.SignalAll();
  }
}

void SendScheduler::Wake() {
  cv_.SignalAll();
  replies_cv_.SignalAll();  // AwaitReply's `failed` predicate may hold now
}

absl::Status SendScheduler::AwaitReply(uint64_t id, const std::function<std::string()>& failed,
                                       std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  auto it = replies_.find(id);
  if (it == replies_.end()) return absl::NotFoundError(absl::StrCat("no reply stream ", id));
  Reply& reply = it->second;  // map nodes stay put until erased below
  std::string why;
  bool ended = false;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reply.sent == reply.total_packets || !reply.error.empty() || stopping_) return true;
    why = reply.failed.empty() ? failed() : reply.failed;
    return !why.empty();
  };
  // Whoever makes `failed` true calls Wake(); the slice is a safety net.
  while (!(ended = done()) && std::chrono::steady_clock::now() < deadline) {
    replies_cv_.WaitWithDeadline(&mu_, std::min(deadline, std::chrono::steady_clock::now() +
                                                             std::chrono::milliseconds(200)));
  }
  // Nothing more of it goes out; a packet being written is finished first,
  // so the caller may write to the socket again.
  queue_.RemoveTransfer(id);
  reply.closing = true;
  replies_cv_.Await(&mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reply.writing; });
  const Reply last = std::move(reply);
  replies_.erase(id);
  if (!last.error.empty()) return absl::UnavailableError(last.error);
  if (last.sent == last.total_packets) return absl::OkStatus();
  if (!why.empty()) return absl::AbortedError(why);
  if (stopping_) return absl::CancelledError("the daemon is stopping");
  if (!ended) return absl::DeadlineExceededError("the reply was not complete in time");
  return absl::OkStatus();
}

void SendScheduler::CloseReply(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = replies_.find(id);
  if (it == replies_.end()) return;
  queue_.RemoveTransfer(id);
  it->second.closing = true;
  replies_cv_.Await(&mu_,
                    [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !it->second.writing; });
  replies_.erase(it);
}

// ------------------------------------------------------------------ loop

void SendScheduler::Loop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    const double wake = SendReadyLocked();
    if (stopping_) break;
    if (!busy_sends_.empty()) {
      // Packets wait for peers whose connections have not drained: wait
      // for one to drain (or the next pacer time; at most kPeerBusyRetryS,
      // so new work is not left waiting long) without the lock.
      std::vector<v1::SendTransfer> busy = std::move(busy_sends_);
      busy_sends_.clear();
      const double timeout_s =
          std::clamp(wake - clock_->NowSeconds(), 0.0, kPeerBusyRetryS);
      lock.Unlock();
      writer_->WaitPeerWritable(busy, timeout_s);
      lock.Lock();
      continue;
    }
    if (wake == kNever) {
      cv_.Wait(&mu_);
    } else {
      const double now = clock_->NowSeconds();
      cv_.WaitWithTimeout(&mu_, std::chrono::duration<double>(std::max(0.0, wake - now)));
    }
  }
}

double SendScheduler::SendReady() {
  MutexLock lock(&mu_);
  return SendReadyLocked();
}

double SendScheduler::SendReadyLocked() {
  while (!stopping_) {
    while (!aborts_.empty()) {
      const auto [send, reason] = aborts_.front();
      aborts_.erase(aborts_.begin());
      mu_.Unlock();
      PacketHeader abort;
      abort.kind = PacketKind::kAbort;
      abort.job = send.job_id();
      abort.transfer = send.transfer_id();
      const std::string text = reason.substr(0, transport::kMaxControlBytes);
      (void)writer_->WriteToPeer(send, abort, text.data(), static_cast<uint32_t>(text.size()),
                                 std::nullopt);
      mu_.Lock();
    }
    const double now = clock_->NowSeconds();
    while (!release_at_.empty() && release_at_.begin()->first <= now) {
      const uint64_t id = release_at_.begin()->second;
      release_at_.erase(release_at_.begin());
      ReleaseLocked(id);
    }
    double wake = release_at_.empty() ? kNever : release_at_.begin()->first;
    // The most urgent packet whose transfer may send now: one waiting for
    // its pacer's tokens (or the replies' budget) does not hold back the
    // packets of other transfers, which have reservations of their own.
    std::optional<PacketDescriptor> packet = queue_.Peek(now);
    absl::flat_hash_set<TransferId> waiting;
    // Peers with a more urgent packet that may not go now (its pacer, or
    // the connection not drained): their other packets wait too, so the
    // packets on one connection keep strict priority (Mercury); other
    // peers' packets go meanwhile.
    absl::flat_hash_set<std::string> busy_peers;
    double next_s = kNever;
    bool sent = false;
    bool removed = false;
    // (At most kMaxWaiting transfers are looked past in one pass.)
    constexpr size_t kMaxWaiting = 256;
    while (packet.has_value() && !sent && !removed && waiting.size() < kMaxWaiting) {
      double packet_next_s = kNever;
      if (auto out = outgoing_.find(packet->transfer_id); out != outgoing_.end()) {
        const std::string& peer = out->second.send.dst_address();
        bool peer_busy = busy_peers.contains(peer);
        if (peer_busy) {
          packet_next_s = now + kPeerBusyRetryS;
        } else {
          sent = SendTransferPacketLocked(*packet, out->second, now, &packet_next_s,
                                          &peer_busy, waiting);
          if (!sent) busy_peers.insert(peer);
        }
      } else if (auto reply = replies_.find(packet->transfer_id); reply != replies_.end()) {
        sent = SendReplyPacketLocked(*packet, reply->second, reply->first, now,
                                     &packet_next_s, waiting);
      } else {  // failed meanwhile
        queue_.RemoveTransfer(packet->transfer_id);
        removed = true;
      }
      if (sent || removed) break;
      next_s = std::min(next_s, packet_next_s);
      waiting.insert(packet->transfer_id);
      packet = queue_.PeekSkipping(now, waiting);
    }
    if (sent || removed) continue;
    busy_sends_.clear();
    for (const std::string& peer : busy_peers) {
      for (const auto& [id, out] : outgoing_) {
        if (out.send.dst_address() == peer) {
          busy_sends_.push_back(out.send);
          break;
        }
      }
    }
    return std::min(wake, next_s);
  }
  return kNever;
}

void SendScheduler::AdaptLimitLocked(uint64_t* limit, const std::vector<transport::Frame>& frames,
                                     size_t written) const {
  // What the kernel took is what it will likely take next time: offering
  // much more only encodes frames that go back to the queue (on a backed-up
  // connection that doubled the sender's CPU per byte). All taken: offer
  // twice as much next time, up to the cap.
  const uint64_t packet = options_.payload_bytes;
  if (written >= frames.size()) {
    *limit = std::min<uint64_t>(options_.coalesce_bytes, std::max<uint64_t>(*limit, packet) * 2);
    return;
  }
  uint64_t taken = 0;
  for (size_t f = 0; f < written; ++f) taken += frames[f].length;
  *limit = std::max<uint64_t>(packet, taken + packet);
}

bool SendScheduler::SendReplyPacketLocked(const PacketDescriptor& packet, Reply& reply,
                                          uint64_t id, double now, double* next_s,
                                          const absl::flat_hash_set<TransferId>& skip) {
  // Unscheduled traffic has its own budget (docs/architecture.md §5).
  if (unscheduled_.has_value() && !unscheduled_->TryConsume(packet.length_bytes, now)) {
    *next_s = unscheduled_->NextSendTime(packet.length_bytes, now);
    return false;
  }
  std::vector<Taken>& taken = taken_;  // reused: only the loop's thread writes
  taken.clear();
  taken.push_back({packet, 0});
  queue_.Remove(packet, &taken.back().sequence);
  // Coalesce: the next most urgent packets while they are this reply's and
  // the budget allows.
  if (reply.coalesce_limit == 0) reply.coalesce_limit = options_.coalesce_bytes;
  uint64_t bytes = packet.length_bytes;
  while (true) {
    std::optional<PacketDescriptor> more = queue_.PeekSkipping(now, skip);
    if (!more.has_value() || more->transfer_id != id ||
        bytes + more->length_bytes > reply.coalesce_limit) {
      break;
    }
    if (unscheduled_.has_value() && !unscheduled_->TryConsume(more->length_bytes, now)) break;
    taken.push_back({*more, 0});
    queue_.Remove(*more, &taken.back().sequence);
    bytes += more->length_bytes;
  }
  reply.writing = true;
  const std::shared_ptr<SharedBuffer> buffer = reply.buffer;  // keeps the payload alive
  std::vector<transport::Frame>& frames = frames_;
  frames.clear();
  for (const Taken& t : taken) {
    transport::Frame frame;
    frame.header.kind = PacketKind::kData;
    frame.header.job = reply.job_id;
    frame.header.transfer = reply.request;
    frame.header.tensor = reply.contributions;
    frame.header.priority = HeaderPriority(reply.priority);
    frame.payload = t.packet.payload;
    frame.length = t.packet.length_bytes;
    frame.header.offset = static_cast<uint64_t>(
        reinterpret_cast<const uint8_t*>(t.packet.payload) - buffer->data());
    frames.push_back(frame);
  }
  const int fd = reply.fd;
  mu_.Unlock();
  absl::StatusOr<size_t> written = writer_->WriteFramesToSocket(fd, frames);
  mu_.Lock();
  // The reply stays in replies_ while `writing` (AwaitReply waits for it).
  reply.writing = false;
  if (written.ok()) {
    ++writes_;
    AdaptLimitLocked(&reply.coalesce_limit, frames, *written);
    for (size_t i = 0; i < taken.size(); ++i) {
      const PacketDescriptor& p = taken[i].packet;
      if (i < *written) {
        ++reply.sent;
        bytes_sent_ += p.length_bytes;
        continue;
      }
      // Not taken by the kernel: back in its place, its budget returned.
      if (unscheduled_.has_value()) unscheduled_->Refund(p.length_bytes);
      if (reply.error.empty() && reply.failed.empty()) (void)queue_.Restore(p, taken[i].sequence);
    }
  } else {
    reply.error = absl::StrCat("sending the get reply failed: ", written.status().message());
    MLF_LOG(WARNING) << "get reply " << reply.request << " (job " << reply.job_id << ", "
                     << reply.sent << " of " << reply.total_packets
                     << " packets sent): " << written.status().message();
    queue_.RemoveTransfer(id);
  }
  // AwaitReply waits for the last packet, an error or (closing) the end
  // of this write; a packet of many does not wake it.
  if (reply.sent == reply.total_packets || !reply.error.empty() || reply.closing) {
    replies_cv_.SignalAll();
  }
  return true;
}

bool SendScheduler::SendTransferPacketLocked(const PacketDescriptor& packet, Outgoing& outgoing,
                                             double now, double* next_s, bool* peer_busy,
                                             const absl::flat_hash_set<TransferId>& skip) {
  // A peer whose connection has not drained (its link is slower than
  // planned) does not stall the packets for other peers; look again soon.
  // (With one transfer or reply in hand there are no others to serve.)
  if (outgoing_.size() + replies_.size() > 1 && !writer_->PeerWritable(outgoing.send)) {
    *next_s = now + kPeerBusyRetryS;
    *peer_busy = true;
    return false;
  }
  if (!outgoing.pacer->TryConsume(packet.length_bytes, now)) {
    *next_s = outgoing.pacer->NextSendTime(packet.length_bytes, now);
    return false;
  }
  const v1::SendTransfer send = outgoing.send;
  TakeTransferRunLocked(packet, send.dst_address(), now, skip);
  TransferFramesLocked(now);
  mu_.Unlock();
  absl::StatusOr<size_t> written = writer_->WriteFramesToPeer(send, frames_);
  mu_.Lock();
  if (!written.ok()) {
    MLF_LOG(WARNING) << "transfer " << send.transfer_id() << " to " << send.dst_host()
                     << " failed: " << written.status().message();
    FailDestinationLocked(send.dst_address(), std::string(written.status().message()));
    held_.clear();
    return true;
  }
  ++writes_;
  AdaptLimitLocked(&coalesce_limit_[send.dst_address()], frames_, *written);
  SettleTransferWriteLocked(*written);
  held_.clear();
  return true;
}

void SendScheduler::TakeTransferRunLocked(const PacketDescriptor& first, const std::string& peer,
                                          double now,
                                          const absl::flat_hash_set<TransferId>& skip) {
  taken_.clear();
  taken_.push_back({first, 0});
  queue_.Remove(first, &taken_.back().sequence);
  // Coalesce (docs/architecture.md §5): the next most urgent packets, in the queue's
  // order, while they go to the same peer, their pacers have the tokens and
  // the write stays under the peer's limit. The first packet for another
  // peer, or one that must wait, ends the run: nothing is sent out of order.
  const uint64_t limit = coalesce_limit_.try_emplace(peer, options_.coalesce_bytes).first->second;
  uint64_t bytes = first.length_bytes;
  while (true) {
    std::optional<PacketDescriptor> more = queue_.PeekSkipping(now, skip);
    if (!more.has_value() || bytes + more->length_bytes > limit) break;
    auto out = outgoing_.find(more->transfer_id);
    if (out == outgoing_.end() || out->second.send.dst_address() != peer ||
        !out->second.pacer->TryConsume(more->length_bytes, now)) {
      break;
    }
    taken_.push_back({*more, 0});
    queue_.Remove(*more, &taken_.back().sequence);
    bytes += more->length_bytes;
  }
}

void SendScheduler::TransferFramesLocked(double now) {
  frames_.clear();
  frame_packet_.clear();
  held_.clear();
  for (size_t i = 0; i < taken_.size(); ++i) {
    const PacketDescriptor& p = taken_[i].packet;
    Outgoing& out = outgoing_.at(p.transfer_id);
    if (held_.empty() || held_.back() != out.buffer) held_.push_back(out.buffer);
    // Each transfer's kBegin goes before its first data packet.
    if (!out.begun) {
      MLF_LOG(DEBUG) << "sending transfer " << p.transfer_id << " from "
                     << absl::StrFormat("%.6f", now);
      if (out.checksums != nullptr) out.checksums->MarkSending();
      out.begun = true;
      transport::Frame begin;
      begin.header.kind = PacketKind::kBegin;
      begin.header.job = out.send.job_id();
      begin.header.transfer = out.send.transfer_id();
      begin.header.offset = static_cast<uint64_t>(out.send.bytes());
      frames_.push_back(begin);
      frame_packet_.push_back(-1);
    }
    transport::Frame data;
    data.header.kind = PacketKind::kData;
    data.header.job = out.send.job_id();
    data.header.transfer = out.send.transfer_id();
    data.header.tensor = p.tensor_id;
    data.header.priority = HeaderPriority(p.tensor_priority);
    const auto* payload = reinterpret_cast<const uint8_t*>(p.payload);
    data.header.offset = static_cast<uint64_t>(payload - out.buffer->data());  // within the transfer
    data.payload = payload;
    data.length = p.length_bytes;
    if (out.checksums != nullptr) data.crc = out.checksums->Find(data.header.offset, p.length_bytes);
    frames_.push_back(data);
    frame_packet_.push_back(static_cast<int>(i));
  }
}

void SendScheduler::SettleTransferWriteLocked(size_t written) {
  // Every transfer may have been cancelled or failed while unlocked.
  for (size_t f = 0; f < frames_.size(); ++f) {
    const int i = frame_packet_[f];
    auto out = outgoing_.find(frames_[f].header.transfer);
    if (out == outgoing_.end()) continue;
    if (f >= written) {
      // Not taken by the kernel: back where it was in the queue, with its
      // tokens, so that a more urgent packet released meanwhile goes first.
      if (i < 0) {
        out->second.begun = false;
      } else {
        out->second.pacer->Refund(taken_[i].packet.length_bytes);
        (void)queue_.Restore(taken_[i].packet, taken_[i].sequence);
      }
      continue;
    }
    if (i < 0) continue;
    bytes_sent_ += taken_[i].packet.length_bytes;
    if (--out->second.packets_left == 0) outgoing_.erase(out);
  }
}

}  // namespace mlfabric::daemon
