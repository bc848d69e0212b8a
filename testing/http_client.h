// A small blocking HTTP/1.1 client on Boost.Beast for tests of the admin
// endpoint: one request per connection to 127.0.0.1:port, a 10 s bound on
// the whole exchange, and a raw mode that sends arbitrary bytes (to send
// malformed requests on purpose) and still parses the response with Beast.
//
//   HttpResult r = Http(port, "GET", "/api/v1/cluster");
//   HttpResult bad = RawHttp(port, "GARBAGE\r\n\r\n");   // r.status == 400
//
// status is 0 when there was no parsable response (refused, timed out,
// closed early). Thread safety: stateless; call from any thread.
#ifndef MLFABRIC_TESTING_HTTP_CLIENT_H_
#define MLFABRIC_TESTING_HTTP_CLIENT_H_

#include <string>

namespace mlfabric::testing {

struct HttpResult {
  int status = 0;  // 0 = no response
  std::string body;
};

// Sends `raw` as is, then reads one response.
HttpResult RawHttp(int port, const std::string& raw);

// A well-formed request; `body` goes as application/json, `authorization`
// (e.g. "Bearer t") as the Authorization header when not empty.
HttpResult Http(int port, const std::string& method, const std::string& target,
                const std::string& body = "", const std::string& authorization = "");

// The same over HTTPS, verifying the server's certificate against the CA in
// `ca_file` (PEM) for the name 127.0.0.1; status 0 also when the TLS
// handshake or the verification fails.
HttpResult Https(int port, const std::string& ca_file, const std::string& method,
                 const std::string& target, const std::string& authorization = "");

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTING_HTTP_CLIENT_H_
