#include "scheduler/core/replication.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <catch2/catch.hpp>

#include "scheduler/core/mlfabric_planner.h"
#include "scheduler/core/plan_checker.h"

namespace mlfabric::core {
namespace {

using Vec = std::vector<double>;

Vec Add(const Vec& a, const Vec& b, double scale = 1.0) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + scale * b[i];
  return out;
}

double Norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

Vec Random(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<double> normal;
  Vec v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

// Eq. 2 applied literally: w_{t+1} = w_t + u_t + gamma (w_t - w_{t-1}).
struct Model {
  Vec w, previous;
  void Apply(const Vec& u, double gamma) {
    Vec next = Add(Add(w, u), Add(w, previous, -1.0), gamma);
    previous = w;
    w = next;
  }
};

TEST_CASE("Eqs. 5-6: re-ordering two updates diverges by gamma |u1 - u2|") {
  std::mt19937_64 rng(5);
  const double gamma = 0.9;
  const Vec w0 = Random(rng, 32), h0 = Random(rng, 32), u1 = Random(rng, 32), u2 = Random(rng, 32);
  Model server{w0, Add(w0, h0, -1.0)}, replica = server;
  server.Apply(u1, gamma);
  server.Apply(u2, gamma);
  replica.Apply(u2, gamma);
  replica.Apply(u1, gamma);
  CHECK(Norm(Add(server.w, replica.w, -1.0)) == Approx(gamma * Norm(Add(u1, u2, -1.0))));
}

TEST_CASE("Eqs. 7-8 on real vectors, and the norm-only bound of eqs. 10-11") {
  std::mt19937_64 rng(7);
  const double gamma = 0.8;
  for (int trial = 0; trial < 20; ++trial) {
    const Vec w0 = Random(rng, 16), h0 = Random(rng, 16), u1 = Random(rng, 16), u2 = Random(rng, 16);
    Model server{w0, Add(w0, h0, -1.0)};
    server.Apply(u1, gamma);
    const Vec w1 = server.w;
    server.Apply(u2, gamma);
    // Eq. 7: the server leads a replica at w0 by u1, u2.
    const Vec eq7 = Add(Add(Add(Vec(16, 0), h0, gamma + gamma * gamma), u1, 1 + gamma), u2);
    CHECK(Norm(Add(server.w, w0, -1.0)) == Approx(Norm(eq7)));
    // Eq. 8: after u1 reaches the replica first, the lead shrinks.
    const Vec eq8 = Add(Add(Add(Vec(16, 0), h0, gamma * gamma), u1, gamma), u2);
    CHECK(Norm(Add(server.w, w1, -1.0)) == Approx(Norm(eq8)));
    const Vec norms = {Norm(u1), Norm(u2)};
    const double bound7 = DivergenceBound(gamma, Norm(h0), norms, 0, 2);
    const double bound8 = DivergenceBound(gamma, Norm(h0), norms, 1, 2);
    // The derived coefficients: c0 = gamma + gamma^2, c1 = 1 + gamma, c2 = 1.
    CHECK(bound7 == Approx((gamma + gamma * gamma) * Norm(h0) + (1 + gamma) * norms[0] + norms[1]));
    CHECK(bound8 == Approx(gamma * gamma * Norm(h0) + gamma * norms[0] + norms[1]));
    CHECK(Norm(eq7) <= bound7 + 1e-12);
    CHECK(Norm(eq8) <= bound8 + 1e-12);
    CHECK(bound8 < bound7);
  }
}

TEST_CASE("The generalised bound holds for any lead and is tight for aligned updates") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(0.0, 0.99);
  for (int trial = 0; trial < 200; ++trial) {
    INFO("trial " << trial);
    const double gamma = uniform(rng);
    const size_t s = 1 + rng() % 12, r = rng() % (s + 1);
    const bool aligned = trial % 4 == 0;
    const Vec direction = Random(rng, 8);
    const Vec w0 = Random(rng, 8);
    const Vec h0 = aligned ? Add(Vec(8, 0), direction, uniform(rng)) : Random(rng, 8);
    Model model{w0, Add(w0, h0, -1.0)};
    Vec w_r = w0;
    Vec norms;
    for (size_t m = 1; m <= s; ++m) {
      const Vec u = aligned ? Add(Vec(8, 0), direction, uniform(rng)) : Random(rng, 8);
      norms.push_back(Norm(u));
      model.Apply(u, gamma);
      if (m == r) w_r = model.w;
    }
    const double actual = Norm(Add(model.w, w_r, -1.0));
    const double bound = DivergenceBound(gamma, Norm(h0), norms, r, s);
    CHECK(actual <= bound * (1 + 1e-12) + 1e-12);
    if (aligned) CHECK(actual == Approx(bound));
  }
}

Batch ReplicaBatch(double divergence_bound) {
  Batch batch;
  batch.server = "s";
  batch.tau_max = 100;
  // The replica's downlink has half the server's: replicating all four
  // updates takes twice as long as serving them.
  batch.hosts = {{"s", 1e10, 1e10, {}, {}}, {"r", 1e10, 5e9, {}, {}}};
  for (int i = 0; i < 4; ++i) {
    const std::string w = "w" + std::to_string(i);
    batch.hosts.push_back({w, 1e10, 1e10, {}, {}});
    batch.updates.push_back({"g" + std::to_string(i), w, 125000000, 0, 1.0, {}});
  }
  ReplicaSpec replica;
  replica.host = "r";
  replica.divergence_bound = divergence_bound;
  replica.momentum = 0.5;
  replica.history_norm = 1.0;
  batch.replica = replica;
  return batch;
}

TEST_CASE("A loose bound punts the replica transfers that finish after T_last") {
  auto plan = MlfabricPlanner().PlanBatch(ReplicaBatch(100.0));
  REQUIRE(plan.ok());
  // The worker uplinks are busy with the server transfers in turn; replica
  // transfers use what is left, and the last ones finish after T_last = 0.4 s.
  CHECK(plan->commits.back().at_s == Approx(0.4));
  CHECK(plan->replica_commits.size() == 2);
  CHECK(plan->punted == std::vector<std::string>{"g2", "g3"});
  CHECK(plan->replica_divergence <= 100.0);
  CHECK(CheckPlan(ReplicaBatch(100.0), *plan).empty());
}

TEST_CASE("A tight bound delays the last server transfer until the replica catches up") {
  const Batch batch = ReplicaBatch(0.0);
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  CHECK(plan->punted.empty());
  REQUIRE(plan->replica_commits.size() == 4);
  CHECK(plan->replica_divergence == 0.0);
  // The last server commit waits for the replica's last commit.
  CHECK(plan->commits.back().at_s > plan->replica_commits.back().at_s);
  CHECK(plan->replica_commits.back().at_s == Approx(0.8));
  CHECK(plan->commits.back().at_s == Approx(0.9));
  CHECK(plan->commits[2].at_s == Approx(0.3));  // only the last transfer moves
  const auto problems = CheckPlan(batch, *plan);
  INFO((problems.empty() ? "" : problems[0]));
  CHECK(problems.empty());
}

TEST_CASE("An unreachable replica makes the server drop what would break the bound") {
  Batch batch = ReplicaBatch(2.0);
  // The replica's downlink dies after half an update.
  batch.hosts[1].downlink_profile = {{0, 5e9}, {0.1, 0}};
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  // H_1 = 0.5 * 1 + 1 = 1.5 <= 2, H_1 + H_2 = 1.5 + 1.75 > 2: one update stays.
  REQUIRE(plan->order.size() == 1);
  CHECK(plan->dropped.size() == 3);
  for (const Drop& d : plan->dropped) CHECK(d.reason == "replica_divergence");
  CHECK(plan->replica_commits.empty());
  CHECK(plan->punted == plan->order);
  CHECK(plan->replica_divergence == Approx(1.5));
  const auto problems = CheckPlan(batch, *plan);
  INFO((problems.empty() ? "" : problems[0]));
  CHECK(problems.empty());
}

TEST_CASE("Punted updates re-sent as pending go to the replica first") {
  Batch batch = ReplicaBatch(100.0);
  UpdateRequest punted;
  punted.id = "p0";
  punted.worker = "w3";
  punted.bytes = 62500000;  // 0.5 Gbit
  punted.norm = 2.0;
  batch.replica->pending = {punted};
  batch.replica->lead = {0.5};
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->replica_commits.empty());
  CHECK(plan->replica_commits[0].update == "p0");
  CHECK(plan->replica_commits.size() + plan->punted.size() == 5);
  bool sent = false;
  for (const Transfer& t : plan->transfers) {
    sent = sent || (t.update == "p0" && t.kind == TransferKind::kReplica && t.src == "w3");
  }
  CHECK(sent);
  // p0 is not a server update: it is neither ordered nor dropped.
  CHECK(std::find(plan->order.begin(), plan->order.end(), "p0") == plan->order.end());
  const auto problems = CheckPlan(batch, *plan);
  INFO((problems.empty() ? "" : problems[0]));
  CHECK(problems.empty());
}

