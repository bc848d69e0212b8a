#include "scheduler/admin/views.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace mlfabric::admin {
namespace {

using nlohmann::json;

json SegmentsJson(const std::vector<core::RateSegment>& segments) {
  json out = json::array();
  for (const core::RateSegment& s : segments) out.push_back({s.from_s, s.to_s, s.rate_bps});
  return out;
}

json TransferJson(const TransferView& t) {
  return {{"transfer_id", t.transfer_id}, {"batch_id", t.batch_id}, {"job", t.job},
          {"server", t.server},           {"src", t.src},           {"dst", t.dst},
          {"bytes", t.bytes},             {"start_s", t.start_s},   {"end_s", t.end_s},
          {"deadline_s", t.deadline_s},   {"segments", SegmentsJson(t.segments)}};
}

json StatsJson(const SchedulerStats& s) {
  return {{"batches", s.batches},
          {"planned", s.planned},
          {"applied", s.applied},
          {"dropped", s.dropped},
          {"failed", s.failed},
          {"rejected", s.rejected},
          {"timed_out", s.timed_out},
          {"aggregates", s.aggregates},
          {"chain_hops", s.chain_hops},
          {"replica_copies", s.replica_copies},
          {"replica_aggregates", s.replica_aggregates},
          {"replica_bytes", s.replica_bytes},
          {"replica_updates", s.replica_updates},
          {"bandwidth_reports", s.bandwidth_reports},
          {"in_doubt_applied", s.in_doubt_applied},
          {"in_doubt_failed", s.in_doubt_failed},
          {"held_sources_recopied", s.held_sources_recopied},
          {"replica_bound_waits", s.replica_bound_waits},
          {"round_grants", s.round_grants},
          {"granted_pushes", s.granted_pushes},
          {"outcome_contradicted", s.outcome_contradicted},
          {"outcome_queries", s.outcome_queries},
          {"plan_ms_total", s.plan_ms_total},
          {"plan_ms_max", s.plan_ms_max}};
}

json BatchJson(const BatchView& b) {
  json network = json::array();
  for (const core::HostLink& h : b.network) {
    json profile_up = json::array(), profile_down = json::array();
    for (const auto& [t, r] : h.uplink_profile) profile_up.push_back({t, r});
    for (const auto& [t, r] : h.downlink_profile) profile_down.push_back({t, r});
    network.push_back({{"host", h.name},
                       {"uplink_bps", h.uplink_bps},
                       {"downlink_bps", h.downlink_bps},
                       {"uplink_profile", profile_up},
                       {"downlink_profile", profile_down}});
  }
  json transfers = json::array();
  for (const TransferView& t : b.transfers) transfers.push_back(TransferJson(t));
  json drops = json::array();
  for (const core::Drop& d : b.drops) drops.push_back({{"update", d.id}, {"reason", d.reason}});
  json out = {{"id", b.id},
              {"job", b.job},
              {"server", b.server},
              {"server_host", b.server_host},
              {"planned_at_s", b.planned_at_s},
              {"compute_ms", b.compute_ms},
              {"planning_thread", b.worker_thread},
              {"updates", b.updates},
              {"scheduled", b.scheduled},
              {"dropped", b.dropped},
              {"network", network},
              {"transfers", transfers},
              {"drops", drops}};
  if (!b.error.empty()) out["error"] = b.error;
  return out;
}

// Prometheus label values escape backslash, double quote and newline.
std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

class PromWriter {
 public:
  void Family(const std::string& name, const std::string& type, const std::string& help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels,
              double value) {
    out_ << name;
    if (!labels.empty()) {
      out_ << "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        out_ << (i ? "," : "") << labels[i].first << "=\"" << Escape(labels[i].second) << "\"";
      }
      out_ << "}";
    }
    out_ << " " << Number(value) << "\n";
  }
  std::string Text() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

json ClusterJson(const ClusterSnapshot& snap) {
  int alive = 0;
  for (const HostView& h : snap.hosts) alive += h.alive;
  return {{"now_s", snap.now_s},
          {"uptime_s", snap.now_s - snap.started_s},
          {"planner", snap.planner},
          {"batch_interval_ms", snap.batch_interval_ms},
          {"planner_threads", snap.planner_threads},
          {"hosts", snap.hosts.size()},
          {"hosts_alive", alive},
          {"jobs", snap.jobs.size()},
          {"in_flight", snap.in_flight.size()},
          {"stats", StatsJson(snap.stats)}};
}

json HostsJson(const ClusterSnapshot& snap) {
  json hosts = json::array();
  for (const HostView& h : snap.hosts) {
    hosts.push_back({{"name", h.name},
                     {"data_address", h.data_address},
                     {"alive", h.alive},
                     {"draining", h.draining},
                     {"capacity_up_bps", h.capacity_up_bps},
                     {"capacity_down_bps", h.capacity_down_bps},
                     {"reported_up_bps", h.reported_up_bps},
                     {"reported_down_bps", h.reported_down_bps},
                     {"reserved_up_bps", h.reserved_up_bps},
                     {"reserved_down_bps", h.reserved_down_bps},
                     {"available_up_bps", h.available_up_bps},
                     {"available_down_bps", h.available_down_bps},
                     {"last_report_s", h.last_report_s},
                     {"report_age_s", h.last_report_s < 0 ? json(nullptr)
                                                          : json(snap.now_s - h.last_report_s)},
                     {"reports", h.reports}});
  }
  return {{"now_s", snap.now_s}, {"hosts", hosts}};
}

json JobsJson(const ClusterSnapshot& snap) {
  json jobs = json::array();
  for (const JobView& j : snap.jobs) {
    json servers = json::array();
    for (const ServerView& s : j.servers) {
      json replica = nullptr;
      if (!s.replica_host.empty()) {
        replica = {{"host", s.replica_host},
                   {"applied", s.replica_applied},
                   {"lag_updates", s.replica_lag},
                   {"divergence_estimate", s.divergence_estimate}};
      }
      servers.push_back({{"name", s.name},
                         {"host", s.host},
                         {"model_version", s.model_version},
                         {"pending", s.pending},
                         {"in_flight", s.in_flight},
                         {"shards", s.shards},
                         {"group", s.group.empty() ? json(nullptr) : json(s.group)},
                         {"replica", replica}});
    }
    json workers = json::array();
    for (const WorkerTiming& w : j.workers) {
      workers.push_back({{"name", w.worker},
                         {"iterations", w.iterations},
                         {"iteration_s", w.iteration_s},
                         {"transfer_s", w.transfer_s},
                         {"compute_s", w.compute_s},
                         {"slowdown", w.slowdown},
                         {"straggler", w.straggler}});
    }
    json ssp_waiting = json::array();
    for (const JobView::SspWait& w : j.ssp_waiting) {
      ssp_waiting.push_back({{"worker", w.worker},
                             {"clock", w.clock},
                             {"slowest_clock", w.slowest_clock},
                             {"slowest_worker", w.slowest_worker},
                             {"waiting_s", snap.now_s - w.since_s}});
    }
    json failovers = json::array();
    for (const FailoverView& f : j.failovers) {
      failovers.push_back({{"server", f.server},
                           {"from_host", f.from_host},
                           {"to_host", f.to_host},
                           {"reason", f.reason},
                           {"at_s", f.at_s},
                           {"model_version", f.model_version},
                           {"in_flight_applied", f.in_flight_applied},
                           {"in_flight_failed", f.in_flight_failed},
                           {"in_flight_awaiting", f.in_flight_awaiting},
                           {"catch_up_copies", f.catch_up_copies},
                           {"lost_updates", f.lost_updates},
                           {"lost_norm", f.lost_norm}});
    }
    json membership_changes = json::array();
    for (const MembershipChange& c : j.membership_changes) {
      membership_changes.push_back({{"at_s", c.at_s},
                                    {"worker", c.worker},
                                    {"event", c.joined ? "joined" : "left"},
                                    {"reason", c.reason},
                                    {"generation", c.generation}});
    }
    jobs.push_back({{"name", j.params.name},
                    {"id", j.id},
                    {"mode", JobModeName(j.params.mode)},
                    {"tau_max", j.params.tau_max},
                    {"staleness_k", j.params.staleness_k},
                    {"backup_workers", j.params.backup_workers},
                    {"divergence_max", j.params.divergence_max},
                    {"momentum", j.params.momentum},
                    {"priority_class", j.params.priority_class},
                    {"applied", j.applied},
                    {"dropped", j.dropped},
                    {"failed", j.failed},
                    {"servers", servers},
                    {"workers", workers},
                    {"ssp_waiting", ssp_waiting},
                    {"ssp_waits", j.ssp_waits},
                    {"ssp_wait_timeouts", j.ssp_wait_timeouts},
                    {"failovers", failovers},
                    {"member_loss", MemberLossName(j.params.member_loss)},
                    {"members", j.members.size()},
                    {"member_names", j.members},
                    {"generation", j.generation},
                    {"membership_changes", membership_changes}});
  }
  return {{"now_s", snap.now_s}, {"jobs", jobs}};
}

json BatchesJson(const ClusterSnapshot& snap, size_t limit) {
  json recent = json::array();
  const size_t n = snap.recent_batches.size();
  for (size_t i = n > limit ? n - limit : 0; i < n; ++i) {
    recent.push_back(BatchJson(snap.recent_batches[i]));
  }
  json current = n ? BatchJson(snap.recent_batches.back()) : json(nullptr);
  return {{"now_s", snap.now_s}, {"current", current}, {"recent", recent}};
}

json TransfersJson(const ClusterSnapshot& snap) {
  json in_flight = json::array();
  for (const TransferView& t : snap.in_flight) in_flight.push_back(TransferJson(t));
  json recent = json::array();
  for (const BatchView& b : snap.recent_batches) {
    for (const TransferView& t : b.transfers) recent.push_back(TransferJson(t));
  }
  return {{"now_s", snap.now_s}, {"in_flight", in_flight}, {"recent", recent}};
}

json DropsJson(const ClusterSnapshot& snap) {
  json recent = json::array();
  for (const DropView& d : snap.recent_drops) {
    recent.push_back({{"transfer_id", d.transfer_id},
                      {"job", d.job},
                      {"server", d.server},
                      {"src", d.src},
                      {"outcome", d.outcome},
                      {"category", d.category},
                      {"reason", d.reason},
                      {"at_s", d.at_s}});
  }
  return {{"now_s", snap.now_s}, {"by_reason", snap.drops_by_category}, {"recent", recent}};
}

json DelaysJson(const ClusterSnapshot& snap) {
  json recent = json::array();
  for (const DelayView& d : snap.recent_delays) {
    recent.push_back({{"transfer_id", d.transfer_id},
                      {"job", d.job},
                      {"server", d.server},
                      {"src", d.src},
                      {"delay", d.delay},
                      {"latency_s", d.latency_s},
                      {"queued_s", d.queued_s},
                      {"planned_s", d.planned_s},
                      {"late_s", d.late_s},
                      {"at_s", d.at_s}});
  }
  // Where an applied push's time went, mean over all of a job's planned
  // pushes: waiting for its batch, the plan until its bytes reach the
  // server, and the commit's report later than planned.
  json phases = json::object();
  for (const auto& [job, p] : snap.push_phases) {
    const double n = std::max<int64_t>(1, p.count);
    phases[job] = {{"applied", p.count},
                   {"latency_s", p.latency_s / n},
                   {"queued_s", p.queued_s / n},
                   {"planned_s", p.planned_s / n},
                   {"late_s", p.late_s / n}};
  }
  const DelayHistogram& h = snap.delay_histogram;
  return {{"now_s", snap.now_s},
          {"histogram",
           {{"bounds", h.bounds}, {"counts", h.counts}, {"total", h.total}, {"sum", h.sum}}},
          {"push_phases", phases},
          {"recent", recent}};
}

json LinksJson(const ClusterSnapshot& snap) {
  json samples = json::array();
  for (const LinkSample& s : snap.link_samples) {
    json links = json::array();
    for (const LinkSample::Use& u : s.links) {
      links.push_back({{"host", u.host},
                       {"up_reserved_bps", u.up_reserved_bps},
                       {"down_reserved_bps", u.down_reserved_bps},
                       {"up_reported_bps", u.up_reported_bps},
                       {"down_reported_bps", u.down_reported_bps}});
    }
    samples.push_back({{"at_s", s.at_s}, {"links", links}});
  }
  return {{"now_s", snap.now_s}, {"samples", samples}};
}

namespace {

// The q-quantile (nearest rank) of the recent cycles' total time; 0 if none.
double CycleQuantileMs(const ClusterSnapshot& snap, double q) {
  if (snap.recent_cycles.empty()) return 0;
  std::vector<double> ms;
  for (const CycleView& c : snap.recent_cycles) ms.push_back(c.total_ms);
  const size_t rank = std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()));
  std::nth_element(ms.begin(), ms.begin() + rank, ms.end());
  return ms[rank];
}

}  // namespace

