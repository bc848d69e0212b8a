#include "daemon/receive/incoming_transfers.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

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

std::string IncomingTransfers::JobMismatch(uint64_t transfer, uint32_t job) const {
  const Incoming* incoming = Find(transfer);
  if (incoming == nullptr || incoming->job_id == job) return "";
  MLF_LOG(WARNING) << "transfer " << transfer << " arrived as job " << incoming->job_id
                   << "'s data but is job " << job << "'s: refused";
  return absl::StrCat("transfer ", transfer, " arrived as job ", incoming->job_id,
                      "'s data but is job ", job, "'s");
}

}  // namespace mlfabric::daemon
