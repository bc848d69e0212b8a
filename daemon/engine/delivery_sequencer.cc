#include "daemon/engine/delivery_sequencer.h"

namespace mlfabric::daemon {

void DeliverySequencer::Expect(const std::string& key, const v1::ExpectDelivery& info,
                               const std::string& cancel_reason) {
  Delivery& delivery = endpoints_[key].expected[info.sequence()];
  delivery.info = info;  // announced again: a cancellation already made stands
  delivery.held = info.held();
  if (!cancel_reason.empty()) {
    delivery.cancelled = true;
    delivery.cancel_reason = cancel_reason;
  }
}

bool DeliverySequencer::Cancel(const std::string& key, uint64_t sequence,
                               const std::string& reason) {
  auto endpoint = endpoints_.find(key);
  if (endpoint == endpoints_.end()) return false;
  auto it = endpoint->second.expected.find(sequence);
  if (it == endpoint->second.expected.end()) return false;
  it->second.cancelled = true;
  it->second.cancel_reason = reason;
  return true;
}

std::optional<v1::ExpectDelivery> DeliverySequencer::CancelTransfer(uint64_t sequence,
                                                                    uint64_t transfer_id,
                                                                    const std::string& reason) {
  for (auto& [key, endpoint] : endpoints_) {
    auto it = endpoint.expected.find(sequence);
    if (it == endpoint.expected.end() || it->second.info.transfer_id() != transfer_id) continue;
    it->second.cancelled = true;
    it->second.cancel_reason = reason;
    return it->second.info;
  }
  return std::nullopt;
}

std::optional<v1::ExpectDelivery> DeliverySequencer::Release(uint64_t sequence,
                                                             uint64_t transfer_id) {
  for (auto& [key, endpoint] : endpoints_) {
    auto it = endpoint.expected.find(sequence);
    if (it == endpoint.expected.end() || it->second.info.transfer_id() != transfer_id) continue;
    it->second.held = false;
    return it->second.info;
  }
  return std::nullopt;
}

std::vector<v1::ExpectDelivery> DeliverySequencer::Held(const std::string& key) const {
  std::vector<v1::ExpectDelivery> held;
  auto endpoint = endpoints_.find(key);
  if (endpoint == endpoints_.end()) return held;
  for (const auto& [sequence, delivery] : endpoint->second.expected) {
    if (delivery.held && !delivery.cancelled) held.push_back(delivery.info);
  }
  return held;
}

std::vector<v1::ExpectDelivery> DeliverySequencer::Undelivered(const std::string& key) const {
  std::vector<v1::ExpectDelivery> out;
  auto endpoint = endpoints_.find(key);
  if (endpoint == endpoints_.end()) return out;
  for (const auto& [sequence, delivery] : endpoint->second.expected) {
    if (!delivery.cancelled) out.push_back(delivery.info);
  }
  return out;
}

std::vector<uint64_t> DeliverySequencer::Reset() {
  std::vector<uint64_t> pending;
  for (const auto& [key, endpoint] : endpoints_) {
    for (const auto& [sequence, delivery] : endpoint.expected) {
      if (!delivery.cancelled) pending.push_back(delivery.info.transfer_id());
    }
  }
  endpoints_.clear();
  return pending;
}

std::vector<uint64_t> DeliverySequencer::Rename(const std::string& from, const std::string& to,
                                                const std::string& server) {
  std::vector<uint64_t> dropped;
  if (from == to) return dropped;
  if (auto old = endpoints_.find(to); old != endpoints_.end()) {
    for (const auto& [sequence, delivery] : old->second.expected) {
      if (!delivery.cancelled) dropped.push_back(delivery.info.transfer_id());
    }
    endpoints_.erase(old);
  }
  auto moving = endpoints_.find(from);
  if (moving == endpoints_.end()) return dropped;
  Endpoint endpoint = std::move(moving->second);
  endpoints_.erase(moving);
  for (auto& [sequence, delivery] : endpoint.expected) delivery.info.set_server(server);
  endpoints_[to] = std::move(endpoint);
  return dropped;
}

std::vector<uint64_t> DeliverySequencer::CancelAll(const std::string& key,
                                                   const std::string& reason) {
  std::vector<uint64_t> cancelled;
  auto endpoint = endpoints_.find(key);
  if (endpoint == endpoints_.end()) return cancelled;
  for (auto& [sequence, delivery] : endpoint->second.expected) {
    if (delivery.cancelled) continue;
    delivery.cancelled = true;
    delivery.cancel_reason = reason;
    cancelled.push_back(delivery.info.transfer_id());
  }
  return cancelled;
}

DeliverySequencer::Step DeliverySequencer::Next(
    const std::string& key, const std::function<bool(uint64_t transfer)>& complete) {
  Step step;
  auto found = endpoints_.find(key);
  if (found == endpoints_.end()) return step;
  Endpoint& endpoint = found->second;
  while (!endpoint.expected.empty()) {
    auto head = endpoint.expected.begin();
    if (head->first < endpoint.next_sequence) {  // announced again after it was passed
      endpoint.expected.erase(head);
      continue;
    }
    if (head->first != endpoint.next_sequence) return step;  // an earlier one is not announced yet
    step.sequence = head->first;
    step.info = head->second.info;
    if (head->second.cancelled) {
      step.kind = Step::kSkip;
      step.reason = head->second.cancel_reason;
      endpoint.expected.erase(head);
      ++endpoint.next_sequence;
      return step;
    }
    // A held copy waits for its release; everything after it waits too.
    if (!head->second.held && complete(head->second.info.transfer_id())) {
      step.kind = Step::kDeliver;
    }
    return step;
  }
  return step;
}

void DeliverySequencer::Advance(const std::string& key) {
  auto found = endpoints_.find(key);
  if (found == endpoints_.end()) return;
  found->second.expected.erase(found->second.next_sequence);
  ++found->second.next_sequence;
}

std::vector<std::pair<uint32_t, std::string>> DeliverySequencer::EndpointsExpecting(
    uint64_t transfer_id) const {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const auto& [key, endpoint] : endpoints_) {
    for (const auto& [sequence, delivery] : endpoint.expected) {
      if (delivery.info.transfer_id() == transfer_id) {
        out.emplace_back(delivery.info.job_id(), delivery.info.server());
      }
    }
  }
  return out;
}

size_t DeliverySequencer::Pending(const std::string& key) const {
  auto found = endpoints_.find(key);
  return found == endpoints_.end() ? 0 : found->second.expected.size();
}

uint64_t DeliverySequencer::NextPosition(const std::string& key) const {
  auto found = endpoints_.find(key);
  return found == endpoints_.end() ? 1 : found->second.next_sequence;
}

}  // namespace mlfabric::daemon