json CyclesJson(const ClusterSnapshot& snap) {
  json cycles = json::array();
  double max_ms = 0;
  for (const CycleView& c : snap.recent_cycles) {
    cycles.push_back({{"start_s", c.start_s},
                      {"total_ms", c.total_ms},
                      {"lock_wait_ms", c.lock_wait_ms},
                      {"cut_ms", c.cut_ms},
                      {"plan_ms", c.plan_ms},
                      {"dispatch_ms", c.dispatch_ms},
                      {"lead_ms", c.lead_ms},
                      {"batches", c.batches},
                      {"updates", c.updates}});
    max_ms = std::max(max_ms, c.total_ms);
  }
  return {{"now_s", snap.now_s},
          {"batch_interval_ms", snap.batch_interval_ms},
          {"p50_ms", CycleQuantileMs(snap, 0.5)},
          {"p99_ms", CycleQuantileMs(snap, 0.99)},
          {"max_ms", max_ms},
          {"cycles", cycles}};
}

namespace {

// The scheduler's own families: uptime, cycles, and what became of updates
// and of the transfers that carry them.
void WriteUpdateMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  const SchedulerStats& s = snap.stats;
  w->Family("mlfabric_scheduler_uptime_seconds", "gauge", "Seconds since the scheduler started.");
  w->Sample("mlfabric_scheduler_uptime_seconds", {}, snap.now_s - snap.started_s);
  w->Family("mlfabric_scheduler_batch_cycles_total", "counter",
            "Batching cycles that planned at least one server.");
  w->Sample("mlfabric_scheduler_batch_cycles_total", {}, s.batches);
  w->Family("mlfabric_scheduler_updates_total", "counter", "Pushed updates by how they ended.");
  for (const auto& [outcome, n] : std::vector<std::pair<std::string, int64_t>>{
           {"planned", s.planned}, {"applied", s.applied}, {"dropped", s.dropped},
           {"failed", s.failed}, {"rejected", s.rejected}}) {
    w->Sample("mlfabric_scheduler_updates_total", {{"outcome", outcome}}, n);
  }
  w->Family("mlfabric_scheduler_timed_out_total", "counter",
            "In-flight transfers failed for missing their deadline.");
  w->Sample("mlfabric_scheduler_timed_out_total", {}, s.timed_out);
  w->Family("mlfabric_scheduler_aggregates_total", "counter",
            "In-network aggregates dispatched to aggregator daemons (section 5.2).");
  w->Sample("mlfabric_scheduler_aggregates_total", {}, s.aggregates);
  w->Family("mlfabric_scheduler_chain_hops_total", "counter",
            "Partial sums streamed from one aggregator to the next (streaming chains).");
  w->Sample("mlfabric_scheduler_chain_hops_total", {}, s.chain_hops);
}

