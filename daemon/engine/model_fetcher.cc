#include "daemon/engine/model_fetcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/control/scheduler_client.h"
#include "daemon/transport/framing.h"

namespace mlfabric::daemon {

using transport::PacketHeader;
using transport::PacketKind;

ModelFetcher::ModelFetcher(Options options, ServerResolver* resolver,
                           transport::GetClient* client, SendScheduler* send,
                           transport::SendWatchdog* watchdog)
    : options_(std::move(options)),
      resolver_(resolver),
      client_(client),
      send_(send),
      watchdog_(watchdog) {}

void ModelFetcher::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
}

std::string ModelFetcher::RelayKey(uint32_t job_id, const std::string& server, bool round) {
  return absl::StrCat(job_id, "/", server, round ? "#round" : "");
}

void ModelFetcher::ApplyLocked(RelayTable::Effects effects) {
  for (const auto& [id, range] : effects.forward) {
    send_->QueueReply(id, range.first, range.second, effects.contributions);
  }
  for (uint64_t id : effects.complete) send_->EndReply(id);
  for (const auto& [id, why] : effects.fail) send_->FailReply(id, why);
  if (pool_ == nullptr) return;
  for (std::shared_ptr<SharedBuffer>& copy : effects.dropped) pool_->Recycle(std::move(copy));
}

std::shared_ptr<SharedBuffer> ModelFetcher::AwaitRelayCopy(const std::string& key,
                                                          uint64_t batch,
                                                          const std::string& server,
                                                          const std::string& who,
                                                          v1::DataGetReply* reply) {
  using State = RelayTable::State;
  // Our own get of the batch may not have its reply header yet.
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.get_timeout_s));
  while (relays_.StateOf(key, batch) == State::kUnknown && !stopping_ &&
         std::chrono::steady_clock::now() < deadline) {
    cv_.WaitWithDeadline(&mu_, deadline);
  }
  RelayTable::Watch peek = relays_.AddWatcher(key, batch, 0);
  if (stopping_) {
    reply->set_error(absl::StrCat(who, " is stopping"));
  } else if (peek.state == State::kUnknown || peek.state == State::kGone) {
    reply->set_error(absl::StrCat(
        who, " has no copy of batch ", batch, " of server '", server, "' ",
        peek.state == State::kGone ? "any more"
                                   : absl::StrCat("(its own get did not begin within ",
                                                  options_.get_timeout_s, " s)")));
  } else if (peek.state == State::kFailed) {
    reply->set_error(absl::StrCat(who, " could not receive the model: ", peek.error));
  } else {
    reply->set_version(peek.version);
    return peek.model;
  }
  return nullptr;
}

absl::Status ModelFetcher::ServeRelay(int fd, const PacketHeader& request,
                                      const v1::DataGetRequest& body) {
  // offset = round + 1: a synchronous round's sum (batch = round + 1).
  const std::string key = RelayKey(request.job, body.server(), request.offset > 0);
  const uint64_t batch = body.relay_batch();
  const std::string who = absl::StrCat("distributor ", options_.host);
  using State = RelayTable::State;
  v1::DataGetReply reply;
  reply.set_batch(batch);
  std::shared_ptr<SharedBuffer> model = AwaitRelayCopy(key, batch, body.server(), who, &reply);
  RETURN_IF_ERROR(transport::WriteGetReply(
      *watchdog_, fd, request, reply, model ? static_cast<int64_t>(model->size()) : 0));
  if (!model || model->size() == 0) return absl::OkStatus();
  // Cut-through: what has arrived goes now, each later packet as it comes.
  const uint64_t stream = send_->ReserveReplyId();
  std::string failed_meanwhile;
  {
    MutexLock lock(&mu_);  // relay effects are applied under it
    send_->OpenReply(stream, fd, request, model,
                     std::numeric_limits<size_t>::max());
    RelayTable::Watch watch = relays_.AddWatcher(key, batch, stream);
    if (watch.state == State::kFailed || watch.state == State::kUnknown ||
        watch.state == State::kGone) {
      failed_meanwhile = watch.state == State::kFailed ? watch.error : "its copy was dropped";
    } else {
      // Counted before the first packet is queued: the requester may have
      // the whole copy before this thread runs again (model_fetcher_test
      // read 0 about once in 20 runs when this came after).
      ++copies_forwarded_;
      for (const auto& [begin, end] : watch.ready) {
        send_->QueueReply(stream, begin, end, watch.contributions);
      }
      if (watch.state == State::kDone) send_->EndReply(stream);
      MLF_LOG(DEBUG) << "forwards batch " << batch << " of server '" << body.server()
                     << "' to get " << request.transfer << " ("
                     << (watch.state == State::kDone ? "all arrived" : "cut-through") << ")";
    }
  }
  absl::Status streamed =
      failed_meanwhile.empty()
          ? send_->AwaitReply(
                stream,
                [&] {
                  std::string why;
                  if (relays_.StateOf(key, batch, &why) != State::kFailed) return std::string();
                  return why;
                },
                std::chrono::steady_clock::time_point::max())
          : absl::AbortedError(failed_meanwhile);
  relays_.RemoveWatcher(key, batch, stream);
  if (!failed_meanwhile.empty()) send_->CloseReply(stream);
  if (streamed.ok()) return streamed;
  // Our copy failed (or the requester went away): tell it why.
  PacketHeader abort;
  abort.kind = PacketKind::kAbort;
  abort.job = request.job;
  abort.transfer = request.transfer;
  const std::string reason = absl::StrCat(who, " lost the model mid-forward: ", streamed.message());
  return transport::WritePacket(*watchdog_, fd, abort, reason.data(),
                                static_cast<uint32_t>(reason.size()));
}

