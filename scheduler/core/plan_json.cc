#include "scheduler/core/plan_json.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlfabric::core {

namespace {

using Json = nlohmann::ordered_json;

absl::Status Error(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckObject(const Json& json, const std::string& field,
                         std::initializer_list<const char*> known) {
  if (!json.is_object()) return Error(field, "must be an object");
  for (auto it = json.begin(); it != json.end(); ++it) {
    bool found = false;
    for (const char* key : known) found = found || it.key() == key;
    if (!found) {
      return Error(field.empty() ? it.key() : absl::StrCat(field, ".", it.key()),
                   "unknown key (check its spelling against docs/architecture.md §4)");
    }
  }
  return absl::OkStatus();
}

std::string Join(const std::string& field, const char* key) {
  return field.empty() ? key : absl::StrCat(field, ".", key);
}

absl::StatusOr<double> GetNumber(const Json& json, const std::string& field) {
  if (!json.is_number()) return Error(field, "must be a number");
  const double value = json.get<double>();
  if (!std::isfinite(value)) return Error(field, "must be finite");
  return value;
}

absl::StatusOr<int64_t> GetInteger(const Json& json, const std::string& field) {
  if (json.is_number_integer()) {
    if (json.is_number_unsigned() &&
        json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(field, "integer out of range");
    }
    return json.get<int64_t>();
  }
  if (json.is_number_float()) {
    const double value = json.get<double>();
    if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 9.0e15) {
      return static_cast<int64_t>(value);
    }
  }
  return Error(field, "must be an integer");
}

absl::StatusOr<std::string> GetString(const Json& json, const std::string& field) {
  if (!json.is_string()) return Error(field, "must be a string");
  return json.get<std::string>();
}

absl::StatusOr<std::vector<std::string>> GetStrings(const Json& json, const std::string& field) {
  if (!json.is_array()) return Error(field, "must be an array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < json.size(); ++i) {
    ASSIGN_OR_RETURN(std::string s, GetString(json[i], absl::StrCat(field, "[", i, "]")));
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<double>> GetNumbers(const Json& json, const std::string& field) {
  if (!json.is_array()) return Error(field, "must be an array of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < json.size(); ++i) {
    ASSIGN_OR_RETURN(double v, GetNumber(json[i], absl::StrCat(field, "[", i, "]")));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<ProfilePoint>> GetProfile(const Json& json, const std::string& field) {
  if (!json.is_array()) return Error(field, "must be an array of [time_s, rate_bps] pairs");
  std::vector<ProfilePoint> out;
  for (size_t i = 0; i < json.size(); ++i) {
    const std::string point = absl::StrCat(field, "[", i, "]");
    if (!json[i].is_array() || json[i].size() != 2) {
      return Error(point, "must be a [time_s, rate_bps] pair");
    }
    ASSIGN_OR_RETURN(double t, GetNumber(json[i][0], point + "[0]"));
    ASSIGN_OR_RETURN(double r, GetNumber(json[i][1], point + "[1]"));
    if (r < 0) return Error(point + "[1]", "rate must be >= 0");
    out.push_back({t, r});
  }
  return out;
}

// Reads an optional key: absent or null leaves `*out` untouched.
template <typename T, typename F>
absl::Status Optional(const Json& obj, const char* key, const std::string& field, F parse, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(*out, parse(*it, Join(field, key)));
  return absl::OkStatus();
}

template <typename T, typename F>
absl::Status Required(const Json& obj, const char* key, const std::string& field, F parse, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Error(Join(field, key), "missing");
  ASSIGN_OR_RETURN(*out, parse(*it, Join(field, key)));
  return absl::OkStatus();
}

absl::StatusOr<HostLink> ParseHost(const Json& json, const std::string& field) {
  RETURN_IF_ERROR(CheckObject(json, field,
                              {"name", "uplink_bps", "downlink_bps", "uplink_profile",
                               "downlink_profile"}));
  HostLink host;
  RETURN_IF_ERROR(Required(json, "name", field, GetString, &host.name));
  RETURN_IF_ERROR(Optional(json, "uplink_bps", field, GetNumber, &host.uplink_bps));
  RETURN_IF_ERROR(Optional(json, "downlink_bps", field, GetNumber, &host.downlink_bps));
  RETURN_IF_ERROR(Optional(json, "uplink_profile", field, GetProfile, &host.uplink_profile));
  RETURN_IF_ERROR(Optional(json, "downlink_profile", field, GetProfile, &host.downlink_profile));
  for (const char* key : {"uplink", "downlink"}) {
    const bool has_constant = json.contains(absl::StrCat(key, "_bps"));
    const bool has_profile = json.contains(absl::StrCat(key, "_profile"));
    if (!has_constant && !has_profile) {
      return Error(absl::StrCat(field, ".", key, "_bps"), "missing (or give a profile)");
    }
  }
  return host;
}

absl::StatusOr<UpdateRequest> ParseUpdate(const Json& json, const std::string& field) {
  RETURN_IF_ERROR(
      CheckObject(json, field, {"id", "worker", "bytes", "version", "norm", "shards", "tensors"}));
  UpdateRequest u;
  RETURN_IF_ERROR(Required(json, "id", field, GetString, &u.id));
  RETURN_IF_ERROR(Required(json, "worker", field, GetString, &u.worker));
  auto positive = [](const Json& j, const std::string& f) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> v = GetInteger(j, f);
    if (!v.ok() || *v <= 0) return Error(f, "must be a positive integer");
    return v;
  };
  RETURN_IF_ERROR(Required(json, "bytes", field, positive, &u.bytes));
  RETURN_IF_ERROR(Required(json, "version", field, GetInteger, &u.version));
  RETURN_IF_ERROR(Optional(json, "norm", field, GetNumber, &u.norm));
  if (u.norm < 0) return Error(Join(field, "norm"), "must be >= 0");
  auto it = json.find("shards");
  if (it != json.end() && !it->is_null()) {
    const std::string shards = Join(field, "shards");
    if (!it->is_array()) return Error(shards, "must be an array");
    for (size_t j = 0; j < it->size(); ++j) {
      const std::string shard_field = absl::StrCat(shards, "[", j, "]");
      const Json& s = (*it)[j];
      RETURN_IF_ERROR(CheckObject(s, shard_field, {"server", "bytes"}));
      ShardPart part;
      RETURN_IF_ERROR(Required(s, "server", shard_field, GetString, &part.server));
      RETURN_IF_ERROR(Required(s, "bytes", shard_field, positive, &part.bytes));
      u.shards.push_back(std::move(part));
    }
  }
  return u;
}

absl::StatusOr<ReplicaSpec> ParseReplica(const Json& json, const std::string& field) {
  RETURN_IF_ERROR(CheckObject(json, field,
                              {"host", "aggregators", "divergence_bound", "momentum",
                               "history_norm", "lead", "pending"}));
  ReplicaSpec r;
  RETURN_IF_ERROR(Required(json, "host", field, GetString, &r.host));
  RETURN_IF_ERROR(Optional(json, "aggregators", field, GetStrings, &r.aggregators));
  RETURN_IF_ERROR(Required(json, "divergence_bound", field, GetNumber, &r.divergence_bound));
  if (r.divergence_bound < 0) return Error(Join(field, "divergence_bound"), "must be >= 0");
  RETURN_IF_ERROR(Optional(json, "momentum", field, GetNumber, &r.momentum));
  if (r.momentum < 0 || r.momentum >= 1) return Error(Join(field, "momentum"), "must be in [0, 1)");
  RETURN_IF_ERROR(Optional(json, "history_norm", field, GetNumber, &r.history_norm));
  if (r.history_norm < 0) return Error(Join(field, "history_norm"), "must be >= 0");
  RETURN_IF_ERROR(Optional(json, "lead", field, GetNumbers, &r.lead));
  for (size_t i = 0; i < r.lead.size(); ++i) {
    if (r.lead[i] < 0) return Error(absl::StrCat(field, ".lead[", i, "]"), "must be >= 0");
  }
  auto pending = json.find("pending");
  if (pending != json.end() && !pending->is_null()) {
    const std::string list = Join(field, "pending");
    if (!pending->is_array()) return Error(list, "must be an array");
    for (size_t i = 0; i < pending->size(); ++i) {
      const std::string item = absl::StrCat(list, "[", i, "]");
      const Json& p = (*pending)[i];
      RETURN_IF_ERROR(CheckObject(p, item, {"id", "worker", "bytes", "norm", "version"}));
      UpdateRequest u;
      RETURN_IF_ERROR(Required(p, "id", item, GetString, &u.id));
      RETURN_IF_ERROR(Required(p, "worker", item, GetString, &u.worker));
      RETURN_IF_ERROR(Required(p, "bytes", item, GetInteger, &u.bytes));
      if (u.bytes <= 0) return Error(Join(item, "bytes"), "must be a positive integer");
      RETURN_IF_ERROR(Optional(p, "norm", item, GetNumber, &u.norm));
      if (u.norm < 0) return Error(Join(item, "norm"), "must be >= 0");
      RETURN_IF_ERROR(Optional(p, "version", item, GetInteger, &u.version));
      r.pending.push_back(std::move(u));
    }
  }
  return r;
}

template <typename T, typename F>
absl::Status ParseArray(const Json& obj, const char* key, bool required, F parse,
                        std::vector<T>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    return required ? Error(key, "missing") : absl::OkStatus();
  }
  if (!it->is_array()) return Error(key, "must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    ASSIGN_OR_RETURN(T value, parse((*it)[i], absl::StrCat(key, "[", i, "]")));
    out->push_back(std::move(value));
  }
  return absl::OkStatus();
}

absl::StatusOr<TopologyLink> ParseLink(const Json& json, const std::string& field) {
  RETURN_IF_ERROR(CheckObject(json, field, {"name", "bps", "profile"}));
  TopologyLink link;
  RETURN_IF_ERROR(Required(json, "name", field, GetString, &link.name));
  RETURN_IF_ERROR(Optional(json, "bps", field, GetNumber, &link.bps));
  RETURN_IF_ERROR(Optional(json, "profile", field, GetProfile, &link.profile));
  return link;
}

absl::StatusOr<FixedPath> ParsePath(const Json& json, const std::string& field) {
  RETURN_IF_ERROR(CheckObject(json, field, {"src", "dst", "links"}));
  FixedPath path;
  RETURN_IF_ERROR(Required(json, "src", field, GetString, &path.src));
  RETURN_IF_ERROR(Required(json, "dst", field, GetString, &path.dst));
  RETURN_IF_ERROR(Required(json, "links", field, GetStrings, &path.links));
  return path;
}

Json Profile(const std::vector<ProfilePoint>& profile) {
  Json out = Json::array();
  for (const auto& [t, r] : profile) out.push_back({t, r});
  return out;
}

Json CommitsJson(const std::vector<Commit>& commits) {
  Json out = Json::array();
  for (const Commit& c : commits) {
    out.push_back({{"update", c.update}, {"at_s", c.at_s}, {"position", c.position}});
  }
  return out;
}

}  // namespace

absl::StatusOr<Batch> BatchFromJson(const Json& json) {
  if (!json.is_object()) return Error("input", "must be a JSON object (one batch)");
  Batch batch;
  RETURN_IF_ERROR(Optional(json, "now_s", "", GetNumber, &batch.now_s));
  std::string mode = "async";
  RETURN_IF_ERROR(Optional(json, "mode", "", GetString, &mode));
  if (mode == "async") {
    batch.mode = Mode::kAsync;
  } else if (mode == "sync") {
    batch.mode = Mode::kSync;
  } else {
    return Error("mode", absl::StrCat("must be \"async\" or \"sync\", got \"", mode, "\""));
  }
  if (batch.mode == Mode::kAsync) {
    RETURN_IF_ERROR(Required(json, "tau_max", "", GetInteger, &batch.tau_max));
    RETURN_IF_ERROR(Required(json, "v_init", "", GetInteger, &batch.v_init));
  } else {
    RETURN_IF_ERROR(Optional(json, "tau_max", "", GetInteger, &batch.tau_max));
    RETURN_IF_ERROR(Optional(json, "v_init", "", GetInteger, &batch.v_init));
  }
  if (batch.tau_max < 0) return Error("tau_max", "must be >= 0");
  RETURN_IF_ERROR(Required(json, "server", "", GetString, &batch.server));
  RETURN_IF_ERROR(Optional(json, "aggregators", "", GetStrings, &batch.aggregators));
  auto replica = json.find("replica");
  if (replica != json.end() && !replica->is_null()) {
    ASSIGN_OR_RETURN(batch.replica, ParseReplica(*replica, "replica"));
  }
  RETURN_IF_ERROR(ParseArray(json, "hosts", true, ParseHost, &batch.hosts));
  RETURN_IF_ERROR(ParseArray(json, "updates", true, ParseUpdate, &batch.updates));
  RETURN_IF_ERROR(ParseArray(json, "links", false, ParseLink, &batch.links));
  RETURN_IF_ERROR(ParseArray(json, "paths", false, ParsePath, &batch.paths));
  auto seed = json.find("seed");
  if (seed != json.end() && !seed->is_null()) {
    if (!seed->is_number_unsigned()) return Error("seed", "must be a non-negative integer");
    batch.seed = seed->get<uint64_t>();
  }
  std::string aggregation = "streaming";
  RETURN_IF_ERROR(Optional(json, "aggregation", "", GetString, &aggregation));
  if (aggregation != "streaming" && aggregation != "alg3") {
    return Error("aggregation",
                 absl::StrCat("must be \"streaming\" or \"alg3\", got \"", aggregation, "\""));
  }
  batch.streaming_aggregation = aggregation == "streaming";
  return batch;
}

absl::StatusOr<Batch> BatchFromJsonText(const std::string& text) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Error("input", absl::StrCat("not valid JSON: ", e.what()));
  }
  return BatchFromJson(json);
}