// Replica copies (§5.3), bandwidth reports, and what a restarted scheduler
// settled or was asked about pushes of its predecessor.
void WriteReplicaAndRecoveryMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  const SchedulerStats& s = snap.stats;
  w->Family("mlfabric_scheduler_replica_copies_total", "counter",
            "Replica transfers dispatched to keep hot standbys within bound (section 5.3).");
  w->Sample("mlfabric_scheduler_replica_copies_total", {}, s.replica_copies);
  w->Family("mlfabric_scheduler_replica_aggregates_total", "counter",
            "Replica transfers that are sums of punted copies made at an aggregator.");
  w->Sample("mlfabric_scheduler_replica_aggregates_total", {}, s.replica_aggregates);
  w->Family("mlfabric_scheduler_replica_bytes_total", "counter",
            "Bytes of the replica transfers dispatched to replicas' hosts.");
  w->Sample("mlfabric_scheduler_replica_bytes_total", {}, s.replica_bytes);
  w->Family("mlfabric_scheduler_replica_updates_total", "counter",
            "Updates the replica transfers carry (an aggregate carries several).");
  w->Sample("mlfabric_scheduler_replica_updates_total", {}, s.replica_updates);
  w->Family("mlfabric_scheduler_bandwidth_reports_total", "counter",
            "ReportBandwidth calls accepted.");
  w->Sample("mlfabric_scheduler_bandwidth_reports_total", {}, s.bandwidth_reports);
  w->Family("mlfabric_scheduler_in_doubt_pushes_total", "counter",
            "Pushes in flight when a scheduler died, ended by this one, by outcome.");
  w->Sample("mlfabric_scheduler_in_doubt_pushes_total", {{"outcome", "applied"}},
            s.in_doubt_applied);
  w->Sample("mlfabric_scheduler_in_doubt_pushes_total", {{"outcome", "failed"}}, s.in_doubt_failed);
  w->Family("mlfabric_scheduler_held_copies_recopied_total", "counter",
            "Punted replica copies held at their sources across a scheduler restart, "
            "planned again.");
  w->Sample("mlfabric_scheduler_held_copies_recopied_total", {}, s.held_sources_recopied);
  w->Family("mlfabric_scheduler_replica_bound_waits_total", "counter",
            "Pushes held back from a batch until the replica caught up (replica_bound strict).");
  w->Sample("mlfabric_scheduler_replica_bound_waits_total", {}, s.replica_bound_waits);
  w->Family("mlfabric_scheduler_granted_pushes_total", "counter",
            "Round members sent on the previous round's plan (a grant), not planned again.");
  w->Sample("mlfabric_scheduler_granted_pushes_total", {}, s.granted_pushes);
  w->Family("mlfabric_scheduler_outcome_queries_total", "counter",
            "QueryOutcomes calls: applications that lost their daemon asking how pushes ended.");
  w->Sample("mlfabric_scheduler_outcome_queries_total", {}, s.outcome_queries);
  w->Family("mlfabric_scheduler_outcomes_contradicted_total", "counter",
            "Pushes a server applied after they were reported dropped or failed (should be 0).");
  w->Sample("mlfabric_scheduler_outcomes_contradicted_total", {}, s.outcome_contradicted);
}

