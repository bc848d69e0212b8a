#include "daemon/apps/app_sessions.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

namespace asio = boost::asio;

namespace {

// True if `fd` has something to read now (a message, or its end).
bool ReadableNow(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace

AppSessions::Reader::Reader(asio::io_context& io, std::shared_ptr<AppSession> session)
    : app(std::move(session)), readable(io, app->channel->fd()) {}

AppSessions::Reader::~Reader() {
  // The channel closes the descriptor; the wait only lets go of it.
  (void)readable.release();
}

AppSessions::AppSessions(Options options, AppHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

AppSessions::~AppSessions() { Stop(); }

absl::Status AppSessions::Listen() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.path.empty() || options_.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_socket path is ", options_.path.empty() ? "empty" : "too long", ": ", options_.path));
  }
  std::strncpy(addr.sun_path, options_.path.c_str(), sizeof(addr.sun_path) - 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create a local socket: ", std::strerror(errno)));
  }
  ::unlink(options_.path.c_str());
  // Created 0600 (umask), then opened to the group if one is configured,
  // and only then listening: no one else can connect in between.
  const mode_t old_umask = ::umask(0177);
  const int bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind local socket ", options_.path, ": ",
                                               std::strerror(bind_errno)));
  }
  if (!options_.group.empty()) {
    const struct group* group = ::getgrnam(options_.group.c_str());
    if (group == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("local_socket_group: no group named '", options_.group, "'"));
    }
    if (::chown(options_.path.c_str(), static_cast<uid_t>(-1), group->gr_gid) != 0 ||
        ::chmod(options_.path.c_str(), 0660) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("cannot give local socket ", options_.path,
                                                      " to group '", options_.group,
                                                      "': ", std::strerror(errno)));
    }
  }
  if (::listen(listen_fd_, 64) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on local socket ", options_.path,
                                               ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void AppSessions::Start() {
  // Accepted in a loop until EAGAIN each time the socket is readable.
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  guard_.emplace(io_.get_executor());
  listening_.emplace(io_, listen_fd_);
  WaitForConnection();
  io_thread_ = std::thread([this] { io_.run(); });
}

void AppSessions::Stop() {
  if (stopping_.exchange(true)) return;
  if (io_thread_.joinable()) {
    // Wakes the wait for connections; the I/O thread sees stopping_ and
    // accepts no more. Once this posted no-op has run, no session is
    // being added.
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    std::promise<void> passed;
    asio::post(io_, [&passed] { passed.set_value(); });
    passed.get_future().wait();
  }
  {
    // Each shut-down connection reads as ended: its session ends on a
    // handler thread (AppGone), and the I/O thread is needed until then.
    MutexLock lock(&mu_);
    for (const auto& app : sessions_) app->channel->Shutdown();
    sessions_done_.Await(&mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return active_ == 0;
    });
  }
  if (io_thread_.joinable()) {
    guard_.reset();
    io_.stop();
    io_thread_.join();
  }
  if (listening_.has_value()) (void)listening_->release();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(options_.path.c_str());
  }
}

std::vector<std::shared_ptr<AppSession>> AppSessions::Sessions() const {
  MutexLock lock(&mu_);
  return {sessions_.begin(), sessions_.end()};
}

void AppSessions::WaitForConnection() {
  listening_->async_wait(asio::posix::stream_descriptor::wait_read,
                         [this](const boost::system::error_code& error) {
                           if (stopping_.load()) return;
                           if (error) {
                             MLF_LOG(ERROR) << "local accept failed: " << error.message();
                             return;
                           }
                           AcceptPending();
                         });
}

