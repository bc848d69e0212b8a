#include "scheduler/service/host_table.h"

namespace mlfabric {

HostState* HostTable::Find(const std::string& name) {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : &it->second;
}

const HostState* HostTable::Find(const std::string& name) const {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : &it->second;
}

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
