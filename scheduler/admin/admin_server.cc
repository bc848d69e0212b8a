#include "scheduler/admin/admin_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::admin {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::chrono::seconds kRequestTimeout(10);
constexpr uint64_t kMaxBodyBytes = 1 << 20;

// One connection: read a request, answer it, repeat while keep-alive.
// `Stream` is beast::tcp_stream (HTTP) or an ssl_stream over it (HTTPS).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(tcp::socket socket, const AdminHandler* handler)
      : stream_(std::move(socket)), handler_(handler) {}
  Session(tcp::socket socket, asio::ssl::context& tls, const AdminHandler* handler)
      : stream_(std::move(socket), tls), handler_(handler) {}

  // HTTPS: the TLS handshake first (bounded like a request), then Read().
  void Start() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      Read();
    } else {
      beast::get_lowest_layer(stream_).expires_after(kRequestTimeout);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  MLF_LOG(DEBUG) << "admin: TLS handshake failed: " << ec.message();
                                  beast::get_lowest_layer(self->stream_).close();
                                  return;
                                }
                                self->Read();
                              });
    }
  }

  void Read() {
    parser_.emplace();
    parser_->body_limit(kMaxBodyBytes);
    beast::get_lowest_layer(stream_).expires_after(kRequestTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::ssl::error::stream_truncated) {
      Close();
      return;
    }
    if (ec) {
      // Unparseable request: say so and hang up.
      auto response = std::make_shared<http::response<http::string_body>>(
          ec == http::error::body_limit ? http::status::payload_too_large
                                        : http::status::bad_request,
          11);
      response->set(http::field::content_type, "application/json");
      response->body() = "{\"error\": \"malformed HTTP request: " + ec.message() + "\"}\n";
      response->keep_alive(false);
      response->prepare_payload();
      Write(response);
      return;
    }
    const auto& request = parser_->get();
    HttpRequest in;
    in.method = std::string(request.method_string());
    in.target = std::string(request.target());
    in.authorization = std::string(request[http::field::authorization]);
    in.body = request.body();
    HttpResponse out = handler_->Handle(in);
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(out.status), request.version());
    response->set(http::field::server, "mlfabric-scheduler");
    response->set(http::field::content_type, out.content_type);
    response->set(http::field::cache_control, "no-store");
    response->keep_alive(request.keep_alive());
    if (request.method() != http::verb::head) response->body() = std::move(out.body);
    response->prepare_payload();
    Write(response);
  }

  void Write(std::shared_ptr<http::response<http::string_body>> response) {
    beast::get_lowest_layer(stream_).expires_after(kRequestTimeout);
    http::async_write(stream_, *response,
                      [self = this->shared_from_this(), response](beast::error_code ec, size_t) {
                        if (ec || !response->keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
    beast::get_lowest_layer(stream_).close();
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const AdminHandler* handler_;
};

}  // namespace

struct AdminServer::Impl {
  explicit Impl(const AdminHandler* h) : handler(h), acceptor(io) {}

  void Accept() {
    acceptor.async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        if (tls.has_value()) {
          std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(std::move(socket), *tls,
                                                                          handler)
              ->Start();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(std::move(socket), handler)->Start();
        }
      }
      Accept();
    });
  }

  const AdminHandler* handler;
  std::optional<asio::ssl::context> tls;  // HTTPS when set
  asio::io_context io;
  tcp::acceptor acceptor;
  std::thread thread;
};

AdminServer::AdminServer(const AdminHandler* handler) : impl_(std::make_unique<Impl>(handler)) {}

AdminServer::~AdminServer() { Stop(); }

absl::Status AdminServer::UseTls(const std::string& cert_pem, const std::string& key_pem) {
  asio::ssl::context tls(asio::ssl::context::tls_server);
  tls.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                  asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                  asio::ssl::context::no_tlsv1_1);
  beast::error_code ec;
  tls.use_certificate_chain(asio::buffer(cert_pem), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin HTTPS: the certificate is not usable: ", ec.message()));
  }
  tls.use_private_key(asio::buffer(key_pem), asio::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin HTTPS: the key is not usable: ", ec.message()));
  }
  impl_->tls.emplace(std::move(tls));
  return absl::OkStatus();
}

absl::StatusOr<int> AdminServer::Start(const std::string& address, int port) {
  beast::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin_address: '", address, "' is not an IP address (", ec.message(), ")"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("admin_port: cannot listen on ", address, ":", port,
                                               ": ", ec.message(),
                                               " (pass --admin_port=0 to pick a free port)"));
  }
  const int bound = acceptor.local_endpoint().port();
  impl_->Accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
  return bound;
}

void AdminServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->io.stop();
  impl_->thread.join();
}

}  // namespace mlfabric::admin
