#include "scheduler/service/control_auth.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

SchedulerConfig WithSecret(const std::string& secret) {
  SchedulerConfig config;
  config.cluster_secret = secret;
  return config;
}

TEST_CASE("no secret and no mutual TLS: hosts are not authenticated, data keys are random") {
  ControlAuth a(SchedulerConfig{});
  ControlAuth b(SchedulerConfig{});
  CHECK_FALSE(a.hosts_authenticated());
  CHECK(a.CheckRegistration("w1", "", {}).ok());
  CHECK(a.data_key().size() == 32);
  CHECK(a.data_key() != b.data_key());
}

TEST_CASE("the cluster secret is required to register, and keys derive from it") {
  ControlAuth auth(WithSecret("cluster secret"));
  CHECK(auth.hosts_authenticated());
  CHECK(auth.CheckRegistration("w1", "cluster secret", {}).ok());
  absl::Status missing = auth.CheckRegistration("w1", "", {});
  CHECK(missing.code() == absl::StatusCode::kUnauthenticated);
  CHECK(std::string(missing.message()) ==
        "host 'w1': no cluster secret (the daemon's cluster_secret_file must hold the scheduler's)");
  CHECK(auth.CheckRegistration("w1", "guess", {}).code() == absl::StatusCode::kUnauthenticated);

  // A restarted scheduler with the same secret hands out the same keys.
  ControlAuth again(WithSecret("cluster secret"));
  auth.AddJob(1, "a", "token-a");
  auth.AddJob(2, "b", "token-b");
  again.AddJob(1, "a", "token-a");
  CHECK(auth.data_key() == again.data_key());
  CHECK(auth.JobDataKey(1) == again.JobDataKey(1));
  CHECK(auth.JobDataKey(1) != auth.JobDataKey(2));
  CHECK(auth.JobDataKey(1) != auth.data_key());
  CHECK(auth.JobDataKey(3).empty());
  // Another cluster's keys differ.
  ControlAuth other(WithSecret("another secret"));
  other.AddJob(1, "a", "token-a");
  CHECK(other.JobDataKey(1) != auth.JobDataKey(1));
}

TEST_CASE("mutual TLS: the certificate's common name must be the host's") {
  SchedulerConfig config;
  config.tls_client_ca_file = "/some/ca.pem";
  ControlAuth auth(config);
  CHECK(auth.hosts_authenticated());
  CHECK(auth.CheckRegistration("w1", "", {"w1"}).ok());
  absl::Status other = auth.CheckRegistration("w1", "", {"w2"});
  CHECK(other.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(other.message()).find("presented a certificate for 'w2'") != std::string::npos);
}

TEST_CASE("data_plane_auth off: no data keys") {
  SchedulerConfig config;
  config.data_plane_auth = false;
  ControlAuth auth(config);
  auth.AddJob(1, "a", "t");
  CHECK(auth.data_key().empty());
  CHECK(auth.JobDataKey(1).empty());
  CHECK(ControlAuth::NewSessionToken().size() == 32);
  CHECK(ControlAuth::NewSessionToken() != ControlAuth::NewSessionToken());
}

}  // namespace
}  // namespace mlfabric
