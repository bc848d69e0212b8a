#include "api/mlfabric.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mlfabric {
namespace {

absl::StatusOr<std::unique_ptr<LocalChannel>> ConnectAndRegister(const ClientOptions& options,
                                                                 v1::Role role,
                                                                 int64_t* version,
                                                                 std::string* path,
                                                                 std::string* host = nullptr) {
  *path = options.daemon_socket;
  if (path->empty()) {
    const char* env = std::getenv("MLFABRIC_DAEMON_SOCKET");
    if (env == nullptr || *env == '\0') {
      return absl::InvalidArgumentError(
          "no daemon socket: set ClientOptions::daemon_socket or MLFABRIC_DAEMON_SOCKET");
    }
    *path = env;
  }
  if (options.name.empty()) return absl::InvalidArgumentError("ClientOptions::name is empty");
  absl::StatusOr<std::string> token = internal::JobToken(options);
  if (!token.ok()) return token.status();
  auto fd = LocalChannel::Connect(*path, options.connect_timeout_s);
  if (!fd.ok()) return fd.status();
  auto channel = std::make_unique<LocalChannel>(*fd);
  v1::LocalMessage hello;
  v1::LocalRegister* body = hello.mutable_register_();
  body->set_job(options.job);
  body->set_job_token(*token);
  body->set_role(role);
  body->set_name(options.name);
  body->set_round_size(options.round_size);
  body->set_backup_workers(options.backup_workers);
  body->set_plan_on_arrival(options.plan_on_arrival);
  body->set_delay_bound(options.delay_bound);
  body->set_divergence_bound(options.divergence_bound);
  if (!options.shard.group.empty()) {
    v1::ShardSpec* shard = body->mutable_shard();
    shard->set_group(options.shard.group);
    shard->set_index(options.shard.index);
    shard->set_count(options.shard.count);
    shard->set_begin(options.shard.begin);
    shard->set_end(options.shard.end);
  }
  if (auto status = channel->Send(hello); !status.ok()) return status;
  v1::LocalMessage reply;
  int reply_fd = -1;
  if (auto status = channel->Receive(&reply, &reply_fd); !status.ok()) return status;
  if (reply_fd >= 0) ::close(reply_fd);
  if (!reply.has_registered()) return absl::InternalError("daemon sent no registration reply");
  if (!reply.registered().error().empty()) {
    return absl::FailedPreconditionError(reply.registered().error());
  }
  *version = reply.registered().model_version();
  if (host != nullptr) *host = reply.registered().host();
  return channel;
}

PushResult Failed(const std::string& reason) {
  PushResult result;
  result.outcome = PushOutcome::kFailed;
  result.reason = reason;
  return result;
}

// Gives the daemon's buffer `buffer_id`, lent with a get, back over
// `channel` when the last holder lets go (unless the channel is gone).
std::shared_ptr<void> LentBufferLease(const std::shared_ptr<LocalChannel>& channel,
                                      uint64_t buffer_id) {
  std::weak_ptr<LocalChannel> lender = channel;
  return std::shared_ptr<void>(nullptr, [lender, id = buffer_id](void*) {
    if (std::shared_ptr<LocalChannel> to = lender.lock()) {
      v1::LocalMessage release;
      release.mutable_release()->add_buffer_ids(id);
      (void)to->Send(release);  // a closed channel: the daemon forgot it anyway
    }
  });
}

}  // namespace

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitModel(int64_t bytes, int count,
                                                                    int64_t element_bytes) {
  if (element_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("element_bytes: must be positive, got ", element_bytes));
  }
  if (bytes <= 0 || bytes % element_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: must be a positive multiple of ", element_bytes, ", got ", bytes));
  }
  const int64_t elements = bytes / element_bytes;
  if (count < 1 || count > 64 || count > elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "count: must be in [1, min(64, ", elements, " elements)], got ", count));
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t begin = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t end = elements * (i + 1) / count * element_bytes;
    ranges.emplace_back(begin, end);
    begin = end;
  }
  return ranges;
}

