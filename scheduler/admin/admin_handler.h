// AdminHandler: the admin endpoint's routes (scheduler/admin/README.md),
// independent of the HTTP library: a parsed request in, a response out.
// AdminServer feeds it from Boost.Beast; tests call it directly.
//
//   AdminHandler handler(&backend, {.token = "s3cret"});
//   HttpResponse r = handler.Handle({"GET", "/api/v1/hosts", "", ""});
//
// GETs are open to anyone who can reach the socket (it binds to 127.0.0.1
// unless configured otherwise), or with `read_auth` need the same bearer
// token (all but the dashboard's page, which holds no data, and /healthz).
// POSTs need `Authorization: Bearer <token>` and are refused outright when
// no token is configured.
// Thread safety: Handle may be called concurrently (the backend must allow it).
#ifndef MLFABRIC_SCHEDULER_ADMIN_ADMIN_HANDLER_H_
#define MLFABRIC_SCHEDULER_ADMIN_ADMIN_HANDLER_H_

#include <optional>
#include <string>

#include "scheduler/admin/admin_backend.h"

namespace mlfabric::admin {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path plus optional "?query"
  std::string authorization;  // value of the Authorization header
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

struct AdminHandlerOptions {
  std::string token;  // empty: every POST is refused
  bool read_auth = false;  // GETs need the token too (with none: refused)
};

class AdminHandler {
 public:
  AdminHandler(AdminBackend* backend, AdminHandlerOptions options);
  HttpResponse Handle(const HttpRequest& request) const;

 private:
  HttpResponse Get(const std::string& path, const std::string& query,
                   const HttpRequest& request) const;
  HttpResponse Post(const std::string& path, const HttpRequest& request) const;
  // Empty if `request` carries the token, else the refusal.
  std::optional<HttpResponse> Refuse(const HttpRequest& request, const char* what) const;

  AdminBackend* backend_;
  AdminHandlerOptions options_;
};

}  // namespace mlfabric::admin

#endif  // MLFABRIC_SCHEDULER_ADMIN_ADMIN_HANDLER_H_
