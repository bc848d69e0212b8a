#include "api/replica.h"

#include <unistd.h>

#include <algorithm>


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
  body->set_installs_snapshots(params.replica_snapshot);
  replica->snapshots_ = params.replica_snapshot;
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
  if (snapshots_ && !on_install_) {
    return absl::FailedPreconditionError(
        "registered with replica_snapshot: register an install callback before Serve()");
  }
  return internal::ServeMessages(
      *channel_, stopping_, [&](const v1::LocalMessage& message, int fd) -> absl::Status {
        if (message.has_promoted()) {
          if (fd >= 0) ::close(fd);
          promoted_ = true;
          if (on_promotion_) {
            on_promotion_(Promotion{message.promoted().server(), message.promoted().old_host(),
                                    message.promoted().reason(),
                                    message.promoted().model_version()});
          }
          return absl::OkStatus();
        }
        if (message.has_model_request()) {
          if (fd >= 0) ::close(fd);
          return internal::AnswerModelRequest(*channel_, message.model_request(), on_request_);
        }
        if (!message.has_update()) {
          if (fd >= 0) ::close(fd);
          return absl::OkStatus();
        }
        if (message.update().snapshot()) {
          return channel_->Send(InstallSnapshot(message.update(), fd));
        }
        return channel_->Send(internal::ApplyDeliveredUpdate(message.update(), fd, on_update_));
      });
}

v1::LocalMessage Replica::InstallSnapshot(const v1::LocalUpdate& update, int fd) {
  v1::LocalMessage ack;
  v1::LocalUpdateAck* body = ack.mutable_update_ack();
  body->set_transfer_id(update.transfer_id());
  if (!on_install_) {
    if (fd >= 0) ::close(fd);
    body->set_error("a snapshot of the server's model arrived, but no install callback is registered");
    return ack;
  }
  const int64_t offset = std::max<int64_t>(0, update.data_offset());
  auto buffer = SharedBuffer::Map(fd, static_cast<size_t>(offset + update.bytes()));
  if (!buffer.ok()) {
    body->set_error(std::string(buffer.status().message()));
    return ack;
  }
  Install install;
  install.version = update.version();
  install.data = buffer->data() + offset;
  install.bytes = static_cast<size_t>(update.bytes());
  if (absl::Status installed = on_install_(install); !installed.ok()) {
    body->set_error(std::string(installed.message()));
    return ack;
  }
  ++installs_;
  body->set_model_version(install.version);
  return ack;
}

}  // namespace mlfabric
