#include "daemon/engine/round_table.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "daemon/engine/element_types.h"

namespace mlfabric::daemon {

RoundTable::RoundTable(int64_t rounds_kept, uint64_t chunk_bytes, BufferPool* buffers)
    : rounds_kept_(std::max<int64_t>(1, rounds_kept)),
      chunk_bytes_(chunk_bytes),
      buffers_(buffers) {}

std::pair<uint64_t, uint64_t> RoundTable::ChunkRange(const Round& round, uint32_t chunk) const {
  const uint64_t begin = uint64_t{chunk} * chunk_bytes_;
  return {begin, std::min<uint64_t>(begin + chunk_bytes_, static_cast<uint64_t>(round.bytes))};
}

RoundTable::Round& RoundTable::GetOrCreateLocked(const std::string& key, int64_t number,
                                                 Effects* fx) {
  auto [it, created] = rounds_.try_emplace(Key{key, number});
  if (!created) return it->second;
  it->second.round = number;
  it->second.pool_id = (uint64_t{1} << 61) | next_id_++;
  // Keep the last rounds_kept rounds for gets that come late (workers
  // behind, late backup workers); older ones go.
  for (auto old = rounds_.lower_bound(Key{key, std::numeric_limits<int64_t>::min()});
       old != rounds_.end() && old->first.first == key;) {
    if (old->first.second > number - rounds_kept_) break;  // sorted by number
    if (!old->second.reported) {
      FailLocked(old->first, old->second, absl::StrCat("round ", number, " began"), fx);
    }
    for (const auto& [member, contributions] : old->second.members) round_of_.erase(member);
    (void)pool_.UnregisterTransfer(old->second.pool_id);
    std::shared_ptr<SharedBuffer> sum = std::move(old->second.sum);
    old = rounds_.erase(old);
    if (buffers_ != nullptr) buffers_->Recycle(std::move(sum));  // kept if nobody holds it
  }
  return it->second;
}

void RoundTable::FailLocked(const Key& key, Round& round, const std::string& reason,
                            Effects* fx) {
  if (!round.failed.empty() || round.reported) return;
  round.failed = reason;
  round.reported = true;
  (void)pool_.UnregisterTransfer(round.pool_id);
  MLF_LOG(WARNING) << "round " << round.round << " of server " << key.first
                   << " failed: " << reason;
  for (const auto& [member, contributions] : round.members) {
    fx->failed.emplace_back(member, absl::StrCat("round ", round.round, " failed: ", reason));
  }
  fx->changed = true;
}

void RoundTable::Join(const v1::ExpectDelivery& expect, bool server_connected, Effects* fx) {
  const std::string key = absl::StrCat(expect.job_id(), "/", expect.server());
  MutexLock lock(&mu_);
  const Key round_key{key, expect.version()};
  Round& round = GetOrCreateLocked(key, expect.version(), fx);
  const uint64_t transfer = expect.transfer_id();
  round_of_[transfer] = round_key;
  round.members[transfer] = expect.contributions();
  if (!round.failed.empty()) {
    fx->failed.emplace_back(transfer,
                            absl::StrCat("round ", round.round, " failed: ", round.failed));
    return;
  }
  auto fail = [&](const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FailLocked(round_key, round, reason, fx);
  };
  const std::optional<aggregator::DType> type = PoolType(expect.dtype());
  if (round.bytes < 0) {
    const size_t element = ElementBytes(expect.dtype());
    if (!type.has_value() || expect.bytes() <= 0 || expect.bytes() % element != 0) {
      fail(absl::StrCat("round of ", expect.bytes(), " bytes of ", v1::DType_Name(expect.dtype()),
                        " cannot be summed element-wise"));
      return;
    }
    const size_t bytes = static_cast<size_t>(expect.bytes());
    // A reused buffer keeps its old bytes: the pool initialises each packet
    // with its first contribution (aggregator::PacketPool::RegisterTransfer).
    std::shared_ptr<SharedBuffer> sum = buffers_ != nullptr ? buffers_->Take(bytes) : nullptr;
    if (sum == nullptr) {
      auto created = SharedBuffer::Create(bytes);
      if (!created.ok()) {
        fail(std::string(created.status().message()));
        return;
      }
      sum = std::make_shared<SharedBuffer>(std::move(*created));
    }
    round.size = expect.round_size();
    round.bytes = expect.bytes();
    round.dtype = expect.dtype();
    round.sum = std::move(sum);
    aggregator::AggregationSpec spec;
    spec.dtype = *type;
    spec.bytes = static_cast<uint64_t>(round.bytes);
    spec.packet_bytes = static_cast<uint32_t>(chunk_bytes_);
    spec.expected_contributions = static_cast<uint32_t>(std::max(0, round.size));
    round.packets = aggregator::PacketCount(spec);
    round.ready.reserve(round.packets);
    if (auto registered = pool_.RegisterTransfer(
            round.pool_id, spec,
            absl::Span<std::byte>(reinterpret_cast<std::byte*>(round.sum->data()),
                                  round.sum->size()));
        !registered.ok()) {
      fail(absl::StrCat("round ", round.round, ": ", registered.message()));
      return;
    }
    fx->changed = true;  // gets waiting for the round to begin
  } else if (expect.round_size() != round.size || expect.bytes() != round.bytes ||
             expect.dtype() != round.dtype) {
    fail(absl::StrCat("push ", transfer, " (", expect.bytes(), " bytes of ",
                      v1::DType_Name(expect.dtype()), ") does not match round ", round.round, " (",
                      round.bytes, " bytes of ", v1::DType_Name(round.dtype), ")"));
    return;
  }
  round.contributions += expect.contributions();
  if (expect.contributions() <= 0) {
    fail(absl::StrCat("push ", transfer, " stands for ", expect.contributions(),
                      " contributions"));
    return;
  }
  // The pool refuses more contributions than the round's size.
  if (auto joined = pool_.AddContributor(round.pool_id, transfer, 1.0,
                                         static_cast<uint32_t>(expect.contributions()));
      !joined.ok()) {
    fail(absl::StrCat("round ", round.round, " was sent ", round.contributions, " pushes for ",
                      round.size, ": ", joined.message()));
    return;
  }
  if (!server_connected) {
    fail(absl::StrCat("server '", expect.server(), "' is not connected"));
  }
}

std::optional<std::pair<std::string, int64_t>> RoundTable::RoundOf(uint64_t transfer) const {
  MutexLock lock(&mu_);
  auto it = round_of_.find(transfer);
  if (it == round_of_.end()) return std::nullopt;
  return it->second;
}

void RoundTable::Fold(uint64_t transfer, const uint8_t* data, uint64_t offset, uint32_t length,
                      Effects* fx) {
  MutexLock lock(&mu_);
  auto member = round_of_.find(transfer);
  if (member == round_of_.end()) return;
  auto it = rounds_.find(member->second);
  if (it == rounds_.end()) return;
  Round& round = it->second;
  if (!round.failed.empty() || round.complete || round.bytes < 0) return;
  // Summed packet by packet into the round's sum (aggregator::PacketPool);
  // a packet of the grid is final once all `size` pushes covered it.
  const size_t ready_before = round.ready.size();
  absl::Status added = pool_.Add(
      round.pool_id, transfer, offset,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), length), &round.ready);
  if (!added.ok()) {
    FailLocked(it->first, round,
               absl::StrCat("packet [", offset, ", +", length, ") of push ", transfer, ": ",
                            added.message()),
               fx);
    return;
  }
  ReleaseLocked(it->first, round, ready_before, fx);
}

