#include "daemon/engine/model_server.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "daemon/transport/get_client.h"

namespace mlfabric::daemon {

using transport::PacketHeader;

ModelServer::ModelServer(Options options, ServerApps* apps, SchedulerClient* scheduler,
                         SendScheduler* send, transport::SendWatchdog* watchdog)
    : options_(std::move(options)),
      apps_(apps),
      scheduler_(scheduler),
      send_(send),
      watchdog_(watchdog) {}

uint64_t ModelServer::NewHistoryRequest(const std::string& key) {
  if (options_.snapshot_history == 0) return 0;
  MutexLock lock(&mu_);
  const uint64_t id = kHistoryId | next_history_++;
  history_requests_[id] = key;
  return id;
}

void ModelServer::Answer(uint64_t batch, GetBatcher::Snapshot snapshot) {
  MutexLock lock(&mu_);
  if ((batch & kHistoryId) != 0) {
    auto request = history_requests_.find(batch);
    if (request == history_requests_.end()) return;
    const std::string key = std::move(request->second);
    history_requests_.erase(request);
    if (!snapshot.error.empty() || snapshot.model == nullptr) return;
    std::map<int64_t, GetBatcher::Snapshot>& kept = history_[key];
    kept[snapshot.version] = std::move(snapshot);
    while (kept.size() > options_.snapshot_history) kept.erase(kept.begin());
    cv_.SignalAll();
    return;
  }
  if ((batch & kSoloId) != 0) {
    if (auto solo = solo_.find(batch); solo != solo_.end()) solo->second = std::move(snapshot);
  } else {
    gets_.Answer(batch, std::move(snapshot));
  }
  cv_.SignalAll();
}

void ModelServer::SoloSnapshot(const std::string& key, const std::string& server,
                               int64_t min_version, std::string* error, int64_t* version,
                               std::shared_ptr<SharedBuffer>* model) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.get_timeout_s));
  MutexLock lock(&mu_);
  // The version asked for, kept from right after its update (a server
  // group's shard; NewHistoryRequest).
  if (auto kept = history_.find(key); kept != history_.end() && min_version >= 0) {
    if (auto at = kept->second.find(min_version); at != kept->second.end()) {
      *version = at->second.version;
      *model = at->second.model;
      return;
    }
  }
  while (true) {
    const uint64_t id = kSoloId | next_solo_++;
    solo_[id];
    lock.Unlock();
    absl::Status asked = apps_->AskSnapshot(key, id, min_version);
    lock.Lock();
    if (!asked.ok()) {
      solo_.erase(id);
      *error = absl::StrCat("cannot reach server '", server, "': ", asked.message());
      return;
    }
    cv_.AwaitWithDeadline(&mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return solo_[id].has_value() || stopping_.load();
    });
    std::optional<GetBatcher::Snapshot> snapshot = std::move(solo_[id]);
    solo_.erase(id);
    if (!snapshot.has_value()) {
      *error = stopping_.load() ? std::string("the daemon is stopping")
                                : absl::StrCat("server '", server, "' did not answer within ",
                                               options_.get_timeout_s, " s");
      return;
    }
    if (!snapshot->error.empty() || snapshot->version >= min_version) {
      *error = snapshot->error;
      *version = snapshot->version;
      *model = snapshot->model;
      return;
    }
    // Not there yet: its update is being applied (a group push released at
    // every shard at once).
    if (cv_.AwaitWithTimeout(&mu_, std::chrono::milliseconds(2),
                             [&] { return stopping_.load(); }) ||
        std::chrono::steady_clock::now() >= deadline) {
      *error = absl::StrCat("server '", server, "' is at version ", snapshot->version,
                            " and did not reach ", min_version, " within ",
                            options_.get_timeout_s, " s");
      return;
    }
  }
}

void ModelServer::FailServer(const std::string& key, const std::string& why) {
  MutexLock lock(&mu_);
  history_.erase(key);
  gets_.FailKey(key, why);
  cv_.SignalAll();
}

void ModelServer::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
}

ModelServer::Stats ModelServer::stats() const {
  MutexLock lock(&mu_);
  const GetBatcher::Stats batches = gets_.stats();
  return {batches.gets, batches.snapshots, copies_sent_.load(), routed_.load()};
}