// Planner and batch-cycle time, and the transfers in flight.
void WritePlanTimingMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  const SchedulerStats& s = snap.stats;
  w->Family("mlfabric_scheduler_plan_seconds_total", "counter", "Planner compute time, summed.");
  w->Sample("mlfabric_scheduler_plan_seconds_total", {}, s.plan_ms_total / 1e3);
  w->Family("mlfabric_scheduler_plan_seconds_max", "gauge", "Longest single batch plan.");
  w->Sample("mlfabric_scheduler_plan_seconds_max", {}, s.plan_ms_max / 1e3);
  w->Family("mlfabric_scheduler_batch_cycle_seconds", "gauge",
            "Batch cycle time over the recent cycles that planned something, by quantile.");
  w->Sample("mlfabric_scheduler_batch_cycle_seconds", {{"quantile", "0.5"}},
            CycleQuantileMs(snap, 0.5) / 1e3);
  w->Sample("mlfabric_scheduler_batch_cycle_seconds", {{"quantile", "0.99"}},
            CycleQuantileMs(snap, 0.99) / 1e3);
  w->Family("mlfabric_scheduler_in_flight_transfers", "gauge", "Transfers scheduled, not done.");
  w->Sample("mlfabric_scheduler_in_flight_transfers", {}, snap.in_flight.size());
}