void RoundTable::ReleaseLocked(const Key& key, Round& round, size_t ready_before, Effects* fx) {
  if (round.ready.size() == ready_before) return;
  // Workers' gets stream the new chunks at once (Mercury PS).
  for (uint64_t stream : round.watchers) {
    for (size_t i = ready_before; i < round.ready.size(); ++i) {
      const auto [begin, end] = ChunkRange(round, round.ready[i]);
      fx->chunks.push_back({stream, begin, end, round.size});
    }
  }
  if (round.ready.size() == round.packets) {
    round.complete = true;
    fx->complete.push_back(key);
    fx->changed = true;  // AwaitSum
  }
}

void RoundTable::Shrink(const std::string& key, int64_t number, int32_t size,
                        const std::string& reason, Effects* fx) {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it == rounds_.end()) return;
  Round& round = it->second;
  if (round.bytes < 0 || !round.failed.empty() || round.complete || round.reported ||
      size >= round.size) {
    return;
  }
  if (size < round.contributions || size <= 0) {
    FailLocked(it->first, round,
               absl::StrCat("asked to close with ", size, " pushes (", reason, ") but ",
                            round.contributions, " were announced"),
               fx);
    return;
  }
  const size_t ready_before = round.ready.size();
  if (absl::Status lowered =
          pool_.LowerExpected(round.pool_id, static_cast<uint32_t>(size), &round.ready);
      !lowered.ok()) {
    FailLocked(it->first, round, absl::StrCat("closing with ", size, " pushes: ", lowered.message()),
               fx);
    return;
  }
  MLF_LOG(INFO) << "round " << number << " of server " << key << " closes with " << size
                << " of its " << round.size << " pushes: " << reason;
  round.size = size;
  ReleaseLocked(it->first, round, ready_before, fx);
}

