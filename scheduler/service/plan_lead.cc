#include "scheduler/service/plan_lead.h"

#include <algorithm>
#include <cmath>

namespace mlfabric {

PlanLead::PlanLead(double fixed_s, double max_s) : fixed_s_(fixed_s), max_s_(max_s) {}

double PlanLead::LeadS() const {
  if (!automatic()) return fixed_s_;
  if (recent_.empty()) return 0;
  return std::min(*std::max_element(recent_.begin(), recent_.end()), max_s_);
}

void PlanLead::Record(double cycle_s) {
  if (!automatic()) return;
  recent_.push_back(std::isfinite(cycle_s) && cycle_s > 0 ? cycle_s : 0);
  if (recent_.size() > kWindow) recent_.pop_front();
}

}  // namespace mlfabric