absl::Status ModelServer::Serve(int fd, const PacketHeader& request,
                                const v1::DataGetRequest& body) {
  const std::string& server = body.server();
  const std::string key = absl::StrCat(request.job, "/", server);
  std::string error;
  std::shared_ptr<SharedBuffer> model;
  int64_t version = 0;
  std::optional<GetBatcher::Ticket> ticket;
  // The scheduler resolves a server as soon as it registered there, which
  // is a moment before its daemon records the application (after the
  // RegisterEntity reply): a get arriving in between waits briefly
  // instead of failing.
  const bool connected = apps_->AwaitServer(key, options_.server_connect_wait_s);
  if (connected && body.fresh()) {
    // A group get's shard behind the others (model_fetcher.h FetchGroup):
    // its own snapshot now, sent from here, not one of the next batch.
    SoloSnapshot(key, server, body.min_version(), &error, &version, &model);
  } else if (!connected) {
    error = absl::StrCat("server '", server, "' is not connected to ", options_.host,
                         "'s daemon");
  } else {
    ticket = BatchSnapshot(key, request, body, &error, &version, &model);
  }
  // However the reply ends, this get has left its batch (the next batch may
  // take its snapshot once every get of this one has).
  auto leave = [&] {
    if (!ticket.has_value()) return;
    MutexLock lock(&mu_);
    gets_.Leave(ticket->batch);
    cv_.SignalAll();
  };
  // §10.3: the batch's distribution tree says whether this requester gets
  // the model from here or from a distributor of the same batch.
  GetBatcher::Route route;
  if (error.empty() && model && ticket.has_value()) {
    route = AwaitRoute(key, request.job, server, *ticket, static_cast<int64_t>(model->size()));
  }
  v1::DataGetReply reply;
  reply.set_version(version);
  reply.set_error(error);
  if (ticket.has_value()) reply.set_batch(ticket->batch);
  const bool relayed = !route.via_host.empty();
  if (relayed) {
    reply.set_relay_host(route.via_host);
    reply.set_relay_address(route.via_address);
  }
  if (auto status = transport::WriteGetReply(*watchdog_, fd, request, reply,
                                  error.empty() && model ? static_cast<int64_t>(model->size()) : 0);
      !status.ok()) {
    leave();
    return status;
  }
  if (relayed) {
    MLF_LOG(DEBUG) << "get " << request.transfer << " of server '" << server << "' (batch "
                   << ticket->batch << ") for " << body.requester_host()
                   << " goes through distributor " << route.via_host;
    ++routed_;
    leave();
    return absl::OkStatus();
  }
  if (!error.empty() || !model || model->size() == 0) {
    leave();
    return absl::OkStatus();
  }
  absl::Status streamed = StreamModel(fd, request, model, ticket);
  leave();
  return streamed;
}

std::optional<GetBatcher::Ticket> ModelServer::BatchSnapshot(
    const std::string& key, const PacketHeader& request, const v1::DataGetRequest& body,
    std::string* error, int64_t* version, std::shared_ptr<SharedBuffer>* model) {
  const std::string& server = body.server();
  MutexLock lock(&mu_);
  // One snapshot per batch of gets (§10.3, daemon/engine/get_batcher.h).
  // A get that asks to be answered from here takes no part in the tree.
  const GetBatcher::Ticket ticket = gets_.Join(
      key, body.no_relay() ? "" : body.requester_host(), body.requester_address());
  MLF_LOG(DEBUG) << "get " << request.transfer << " of server '" << server
                 << "' joins model batch " << ticket.batch
                 << (ticket.ask    ? " (takes its snapshot)"
                     : ticket.late ? " (late, as a leaf of its leaving tree)"
                                   : "");
  if (ticket.ask) AskBatchSnapshotLocked(key, server, ticket.batch);
  if (!cv_.AwaitWithTimeout(&mu_, std::chrono::duration<double>(options_.get_timeout_s),
                            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              return gets_.Result(ticket.batch).has_value() ||
                                     stopping_.load();
                            })) {
    // The whole batch gives up together.
    gets_.Answer(ticket.batch, {0, nullptr,
                                absl::StrCat("server '", server, "' did not answer within ",
                                             options_.get_timeout_s, " s")});
    cv_.SignalAll();
  }
  if (std::optional<GetBatcher::Snapshot> snapshot = gets_.Result(ticket.batch)) {
    *error = snapshot->error;
    *version = snapshot->version;
    *model = snapshot->model;
  } else {
    *error = "the daemon is stopping";
  }
  return ticket;
}