void RoundTable::Fail(const std::string& key, int64_t number, const std::string& reason,
                      Effects* fx) {
  MutexLock lock(&mu_);
  Round& round = GetOrCreateLocked(key, number, fx);
  // Handed to the application already: its acknowledgement decides (a
  // restarted scheduler fails the round it may have been in; in_doubt.h).
  if (round.delivering) return;
  FailLocked(Key{key, number}, round, reason, fx);
}

bool RoundTable::FailMemberRound(uint64_t transfer, const std::string& reason, Effects* fx) {
  MutexLock lock(&mu_);
  auto member = round_of_.find(transfer);
  if (member == round_of_.end()) return false;
  auto it = rounds_.find(member->second);
  if (it != rounds_.end()) {
    FailLocked(it->first, it->second,
               absl::StrCat("push ", transfer, " of the round failed: ", reason), fx);
  }
  return true;
}

void RoundTable::FailServer(const std::string& key, const std::string& reason, Effects* fx,
                            bool spare_delivering) {
  MutexLock lock(&mu_);
  for (auto it = rounds_.lower_bound(Key{key, std::numeric_limits<int64_t>::min()});
       it != rounds_.end() && it->first.first == key; ++it) {
    if (spare_delivering && it->second.delivering) continue;
    if (!it->second.reported) FailLocked(it->first, it->second, reason, fx);
  }
}

std::optional<RoundTable::Delivery> RoundTable::BeginDelivery(const std::string& key,
                                                              int64_t number) {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it == rounds_.end()) return std::nullopt;
  Round& round = it->second;
  if (!round.complete || round.delivering || round.reported) return std::nullopt;
  round.delivering = true;
  // Its own id space: acks for rounds never collide with transfer ids.
  Delivery delivery;
  delivery.id = (uint64_t{1} << 63) | next_id_++;
  delivery.round = round.round;
  delivery.size = round.size;
  for (const auto& [member, contributions] : round.members) delivery.members.push_back(member);
  delivery.bytes = round.bytes;
  delivery.sum = round.sum;
  deliveries_[delivery.id] = it->first;
  (void)pool_.UnregisterTransfer(round.pool_id);  // summed; the sum stays in round.sum
  return delivery;
}

