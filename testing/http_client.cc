#include "testing/http_client.h"

#include <chrono>

#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace mlfabric::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

constexpr std::chrono::seconds kTimeout{10};

// Connects to 127.0.0.1:port, lets `send` write the request, reads one
// response. Any failure (refused, timeout, unparsable) leaves status 0.
template <typename Send>
HttpResult Exchange(int port, Send send) {
  HttpResult result;
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(kTimeout);
  beast::error_code error;
  stream.connect(tcp::endpoint(asio::ip::address_v4::loopback(), static_cast<uint16_t>(port)),
                 error);
  if (error) return result;
  send(stream, error);
  if (error) return result;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(stream, buffer, response, error);
  if (error && error != http::error::end_of_stream) return result;
  result.status = static_cast<int>(response.result_int());
  result.body = std::move(response.body());
  stream.socket().shutdown(tcp::socket::shutdown_both, error);
  return result;
}

}  // namespace

HttpResult RawHttp(int port, const std::string& raw) {
  return Exchange(port, [&](beast::tcp_stream& stream, beast::error_code& error) {
    asio::write(stream, asio::buffer(raw), error);
  });
}

HttpResult Http(int port, const std::string& method, const std::string& target,
                const std::string& body, const std::string& authorization) {
  return Exchange(port, [&](beast::tcp_stream& stream, beast::error_code& error) {
    http::request<http::string_body> request;
    request.method_string(method);
    request.target(target);
    request.version(11);
    request.set(http::field::host, "127.0.0.1");
    request.set(http::field::connection, "close");
    if (!authorization.empty()) request.set(http::field::authorization, authorization);
    if (!body.empty() || method == "POST") {
      request.set(http::field::content_type, "application/json");
      request.body() = body;
      request.prepare_payload();
    }
    http::write(stream, request, error);
  });
}

}  // namespace mlfabric::testing