void ModelServer::AskBatchSnapshotLocked(const std::string& key, const std::string& server,
                                         uint64_t batch) {
  // The previous batch's replies leave first; gets arriving meanwhile
  // join this batch.
  cv_.AwaitWithTimeout(&mu_, std::chrono::duration<double>(options_.get_batch_wait_s),
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         return gets_.MayAsk(batch) || stopping_.load();
                       });
  if (gets_.Result(batch).has_value()) return;  // ended meanwhile (server gone)
  mu_.Unlock();
  absl::Status sent = apps_->AskSnapshot(key, batch, -1);
  mu_.Lock();
  if (absl::IsNotFound(sent)) {
    gets_.FailKey(key, absl::StrCat("server '", server, "' disconnected"));
  } else if (!sent.ok()) {
    gets_.Answer(batch, {0, nullptr,
                         absl::StrCat("cannot reach server '", server, "': ", sent.message())});
  }
  cv_.SignalAll();
}

GetBatcher::Route ModelServer::AwaitRoute(const std::string& key, uint32_t job_id,
                                          const std::string& server,
                                          const GetBatcher::Ticket& ticket,
                                          int64_t model_bytes) {
  if (ticket.ask) RouteBatch(key, job_id, server, ticket.batch, model_bytes);
  MutexLock lock(&mu_);
  std::optional<GetBatcher::Route> routed;
  cv_.AwaitWithTimeout(&mu_, std::chrono::duration<double>(options_.get_timeout_s),
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         routed = gets_.RouteOf(ticket.batch, ticket.member);
                         return routed.has_value() || stopping_.load();
                       });
  if (routed.has_value()) return *routed;
  return GetBatcher::Route();  // direct
}

absl::Status ModelServer::StreamModel(int fd, const PacketHeader& request,
                                      const std::shared_ptr<SharedBuffer>& model,
                                      const std::optional<GetBatcher::Ticket>& ticket) {
  // The model's packets go out through the priority queue (ReplyStream).
  const auto stream_start = std::chrono::steady_clock::now();
  const uint64_t stream = send_->ReserveReplyId();
  ++copies_sent_;
  const size_t payload_bytes = options_.payload_bytes;
  send_->OpenReply(stream, fd, request, model,
                   (model->size() + payload_bytes - 1) / payload_bytes);
  send_->QueueReply(stream, 0, model->size());
  absl::Status streamed = send_->AwaitReply(
      stream, [] { return std::string(); }, std::chrono::steady_clock::time_point::max());
  // The batch is leaving until its bytes have left the host, not only the
  // daemon: the kernel's send buffer takes a whole model at once. Until
  // then, new gets gather into the next batch or join this one's tree.
  // But a receiver whose downlink is slower than its share of this host's
  // uplink (N3) holds its copy's bytes here while the uplink is free: the
  // batch leaves at the latest when the uplink could have sent all of the
  // batch's own copies, so one slow receiver does not hold back the next
  // batch of everyone else.
  if (streamed.ok()) {
    double wait_s = options_.get_timeout_s;
    const double uplink_bps = options_.uplink_bps ? options_.uplink_bps() : 0;
    if (uplink_bps > 0 && ticket.has_value()) {
      const int copies = std::max(1, gets_.DirectCopies(ticket->batch));
      const double uplink_s = 8.0 * static_cast<double>(model->size()) * copies / uplink_bps;
      const double elapsed_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - stream_start).count();
      wait_s = std::clamp(uplink_s - elapsed_s, 0.0, wait_s);
    }
    WaitSent(fd, wait_s);
  }
  return streamed;
}