void RoundTable::DeliveryFailed(uint64_t id, const std::string& reason, Effects* fx) {
  MutexLock lock(&mu_);
  auto delivery = deliveries_.find(id);
  if (delivery == deliveries_.end()) return;
  const Key key = delivery->second;
  deliveries_.erase(delivery);
  auto it = rounds_.find(key);
  if (it != rounds_.end()) FailLocked(it->first, it->second, reason, fx);
}

bool RoundTable::IsDelivery(uint64_t id) const {
  MutexLock lock(&mu_);
  return deliveries_.count(id) != 0;
}

std::optional<RoundTable::Acknowledged> RoundTable::Acknowledge(uint64_t id) {
  MutexLock lock(&mu_);
  auto delivery = deliveries_.find(id);
  if (delivery == deliveries_.end()) return std::nullopt;
  const Key key = delivery->second;
  deliveries_.erase(delivery);
  auto it = rounds_.find(key);
  if (it == rounds_.end() || it->second.reported) return std::nullopt;  // failed meanwhile
  it->second.reported = true;
  Acknowledged acknowledged;
  acknowledged.key = key.first;
  acknowledged.round = it->second.round;
  for (const auto& [member, contributions] : it->second.members) {
    acknowledged.members.push_back(member);
  }
  return acknowledged;
}

int32_t RoundTable::Size(const std::string& key, int64_t number) const {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  return it == rounds_.end() || it->second.bytes < 0 ? 0 : it->second.size;
}

std::shared_ptr<SharedBuffer> RoundTable::CompleteSum(const std::string& key,
                                                     int64_t number) const {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it == rounds_.end() || !it->second.failed.empty() || !it->second.complete) return nullptr;
  return it->second.sum;
}

RoundTable::GetState RoundTable::Lookup(const std::string& key, int64_t number,
                                        std::string* error, int64_t* bytes) const {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it != rounds_.end()) {
    if (!it->second.failed.empty()) {
      if (error != nullptr) *error = it->second.failed;
      return GetState::kFailed;
    }
    if (it->second.bytes < 0) return GetState::kNotYet;
    if (bytes != nullptr) *bytes = it->second.bytes;
    return GetState::kBegun;
  }
  // A round rounds_kept or more behind the newest is gone for good.
  auto newest = rounds_.lower_bound(Key{key, std::numeric_limits<int64_t>::max()});
  if (newest == rounds_.begin()) return GetState::kNotYet;
  --newest;
  if (newest->first.first == key && newest->first.second - number >= rounds_kept_) {
    return GetState::kGone;
  }
  return GetState::kNotYet;
}

std::optional<RoundTable::Watch> RoundTable::AddWatcher(const std::string& key, int64_t number,
                                                        uint64_t stream) {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it == rounds_.end()) return std::nullopt;
  Round& round = it->second;
  if (round.bytes < 0 || !round.failed.empty()) return std::nullopt;
  round.watchers.push_back(stream);
  Watch watch;
  watch.sum = round.sum;
  watch.bytes = round.bytes;
  for (size_t chunk = 0; chunk < round.packets; ++chunk) {
    watch.chunks.push_back(ChunkRange(round, static_cast<uint32_t>(chunk)));
  }
  for (uint32_t chunk : round.ready) watch.ready.push_back(ChunkRange(round, chunk));
  watch.contributions = round.size;
  return watch;
}

void RoundTable::RemoveWatcher(const std::string& key, int64_t number, uint64_t stream) {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  if (it == rounds_.end()) return;
  auto& watchers = it->second.watchers;
  watchers.erase(std::remove(watchers.begin(), watchers.end(), stream), watchers.end());
}

std::string RoundTable::Failure(const std::string& key, int64_t number) const {
  MutexLock lock(&mu_);
  auto it = rounds_.find(Key{key, number});
  return it == rounds_.end() ? std::string() : it->second.failed;
}

size_t RoundTable::rounds() const {
  MutexLock lock(&mu_);
  return rounds_.size();
}

}  // namespace mlfabric::daemon