absl::Status ModelFetcher::Receive(transport::GetClient::Connection& connection,
                                   const std::string& relay_key, const std::string& source,
                                   std::shared_ptr<SharedBuffer>* model) {
  const uint64_t total = connection.header.offset;
  // A buffer an application gave back after an earlier get, else new.
  std::shared_ptr<SharedBuffer> buffer = pool_ != nullptr ? pool_->Take(total) : nullptr;
  if (buffer == nullptr) {
    auto created = SharedBuffer::Create(total);
    if (!created.ok()) return created.status();
    buffer = std::make_shared<SharedBuffer>(std::move(*created));
  }
  const uint64_t batch = connection.reply.batch();
  bool relaying = false;  // this get keeps the copy others may be routed to
  if (!relay_key.empty() && batch != 0 && total > 0) {
    MutexLock lock(&mu_);
    RelayTable::Effects effects;
    relaying = relays_.Begin(relay_key, batch, connection.reply.version(), buffer, &effects);
    ApplyLocked(std::move(effects));
    cv_.SignalAll();  // requesters routed here may be waiting for the copy (ServeRelay)
  }
  absl::Status received = client_->Receive(
      connection, *buffer, [&](uint64_t begin, uint64_t end) {
        if (!relaying) return;
        MutexLock lock(&mu_);
        ApplyLocked(relays_.Arrived(relay_key, batch, begin, end, connection.contributions));
      });
  if (relaying) {
    MutexLock lock(&mu_);
    // Requesters below us learn where the chain broke.
    const std::string broken =
        received.ok() ? "" : absl::StrCat("its copy from ", source, " failed: ", received.message());
    ApplyLocked(relays_.Finish(relay_key, batch, broken));
  }
  if (received.ok()) *model = std::move(buffer);
  return received;
}

absl::Status ModelFetcher::Fetch(const std::string& job, const std::string& server, int64_t round,
                                 uint32_t priority, int64_t* version,
                                 std::shared_ptr<SharedBuffer>* model,
                                 int64_t fresh_min_version, uint32_t* contributions) {
  if (contributions != nullptr) *contributions = 0;
  v1::ResolveServerReply where;
  absl::Status status = resolver_->Resolve(job, server, &where);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("get: ", RpcErrorText(status)));
  }
  if (where.shards_size() > 0) return FetchGroup(job, server, where, priority, version, model);
  // A get that fails asks the scheduler where the server is next time (it
  // may have moved, or the scheduler restarted).
  status = FetchFrom(where, server, round, priority, version, model, fresh_min_version,
                     contributions);
  if (status.ok()) return status;
  resolver_->Forget(job, server);
  if (!where.has_replica() || options_.failover_wait_s <= 0) return status;
  // The server may be failing over to its replica
  // (scheduler/service/failover.h): the scheduler learns of a dead host
  // within its keepalive. Until it names another host, ask again; then get
  // from there, so the worker's get does not fail for the failover.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.failover_wait_s));
  while (std::chrono::steady_clock::now() < deadline) {
    {
      MutexLock lock(&mu_);
      if (!stopping_) cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(200));
      if (stopping_) break;
    }
    v1::ResolveServerReply moved;
    if (!resolver_->Resolve(job, server, &moved).ok()) continue;
    if (moved.host() == where.host()) {
      resolver_->Forget(job, server);  // not yet: ask the scheduler again
      continue;
    }
    absl::Status again =
        FetchFrom(moved, server, round, priority, version, model, -1, contributions);
    if (again.ok()) return again;
    resolver_->Forget(job, server);
    return absl::Status(again.code(),
                        absl::StrCat(again.message(), " (server '", server, "' had moved from ",
                                     where.host(), " to ", moved.host(), " after: ",
                                     status.message(), ")"));
  }
  return status;
}

