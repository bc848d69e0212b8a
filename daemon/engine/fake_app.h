// FakeApp: a local application for the receive side's unit tests, with no
// daemon socket: an AppSession whose channel is one end of a socketpair,
// and the application's end to read what the daemon's parts send it.
//
//   FakeApp ps(/*job_id=*/1, "ps", v1::ROLE_SERVER);
//   servers.PublishLocked(ServerKey(1, "ps"), ps.session);
//   v1::LocalMessage m; int fd = -1;
//   REQUIRE(ps.Next(&m, &fd));   // what was handed over (fd: its bytes)
#ifndef MLFABRIC_DAEMON_RECEIVE_FAKE_APP_H_
#define MLFABRIC_DAEMON_RECEIVE_FAKE_APP_H_

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "daemon/apps/app_sessions.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

struct FakeApp {
  FakeApp(uint32_t job_id, const std::string& name, v1::Role role, const std::string& job = "job") {
    int fds[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
    session = std::make_shared<AppSession>();
    session->channel = std::make_shared<LocalChannel>(fds[0]);
    session->job = job;
    session->name = name;
    session->role = role;
    session->job_id = job_id;
    session->registered = true;
    peer = std::make_unique<LocalChannel>(fds[1]);
  }
  // The next message the application received within `timeout_ms`; false
  // if none came. `*fd` gets an attached descriptor (the caller's) or -1.
  bool Next(v1::LocalMessage* message, int* fd, int timeout_ms = 5000) {
    struct pollfd p {peer->fd(), POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    return peer->Receive(message, fd).ok();
  }
  // True if nothing arrives within `timeout_ms`.
  bool Quiet(int timeout_ms = 100) {
    struct pollfd p {peer->fd(), POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 0;
  }

  std::shared_ptr<AppSession> session;
  std::unique_ptr<LocalChannel> peer;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_RECEIVE_FAKE_APP_H_