// Four punted copies of equal size from four workers, an aggregator host
// with a fast link, and the replica's slow downlink: Alg. 3 sums the punted
// copies on their way, and the batch's own copies still go direct.
Batch PendingAggregationBatch(bool pending_only) {
  Batch batch = ReplicaBatch(100.0);
  batch.hosts.push_back({"a", 1e11, 1e11, {}, {}});
  batch.replica->aggregators = {"a"};
  batch.aggregators.clear();
  batch.replica->aggregate_pending_only = pending_only;
  for (int i = 0; i < 4; ++i) {
    UpdateRequest punted;
    punted.id = "p" + std::to_string(i);
    punted.worker = "w" + std::to_string(i);
    punted.bytes = 125000000;
    punted.norm = 1.0;
    batch.replica->pending.push_back(punted);
  }
  return batch;
}

TEST_CASE("Punted copies are summed at the replica's aggregators; in-flight copies go direct") {
  {
    const Batch batch = PendingAggregationBatch(/*pending_only=*/true);
    auto plan = MlfabricPlanner().PlanBatch(batch);
    REQUIRE(plan.ok());
    std::vector<std::string> summed;
    for (const Transfer& t : plan->transfers) {
      if (t.kind != TransferKind::kReplicaAggregate) continue;
      CHECK(t.src == "a");
      CHECK(t.dst == "r");
      summed.insert(summed.end(), t.constituents.begin(), t.constituents.end());
    }
    CHECK_FALSE(summed.empty());  // summing saves the replica's slow downlink
    for (const std::string& id : summed) CHECK(id[0] == 'p');
    for (const Transfer& t : plan->transfers) {
      if (t.kind == TransferKind::kReplica && t.update[0] == 'g') CHECK(t.dst == "r");
    }
    const auto problems = CheckPlan(batch, *plan);
    INFO((problems.empty() ? "" : problems[0]));
    CHECK(problems.empty());
  }
}

TEST_CASE("Honest commits never precede arrival nor the previous commit") {
  CHECK(HonestCommits({0.3, 0.1, 0.5, 0.4}) == std::vector<double>{0.3, 0.3, 0.5, 0.5});
}

}  // namespace
}  // namespace mlfabric::core