namespace internal {

absl::StatusOr<std::string> JobToken(const ClientOptions& options) {
  if (!options.job_token.empty()) return options.job_token;
  const char* env = std::getenv("MLFABRIC_JOB_TOKEN");
  if (env == nullptr || *env == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "no token for job '", options.job,
        "': set ClientOptions::job_token or MLFABRIC_JOB_TOKEN (the token in the scheduler's "
        "config; none ships by default)"));
  }
  return std::string(env);
}

}  // namespace internal

static_assert(static_cast<int32_t>(ElementType::kFloat32) == v1::DTYPE_FLOAT32 &&
                  static_cast<int32_t>(ElementType::kFloat64) == v1::DTYPE_FLOAT64 &&
                  static_cast<int32_t>(ElementType::kOpaque) == v1::DTYPE_OPAQUE &&
                  static_cast<int32_t>(ElementType::kInt32) == v1::DTYPE_INT32 &&
                  static_cast<int32_t>(ElementType::kInt64) == v1::DTYPE_INT64 &&
                  static_cast<int32_t>(ElementType::kFloat16) == v1::DTYPE_FLOAT16 &&
                  static_cast<int32_t>(ElementType::kInt8) == v1::DTYPE_INT8 &&
                  static_cast<int32_t>(ElementType::kUint8) == v1::DTYPE_UINT8 &&
                  static_cast<int32_t>(ElementType::kInt16) == v1::DTYPE_INT16 &&
                  static_cast<int32_t>(ElementType::kUint16) == v1::DTYPE_UINT16,
              "ElementType mirrors v1::DType");

const char* PushOutcomeName(PushOutcome outcome) {
  switch (outcome) {
    case PushOutcome::kApplied: return "applied";
    case PushOutcome::kDropped: return "dropped";
    case PushOutcome::kFailed: return "failed";
  }
  return "unknown";
}

// ------------------------------------------------------------------ Worker

absl::StatusOr<std::unique_ptr<Worker>> Worker::Connect(const ClientOptions& options) {
  std::unique_ptr<Worker> worker(new Worker());
  auto channel = ConnectAndRegister(options, v1::ROLE_WORKER, &worker->initial_version_,
                                    &worker->socket_path_, &worker->daemon_host_);
  if (!channel.ok()) return channel.status();
  worker->options_ = options;
  worker->options_.daemon_socket = worker->socket_path_;
  worker->reconnect_s_ = options.reconnect_s;
  if (worker->reconnect_s_ < 0) {
    const char* env = std::getenv("MLFABRIC_RECONNECT_S");
    worker->reconnect_s_ = env != nullptr && *env != '\0' ? std::atof(env) : 10.0;
  }
  // Push uids are unique across this worker's connections and any other
  // worker's: a random start (never 0), then one up per push.
  std::random_device random;
  worker->next_uid_ = ((static_cast<uint64_t>(random()) << 32) ^ random()) | 1;
  worker->channel_ = std::move(*channel);
  worker->reader_ = std::thread([w = worker.get()] { w->ReaderLoop(); });
  return worker;
}

Worker::~Worker() {
  std::shared_ptr<LocalChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    channel = channel_;
  }
  cv_.notify_all();
  if (channel) channel->Shutdown();
  if (reader_.joinable()) reader_.join();
}

int64_t Worker::reconnects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reconnects_;
}

void Worker::FailAll(const std::string& reason) {
  std::map<uint64_t, PendingPush> pushes;
  std::map<uint64_t, std::shared_ptr<std::promise<absl::StatusOr<Model>>>> gets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    reconnecting_ = false;
    closed_reason_ = reason;
    pushes.swap(pushes_);
    gets.swap(gets_);
  }
  for (auto& promise : TakeMemberships()) promise->set_value(absl::UnavailableError(reason));
  cv_.notify_all();
  // The daemon that knew these pushes' fate is gone: one may have reached
  // its server and been applied. Say so rather than let "failed" promise
  // that it was not (a later push fails plainly: it never left here).
  const std::string unknown = absl::StrCat(
      reason, "; the push may have reached its server before: its outcome is unknown here");
  for (auto& [id, push] : pushes) push.done(Failed(unknown));
  for (auto& [id, promise] : gets) promise->set_value(absl::UnavailableError(reason));
}