// Per host: liveness, draining, report age, and each link's rates.
void WriteHostMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  w->Family("mlfabric_host_up", "gauge", "1 if the host's daemon is registered and streaming.");
  for (const HostView& h : snap.hosts) w->Sample("mlfabric_host_up", {{"host", h.name}}, h.alive);
  w->Family("mlfabric_host_draining", "gauge", "1 if an operator drained the host.");
  for (const HostView& h : snap.hosts) {
    w->Sample("mlfabric_host_draining", {{"host", h.name}}, h.draining);
  }
  w->Family("mlfabric_host_report_age_seconds", "gauge",
            "Seconds since the host's last bandwidth report (absent if none).");
  for (const HostView& h : snap.hosts) {
    if (h.last_report_s >= 0) {
      w->Sample("mlfabric_host_report_age_seconds", {{"host", h.name}},
                snap.now_s - h.last_report_s);
    }
  }
  struct LinkMetric {
    const char* name;
    const char* help;
    double HostView::*up;
    double HostView::*down;
  };
  const LinkMetric link_metrics[] = {
      {"mlfabric_link_capacity_bps", "Configured NIC capacity.", &HostView::capacity_up_bps,
       &HostView::capacity_down_bps},
      {"mlfabric_link_reported_bps", "Latest available bandwidth reported by the monitor.",
       &HostView::reported_up_bps, &HostView::reported_down_bps},
      {"mlfabric_link_reserved_bps", "Rate reserved by in-flight transfers now.",
       &HostView::reserved_up_bps, &HostView::reserved_down_bps},
      {"mlfabric_link_available_bps", "Reported minus reserved: the planner's view now.",
       &HostView::available_up_bps, &HostView::available_down_bps},
  };
  for (const LinkMetric& m : link_metrics) {
    w->Family(m.name, "gauge", m.help);
    for (const HostView& h : snap.hosts) {
      w->Sample(m.name, {{"host", h.name}, {"direction", "up"}}, h.*(m.up));
      w->Sample(m.name, {{"host", h.name}, {"direction", "down"}}, h.*(m.down));
    }
  }
}

