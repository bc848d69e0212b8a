#include "scheduler/service/plan_lead.h"

#include <catch2/catch.hpp>
#include <limits>

namespace mlfabric {
namespace {

TEST_CASE("An automatic lead is 0 until a cycle is recorded") {
  PlanLead lead;
  CHECK(lead.automatic());
  CHECK(lead.LeadS() == 0);
  lead.Record(0.03);
  CHECK(lead.LeadS() == Approx(0.03));
}

TEST_CASE("An automatic lead is the longest of the last 20 cycles") {
  PlanLead lead;
  for (int ms = 20; ms >= 1; --ms) lead.Record(ms * 1e-3);
  CHECK(lead.LeadS() == Approx(0.020));
  lead.Record(0.005);  // drops the oldest, 20 ms
  CHECK(lead.LeadS() == Approx(0.019));
  lead.Record(0.5);
  CHECK(lead.LeadS() == Approx(0.5));
  // Twenty fast cycles later the slow one is forgotten.
  for (int i = 0; i < 19; ++i) lead.Record(0.002);
  CHECK(lead.LeadS() == Approx(0.5));
  lead.Record(0.002);
  CHECK(lead.LeadS() == Approx(0.002));
}

TEST_CASE("With fewer cycles the lead is the longest of them") {
  PlanLead lead;
  for (int ms : {5, 1, 9, 3}) lead.Record(ms * 1e-3);
  CHECK(lead.LeadS() == Approx(0.009));
}

TEST_CASE("An automatic lead stays within its bound; bad samples count as 0") {
  PlanLead lead(PlanLead::kAuto, /*max_s=*/0.1);
  for (int i = 0; i < 5; ++i) lead.Record(2.0);
  CHECK(lead.LeadS() == Approx(0.1));
  PlanLead odd;
  odd.Record(-1);
  odd.Record(std::numeric_limits<double>::quiet_NaN());
  odd.Record(std::numeric_limits<double>::infinity());
  CHECK(odd.LeadS() == 0);
}

TEST_CASE("A fixed lead ignores the cycles") {
  PlanLead none(0);
  PlanLead fixed(0.025);
  CHECK_FALSE(fixed.automatic());
  for (int i = 0; i < 30; ++i) {
    none.Record(0.08);
    fixed.Record(0.08);
  }
  CHECK(none.LeadS() == 0);
  CHECK(fixed.LeadS() == Approx(0.025));
}

}  // namespace
}  // namespace mlfabric