bool Worker::TakePush(uint64_t request_id, PendingPush* push) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pushes_.find(request_id);
  if (it == pushes_.end()) return false;
  *push = std::move(it->second);
  pushes_.erase(it);
  return true;
}

std::shared_ptr<LocalChannel> Worker::SendChannel(std::string* reason) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !reconnecting_ || closed_ || shutting_down_; });
  if (closed_ || shutting_down_) {
    *reason = closed_ ? closed_reason_ : "the worker is closing";
    return nullptr;
  }
  return channel_;
}

bool Worker::Reconnect(const std::string& why) {
  std::vector<std::shared_ptr<std::promise<absl::StatusOr<Model>>>> gets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_ || reconnect_s_ <= 0) return false;
    reconnecting_ = true;
    // A get's reply died with the daemon (and a round's get needs the
    // push the old daemon knew): it fails, and may be asked again.
    for (auto& [id, promise] : gets_) gets.push_back(promise);
    gets_.clear();
  }
  for (auto& promise : gets) {
    promise->set_value(absl::UnavailableError(
        absl::StrCat(why, "; connecting to the daemon again: ask again")));
  }
  for (auto& promise : TakeMemberships()) {
    promise->set_value(absl::UnavailableError(
        absl::StrCat(why, "; connecting to the daemon again: ask again")));
  }
  std::fprintf(stderr, "mlfabric: worker '%s': %s; connecting again for up to %.1f s\n",
               options_.name.c_str(), why.c_str(), reconnect_s_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(reconnect_s_));
  std::string last = why;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return shutting_down_; })) {
        break;
      }
    }
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    ClientOptions options = options_;
    options.connect_timeout_s = std::min(1.0, left);
    int64_t version = 0;
    std::string path, host;
    auto channel = ConnectAndRegister(options, v1::ROLE_WORKER, &version, &path, &host);
    if (!channel.ok()) {
      last = std::string(channel.status().message());
      continue;
    }
    // The pushes in flight are asked about on the new connection; their
    // answers come as LocalPushDone like any other.
    v1::LocalMessage query;
    std::shared_ptr<LocalChannel> connected = std::move(*channel);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, push] : pushes_) {
        v1::LocalOutcomeQuery::Entry* entry = query.mutable_outcome_query()->add_pushes();
        entry->set_request_id(id);
        entry->set_uid(push.uid);
      }
      channel_ = connected;
      daemon_host_ = host;
      get_mappings_.Clear();  // the old daemon's buffers are not lent again
      reconnecting_ = false;
      ++reconnects_;
    }
    cv_.notify_all();
    if (query.outcome_query().pushes_size() > 0) {
      if (absl::Status sent = connected->Send(query); !sent.ok()) {
        last = std::string(sent.message());
        std::lock_guard<std::mutex> lock(mu_);
        reconnecting_ = true;
        continue;
      }
    }
    std::fprintf(stderr,
                 "mlfabric: worker '%s': connected to the daemon again; asking how %d push(es) "
                 "in flight ended\n",
                 options_.name.c_str(), query.outcome_query().pushes_size());
    return true;
  }
  FailAll(absl::StrCat(why, "; could not connect to the daemon again within ", reconnect_s_,
                       " s: ", last));
  return false;
}

void Worker::ReaderLoop() {
  std::shared_ptr<LocalChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channel = channel_;
  }
  while (true) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = channel->Receive(&message, &fd);
    if (!status.ok()) {
      const std::string why = absl::StrCat("lost the connection to the MLfabric daemon at ",
                                           socket_path_, ": ", status.message());
      if (!Reconnect(why)) {
        FailAll(why);  // no-op if Reconnect failed everything already
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      channel = channel_;
      continue;
    }
    if (message.has_push_done()) {
      PushDone(message.push_done());
    } else if (message.has_get_done()) {
      GetDone(message.get_done(), fd, channel);
    } else if (message.has_membership()) {
      MembershipDone(message.membership());
      if (fd >= 0) ::close(fd);
    } else if (fd >= 0) {
      ::close(fd);
    }
  }
}