absl::Status ModelFetcher::FetchGroup(const std::string& job, const std::string& group,
                                      const v1::ResolveServerReply& where, uint32_t priority,
                                      int64_t* version, std::shared_ptr<SharedBuffer>* model) {
  // Every shard applies the same pushes in the same order, so its version
  // names the same model state at each; the shards are asked at once, and
  // those behind the newest are asked again until all agree.
  const int n = where.shards_size();
  std::vector<int64_t> versions(n, -1);
  std::vector<std::shared_ptr<SharedBuffer>> parts(n);
  std::vector<absl::Status> statuses(n);
  std::vector<int> ask(n);
  for (int i = 0; i < n; ++i) ask[i] = i;
  int64_t newest = -1;  // after the first round: the version every shard must show
  for (int attempt = 0; attempt < kGroupGetAttempts; ++attempt) {
    // The first round joins each shard's batch of gets; a shard behind the
    // newest is then read at once, at the newest version: its daemon asks
    // for the snapshot right after handing over the update that makes it
    // (the same pushes are released at every shard together).
    auto fetch = [&](int i) {
      statuses[i] = Fetch(job, where.shards(i).server(), -1, priority, &versions[i], &parts[i],
                          attempt == 0 ? -1 : newest);
    };
    std::vector<std::thread> others;
    for (size_t k = 1; k < ask.size(); ++k) others.emplace_back(fetch, ask[k]);
    fetch(ask[0]);
    for (std::thread& t : others) t.join();
    for (int i : ask) {
      const v1::ShardLocation& shard = where.shards(i);
      if (!statuses[i].ok() || static_cast<int64_t>(parts[i]->size()) != shard.end() - shard.begin()) {
        resolver_->Forget(job, group);  // its layout may have changed
      }
      if (!statuses[i].ok()) {
        return absl::Status(statuses[i].code(),
                            absl::StrCat("get of server group '", group, "': shard ", i, " ('",
                                         shard.server(), "'): ", statuses[i].message()));
      }
      if (static_cast<int64_t>(parts[i]->size()) != shard.end() - shard.begin()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "get of server group '", group, "': shard ", i, " ('", shard.server(),
            "') returned ", parts[i]->size(), " bytes; it holds bytes [", shard.begin(), ", ",
            shard.end(), ") of the model"));
      }
    }
    newest = *std::max_element(versions.begin(), versions.end());

    ask.clear();
    for (int i = 0; i < n; ++i) {
      if (versions[i] < newest) ask.push_back(i);
    }
    if (ask.empty()) {
      MLF_LOG(DEBUG) << "get of server group '" << group << "': version " << newest << " from "
                     << n << " shards in " << attempt + 1 << " round(s)";
      break;
    }
    MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("daemon stopping");
  }
  if (!ask.empty()) {
    std::string seen;
    for (int i = 0; i < n; ++i) absl::StrAppend(&seen, i == 0 ? "" : ", ", versions[i]);
    return absl::UnavailableError(absl::StrCat(
        "get of server group '", group, "': its shards did not show one version in ",
        kGroupGetAttempts, " tries (last versions ", seen, "); pushes commit faster than the "
        "shards can be read; try again"));
  }
  absl::StatusOr<SharedBuffer> whole =
      SharedBuffer::Create(static_cast<size_t>(where.shards(n - 1).end()));
  if (!whole.ok()) return whole.status();
  for (int i = 0; i < n; ++i) {
    std::memcpy(whole->data() + where.shards(i).begin(), parts[i]->data(), parts[i]->size());
  }
  *version = versions[0];
  *model = std::make_shared<SharedBuffer>(std::move(*whole));
  return absl::OkStatus();
}

