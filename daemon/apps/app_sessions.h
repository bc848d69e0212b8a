// The daemon's local applications (docs/architecture.md §3): workers, servers and
// replicas on this host, each on its own connection to the daemon's
// Unix-domain socket (ipc/local_ipc.h).
//
//   AppSessions apps({.path = "/run/mlfabric.sock", .group = ""}, &handler);
//   RETURN_IF_ERROR(apps.Listen());   // bound 0600 (or 0660 to `group`)
//   apps.Start();                     // accepts; reads when an app has sent
//   ...
//   apps.Stop();                      // ends every session; unlinks the socket
//
// The socket is created 0600 (umask), given to `group` with mode 0660 if
// one is configured, and only then listens: no one else can connect in
// between. Each connection's credentials (SO_PEERCRED) are kept in its
// session. Every message an application sends is handed to the handler
// in order, one at a time per application; when the connection ends (or
// cannot be read), AppGone is called once. Descriptors attached to a push
// or a model reply pass to the handler; any other attached descriptor is
// closed.
//
// Threads: one I/O thread (an Asio io_context) accepts and waits until an
// application's socket is readable; the messages then there are handled
// on a reused thread (BlockingWork: a handler may wait, e.g. for the
// scheduler), after which the wait is armed again. An idle application
// holds no thread; the threads in use are as many as the applications
// whose messages are being handled at once.
//
// Thread safety: any method from any thread. The session set has its own
// lock, not held while calling the handler.
#ifndef MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_
#define MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "absl/status/status.h"
#include "common/blocking_work.h"
#include "common/mutex.h"
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
  // A worker application asks who its job's live workers are; answered
  // with a LocalMembership under the query's request id.
  virtual void HandleMembershipQuery(const std::shared_ptr<AppSession>& app,
                                     const v1::LocalMembershipQuery& query) = 0;
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
    // A handler thread with nothing to handle for this long ends.
    double handler_idle_s = 10.0;
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
  // Threads that handle messages now (busy or idle), and started so far.
  size_t handler_threads() const { return work_.threads(); }
  size_t handler_threads_started() const { return work_.started(); }

 private:
  // A session and the wait for its socket to be readable (the channel
  // keeps the descriptor: the wait releases it rather than closing it).
  struct Reader {
    Reader(boost::asio::io_context& io, std::shared_ptr<AppSession> session);
    ~Reader();
    std::shared_ptr<AppSession> app;
    boost::asio::posix::stream_descriptor readable;
  };

  // On the I/O thread.
  void WaitForConnection();
  void AcceptPending();
  void WaitForMessages(std::shared_ptr<Reader> reader);
  // On a handler thread: the messages there now, in order.
  void Drain(std::shared_ptr<Reader> reader);
  // Receives and hands over one message; false when the session ends.
  bool HandleOne(const std::shared_ptr<AppSession>& app);
  void End(const std::shared_ptr<Reader>& reader);

  const Options options_;
  AppHandler* const handler_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
  std::optional<boost::asio::posix::stream_descriptor> listening_;
  std::thread io_thread_;
  mutable Mutex mu_;
  CondVar sessions_done_;
  std::set<std::shared_ptr<AppSession>> sessions_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // sessions not ended yet (AppGone not returned)
  // Last: destroyed first, once no handler runs (Stop waited for them).
  BlockingWork work_{options_.handler_idle_s};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_APPS_APP_SESSIONS_H_
