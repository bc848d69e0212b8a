#include "daemon/engine/incoming_transfers.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

absl::Status Incoming::Receive(uint64_t transfer, uint64_t offset, uint64_t length) {
  const uint64_t end = offset + length;
  if (end < offset || end > total) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer, " has ", total,
                                                   " bytes; a packet brought [", offset, ", ",
                                                   end, ")"));
  }
  if (length == 0) return absl::OkStatus();
  // The first range that ends after `offset`, if it begins before `end`,
  // overlaps. Ranges are disjoint and not adjacent (merged).
  auto next = arrived.upper_bound(offset);
  if (next != arrived.begin()) {
    auto before = std::prev(next);
    if (before->second > offset) {
      return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer, " received bytes [",
                                                     offset, ", ", end, ") twice"));
    }
  }
  if (next != arrived.end() && next->first < end) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer, " received bytes [",
                                                   offset, ", ", end, ") twice"));
  }
  // In-order packets extend the range before them in place: no
  // allocation per packet.
  if (next != arrived.begin() && std::prev(next)->second == offset) {
    auto before = std::prev(next);
    before->second = end;
    if (next != arrived.end() && next->first == end) {  // and close the gap to the next
      before->second = next->second;
      arrived.erase(next);
    }
  } else if (next != arrived.end() && next->first == end) {  // joins the range after
    const uint64_t until = next->second;
    arrived.erase(next);
    arrived.emplace(offset, until);
  } else {
    arrived.emplace(offset, end);
  }
  received += length;
  return absl::OkStatus();
}

Incoming* IncomingTransfers::Find(uint64_t transfer) {
  auto it = transfers_.find(transfer);
  return it == transfers_.end() ? nullptr : &it->second;
}

const Incoming* IncomingTransfers::Find(uint64_t transfer) const {
  auto it = transfers_.find(transfer);
  return it == transfers_.end() ? nullptr : &it->second;
}

Incoming& IncomingTransfers::Add(uint64_t transfer, uint32_t job, uint64_t total,
                                 std::shared_ptr<SharedBuffer> buffer) {
  Incoming& incoming = transfers_[transfer];
  incoming = Incoming{};
  incoming.job_id = job;
  incoming.total = total;
  incoming.buffer = std::move(buffer);
  return incoming;
}

bool IncomingTransfers::Complete(uint64_t transfer) const {
  const Incoming* incoming = Find(transfer);
  return incoming != nullptr && incoming->received >= incoming->total;
}

bool IncomingTransfers::Erase(uint64_t transfer) { return transfers_.erase(transfer) > 0; }

void IncomingTransfers::Recycle(uint64_t transfer) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return;
  std::shared_ptr<SharedBuffer> buffer = std::move(it->second.buffer);
  transfers_.erase(it);
  if (pool_ != nullptr) pool_->Recycle(std::move(buffer));  // kept only if nobody else holds it
}

void IncomingTransfers::Discard(uint64_t transfer) {
  Recycle(transfer);
  if (!discarded_.insert(transfer).second) return;
  discard_order_.push_back(transfer);
  if (discard_order_.size() > kDiscardsKept) {
    discarded_.erase(discard_order_.front());
    discard_order_.pop_front();
  }
}

std::string IncomingTransfers::JobMismatch(uint64_t transfer, uint32_t job) const {
  const Incoming* incoming = Find(transfer);
  if (incoming == nullptr || incoming->job_id == job) return "";
  MLF_LOG(WARNING) << "transfer " << transfer << " arrived as job " << incoming->job_id
                   << "'s data but is job " << job << "'s: refused";
  return absl::StrCat("transfer ", transfer, " arrived as job ", incoming->job_id,
                      "'s data but is job ", job, "'s");
}

}  // namespace mlfabric::daemon