// Per job and server: model versions, queues, replica lag, failovers, the
// delay bound and pushes by outcome.
void WriteJobMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  w->Family("mlfabric_job_model_version", "gauge", "Model version at each server.");
  for (const JobView& j : snap.jobs) {
    for (const ServerView& sv : j.servers) {
      w->Sample("mlfabric_job_model_version", {{"job", j.params.name}, {"server", sv.name}},
                sv.model_version);
    }
  }
  w->Family("mlfabric_job_pending_updates", "gauge", "Updates waiting for the next batch.");
  for (const JobView& j : snap.jobs) {
    for (const ServerView& sv : j.servers) {
      w->Sample("mlfabric_job_pending_updates", {{"job", j.params.name}, {"server", sv.name}},
                sv.pending);
    }
  }
  w->Family("mlfabric_replica_lag_updates", "gauge",
            "Updates a server applied that its hot-standby replica has not yet (§5.3).");
  for (const JobView& j : snap.jobs) {
    for (const ServerView& sv : j.servers) {
      if (sv.replica_host.empty()) continue;
      w->Sample("mlfabric_replica_lag_updates", {{"job", j.params.name}, {"server", sv.name}},
                sv.replica_lag);
    }
  }
  w->Family("mlfabric_replica_divergence_estimate", "gauge",
            "The planner's bound on ||w_server - w_replica||: the sum of the lagging updates' "
            "norms (§5.3).");
  for (const JobView& j : snap.jobs) {
    for (const ServerView& sv : j.servers) {
      if (sv.replica_host.empty()) continue;
      w->Sample("mlfabric_replica_divergence_estimate",
                {{"job", j.params.name}, {"server", sv.name}}, sv.divergence_estimate);
    }
  }
  w->Family("mlfabric_failovers_total", "counter",
            "Servers of the job whose replica took over (mlfabric.md §3.3).");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_failovers_total", {{"job", j.params.name}},
              static_cast<int64_t>(j.failovers.size()));
  }
  w->Family("mlfabric_failover_lost_updates_total", "counter",
            "Updates a failed server had applied that never reached the replica that took over.");
  for (const JobView& j : snap.jobs) {
    int64_t lost = 0;
    for (const FailoverView& f : j.failovers) lost += f.lost_updates;
    w->Sample("mlfabric_failover_lost_updates_total", {{"job", j.params.name}}, lost);
  }
  w->Family("mlfabric_job_members", "gauge", "A job's live workers (its membership).");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_members", {{"job", j.params.name}},
              static_cast<double>(j.members.size()));
  }
  w->Family("mlfabric_job_membership_generation", "gauge",
            "A job's membership generation: 1, plus one per worker joining or leaving.");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_membership_generation", {{"job", j.params.name}},
              static_cast<double>(j.generation));
  }
  w->Family("mlfabric_job_tau_max", "gauge", "The job's delay bound.");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_tau_max", {{"job", j.params.name}}, j.params.tau_max);
  }
  w->Family("mlfabric_job_updates_total", "counter", "A job's pushes by outcome.");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_updates_total", {{"job", j.params.name}, {"outcome", "applied"}},
              j.applied);
    w->Sample("mlfabric_job_updates_total", {{"job", j.params.name}, {"outcome", "dropped"}},
              j.dropped);
    w->Sample("mlfabric_job_updates_total", {{"job", j.params.name}, {"outcome", "failed"}},
              j.failed);
  }
}

