#include "daemon/apps/app_sessions.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

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
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

void AppSessions::Stop() {
  if (stopping_.exchange(true)) return;
  // shutdown wakes a thread blocked in accept(); close alone does not.
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();  // no reader starts after this
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (const auto& app : sessions_) app->channel->Shutdown();
    readers_done_.wait(lock, [&] { return readers_ == 0; });
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(options_.path.c_str());
  }
}

std::vector<std::shared_ptr<AppSession>> AppSessions::Sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {sessions_.begin(), sessions_.end()};
}

void AppSessions::AcceptLoop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) app->channel->Shutdown();
    sessions_.insert(app);
    ++readers_;
    // Detached: a finished reader is reclaimed at once; Stop() shuts the
    // connections down and waits for the count to reach zero.
    std::thread([this, app] { ReadLoop(app); }).detach();
  }
}

void AppSessions::ReadLoop(std::shared_ptr<AppSession> app) {
  while (!stopping_.load()) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = app->channel->Receive(&message, &fd);
    if (!status.ok()) {
      if (status.code() != absl::StatusCode::kUnavailable) {
        MLF_LOG(WARNING) << "closing local session of '" << app->name << "': " << status.message();
      }
      break;
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
      default:
        MLF_LOG(WARNING) << "unexpected local message " << message.body_case() << " from '"
                         << app->name << "'";
    }
    if (fd >= 0) ::close(fd);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.erase(app);
  }
  handler_->AppGone(app);
  std::lock_guard<std::mutex> lock(mu_);
  --readers_;
  readers_done_.notify_all();
}

}  // namespace mlfabric::daemon
