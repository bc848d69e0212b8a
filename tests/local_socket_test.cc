// The daemon's local socket across real processes: mode
// 0600 by default, 0660 and the configured group with
// --local_socket_group, and a job with a configured "user" admits only
// applications of that user (the daemon reads their uid with SO_PEERCRED;
// the scheduler compares), with an error that names both users.
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"

namespace mlfabric {
namespace {

std::string CurrentUser() {
  const struct passwd* user = ::getpwuid(::getuid());
  REQUIRE(user != nullptr);
  return user->pw_name;
}

std::string CurrentGroup() {
  const struct group* group = ::getgrgid(::getgid());
  REQUIRE(group != nullptr);
  return group->gr_name;
}

TEST_CASE("Local socket modes, and a job that admits one user") {
  const std::string me = CurrentUser();
  REQUIRE(me != "nobody");
  const std::string dir = launch::MakeTempDir("local-socket");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "user": ")" << me
                        << R"("}, {"name": "locked", "token": "locked-token", "user": "nobody"}]})";
  auto cluster = launch::Cluster::StartLoopback(
      {"w1", "w2"}, {"--config=" + config}, {},
      {{"w2", {"--local_socket_group=" + CurrentGroup()}}});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  struct stat st {};
  REQUIRE(::stat((*cluster)->Socket("w1").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat((*cluster)->Socket("w2").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(st.st_gid == ::getgid());

  ClientOptions options;
  options.daemon_socket = (*cluster)->Socket("w1");
  options.name = "worker";
  auto mine = Worker::Connect(options);
  INFO(mine.status().ToString());
  CHECK(mine.ok());
  options.job = "locked";
  options.job_token = "locked-token";
  auto refused = Worker::Connect(options);
  REQUIRE_FALSE(refused.ok());
  const std::string message(refused.status().message());
  INFO(message);
  CHECK(message.find("job 'locked' admits applications of user 'nobody' only; this one runs "
                     "as '" + me + "'") != std::string::npos);
}

TEST_CASE("An unknown --local_socket_group stops the daemon with the reason") {
  auto cluster = launch::Cluster::StartLoopback(
      {"w1"}, {}, {"--local_socket_group=no-such-group-x"});
  REQUIRE_FALSE(cluster.ok());
  CHECK(std::string(cluster.status().message()).find("no group named 'no-such-group-x'") !=
        std::string::npos);
}

}  // namespace
}  // namespace mlfabric
