#include "daemon/control/server_resolver.h"

#include <catch2/catch.hpp>

#include "daemon/control/fake_scheduler_client.h"

namespace mlfabric::daemon {
namespace {

TEST_CASE("ServerResolver: answers for ttl_s, forgets on failure and on Clear, keeps no errors") {
  FakeSchedulerClient scheduler;
  FakeClock clock(100);
  std::string host = "s1";
  int asked = 0;
  scheduler.resolve_hook = [&](const v1::ResolveServerRequest& request,
                               v1::ResolveServerReply* reply) {
    ++asked;
    if (request.server() == "gone") return absl::NotFoundError("server 'gone' is not registered");
    reply->set_host(host);
    reply->set_data_address(host + ":7001");
    reply->set_job_id(request.job() == "a" ? 1 : 2);
    return absl::OkStatus();
  };
  ServerResolver resolver(&scheduler, &clock, /*ttl_s=*/1.0);
  v1::ResolveServerReply where;
  REQUIRE(resolver.Resolve("a", "ps", &where).ok());
  CHECK(where.host() == "s1");
  CHECK(where.job_id() == 1);
  // Within ttl_s: from memory, per job and server.
  clock.Advance(0.5);
  host = "s2";  // the server moved; the scheduler knows, the resolver not yet
  REQUIRE(resolver.Resolve("a", "ps", &where).ok());
  CHECK(where.host() == "s1");
  CHECK(asked == 1);
  REQUIRE(resolver.Resolve("b", "ps", &where).ok());  // another job: asked
  CHECK(where.job_id() == 2);
  CHECK(asked == 2);
  // A failed get forgets it: the next asks again.
  resolver.Forget("a", "ps");
  REQUIRE(resolver.Resolve("a", "ps", &where).ok());
  CHECK(where.host() == "s2");
  CHECK(asked == 3);
  // Past ttl_s: asked again.
  clock.Advance(1.0);
  REQUIRE(resolver.Resolve("a", "ps", &where).ok());
  CHECK(asked == 4);
  // A restarted scheduler: everything forgotten.
  resolver.Clear();
  REQUIRE(resolver.Resolve("b", "ps", &where).ok());
  CHECK(asked == 5);
  // Errors come back unchanged and are not remembered.
  CHECK(resolver.Resolve("a", "gone", &where).code() == absl::StatusCode::kNotFound);
  CHECK(resolver.Resolve("a", "gone", &where).message() == "server 'gone' is not registered");
  CHECK(asked == 7);
  CHECK(resolver.calls() == 7);
  // ttl_s = 0: every call asks.
  ServerResolver always(&scheduler, &clock, 0);
  REQUIRE(always.Resolve("a", "ps", &where).ok());
  REQUIRE(always.Resolve("a", "ps", &where).ok());
  CHECK(asked == 9);
}

}  // namespace
}  // namespace mlfabric::daemon
