// A tiny blocking HTTP/1.1 client for the admin endpoint's cross-process
// tests: one request per connection, raw bytes allowed (to send malformed
// requests on purpose). Test-only; not a general client.
#ifndef MLFABRIC_TESTS_ADMIN_HTTP_H_
#define MLFABRIC_TESTS_ADMIN_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace mlfabric::testing {

struct HttpResult {
  int status = 0;  // 0 = no response
  std::string body;
};

// Sends `raw` to 127.0.0.1:port and reads until the server closes.
inline HttpResult RawHttp(int port, const std::string& raw) {
  HttpResult result;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return result;
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return result;
  }
  size_t sent = 0;
  while (sent < raw.size()) {
    const ssize_t n = ::send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  if (response.rfind("HTTP/1.1 ", 0) != 0) return result;
  result.status = std::atoi(response.c_str() + 9);
  const size_t body = response.find("\r\n\r\n");
  if (body != std::string::npos) result.body = response.substr(body + 4);
  return result;
}

inline HttpResult Http(int port, const std::string& method, const std::string& target,
                       const std::string& body = "", const std::string& authorization = "") {
  std::string raw = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!authorization.empty()) raw += "Authorization: " + authorization + "\r\n";
  if (!body.empty() || method == "POST") {
    raw += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n";
  }
  raw += "\r\n" + body;
  return RawHttp(port, raw);
}

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTS_ADMIN_HTTP_H_
