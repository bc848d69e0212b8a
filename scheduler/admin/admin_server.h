// AdminServer: serves an AdminHandler over HTTP/1.1 with Boost.Beast on one
// background I/O thread (the scheduler's "admin" event loop).
//
//   AdminServer server(&handler);
//   absl::StatusOr<int> port = server.Start("127.0.0.1", 0);  // 0 = free port
//   ...
//   server.Stop();
//
// With UseTls (before Start) it serves HTTPS only: a TLS handshake that
// fails within 10 s closes that connection.
// Each connection may send several keep-alive requests; a request must
// arrive within 10 s and its body be at most 1 MiB. A request Beast cannot
// parse gets "400 Bad Request" and the connection is closed; the server
// keeps serving everyone else.
// Thread safety: Start/Stop from one thread; the handler is called on the
// I/O thread.
#ifndef MLFABRIC_SCHEDULER_ADMIN_ADMIN_SERVER_H_
#define MLFABRIC_SCHEDULER_ADMIN_ADMIN_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "scheduler/admin/admin_handler.h"

namespace mlfabric::admin {

class AdminServer {
 public:
  explicit AdminServer(const AdminHandler* handler);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Serve HTTPS with this certificate chain and key (PEM text).
  // InvalidArgument when either cannot be used.
  absl::Status UseTls(const std::string& cert_pem, const std::string& key_pem);
  // Binds and starts serving; returns the bound port.
  absl::StatusOr<int> Start(const std::string& address, int port);
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlfabric::admin

#endif  // MLFABRIC_SCHEDULER_ADMIN_ADMIN_SERVER_H_