void Worker::PushDone(const v1::LocalPushDone& done) {
  PendingPush push;
  if (!TakePush(done.request_id(), &push)) return;
  PushResult result;
  result.outcome = done.outcome() == v1::OUTCOME_APPLIED   ? PushOutcome::kApplied
                   : done.outcome() == v1::OUTCOME_DROPPED ? PushOutcome::kDropped
                                                           : PushOutcome::kFailed;
  result.reason = done.reason();
  result.applied_version = done.applied_version();
  result.delay = done.delay();
  // The scheduler has no record of it: if it has been running since
  // before the push was handed over (a second's margin), the push
  // never reached it, so it was not applied.
  const double since_handed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - push.handed).count();
  if (done.no_record() && since_handed_s + 1.0 < done.scheduler_uptime_s()) {
    result.reason = "its daemon died before the scheduler heard of it: it was not applied";
  }
  if (done.buffer_released()) push_buffers_.Recycle(std::move(push.buffer));
  push.done(std::move(result));
}

void Worker::GetDone(const v1::LocalGetDone& done, int fd,
                     const std::shared_ptr<LocalChannel>& channel) {
  std::shared_ptr<std::promise<absl::StatusOr<Model>>> promise;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = gets_.find(done.request_id());
    if (it != gets_.end()) {
      promise = it->second;
      gets_.erase(it);
    }
  }
  // A lent buffer goes back to the daemon once its model is gone (or
  // at once, if nobody waits for it or it cannot be mapped).
  std::shared_ptr<void> lease;
  if (done.buffer_id() != 0) lease = LentBufferLease(channel, done.buffer_id());
  if (!promise) {
    if (fd >= 0) ::close(fd);
    return;
  }
  if (!done.error().empty()) {
    if (fd >= 0) ::close(fd);
    promise->set_value(absl::UnavailableError(done.error()));
    return;
  }
  // A lent buffer comes back with a later get: its mapping is kept.
  // One that is not lent is the daemon's only once.
  const size_t bytes = static_cast<size_t>(done.bytes());
  auto buffer = fd < 0                   ? SharedBuffer::Create(0)
                : done.buffer_id() != 0 ? get_mappings_.Map(fd, bytes)
                                        : SharedBuffer::Map(fd, bytes);
  if (!buffer.ok()) {
    promise->set_value(buffer.status());
    return;
  }
  Model model;
  model.version = done.model_version();
  model.count = done.contributions();
  model.lease = std::move(lease);
  model.buffer = std::move(*buffer);
  promise->set_value(std::move(model));
}

void Worker::PushAsync(const std::string& server, const void* data, size_t bytes,
                       int64_t version, double norm, std::function<void(PushResult)> done,
                       const std::vector<TensorSpec>& tensors, ElementType type,
                       const std::optional<std::vector<int64_t>>& shape) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].priority < 0 && tensors[i].priority != TensorSpec::kLayerOrder) {
      done(Failed(absl::StrCat("tensor ", tensors[i].id, " (index ", i, "): priority ",
                               tensors[i].priority,
                               " is negative (use 0 or more, or TensorSpec::kLayerOrder)")));
      return;
    }
  }
  std::shared_ptr<SharedBuffer> buffer = push_buffers_.Take(bytes);
  if (buffer == nullptr) {
    auto created = SharedBuffer::Create(bytes);
    if (!created.ok()) {
      done(Failed(absl::StrCat("cannot allocate shared memory for the push: ",
                               created.status().message())));
      return;
    }
    buffer = std::make_shared<SharedBuffer>(std::move(*created));
  }
  if (bytes > 0) std::memcpy(buffer->data(), data, bytes);
  v1::LocalMessage message;
  v1::LocalPush* push = message.mutable_push();
  push->set_server(server);
  push->set_bytes(static_cast<int64_t>(bytes));
  push->set_version(version);
  push->set_norm(norm);
  // ElementType mirrors v1::DType value for value.
  push->set_dtype(static_cast<v1::DType>(static_cast<int32_t>(type)));
  if (shape.has_value()) {
    v1::TensorShape* dims = push->mutable_shape();  // set even for a scalar's []
    for (int64_t dim : *shape) dims->add_dims(dim);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& tensor = tensors[i];
    v1::TensorInfo* info = push->add_tensors();
    info->set_tensor_id(tensor.id);
    info->set_bytes(tensor.bytes);
    info->set_priority(tensor.priority == TensorSpec::kLayerOrder ? static_cast<int32_t>(i)
                                                                   : tensor.priority);
  }
  std::string closed;
  std::shared_ptr<LocalChannel> channel = SendChannel(&closed);
  if (channel == nullptr) {
    done(Failed(closed));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_request_id_++;
    push->set_request_id(id);
    push->set_uid(next_uid_++);
    if (push->uid() == 0) push->set_uid(next_uid_++);
    pushes_[id] =
        PendingPush{push->uid(), std::move(done), std::chrono::steady_clock::now(), buffer};
  }
  absl::Status sent = channel->Send(message, buffer->fd());
  if (!sent.ok()) {
    // Not handed over whole: the daemon never took it. (Were the
    // connection lost meanwhile, the outcome query says the same.)
    PendingPush failed;
    if (TakePush(push->request_id(), &failed)) {
      failed.done(Failed(absl::StrCat("cannot hand the push to the daemon: ", sent.message())));
    }
  }
}

