#include "testing/http_client.h"

#include <chrono>

#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace mlfabric::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

constexpr std::chrono::seconds kTimeout{10};

// Reads one response from `stream` into a result; status 0 on any error,
// including end_of_stream: the server closed before any byte of a response
// (a default-constructed response would read as 200).
template <typename Stream>
HttpResult ReadResponse(Stream& stream) {
  HttpResult result;
  beast::error_code error;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(stream, buffer, response, error);
  if (error) return result;
  result.status = static_cast<int>(response.result_int());
  result.body = std::move(response.body());
  return result;
}

http::request<http::string_body> Request(const std::string& method, const std::string& target,
                                         const std::string& body,
                                         const std::string& authorization) {
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
  return request;
}

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
  result = ReadResponse(stream);
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
    http::write(stream, Request(method, target, body, authorization), error);
  });
}

HttpResult Https(int port, const std::string& ca_file, const std::string& method,
                 const std::string& target, const std::string& authorization) {
  HttpResult result;
  asio::io_context io;
  asio::ssl::context tls(asio::ssl::context::tls_client);
  beast::error_code error;
  tls.load_verify_file(ca_file, error);
  if (error) return result;
  tls.set_verify_mode(asio::ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(io, tls);
  // The scheduler's certificate from tools/make-certs names 127.0.0.1.
  SSL_set1_host(stream.native_handle(), "127.0.0.1");
  beast::get_lowest_layer(stream).expires_after(kTimeout);
  beast::get_lowest_layer(stream).connect(
      tcp::endpoint(asio::ip::address_v4::loopback(), static_cast<uint16_t>(port)), error);
  if (error) return result;
  stream.handshake(asio::ssl::stream_base::client, error);
  if (error) return result;
  http::write(stream, Request(method, target, "", authorization), error);
  if (error) return result;
  return ReadResponse(stream);
}

}  // namespace mlfabric::testing
