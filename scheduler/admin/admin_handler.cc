#include "scheduler/admin/admin_handler.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "scheduler/admin/dashboard.h"
#include "scheduler/admin/views.h"

namespace mlfabric::admin {
namespace {

using nlohmann::json;

HttpResponse Json(int status, const json& body) {
  // Names and paths come from clients and may not be UTF-8: replace bad
  // bytes rather than throw (found by admin_handler_fuzzer).
  return {status, "application/json",
          body.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"};
}

HttpResponse Error(int status, const std::string& message) {
  return Json(status, {{"error", message}});
}

// Constant-time comparison, so the token cannot be guessed byte by byte
// from response times.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

int StatusToHttp(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kInvalidArgument: return 400;
    default: return 500;
  }
}

size_t QueryLimit(const std::string& query, size_t fallback) {
  const std::string key = "limit=";
  size_t at = query.find(key);
  if (at == std::string::npos) return fallback;
  const long value = std::strtol(query.c_str() + at + key.size(), nullptr, 10);
  return value > 0 ? static_cast<size_t>(value) : fallback;
}

}  // namespace

AdminHandler::AdminHandler(AdminBackend* backend, AdminHandlerOptions options)
    : backend_(backend), options_(std::move(options)) {}

HttpResponse AdminHandler::Handle(const HttpRequest& request) const {
  const size_t question = request.target.find('?');
  const std::string path = request.target.substr(0, question);
  const std::string query =
      question == std::string::npos ? "" : request.target.substr(question + 1);
  if (path.empty() || path[0] != '/') return Error(400, "request target must be an absolute path");
  if (request.method == "GET" || request.method == "HEAD") return Get(path, query, request);
  if (request.method == "POST") return Post(path, request);
  return Error(405, absl::StrCat("method ", request.method,
                                 " not allowed: use GET to read, POST to change"));
}

std::optional<HttpResponse> AdminHandler::Refuse(const HttpRequest& request,
                                                 const char* what) const {
  if (options_.token.empty()) {
    return Error(403, absl::StrCat("admin ", what,
                                   " are disabled: the scheduler has no admin_token configured"));
  }
  const std::string prefix = "Bearer ";
  if (request.authorization.rfind(prefix, 0) != 0 ||
      !SameSecret(request.authorization.substr(prefix.size()), options_.token)) {
    return Error(401, "missing or wrong bearer token: send 'Authorization: Bearer <admin_token>'");
  }
  return std::nullopt;
}

HttpResponse AdminHandler::Get(const std::string& path, const std::string& query,
                               const HttpRequest& request) const {
  if (path == "/" || path == "/dashboard") return {200, "text/html; charset=utf-8", DashboardHtml()};
  if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (options_.read_auth) {
    if (std::optional<HttpResponse> refused = Refuse(request, "reads")) return *refused;
  }
  // The cycles without the rest: polled while the scheduler is under load
  // (mlfabric-loadgen), and a full snapshot holds the service's lock.
  if (path == "/api/v1/cycles") return Json(200, CyclesJson(backend_->CyclesSnapshot()));
  const ClusterSnapshot snap = backend_->Snapshot();
  if (path == "/metrics") {
    return {200, "text/plain; version=0.0.4; charset=utf-8", RenderPrometheus(snap)};
  }
  if (path == "/api/v1/trace" || path == "/trace.json") return Json(200, ChromeTrace(snap));
  if (path == "/api/v1" || path == "/api/v1/") {
    return Json(200, {{"endpoints",
                       {"/api/v1/cluster", "/api/v1/hosts", "/api/v1/jobs", "/api/v1/batches",
                        "/api/v1/transfers", "/api/v1/drops", "/api/v1/delays", "/api/v1/links",
                        "/api/v1/cycles", "/api/v1/trace", "/metrics", "/dashboard"}}});
  }
  if (path == "/api/v1/cluster") return Json(200, ClusterJson(snap));
  if (path == "/api/v1/hosts") return Json(200, HostsJson(snap));
  if (path == "/api/v1/jobs") return Json(200, JobsJson(snap));
  if (path == "/api/v1/batches") return Json(200, BatchesJson(snap, QueryLimit(query, 16)));
  if (path == "/api/v1/transfers") return Json(200, TransfersJson(snap));
  if (path == "/api/v1/drops") return Json(200, DropsJson(snap));
  if (path == "/api/v1/delays") return Json(200, DelaysJson(snap));
  if (path == "/api/v1/links") return Json(200, LinksJson(snap));
  return Error(404, absl::StrCat("no such resource '", path, "'; GET /api/v1 lists them"));
}

HttpResponse AdminHandler::Post(const std::string& path, const HttpRequest& request) const {
  if (std::optional<HttpResponse> refused = Refuse(request, "changes")) return *refused;
  json body = json::object();
  if (!request.body.empty()) {
    body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      return Error(400, "request body must be a JSON object");
    }
  }
  const std::string jobs = "/api/v1/jobs/";
  if (path.rfind(jobs, 0) == 0 && path.size() > jobs.size() &&
      path.find('/', jobs.size()) == std::string::npos) {
    const std::string job = path.substr(jobs.size());
    ConfigReader reader(body, "request body");
    JobParamsUpdate update;
    int64_t i = 0;
    double d = 0;
    auto read_int = [&](const char* key, std::optional<int64_t>* out, int64_t lo, int64_t hi) {
      if (!body.contains(key)) return;
      reader.Int(key, &i, lo, hi);
      *out = i;
    };
    auto read_double = [&](const char* key, std::optional<double>* out, double lo, double hi) {
      if (!body.contains(key)) return;
      reader.Double(key, &d, lo, hi);
      *out = d;
    };
    read_int("tau_max", &update.tau_max, 0, 1000000);
    read_int("staleness_k", &update.staleness_k, 0, 1000000);
    read_double("divergence_max", &update.divergence_max, 0, 1e12);
    read_double("momentum", &update.momentum, 0, 0.999999);
    read_int("priority_class", &update.priority_class, 0, 7);
    if (absl::Status s = reader.Finish(); !s.ok()) return Error(400, std::string(s.message()));
    if (absl::Status s = backend_->UpdateJobParams(job, update); !s.ok()) {
      return Error(StatusToHttp(s), std::string(s.message()));
    }
    return Json(200, JobsJson(backend_->Snapshot()));
  }
  const std::string hosts = "/api/v1/hosts/", drain = "/drain";
  if (path.rfind(hosts, 0) == 0 && path.size() > hosts.size() + drain.size() &&
      path.compare(path.size() - drain.size(), drain.size(), drain) == 0) {
    const std::string host = path.substr(hosts.size(), path.size() - hosts.size() - drain.size());
    ConfigReader reader(body, "request body");
    bool on = true;
    reader.Bool("drain", &on);
    if (absl::Status s = reader.Finish(); !s.ok()) return Error(400, std::string(s.message()));
    if (absl::Status s = backend_->DrainHost(host, on); !s.ok()) {
      return Error(StatusToHttp(s), std::string(s.message()));
    }
    return Json(200, {{"host", host}, {"draining", on}});
  }
  return Error(404, absl::StrCat("no such action '", path,
                                 "'; POST /api/v1/jobs/<job> or /api/v1/hosts/<host>/drain"));
}

}  // namespace mlfabric::admin
