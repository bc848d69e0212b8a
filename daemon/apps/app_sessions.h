// The daemon's local applications (DESIGN.md §3): workers, servers and
// replicas on this host, each on its own connection to the daemon's
// Unix-domain socket (ipc/local_ipc.h).
//
//   AppSessions apps({.path = "/run/mlfabric.sock", .group = ""}, &handler);
//   RETURN_IF_ERROR(apps.Listen());   // bound 0600 (or 0660 to `group`)
//   apps.Start();                     // accepts; one reader thread per app
//   ...
//   apps.Stop();                      // wakes every reader; unlinks the socket
//
// The socket is created 0600 (umask), given to `group` with mode 0660 if
// one is configured, and only then listens: no one else can connect in
// between. Each connection's credentials (SO_PEERCRED) are kept in its
// session. Every message an application sends is handed to the handler
// on that application's reader thread, in order; when the connection
// ends (or cannot be read), AppGone is called once. Descriptors attached
// to a push or a model reply pass to the handler; any other attached
// descriptor is closed.
//
// Thread safety: any method from any thread. The session set has its own
// lock, not held while calling the handler.
#ifndef MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_
#define MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "ipc/local_ipc.h"
#include "ipc/mapped_buffers.h"
#include "proto/local.pb.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// One application's connection. The handler fills in what registration
// says; the fields after `pid` are its own (guarded by the handler).
struct AppSession {
  std::shared_ptr<LocalChannel> channel;
  // The application's credentials (SO_PEERCRED at accept); -1 = unknown.
  int64_t uid = -1;
  int64_t pid = -1;

  std::string job;
  std::string job_token;  // kept to register again if the scheduler restarts
  std::string name;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  uint32_t job_id = 0;
  bool registered = false;
  bool ssp = false;  // a worker of a stale-synchronous job: AwaitClock before each get
  v1::LocalRegister registration;  // as asked, to register again
  // Synchronous-round servers: the version of this app's latest push to
  // each server, which names the round its next get streams back.
  std::map<std::string, int64_t> last_round_push;
  // Get buffers lent to the application (LocalGetDone.buffer_id), until
  // it releases them or leaves. Guarded by the receive lock.
  std::map<uint64_t, std::shared_ptr<SharedBuffer>> lent_buffers;
  // The mappings of this application's push buffers, which it refills
  // and sends again once released. Its own: another application's files
  // are never looked up here. Cleared when it leaves (the handler's
  // AppGone); its own lock.
  MappedBuffers push_mappings;
};

// What the daemon does with its applications' messages.
class AppHandler {
 public:
  virtual ~AppHandler() = default;
  virtual void HandleRegister(const std::shared_ptr<AppSession>& app,
                              const v1::LocalRegister& request) = 0;
  // `fd` (the update's shared memory, or -1) is the handler's to close.
  virtual void HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                          int fd) = 0;
  virtual void HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) = 0;
  virtual void HandleUpdateAck(const v1::LocalUpdateAck& ack) = 0;
  // `fd` (the model's shared memory, or -1) is the handler's to close.
  virtual void HandleModelReply(const v1::LocalModelReply& reply, int fd) = 0;
  // An application that lost its previous daemon asks how its pushes
  // ended; each is answered with a LocalPushDone.
  virtual void HandleOutcomeQuery(const std::shared_ptr<AppSession>& app,
                                  const v1::LocalOutcomeQuery& query) = 0;
  // The application no longer reads buffers the daemon lent it with its
  // gets (it may keep them mapped until they are lent again).
  virtual void HandleRelease(const std::shared_ptr<AppSession>& app,
                             const v1::LocalRelease& release) = 0;
  virtual void AppGone(const std::shared_ptr<AppSession>& app) = 0;
};

class AppSessions {
 public:
  struct Options {
    std::string path;   // the Unix-domain socket
    std::string group;  // if set: the socket is 0660 and owned by this group
  };

  // `handler` must outlive this object.
  AppSessions(Options options, AppHandler* handler);
  ~AppSessions();

  // Binds and listens. Errors name the path or the group.
  absl::Status Listen();
  // Accepts applications until Stop().
  void Start();
  // Stops accepting, shuts every connection down, waits until every
  // reader has ended (each calls AppGone first), and removes the socket
  // file: once it returns, the handler is not called again. Idempotent.
  void Stop();

  // The connected applications now.
  std::vector<std::shared_ptr<AppSession>> Sessions() const;

 private:
  void AcceptLoop();
  void ReadLoop(std::shared_ptr<AppSession> app);

  const Options options_;
  AppHandler* const handler_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::condition_variable readers_done_;
  std::set<std::shared_ptr<AppSession>> sessions_;
  int readers_ = 0;  // reader threads still running
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_
