// mlfabric-scheduler: the central scheduler (docs/architecture.md §2). Serves the
// control-plane gRPC API to daemons and plans pushed updates every
// batch_interval_ms; with --admin_port >= 0 it also serves the admin web
// endpoint (scheduler/admin/README.md). Run with --help for the flags.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/logging.h"
#include "scheduler/admin/admin_backend.h"
#include "scheduler/admin/admin_handler.h"
#include "scheduler/admin/admin_server.h"
#include "scheduler/core/planner_factory.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/grpc_service.h"
#include "scheduler/service/scheduler_service.h"

namespace {

// Signal handlers can only reach a global; it is the process's one stop flag.
std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// A PEM file's text; the error names the config key and the path.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in || text.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        std::string(key) + ": " + path + " is not a readable PEM file");
  }
  return text;
}

void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

// The command line and config, or the exit status when the process ends
// here (--help, or a usage or config error, already reported).
std::optional<int> LoadConfig(int argc, char** argv, mlfabric::SchedulerConfig* config) {
  auto cl = mlfabric::ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabric-scheduler: " << cl.status().message() << "\n";
    return 2;
  }
  if (cl->help) {
    std::cout << mlfabric::SchedulerConfigHelp();
    return 0;
  }
  if (!cl->positional.empty()) {
    std::cerr << "mlfabric-scheduler: unexpected argument '" << cl->positional[0] << "'\n";
    return 2;
  }
  auto loaded = mlfabric::LoadSchedulerConfig(*cl);
  if (!loaded.ok()) {
    std::cerr << "mlfabric-scheduler: " << loaded.status().message() << "\n";
    return 2;
  }
  *config = std::move(*loaded);
  return std::nullopt;
}

