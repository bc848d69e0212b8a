// The C API's one handle table, without a daemon: handles that were never
// created (or were closed) are clear errors on every kind of call, never a
// crash, and a create that fails says why.
#include "api/c_api.h"

#include <string>

#include <catch2/catch.hpp>

namespace {

struct Outcome {
  int outcome = -1;
  std::string reason;
};

void PushDone(void* ctx, int outcome, const char* reason, int64_t, int64_t) {
  auto* out = static_cast<Outcome*>(ctx);
  out->outcome = outcome;
  out->reason = reason;
}

TEST_CASE("unknown handles are errors naming the handle, on every kind of object") {
  const int64_t bogus = 987654321;
  Outcome pushed;
  const void* parts[1] = {"x"};
  const uint64_t sizes[1] = {1};
  mlf_ext_push_async(bogus, "ps0", 1, parts, sizes, nullptr, 0, 0.0, PushDone, &pushed);
  CHECK(pushed.outcome == MLF_FAILED);
  CHECK(pushed.reason == "no Worker with handle 987654321 (closed or never created)");
  char err[256] = {0};
  CHECK(mlf_ext_server_serve(bogus, err, sizeof err) != 0);
  CHECK(std::string(err).find("no Server with handle 987654321") == 0);
  CHECK(mlf_ext_replica_serve(bogus, err, sizeof err) != 0);
  CHECK(std::string(err).find("no Replica with handle 987654321") == 0);
  CHECK(mlf_ext_replica_promoted(bogus) == -1);  // neither promoted nor not
  // Setting callbacks on what does not exist is ignored, not a crash.
  mlf_ext_replica_set_callbacks(bogus, nullptr, nullptr, nullptr, nullptr);
  mlf_ext_server_set_callbacks(bogus, nullptr, nullptr, nullptr);
  CHECK(mlf_sum_server_applied(bogus) == -1);
  // Closing what does not exist is harmless, twice.
  mlf_sum_server_stop(bogus);
  mlf_ext_worker_destroy(bogus);
  mlf_ext_worker_destroy(bogus);
}

TEST_CASE("a create with a bad argument returns handle 0, the code and the reason") {
  int code = 0;
  char err[512] = {0};
  const int64_t worker = mlf_ext_worker_create("/nonexistent/mlfabricd.sock", "demo", "t", "w1",
                                               /*delay_bound=*/-5, -1, &code, err, sizeof err);
  CHECK(worker == 0);
  CHECK(code == 3);  // INVALID_ARGUMENT
  CHECK(std::string(err) == "delay_bound -5 is negative (-1 = the job's bound)");
}

}  // namespace