// Per worker: iteration clock and stragglers; ssp jobs' waiting gets.
void WriteWorkerMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  w->Family("mlfabric_worker_iterations_total", "counter",
            "A worker's pushes to its job: its iteration clock.");
  for (const JobView& j : snap.jobs) {
    for (const WorkerTiming& wt : j.workers) {
      w->Sample("mlfabric_worker_iterations_total", {{"job", j.params.name}, {"worker", wt.worker}},
                wt.iterations);
    }
  }
  w->Family("mlfabric_worker_iteration_seconds", "gauge",
            "Median time between a worker's consecutive pushes.");
  for (const JobView& j : snap.jobs) {
    for (const WorkerTiming& wt : j.workers) {
      w->Sample("mlfabric_worker_iteration_seconds",
                {{"job", j.params.name}, {"worker", wt.worker}}, wt.iteration_s);
    }
  }
  w->Family("mlfabric_worker_straggler", "gauge",
            "1 when the worker is slower than straggler_factor x its job's median.");
  for (const JobView& j : snap.jobs) {
    for (const WorkerTiming& wt : j.workers) {
      w->Sample("mlfabric_worker_straggler", {{"job", j.params.name}, {"worker", wt.worker}},
                wt.straggler ? 1 : 0);
    }
  }
  w->Family("mlfabric_job_ssp_waiting", "gauge",
            "ssp jobs: workers waiting at a get for the slowest worker.");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_ssp_waiting", {{"job", j.params.name}},
              static_cast<int64_t>(j.ssp_waiting.size()));
  }
  w->Family("mlfabric_job_ssp_waits_total", "counter",
            "ssp jobs: gets that waited for the slowest worker (timed_out: gave up).");
  for (const JobView& j : snap.jobs) {
    w->Sample("mlfabric_job_ssp_waits_total", {{"job", j.params.name}, {"result", "caught_up"}},
              j.ssp_waits - j.ssp_wait_timeouts);
    w->Sample("mlfabric_job_ssp_waits_total", {{"job", j.params.name}, {"result", "timed_out"}},
              j.ssp_wait_timeouts);
  }
}

// Drops by reason, the staleness histogram, push phases and the latest
// batches' compute time.
void WriteDropAndDelayMetrics(const ClusterSnapshot& snap, PromWriter* w) {
  w->Family("mlfabric_drops_total", "counter", "Pushes dropped or failed, by reason.");
  for (const auto& [reason, n] : snap.drops_by_category) {
    w->Sample("mlfabric_drops_total", {{"reason", reason}}, n);
  }
  w->Family("mlfabric_update_delay", "histogram",
            "Staleness of applied updates: updates applied since the one computed on.");
  const DelayHistogram& h = snap.delay_histogram;
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    w->Sample("mlfabric_update_delay_bucket", {{"le", Number(h.bounds[i])}}, cumulative);
  }
  w->Sample("mlfabric_update_delay_bucket", {{"le", "+Inf"}}, h.total);
  w->Sample("mlfabric_update_delay_sum", {}, h.sum);
  w->Sample("mlfabric_update_delay_count", {}, h.total);
  w->Family("mlfabric_push_phase_seconds_total", "counter",
            "Applied, planned pushes: seconds waiting for the batch (queued), from the plan to "
            "the bytes' planned arrival at the server (planned), and the commit's report later "
            "than planned (late).");
  for (const auto& [job, p] : snap.push_phases) {
    w->Sample("mlfabric_push_phase_seconds_total", {{"job", job}, {"phase", "queued"}}, p.queued_s);
    w->Sample("mlfabric_push_phase_seconds_total", {{"job", job}, {"phase", "planned"}},
              p.planned_s);
    w->Sample("mlfabric_push_phase_seconds_total", {{"job", job}, {"phase", "late"}}, p.late_s);
  }
  w->Family("mlfabric_push_phase_pushes_total", "counter",
            "Applied, planned pushes counted in mlfabric_push_phase_seconds_total.");
  for (const auto& [job, p] : snap.push_phases) {
    w->Sample("mlfabric_push_phase_pushes_total", {{"job", job}}, p.count);
  }
  if (!snap.recent_batches.empty()) {
    w->Family("mlfabric_last_batch_compute_seconds", "gauge",
              "Planner compute time of the most recent batch of each server.");
    std::map<std::pair<std::string, std::string>, double> last;
    for (const BatchView& b : snap.recent_batches) last[{b.job, b.server}] = b.compute_ms / 1e3;
    for (const auto& [key, seconds] : last) {
      w->Sample("mlfabric_last_batch_compute_seconds", {{"job", key.first}, {"server", key.second}},
                seconds);
    }
  }
}

}  // namespace

