#include "api/replica.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlfabric {

absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string& server,
                                                           const RegistrationParams& params) {
  if (auto status = CheckBounds(params); !status.ok()) return status;
  if (server.empty()) return absl::InvalidArgumentError("RegisterAsReplica: server name is empty");
  std::string path = params.client.daemon_socket;
  if (path.empty() && std::getenv("MLFABRIC_DAEMON_SOCKET") != nullptr) {
    path = std::getenv("MLFABRIC_DAEMON_SOCKET");
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "no daemon socket: set ClientOptions::daemon_socket or MLFABRIC_DAEMON_SOCKET");
  }
  absl::StatusOr<std::string> token = internal::JobToken(params.client);
  if (!token.ok()) return token.status();
  auto fd = LocalChannel::Connect(path, params.client.connect_timeout_s);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<Replica> replica(new Replica());
  replica->server_ = server;
  replica->channel_ = std::make_unique<LocalChannel>(*fd);
  v1::LocalMessage hello;
  v1::LocalRegister* body = hello.mutable_register_();
  body->set_job(params.client.job);
  body->set_job_token(*token);
  body->set_role(v1::ROLE_REPLICA);
  // The replica registers under its server's name: it keeps a copy of it,
  // and the scheduler sends it that server's replica transfers (§5.3).
  body->set_name(server);
  if (auto status = replica->channel_->Send(hello); !status.ok()) return status;
  v1::LocalMessage reply;
  int reply_fd = -1;
  if (auto status = replica->channel_->Receive(&reply, &reply_fd); !status.ok()) return status;
  if (reply_fd >= 0) ::close(reply_fd);
  if (!reply.has_registered()) return absl::InternalError("daemon sent no registration reply");
  if (!reply.registered().error().empty()) {
    return absl::FailedPreconditionError(reply.registered().error());
  }
  return replica;
}

Replica::~Replica() { Stop(); }

void Replica::Stop() {
  stopping_.store(true);
  if (channel_) channel_->Shutdown();
}

absl::Status Replica::Serve() {
  if (!on_update_) {
    return absl::FailedPreconditionError("register an update callback before Serve()");
  }
  while (true) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = channel_->Receive(&message, &fd);
    if (!status.ok()) {
      if (stopping_.load()) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("lost the connection to the MLfabric daemon: ", status.message()));
    }
    if (message.has_promoted()) {
      if (fd >= 0) ::close(fd);
      promoted_ = true;
      if (on_promotion_) {
        on_promotion_(Promotion{message.promoted().server(), message.promoted().old_host(),
                                message.promoted().reason(), message.promoted().model_version()});
      }
      continue;
    }
    if (message.has_model_request()) {
      if (fd >= 0) ::close(fd);
      if (auto sent = internal::AnswerModelRequest(*channel_, message.model_request(), on_request_);
          !sent.ok()) {
        return sent;
      }
      continue;
    }
    if (!message.has_update()) {
      if (fd >= 0) ::close(fd);
      continue;
    }
    const v1::LocalMessage ack = internal::ApplyDeliveredUpdate(message.update(), fd, on_update_);
    if (auto sent = channel_->Send(ack); !sent.ok()) return sent;
  }
}

}  // namespace mlfabric