Json BatchToJson(const Batch& batch) {
  Json out;
  out["now_s"] = batch.now_s;
  out["mode"] = batch.mode == Mode::kSync ? "sync" : "async";
  out["tau_max"] = batch.tau_max;
  out["v_init"] = batch.v_init;
  out["server"] = batch.server;
  out["aggregators"] = batch.aggregators;
  if (batch.replica.has_value()) {
    const ReplicaSpec& r = *batch.replica;
    out["replica"] = {{"host", r.host},
                      {"aggregators", r.aggregators},
                      {"divergence_bound", r.divergence_bound},
                      {"momentum", r.momentum},
                      {"history_norm", r.history_norm},
                      {"lead", r.lead}};
    if (!r.pending.empty()) {
      Json pending = Json::array();
      for (const UpdateRequest& u : r.pending) {
        pending.push_back({{"id", u.id}, {"worker", u.worker}, {"bytes", u.bytes},
                           {"norm", u.norm}, {"version", u.version}});
      }
      out["replica"]["pending"] = std::move(pending);
    }
  } else {
    out["replica"] = nullptr;
  }
  out["hosts"] = Json::array();
  for (const HostLink& h : batch.hosts) {
    Json host = {{"name", h.name}, {"uplink_bps", h.uplink_bps}, {"downlink_bps", h.downlink_bps}};
    if (!h.uplink_profile.empty()) host["uplink_profile"] = Profile(h.uplink_profile);
    if (!h.downlink_profile.empty()) host["downlink_profile"] = Profile(h.downlink_profile);
    out["hosts"].push_back(std::move(host));
  }
  out["updates"] = Json::array();
  for (const UpdateRequest& u : batch.updates) {
    Json update = {{"id", u.id},
                   {"worker", u.worker},
                   {"bytes", u.bytes},
                   {"version", u.version},
                   {"norm", u.norm}};
    if (!u.shards.empty()) {
      update["shards"] = Json::array();
      for (const ShardPart& s : u.shards) {
        update["shards"].push_back({{"server", s.server}, {"bytes", s.bytes}});
      }
    }
    out["updates"].push_back(std::move(update));
  }
  if (!batch.links.empty()) {
    out["links"] = Json::array();
    for (const TopologyLink& l : batch.links) {
      Json link = {{"name", l.name}, {"bps", l.bps}};
      if (!l.profile.empty()) link["profile"] = Profile(l.profile);
      out["links"].push_back(std::move(link));
    }
  }
  if (!batch.paths.empty()) {
    out["paths"] = Json::array();
    for (const FixedPath& p : batch.paths) {
      out["paths"].push_back({{"src", p.src}, {"dst", p.dst}, {"links", p.links}});
    }
  }
  out["seed"] = batch.seed;
  if (!batch.streaming_aggregation) out["aggregation"] = "alg3";
  return out;
}

