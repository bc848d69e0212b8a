#include "scheduler/service/host_table.h"

namespace mlfabric {

const HostState* HostTable::Alive(const std::string& name) const {
  const HostState* host = Find(name);
  return host != nullptr && host->alive ? host : nullptr;
}

bool HostTable::MarkDown(const std::string& name) {
  HostState* host = Find(name);
  if (host == nullptr) return false;
  host->alive = false;
  return true;
}

}  // namespace mlfabric