std::string RenderPrometheus(const ClusterSnapshot& snap) {
  PromWriter w;
  WriteUpdateMetrics(snap, &w);
  WriteReplicaAndRecoveryMetrics(snap, &w);
  WritePlanTimingMetrics(snap, &w);
  WriteHostMetrics(snap, &w);
  WriteJobMetrics(snap, &w);
  WriteWorkerMetrics(snap, &w);
  WriteDropAndDelayMetrics(snap, &w);
  return w.Text();
}

json ChromeTrace(const ClusterSnapshot& snap) {
  json events = json::array();
  constexpr int kUplinks = 1, kDownlinks = 2;
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kUplinks}, {"tid", 0},
                    {"args", {{"name", "uplinks"}}}});
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kDownlinks}, {"tid", 0},
                    {"args", {{"name", "downlinks"}}}});
  std::map<std::string, int> tids;
  auto tid_of = [&](const std::string& host) {
    auto [it, inserted] = tids.emplace(host, static_cast<int>(tids.size()) + 1);
    if (inserted) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", kUplinks},
                        {"tid", it->second}, {"args", {{"name", host + " uplink"}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", kDownlinks},
                        {"tid", it->second}, {"args", {{"name", host + " downlink"}}}});
    }
    return it->second;
  };
  for (const HostView& h : snap.hosts) tid_of(h.name);
  auto micros = [&](double t_s) { return (t_s - snap.started_s) * 1e6; };
  for (const BatchView& b : snap.recent_batches) {
    for (const TransferView& t : b.transfers) {
      const std::string name =
          "t" + std::to_string(t.transfer_id) + " " + t.src + "->" + t.dst;
      double rate = 0;
      for (const core::RateSegment& s : t.segments) rate = std::max(rate, s.rate_bps);
      json args = {{"job", t.job},         {"server", t.server}, {"bytes", t.bytes},
                   {"batch", t.batch_id},  {"peak_rate_bps", rate},
                   {"start_s", t.start_s}, {"end_s", t.end_s}};
      for (auto [pid, host] : {std::pair<int, std::string>{kUplinks, t.src},
                               std::pair<int, std::string>{kDownlinks, t.dst}}) {
        events.push_back({{"ph", "X"},
                          {"name", name},
                          {"cat", t.job},
                          {"pid", pid},
                          {"tid", tid_of(host)},
                          {"ts", micros(t.start_s)},
                          {"dur", std::max(0.0, (t.end_s - t.start_s) * 1e6)},
                          {"args", args}});
      }
    }
    events.push_back({{"ph", "i"}, {"s", "g"}, {"name", "batch " + std::to_string(b.id)},
                      {"pid", kUplinks}, {"tid", 0}, {"ts", micros(b.planned_at_s)},
                      {"args", {{"job", b.job}, {"server", b.server},
                                {"compute_ms", b.compute_ms}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"},
          {"otherData", {{"source", "mlfabric-scheduler"}, {"planner", snap.planner}}}};
}

}  // namespace mlfabric::admin