Json PlanToJson(const Plan& plan) {
  Json out;
  out["order"] = plan.order;
  out["dropped"] = Json::array();
  for (const Drop& d : plan.dropped) out["dropped"].push_back({{"id", d.id}, {"reason", d.reason}});
  out["transfers"] = Json::array();
  for (const Transfer& t : plan.transfers) {
    Json transfer;
    transfer["update"] = t.update;
    transfer["src"] = t.src;
    transfer["dst"] = t.dst;
    transfer["kind"] = TransferKindName(t.kind);
    transfer["start_s"] = t.start_s;
    transfer["end_s"] = t.end_s;
    Json segments = Json::array();
    for (const RateSegment& s : t.segments) segments.push_back({s.from_s, s.to_s, s.rate_bps});
    transfer["segments"] = std::move(segments);
    transfer["bytes"] = t.bytes;
    if (!t.constituents.empty()) transfer["constituents"] = t.constituents;
    if (!t.into.empty()) transfer["into"] = t.into;
    out["transfers"].push_back(std::move(transfer));
  }
  out["commits"] = CommitsJson(plan.commits);
  out["replica_commits"] = CommitsJson(plan.replica_commits);
  out["punted"] = plan.punted;
  out["stats"] = {{"compute_ms", plan.compute_ms},
                  {"aggregation_split", plan.aggregation_split},
                  {"replica_divergence", plan.replica_divergence}};
  return out;
}

}  // namespace mlfabric::core
