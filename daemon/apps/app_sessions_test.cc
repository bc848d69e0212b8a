// AppSessions on a real Unix-domain socket with a recording handler: the
// socket's mode, credentials, messages in order with their descriptors,
// AppGone once per connection, errors that name the path or group, and a
// Stop that ends every session.
#include "daemon/apps/app_sessions.h"

#include <dirent.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

class Recorder final : public AppHandler {
 public:
  void HandleRegister(const std::shared_ptr<AppSession>& app,
                      const v1::LocalRegister& request) override {
    Note("register " + request.name() + " uid " + std::to_string(app->uid));
    app->name = request.name();
  }
  void HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                  int fd) override {
    Note("push " + app->name + " " + std::to_string(push.request_id()) +
         (fd >= 0 ? " with fd" : " no fd"));
    if (fd >= 0) ::close(fd);
  }
  void HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) override {
    Note("get " + app->name + " " + get.server());
  }
  void HandleUpdateAck(const v1::LocalUpdateAck& ack) override {
    Note("ack " + std::to_string(ack.transfer_id()));
  }
  void HandleModelReply(const v1::LocalModelReply& reply, int fd) override {
    Note("model " + std::to_string(reply.request_id()));
    if (fd >= 0) ::close(fd);
  }
  void HandleMembershipQuery(const std::shared_ptr<AppSession>&,
                             const v1::LocalMembershipQuery& query) override {
    Note("membership " + std::to_string(query.request_id()));
  }
  void HandleOutcomeQuery(const std::shared_ptr<AppSession>& app,
                          const v1::LocalOutcomeQuery& query) override {
    Note("outcomes " + app->name + " " + std::to_string(query.pushes_size()));
  }
  void HandleRelease(const std::shared_ptr<AppSession>& app,
                     const v1::LocalRelease& release) override {
    Note("release " + app->name + " " + std::to_string(release.buffer_ids_size()));
  }
  void AppGone(const std::shared_ptr<AppSession>& app) override { Note("gone " + app->name); }

  // Waits (bounded) until `n` events were recorded; returns them.
  std::vector<std::string> Await(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return events_.size() >= n; });
    return events_;
  }

 private:
  void Note(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

// In a directory of its own in /tmp: Bazel's TEST_TMPDIR is longer than a
// Unix socket path may be, and sandboxed runs share one pid.
std::string SocketPath(const std::string& name) {
  char dir[] = "/tmp/mlfabric-apps-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return std::string(dir) + "/" + name + ".sock";
}

std::unique_ptr<LocalChannel> Connect(const std::string& path) {
  auto fd = LocalChannel::Connect(path, 5.0);
  REQUIRE(fd.ok());
  return std::make_unique<LocalChannel>(*fd);
}

TEST_CASE("AppSessions hands each application's messages over in order, then AppGone once") {
  Recorder recorder;
  const std::string path = SocketPath("apps");
  AppSessions apps({path, ""}, &recorder);
  REQUIRE(apps.Listen().ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // only this user may connect
  apps.Start();

  auto app = Connect(path);
  v1::LocalMessage message;
  message.mutable_register_()->set_name("w1");
  REQUIRE(app->Send(message).ok());
  message.Clear();
  message.mutable_push()->set_request_id(7);
  auto buffer = SharedBuffer::Create(64);
  REQUIRE(buffer.ok());
  REQUIRE(app->Send(message, buffer->fd()).ok());
  message.Clear();
  message.mutable_get()->set_server("ps0");
  REQUIRE(app->Send(message).ok());
  message.Clear();
  message.mutable_update_ack()->set_transfer_id(9);
  REQUIRE(app->Send(message).ok());
  message.Clear();
  message.mutable_model_reply()->set_request_id(3);
  REQUIRE(app->Send(message).ok());
  std::vector<std::string> events = recorder.Await(5);
  CHECK(apps.Sessions().size() == 1);
  app.reset();  // the application exits
  events = recorder.Await(6);
  REQUIRE(events.size() == 6);
  CHECK(events[0] == "register w1 uid " + std::to_string(::getuid()));
  CHECK(events[1] == "push w1 7 with fd");
  CHECK(events[2] == "get w1 ps0");
  CHECK(events[3] == "ack 9");
  CHECK(events[4] == "model 3");
  CHECK(events[5] == "gone w1");
  apps.Stop();
  CHECK(::access(path.c_str(), F_OK) != 0);  // the socket file is gone
}

// Threads of this process now.
int ThreadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  REQUIRE(dir != nullptr);
  int n = 0;
  while (const dirent* entry = ::readdir(dir)) n += entry->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

TEST_CASE("AppSessions: connected applications with nothing to say hold no thread") {
  Recorder recorder;
  const std::string path = SocketPath("idle");
  AppSessions::Options options{path, ""};
  options.handler_idle_s = 0.1;
  AppSessions apps(options, &recorder);
  REQUIRE(apps.Listen().ok());
  apps.Start();
  const int before = ThreadCount();  // the test's, plus the I/O thread
  constexpr int kApps = 32;
  std::vector<std::unique_ptr<LocalChannel>> connected;
  for (int i = 0; i < kApps; ++i) {
    connected.push_back(Connect(path));
    v1::LocalMessage message;
    message.mutable_register_()->set_name("w" + std::to_string(i));
    REQUIRE(connected.back()->Send(message).ok());
  }
  REQUIRE(recorder.Await(kApps).size() == kApps);
  CHECK(apps.Sessions().size() == kApps);
  // Their messages handled, the handler threads end; the sessions stay
  // (one thread per application would keep 32 alive).
  // (A thread counted out may take a moment more to leave the process.)
  for (int i = 0; i < 300 && (apps.handler_threads() > 0 || ThreadCount() != before); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(apps.handler_threads() == 0);
  CHECK(ThreadCount() == before);
  CHECK(apps.Sessions().size() == kApps);
  // Each still has its messages handled, in order.
  v1::LocalMessage message;
  message.mutable_get()->set_server("ps");
  REQUIRE(connected[17]->Send(message).ok());
  REQUIRE(recorder.Await(kApps + 1).size() == kApps + 1);
  CHECK(recorder.Await(kApps + 1).back() == "get w17 ps");
  apps.Stop();
  CHECK(recorder.Await(2 * kApps + 1).size() == 2 * kApps + 1);  // each gone once
}

TEST_CASE("AppSessions Stop ends every connected application's session") {
  Recorder recorder;
  const std::string path = SocketPath("stop");
  AppSessions apps({path, ""}, &recorder);
  REQUIRE(apps.Listen().ok());
  apps.Start();
  auto a = Connect(path);
  auto b = Connect(path);
  v1::LocalMessage message;
  message.mutable_register_()->set_name("a");
  REQUIRE(a->Send(message).ok());
  message.mutable_register_()->set_name("b");
  REQUIRE(b->Send(message).ok());
  recorder.Await(2);
  apps.Stop();
  const std::vector<std::string> events = recorder.Await(4);
  REQUIRE(events.size() == 4);
  int gone = 0;
  for (const auto& event : events) gone += event.rfind("gone ", 0) == 0;
  CHECK(gone == 2);
}

TEST_CASE("AppSessions names what is wrong with its socket") {
  Recorder recorder;
  SECTION("a path too long for a Unix socket") {
    AppSessions apps({"/tmp/" + std::string(200, 'x'), ""}, &recorder);
    absl::Status status = apps.Listen();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find("too long") != std::string::npos);
  }
  SECTION("a directory that does not exist") {
    AppSessions apps({"/nonexistent-dir/mlfabric.sock", ""}, &recorder);
    absl::Status status = apps.Listen();
    CHECK(!status.ok());
    CHECK(std::string(status.message()).find("/nonexistent-dir/mlfabric.sock") !=
          std::string::npos);
  }
  SECTION("a group that does not exist") {
    AppSessions apps({SocketPath("group"), "no-such-group-mlfabric"}, &recorder);
    absl::Status status = apps.Listen();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find("no-such-group-mlfabric") != std::string::npos);
  }
}

}  // namespace
}  // namespace mlfabric::daemon