// The gRPC server's credentials: plaintext, TLS, or with a client CA mutual
// TLS, where a daemon must present a certificate the CA signed (its common
// name is checked at RegisterHost).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcCredentials(
    const mlfabric::SchedulerConfig& config) {
  if (config.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(
      config.tls_client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  auto cert = ReadPem(config.tls_cert_file, "tls_cert_file");
  auto key = ReadPem(config.tls_key_file, "tls_key_file");
  auto ca = config.tls_client_ca_file.empty()
                ? absl::StatusOr<std::string>("")
                : ReadPem(config.tls_client_ca_file, "tls_client_ca_file");
  for (const auto* file : {&cert, &key, &ca}) {
    if (!file->ok()) return file->status();
  }
  tls.pem_root_certs = *ca;
  tls.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(tls);
}

// Keepalive both ways (docs/architecture.md §3a): the daemons ping every keepalive_s
// too, so their pings must not count as abuse.
void SetKeepalive(double keepalive_s, grpc::ServerBuilder* builder) {
  const int keepalive_ms = static_cast<int>(keepalive_s * 1000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              std::max(1, keepalive_ms / 2));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // gRPC stops pinging after two pings without data sent (its default):
  // a schedule stream idle for a while would then never notice its host cut
  // off. Keep pinging, so that a silent partition is found within 2 x
  // keepalive_s whenever it comes.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

// Starts the admin endpoint when admin_port >= 0 (over HTTPS with the
// scheduler's certificate when admin_https). Returns 0, or the exit status
// after reporting why it could not start.
int StartAdminEndpoint(const mlfabric::SchedulerConfig& config,
                       mlfabric::admin::AdminServer* admin_server) {
  if (config.admin_port >= 0 && config.admin_https) {
    auto cert = ReadPem(config.tls_cert_file, "tls_cert_file");
    auto key = ReadPem(config.tls_key_file, "tls_key_file");
    absl::Status tls = !cert.ok() ? cert.status()
                       : !key.ok() ? key.status()
                                   : admin_server->UseTls(*cert, *key);
    if (!tls.ok()) {
      std::cerr << "mlfabric-scheduler: " << tls.message() << "\n";
      return 2;
    }
  }
  if (config.admin_port >= 0) {
    auto admin_port = admin_server->Start(config.admin_address,
                                          static_cast<int>(config.admin_port));
    if (!admin_port.ok()) {
      std::cerr << "mlfabric-scheduler: " << admin_port.status().message() << "\n";
      return 1;
    }
    MLF_LOG(INFO) << "admin endpoint on " << (config.admin_https ? "https" : "http") << "://"
                  << config.admin_address << ":" << *admin_port
                  << "/ (POSTs " << (config.admin_token.empty() ? "disabled" : "need the token")
                  << (config.admin_read_auth ? ", reads need it too" : ", reads are open") << ")";
    WritePortFile(config.admin_port_file, *admin_port);
  }
  return 0;
}

// The line that says the scheduler is serving, and how it is secured.
void LogServing(const mlfabric::SchedulerConfig& config, int bound_port,
                bool hosts_authenticated) {
  const char* tls = config.tls_cert_file.empty()        ? ""
                    : config.tls_client_ca_file.empty() ? " (TLS)"
                                                        : " (mutual TLS)";
  MLF_LOG(INFO) << "listening on " << config.listen_address << ":" << bound_port << tls
                << (hosts_authenticated ? ", hosts authenticated" : "")
                << (config.data_plane_auth ? ", data plane authenticated" : "") << ", planner "
                << config.planner << ", batch interval " << config.batch_interval_ms << " ms";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  SetLogProcessName("scheduler");
  SchedulerConfig config;
  if (std::optional<int> exit_status = LoadConfig(argc, argv, &config)) return *exit_status;
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(config.log_level, &level);
  SetMinLogLevel(level);

  auto planner = core::MakePlanner(config.planner);
  if (!planner.ok()) {
    std::cerr << "mlfabric-scheduler: " << planner.status().message() << "\n";
    return 2;
  }
  RealClock clock;
  // Transfer ids and incarnations carry the second this scheduler started in
  // (its epoch, cluster_state.h). Starting at the beginning of a second of
  // its own gives a quick restart an epoch different from its predecessor's,
  // which had begun serving by then.
  const double wall_s = clock.WallSeconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(std::floor(wall_s) + 1 - wall_s));
  SchedulerService service(config, &clock, std::move(*planner));

  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string address = config.listen_address + ":" + std::to_string(config.grpc_port);
  auto credentials = GrpcCredentials(config);
  if (!credentials.ok()) {
    std::cerr << "mlfabric-scheduler: " << credentials.status().message() << "\n";
    return 2;
  }
  if (!IsLoopbackAddress(config.listen_address) && config.tls_cert_file.empty()) {
    MLF_LOG(WARNING) << "listening on " << config.listen_address
                     << " without TLS: the cluster secret, sessions and job tokens cross the "
                        "network in the clear (set tls_cert_file and tls_key_file)";
  }
  builder.AddListeningPort(address, *credentials, &bound_port);
  SetKeepalive(config.keepalive_s, &builder);
  SchedulerGrpcService grpc_face(&service);
  builder.RegisterService(&grpc_face);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    std::cerr << "mlfabric-scheduler: cannot listen on " << address
              << " (port in use? pass --grpc_port=0 to pick a free one)\n";
    return 1;
  }
  admin::ServiceAdminBackend<SchedulerService> admin_backend(&service);
  admin::AdminHandler admin_handler(&admin_backend,
                                    {config.admin_token, config.admin_read_auth});
  admin::AdminServer admin_server(&admin_handler);
  if (int exit_status = StartAdminEndpoint(config, &admin_server); exit_status != 0) {
    return exit_status;
  }
  // The gRPC port file last: once it exists, everything is serving.
  WritePortFile(config.port_file, bound_port);
  LogServing(config, bound_port, service.auth().hosts_authenticated());
  service.Start();

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  MLF_LOG(INFO) << "shutting down";
  admin_server.Stop();
  service.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  const auto stats = service.GetStats();
  MLF_LOG(INFO) << "batches " << stats.batches << ", planned " << stats.planned << ", applied "
                << stats.applied << ", dropped " << stats.dropped << ", failed " << stats.failed
                << ", rejected " << stats.rejected;
  return 0;
}