void ModelServer::WaitSent(int fd, double timeout_s) {
  constexpr int kLeftBytes = 64 * 1024;  // about two packets still on their way
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (!stopping_.load() && std::chrono::steady_clock::now() < deadline) {
    int unsent = 0;  // bytes in the send queue not yet acknowledged by the peer
    if (ioctl(fd, SIOCOUTQ, &unsent) != 0 || unsent <= kLeftBytes) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void ModelServer::RouteBatch(const std::string& key, uint32_t job_id, const std::string& server,
                             uint64_t batch, int64_t model_bytes) {
  const std::vector<std::string> members = gets_.Requesters(batch);
  std::vector<GetBatcher::Route> routes(members.size());  // direct unless planned
  // The remote hosts that asked, each once, in request order. Gets from
  // this host, or from a daemon that did not say, are answered from here.
  std::vector<std::string> hosts;
  std::set<std::string> seen;
  for (const std::string& member : members) {
    if (!member.empty() && member != options_.host && seen.insert(member).second) {
      hosts.push_back(member);
    }
  }
  const std::string job = apps_->JobOf(key);
  // A tree needs two hosts; one host is planned too when later gets may
  // join this batch, for the rates that place them.
  const bool tree_size = model_bytes >= options_.get_tree_min_bytes;
  const size_t min_hosts = options_.get_late_joins > 0 ? 1 : 2;
  double min_late_bps = 0;
  bool late_joins_help = true;  // unless the plan says the server is not the bottleneck
  if (hosts.size() >= min_hosts && tree_size && !job.empty()) {
    v1::PlanDistributionRequest ask;
    ask.set_host(options_.host);
    ask.set_job(job);
    ask.set_server(server);
    ask.set_model_bytes(model_bytes);
    for (const std::string& host : hosts) ask.add_requesters(host);
    v1::PlanDistributionReply plan;
    absl::Status planned = scheduler_->PlanDistribution(ask, &plan);
    if (planned.ok() && plan.routes_size() != static_cast<int>(hosts.size())) {
      planned = absl::InternalError(absl::StrCat("the plan has ", plan.routes_size(),
                                                 " routes for ", hosts.size(), " requesters"));
    }
    if (planned.ok()) {
      std::map<std::string, GetBatcher::Route> by_host;
      for (const v1::DistributionRoute& r : plan.routes()) {
        GetBatcher::Route& route = by_host[r.host()];
        // Only a requester of this batch may forward it, and not to itself.
        if (!r.via_host().empty() && r.via_host() != r.host() && seen.count(r.via_host()) > 0) {
          route.via_host = r.via_host();
          route.via_address = r.via_address();
        }
        route.rate_bps = r.rate_bps();
        route.uplink_bps = r.uplink_bps();
        route.children = r.children();
      }
      // A late get goes below a requester only where its copy would come
      // at least this fast (get_late_join_min_share of the server's own).
      min_late_bps = options_.get_late_join_min_share * plan.copy_bps();
      // Where the requesters' own links, not the server's uplink, slow its
      // copies (N3), another copy from here costs the others little, and
      // forwarding would take a requester's uplink its next push needs.
      // (Plans without rates, store_forward, do not say.)
      late_joins_help = plan.copy_bps() <= 0 || plan.server_bound();
      for (size_t i = 0; i < members.size(); ++i) {
        if (auto it = by_host.find(members[i]); it != by_host.end()) routes[i] = it->second;
      }
      MLF_LOG(DEBUG) << "model batch " << batch << " of server '" << server << "' (job " << job_id
                     << "): " << hosts.size() << " hosts, " << plan.server_copies()
                     << " copies from here, the rest through distributors";
    } else {
      MLF_LOG(WARNING) << "model batch " << batch << " of server '" << server
                       << "': no distribution tree (" << RpcErrorText(planned)
                       << "); every get is answered from here";
    }
  }
  // Gets that come while this batch's copies leave join its tree as leaves
  // (at most get_late_joins below each member).
  const int late_joins =
      tree_size && late_joins_help ? static_cast<int>(options_.get_late_joins) : 0;
  MutexLock lock(&mu_);
  gets_.SetRoutes(batch, std::move(routes), late_joins, min_late_bps);
  cv_.SignalAll();
}

}  // namespace mlfabric::daemon