std::future<PushResult> Worker::Push(const std::string& server, const void* data, size_t bytes,
                                     int64_t version, double norm,
                                     const std::vector<TensorSpec>& tensors, ElementType type,
                                     const std::optional<std::vector<int64_t>>& shape) {
  auto promise = std::make_shared<std::promise<PushResult>>();
  std::future<PushResult> future = promise->get_future();
  PushAsync(
      server, data, bytes, version, norm,
      [promise](PushResult result) { promise->set_value(std::move(result)); }, tensors, type,
      shape);
  return future;
}

absl::StatusOr<Model> Worker::Get(const std::string& server, int32_t priority) {
  if (priority < 0) {
    return absl::InvalidArgumentError(absl::StrCat("get priority ", priority, " is negative"));
  }
  std::string closed;
  std::shared_ptr<LocalChannel> channel = SendChannel(&closed);
  if (channel == nullptr) return absl::UnavailableError(closed);
  auto promise = std::make_shared<std::promise<absl::StatusOr<Model>>>();
  auto future = promise->get_future();
  v1::LocalMessage message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_request_id_++;
    message.mutable_get()->set_request_id(id);
    gets_[id] = promise;
  }
  message.mutable_get()->set_server(server);
  message.mutable_get()->set_priority(priority);
  if (auto sent = channel->Send(message); !sent.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (gets_.erase(message.get().request_id())) return sent;
  }
  return future.get();
}

std::vector<std::shared_ptr<std::promise<absl::StatusOr<JobMembers>>>> Worker::TakeMemberships() {
  std::vector<std::shared_ptr<std::promise<absl::StatusOr<JobMembers>>>> taken;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, promise] : memberships_) taken.push_back(promise);
  memberships_.clear();
  return taken;
}

void Worker::MembershipDone(const v1::LocalMembership& done) {
  std::shared_ptr<std::promise<absl::StatusOr<JobMembers>>> promise;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memberships_.find(done.request_id());
    if (it == memberships_.end()) return;
    promise = std::move(it->second);
    memberships_.erase(it);
  }
  if (!done.error().empty()) {
    promise->set_value(absl::UnavailableError(done.error()));
    return;
  }
  JobMembers members;
  members.generation = done.generation();
  members.members.assign(done.members().begin(), done.members().end());
  promise->set_value(std::move(members));
}

absl::StatusOr<JobMembers> Worker::Membership() {
  std::string closed;
  std::shared_ptr<LocalChannel> channel = SendChannel(&closed);
  if (channel == nullptr) return absl::UnavailableError(closed);
  auto promise = std::make_shared<std::promise<absl::StatusOr<JobMembers>>>();
  auto future = promise->get_future();
  v1::LocalMessage message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_request_id_++;
    message.mutable_membership_query()->set_request_id(id);
    memberships_[id] = promise;
  }
  if (auto sent = channel->Send(message); !sent.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (memberships_.erase(message.membership_query().request_id())) return sent;
  }
  return future.get();
}

