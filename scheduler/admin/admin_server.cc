#include "scheduler/admin/admin_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>

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
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const AdminHandler* handler)
      : stream_(std::move(socket)), handler_(handler) {}

  void Read() {
    parser_.emplace();
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(kRequestTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset) {
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
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](beast::error_code ec, size_t) {
                        if (ec || !response->keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
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
      if (!ec) std::make_shared<Session>(std::move(socket), handler)->Read();
      Accept();
    });
  }

  const AdminHandler* handler;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::thread thread;
};

AdminServer::AdminServer(const AdminHandler* handler) : impl_(std::make_unique<Impl>(handler)) {}

AdminServer::~AdminServer() { Stop(); }

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