void AppSessions::AcceptPending() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) break;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the next attempt may work.
        MLF_LOG(WARNING) << "local accept failed: " << std::strerror(errno) << "; retrying";
        auto retry = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        retry->async_wait([this, retry](const boost::system::error_code&) {
          if (!stopping_.load()) AcceptPending();
        });
        return;
      }
      if (!stopping_.load()) MLF_LOG(ERROR) << "local accept failed: " << std::strerror(errno);
      return;
    }
    auto app = std::make_shared<AppSession>();
    struct ucred cred {};
    socklen_t cred_len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0) {
      app->uid = cred.uid;
      app->pid = cred.pid;
    }
    app->channel = std::make_shared<LocalChannel>(fd);
    auto reader = std::make_shared<Reader>(io_, app);
    {
      MutexLock lock(&mu_);
      sessions_.insert(app);
      ++active_;
    }
    WaitForMessages(std::move(reader));
  }
  if (!stopping_.load()) WaitForConnection();
}

void AppSessions::WaitForMessages(std::shared_ptr<Reader> reader) {
  Reader& r = *reader;
  // Readable (or ended, or shut down by Stop): the messages go to a
  // handler thread. A failed wait ends the session there.
  r.readable.async_wait(asio::posix::stream_descriptor::wait_read,
                        [this, reader = std::move(reader)](const boost::system::error_code& error) {
                          if (error) {
                            MLF_LOG(WARNING) << "local session of '" << reader->app->name
                                             << "' cannot be waited on: " << error.message();
                            work_.Run([this, reader] { End(reader); });
                            return;
                          }
                          work_.Run([this, reader] { Drain(reader); });
                        });
}

void AppSessions::Drain(std::shared_ptr<Reader> reader) {
  // Whole messages, one after another, while more are there; the next
  // wait is armed only after, so one application's messages are handled
  // one at a time, in order.
  do {
    if (stopping_.load() || !HandleOne(reader->app)) {
      End(reader);
      return;
    }
  } while (ReadableNow(reader->app->channel->fd()));
  asio::post(io_, [this, reader = std::move(reader)]() mutable {
    WaitForMessages(std::move(reader));
  });
}

bool AppSessions::HandleOne(const std::shared_ptr<AppSession>& app) {
  v1::LocalMessage message;
  int fd = -1;
  absl::Status status = app->channel->Receive(&message, &fd);
  if (!status.ok()) {
    if (fd >= 0) ::close(fd);  // a descriptor that came with the broken message
    if (status.code() != absl::StatusCode::kUnavailable) {
      MLF_LOG(WARNING) << "closing local session of '" << app->name << "': " << status.message();
    } else if (!absl::StartsWith(status.message(), "local peer closed the connection")) {
      // Not the application's orderly close: a read error (an application
      // killed with bytes unread says "Connection reset by peer").
      MLF_LOG(INFO) << "local session of '" << app->name << "' (pid " << app->pid
                    << ") ended: " << status.message();
    }
    return false;
  }
  switch (message.body_case()) {
    case v1::LocalMessage::kRegister:
      handler_->HandleRegister(app, message.register_());
      break;
    case v1::LocalMessage::kPush:
      handler_->HandlePush(app, message.push(), fd);
      fd = -1;
      break;
    case v1::LocalMessage::kGet:
      handler_->HandleGet(app, message.get());
      break;
    case v1::LocalMessage::kUpdateAck:
      handler_->HandleUpdateAck(message.update_ack());
      break;
    case v1::LocalMessage::kModelReply:
      handler_->HandleModelReply(message.model_reply(), fd);
      fd = -1;
      break;
    case v1::LocalMessage::kOutcomeQuery:
      handler_->HandleOutcomeQuery(app, message.outcome_query());
      break;
    case v1::LocalMessage::kRelease:
      handler_->HandleRelease(app, message.release());
      break;
    case v1::LocalMessage::kMembershipQuery:
      handler_->HandleMembershipQuery(app, message.membership_query());
      break;
    default:
      MLF_LOG(WARNING) << "unexpected local message " << message.body_case() << " from '"
                       << app->name << "'";
  }
  if (fd >= 0) ::close(fd);
  return true;
}

void AppSessions::End(const std::shared_ptr<Reader>& reader) {
  {
    MutexLock lock(&mu_);
    sessions_.erase(reader->app);
  }
  handler_->AppGone(reader->app);
  MutexLock lock(&mu_);
  --active_;
  sessions_done_.SignalAll();
}

}  // namespace mlfabric::daemon