// ------------------------------------------------------------------ Server

namespace internal {

v1::LocalMessage ApplyDeliveredUpdate(const v1::LocalUpdate& update, int fd,
                                      const Server::UpdateCallback& on_update) {
  v1::LocalMessage ack;
  v1::LocalUpdateAck* body = ack.mutable_update_ack();
  body->set_transfer_id(update.transfer_id());
  auto buffer = SharedBuffer::Map(fd, static_cast<size_t>(update.bytes()));
  if (!buffer.ok()) {
    body->set_error(std::string(buffer.status().message()));
    return ack;
  }
  Server::Update view;
  view.transfer_id = update.transfer_id();
  view.sequence = update.sequence();
  view.count = std::max<int64_t>(1, update.count());
  view.worker = update.worker();
  view.version = update.version();
  view.norm = update.norm();
  view.data = buffer->data();
  view.bytes = buffer->size();
  absl::StatusOr<int64_t> applied = on_update(view);
  if (applied.ok()) {
    body->set_model_version(*applied);
  } else {
    body->set_error(std::string(applied.status().message()));
  }
  return ack;
}

absl::Status AnswerModelRequest(LocalChannel& channel, const v1::LocalModelRequest& request,
                                const Server::RequestCallback& on_request) {
  v1::LocalMessage reply;
  v1::LocalModelReply* body = reply.mutable_model_reply();
  body->set_request_id(request.request_id());
  absl::StatusOr<Server::Snapshot> snapshot =
      on_request ? on_request()
                 : absl::StatusOr<Server::Snapshot>(absl::FailedPreconditionError(
                       "this application answers no model requests (no request callback)"));
  if (!snapshot.ok()) {
    body->set_error(std::string(snapshot.status().message()));
    return channel.Send(reply);
  }
  auto buffer = SharedBuffer::Create(snapshot->bytes.size());
  if (!buffer.ok()) {
    body->set_error(std::string(buffer.status().message()));
    return channel.Send(reply);
  }
  if (!snapshot->bytes.empty()) {
    std::memcpy(buffer->data(), snapshot->bytes.data(), snapshot->bytes.size());
  }
  body->set_model_version(snapshot->version);
  body->set_bytes(static_cast<int64_t>(snapshot->bytes.size()));
  return channel.Send(reply, buffer->fd());
}

absl::Status ServeMessages(
    LocalChannel& channel, const std::atomic<bool>& stopping,
    absl::FunctionRef<absl::Status(const v1::LocalMessage& message, int fd)> handle) {
  while (true) {
    v1::LocalMessage message;
    int fd = -1;
    absl::Status status = channel.Receive(&message, &fd);
    if (!status.ok()) {
      if (stopping.load()) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("lost the connection to the MLfabric daemon: ", status.message()));
    }
    if (absl::Status handled = handle(message, fd); !handled.ok()) return handled;
  }
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Server>> Server::Connect(const ClientOptions& options) {
  std::unique_ptr<Server> server(new Server());
  std::string path;
  auto channel = ConnectAndRegister(options, v1::ROLE_SERVER, &server->initial_version_, &path);
  if (!channel.ok()) return channel.status();
  server->channel_ = std::move(*channel);
  return server;
}

Server::~Server() { Stop(); }

void Server::Stop() {
  stopping_.store(true);
  if (channel_) channel_->Shutdown();
}

absl::Status Server::Serve() {
  if (!on_update_ || !on_request_) {
    return absl::FailedPreconditionError(
        "register both an update callback and a request callback before Serve()");
  }
  return internal::ServeMessages(
      *channel_, stopping_, [&](const v1::LocalMessage& message, int fd) -> absl::Status {
        if (message.has_update()) {
          return channel_->Send(internal::ApplyDeliveredUpdate(message.update(), fd, on_update_));
        }
        if (fd >= 0) ::close(fd);
        if (message.has_model_request()) {
          return internal::AnswerModelRequest(*channel_, message.model_request(), on_request_);
        }
        return absl::OkStatus();
      });
}

}  // namespace mlfabric