absl::Status ModelFetcher::FetchFrom(const v1::ResolveServerReply& where,
                                     const std::string& server, int64_t round, uint32_t priority,
                                     int64_t* version, std::shared_ptr<SharedBuffer>* model,
                                     int64_t fresh_min_version, uint32_t* contributions) {
  PacketHeader request;
  request.kind = PacketKind::kGetRequest;
  request.job = where.job_id();
  request.priority = static_cast<uint16_t>(std::min<uint32_t>(priority, 65535));
  // A synchronous-round server answers a worker that pushed round r with
  // that round's sum, streamed as its chunks complete (Mercury PS).
  const bool round_get = where.round_size() > 0 && round >= 0;
  // Same host: the sum never crosses a socket (the root rank of an
  // AllReduce reads the sum its own daemon makes).
  // Its errors read as the server's daemon's reply would.
  if (round_get && local_rounds_ != nullptr && where.host() == options_.host) {
    return local_rounds_->AwaitSum(where.job_id(), server, round, version, model, contributions);
  }
  if (round_get) request.offset = static_cast<uint64_t>(round) + 1;
  request.transfer = next_request_++;
  v1::DataGetRequest body;
  body.set_server(server);
  body.set_requester_host(options_.host);
  body.set_requester_address(options_.data_address);
  if (fresh_min_version >= 0) {
    body.set_fresh(true);
    body.set_min_version(fresh_min_version);
    body.set_no_relay(true);
  }
  transport::GetClient::Connection direct;
  RETURN_IF_ERROR(client_->Request(where.host(), where.data_address(), request, body, &direct));
  // The copy is kept for requesters the server routes through us.
  const std::string relay_key = RelayKey(where.job_id(), server, round_get);
  if (direct.reply.relay_host().empty()) {
    RETURN_IF_ERROR(Receive(direct, relay_key, absl::StrCat(where.host(), "'s daemon"), model));
    *version = direct.reply.version();
    if (contributions != nullptr) *contributions = direct.contributions;
    client_->Keep(direct);
    return absl::OkStatus();
  }
  client_->Keep(direct);  // nothing follows on it
  return FetchThroughDistributor(where, server, relay_key, direct, request, body, version,
                                 model, contributions);
}

absl::Status ModelFetcher::FetchThroughDistributor(
    const v1::ResolveServerReply& where, const std::string& server,
    const std::string& relay_key, const transport::GetClient::Connection& direct,
    PacketHeader request, v1::DataGetRequest body, int64_t* version,
    std::shared_ptr<SharedBuffer>* model, uint32_t* contributions) {
  const std::string distributor =
      absl::StrCat(direct.reply.relay_host(), " (", direct.reply.relay_address(), ")");
  auto from_distributor = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("get of server '", server, "' through distributor ",
                                               distributor, ": ", s.message()));
  };
  body.set_relay_batch(direct.reply.batch());
  request.transfer = next_request_++;
  transport::GetClient::Connection relay;
  if (auto s = client_->Request(direct.reply.relay_host(), direct.reply.relay_address(), request, body,
                            &relay);
      !s.ok()) {
    // Nothing came from the distributor (it is gone, or no longer has the
    // copy): the server's daemon answers this get itself.
    MLF_LOG(INFO) << "get of server '" << server << "': distributor " << distributor
                  << " did not forward (" << s.message() << "); asking the server's daemon";
    body.clear_relay_batch();
    body.set_no_relay(true);
    request.transfer = next_request_++;
    transport::GetClient::Connection again;
    RETURN_IF_ERROR(client_->Request(where.host(), where.data_address(), request, body, &again));
    RETURN_IF_ERROR(Receive(again, relay_key, absl::StrCat(where.host(), "'s daemon"), model));
    *version = again.reply.version();
    if (contributions != nullptr) *contributions = again.contributions;
    client_->Keep(again);
    return absl::OkStatus();
  }
  if (relay.header.offset != direct.header.offset ||
      relay.reply.version() != direct.reply.version()) {
    return from_distributor(absl::DataLossError(absl::StrCat(
        "it forwards version ", relay.reply.version(), " (", relay.header.offset,
        " bytes), the server answered version ", direct.reply.version(), " (",
        direct.header.offset, " bytes)")));
  }
  if (auto s = Receive(relay, relay_key, absl::StrCat("distributor ", distributor), model);
      !s.ok()) {
    return from_distributor(s);
  }
  *version = relay.reply.version();
  if (contributions != nullptr) *contributions = relay.contributions;
  client_->Keep(relay);
  return absl::OkStatus();
}

}  // namespace mlfabric::daemon
