// Authentication across real processes: every port refuses a caller without
// credentials or with another job's, says why, logs it and keeps serving
// everyone else; a daemon-level client of job B can neither get job A's
// model nor inject into A's transfers (A's model stays exact); and a
// mutual-TLS cluster runs a workload end to end, its admin endpoint over
// HTTPS, while a host with a certificate from another CA is refused.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/registration.h"
#include "common/secrets.h"
#include "daemon/transport/data_auth.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/get_client.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "proto/scheduler.grpc.pb.h"
#include "testing/http_client.h"

namespace mlfabric {
namespace {

constexpr char kTokenA[] = "job-a-token-0123456789";
constexpr char kTokenB[] = "job-b-token-9876543210";
constexpr size_t kFloats = 4096;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Job A's server on s1 (a sum of float vectors) and a worker on w1.
struct JobA {
  std::unique_ptr<Server> server;
  std::thread serving;
  std::vector<float> model = std::vector<float>(kFloats, 0.0f);
  std::mutex mu;
  int64_t version = 0;

  explicit JobA(launch::Cluster& cluster, const std::string& job = "a",
                const std::string& token = kTokenA) {
    ClientOptions options;
    options.daemon_socket = cluster.Socket("s1");
    options.job = job;
    options.job_token = token;
    options.name = "ps";
    auto connected = Server::Connect(options);
    INFO(connected.status().ToString());
    REQUIRE(connected.ok());
    server = std::move(*connected);
    server->RegisterUpdateCallback([this](const Server::Update& u) -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(mu);
      const float* values = reinterpret_cast<const float*>(u.data);
      for (size_t i = 0; i < kFloats; ++i) model[i] += values[i];
      version += u.count;
      return version;
    });
    server->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
      std::lock_guard<std::mutex> lock(mu);
      Server::Snapshot snapshot;
      snapshot.version = version;
      snapshot.bytes.resize(kFloats * sizeof(float));
      std::memcpy(snapshot.bytes.data(), model.data(), snapshot.bytes.size());
      return snapshot;
    });
    serving = std::thread([this] { (void)server->Serve(); });
  }
  ~JobA() {
    server->Stop();
    serving.join();
  }

  // Pushes `n` vectors of ones from w1 and gets the model: every element
  // must then be `expect`.
  void Train(launch::Cluster& cluster, int n, float expect, const std::string& job = "a",
             const std::string& token = kTokenA) {
    ClientOptions options;
    options.daemon_socket = cluster.Socket("w1");
    options.job = job;
    options.job_token = token;
    options.name = "wa";
    auto worker = Worker::Connect(options);
    INFO(worker.status().ToString());
    REQUIRE(worker.ok());
    const std::vector<float> ones(kFloats, 1.0f);
    for (int i = 0; i < n; ++i) {
      auto model = (*worker)->Get("ps");
      REQUIRE(model.ok());
      PushResult pushed =
          (*worker)->Push("ps", ones.data(), ones.size() * sizeof(float), model->version, 1.0).get();
      INFO(pushed.reason);
      REQUIRE(pushed.outcome == PushOutcome::kApplied);
    }
    auto model = (*worker)->Get("ps");
    REQUIRE(model.ok());
    REQUIRE(model->size() == kFloats * sizeof(float));
    const float* values = reinterpret_cast<const float*>(model->data());
    for (size_t i = 0; i < kFloats; ++i) {
      if (values[i] != expect) FAIL("element " << i << " is " << values[i] << ", not " << expect);
    }
  }
};

// Asks s1's daemon at `address`, as `host`'s daemon would, for server
// `server` of `job`; `connection` then holds the reply.
absl::Status AskForModel(transport::GetClient& client, const std::string& address, uint32_t job,
                         uint64_t transfer, const std::string& server, const std::string& host,
                         transport::GetClient::Connection* connection) {
  transport::PacketHeader request;
  request.kind = transport::PacketKind::kGetRequest;
  request.job = job;
  request.transfer = transfer;
  v1::DataGetRequest body;
  body.set_server(server);
  body.set_requester_host(host);
  return client.Request("s1", address, request, body, connection);
}

std::string ReadSecret(const std::string& path) {
  std::ifstream in(path);
  std::string secret;
  in >> secret;
  return secret;
}

TEST_CASE("Every port refuses callers without credentials or with another job's") {
  const std::string dir = launch::MakeTempDir("security");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "a", "token": ")" << kTokenA
                        << R"("}, {"name": "b", "token": ")" << kTokenB << R"("}]})";
  auto started = launch::Cluster::StartLoopback({"s1", "w1"}, {"--config=" + config});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& cluster = **started;
  JobA a(cluster);
  a.Train(cluster, 3, 3.0f);
  JobA b(cluster, "b", kTokenB);  // job B has a server on s1 too

  // ---- gRPC: hosts authenticate, calls act only for their own host and job.
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(cluster.scheduler_address(), grpc::InsecureChannelCredentials()));
  const std::string secret = ReadSecret(cluster.dir() + "/cluster.secret");
  REQUIRE(secret.size() == 64);
  v1::RegisterHostRequest host;
  host.set_protocol_version(1);
  host.set_host("intruder");
  host.set_data_address("127.0.0.1:9");
  v1::RegisterHostReply registered;
  {
    grpc::ClientContext context;
    grpc::Status s = stub->RegisterHost(&context, host, &registered);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(Contains(s.error_message(), "host 'intruder': no cluster secret"));
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-cluster-secret", "guess");
    grpc::Status s = stub->RegisterHost(&context, host, &registered);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(Contains(s.error_message(), "a wrong cluster secret"));
  }
  {
    // A host of this cluster that runs job B only.
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-cluster-secret", secret);
    REQUIRE(stub->RegisterHost(&context, host, &registered).ok());
    CHECK(registered.session_token().size() == 32);
    CHECK(registered.data_key().size() == 32);
  }
  auto sign = [&](grpc::ClientContext* context, const std::string& token) {
    context->AddMetadata("x-mlfabric-host", "intruder");
    context->AddMetadata("x-mlfabric-session", registered.session_token());
    if (!token.empty()) context->AddMetadata("x-mlfabric-job-token", token);
  };
  v1::RegisterEntityRequest entity;
  entity.set_job("b");
  entity.set_job_token(kTokenB);
  entity.set_role(v1::ROLE_WORKER);
  entity.set_name("bw");
  entity.set_host("intruder");
  v1::RegisterEntityReply in_b;
  {
    grpc::ClientContext context;  // no session
    grpc::Status s = stub->RegisterEntity(&context, entity, &in_b);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(Contains(s.error_message(), "host 'intruder': no session token"));
  }
  {
    grpc::ClientContext context;
    sign(&context, "");
    REQUIRE(stub->RegisterEntity(&context, entity, &in_b).ok());
    CHECK(in_b.job_data_key().size() == 32);
  }
  {
    v1::RegisterEntityRequest into_a = entity;
    into_a.set_job("a");
    grpc::ClientContext context;
    sign(&context, "");
    v1::RegisterEntityReply reply;
    grpc::Status s = stub->RegisterEntity(&context, into_a, &reply);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(Contains(s.error_message(), "wrong token for job 'a'"));
  }
  {
    v1::SubmitUpdateRequest push;
    push.set_job("a");
    push.set_src_host("intruder");
    push.set_server("ps");
    push.set_bytes(kFloats * sizeof(float));
    grpc::ClientContext context;
    sign(&context, kTokenB);
    v1::SubmitUpdateReply reply;
    grpc::Status s = stub->SubmitUpdate(&context, push, &reply);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(s.error_message() == "job 'a': a wrong job token on the call");
  }
  {
    v1::BandwidthReport report;  // for another host
    report.set_host("w1");
    report.set_uplink_bps(1e3);
    grpc::ClientContext context;
    sign(&context, "");
    v1::BandwidthAck ack;
    grpc::Status s = stub->ReportBandwidth(&context, report, &ack);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(s.error_message() == "host 'intruder' may not act for host 'w1'");
  }
  {
    // Completions for another host: refused whole, and one by one when
    // they hide in a call of the caller's own.
    v1::CompletionReports reports;
    reports.set_host("w1");
    v1::CompletionReport* report = reports.add_reports();
    report->set_host("w1");
    report->set_transfer_id(1);
    report->set_error("forged");
    grpc::ClientContext context;
    sign(&context, "");
    v1::CompletionAcks acks;
    grpc::Status s = stub->ReportCompletions(&context, reports, &acks);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(s.error_message() == "host 'intruder' may not act for host 'w1'");
    reports.set_host("intruder");
    grpc::ClientContext own;
    sign(&own, "");
    REQUIRE(stub->ReportCompletions(&own, reports, &acks).ok());
    REQUIRE(acks.results_size() == 1);
    CHECK(acks.results(0).code() == static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    CHECK(acks.results(0).message() == "reports[0].host: 'w1' is not the call's host 'intruder'");
  }
  {
    v1::StreamSchedulesRequest stream;  // w1's commands, without its session
    stream.set_host("w1");
    grpc::ClientContext context;
    v1::DaemonCommand command;
    auto reader = stub->StreamSchedules(&context, stream);
    CHECK_FALSE(reader->Read(&command));
    CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  const std::string scheduler_log = cluster.scheduler().Log();
  CHECK(Contains(scheduler_log, "refused RegisterHost from"));
  CHECK(Contains(scheduler_log, "refused SubmitUpdate from"));
  CHECK(Contains(scheduler_log, "refused StreamSchedules from"));

  // ---- Data port: B's daemon-level client, with the keys B's host holds.
  v1::ResolveServerRequest where_request;  // where A's server is (no secret)
  where_request.set_job("a");
  where_request.set_server("ps");
  v1::ResolveServerReply where;
  {
    grpc::ClientContext context;
    sign(&context, kTokenA);
    REQUIRE(stub->ResolveServer(&context, where_request, &where).ok());
  }
  const uint32_t job_a = where.job_id();
  const uint32_t job_b = in_b.job_id();
  REQUIRE(job_a != job_b);
  transport::DataKeys keys;
  keys.SetClusterKey(registered.data_key());
  keys.SetJobKey(job_b, in_b.job_data_key());
  boost::asio::io_context io;
  transport::SendWatchdog watchdog(5);
  auto get = [&](transport::DataKeys& with, uint32_t job, const std::string& server) {
    transport::GetClient client(io, watchdog, 1, uint64_t{1} << 30, &with, "intruder");
    transport::GetClient::Connection connection;
    return AskForModel(client, where.data_address(), job, 1, server, "intruder", &connection);
  };
  // Its own job's key does not open A's model...
  absl::Status no_key = get(keys, job_a, "ps");
  CHECK(no_key.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(std::string(no_key.message()), "holds no key for job"));
  // ...nor does a proof made with it under A's job id...
  transport::DataKeys forged;
  forged.SetClusterKey(registered.data_key());
  forged.SetJobKey(job_a, in_b.job_data_key());
  CHECK_FALSE(get(forged, job_a, "ps").ok());
  // ...and asking as B for a server of that name gets B's own (version 0),
  // never A's (version 3).
  transport::GetClient own(io, watchdog, 1, uint64_t{1} << 30, &keys, "intruder");
  {
    transport::GetClient::Connection connection;
    absl::Status as_b =
        AskForModel(own, where.data_address(), job_b, 2, "ps", "intruder", &connection);
    INFO(as_b.ToString());
    REQUIRE(as_b.ok());
    CHECK(connection.reply.version() == 0);
  }
  // A session that skips the handshake, and one with another cluster's key.
  transport::DataKeys stranger;
  stranger.SetClusterKey(RandomBytes(32));
  stranger.SetJobKey(job_a, RandomBytes(32));
  absl::Status wrong_cluster = get(stranger, job_a, "ps");
  CHECK(wrong_cluster.code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(std::string(wrong_cluster.message()), "does not hold this cluster's data key"));
  {
    auto endpoint = transport::ParseEndpoint(where.data_address());
    REQUIRE(endpoint.ok());
    boost::asio::ip::tcp::socket raw(io);
    raw.connect(*endpoint);
    // A transfer's begin as job A, with no handshake before it.
    transport::PacketHeader begin;
    begin.kind = transport::PacketKind::kBegin;
    begin.job = job_a;
    begin.transfer = 12345;
    begin.offset = kFloats * sizeof(float);
    REQUIRE(transport::WritePacket(watchdog, raw.native_handle(), begin, nullptr, 0).ok());
    char byte;
    CHECK(::recv(raw.native_handle(), &byte, 1, 0) <= 0);  // closed (or reset) on us
  }
  // Injection into a transfer of A's over a session that proved job B.
  {
    auto endpoint = transport::ParseEndpoint(where.data_address());
    boost::asio::ip::tcp::socket session(io);
    session.connect(*endpoint);
    auto auth = transport::InitiatorHandshake(session.native_handle(), keys, "intruder", "s1");
    REQUIRE(auth.ok());
    auto proof = transport::JobProof(*auth, keys, job_b);
    REQUIRE(proof.ok());
    transport::PacketHeader frame;
    frame.kind = transport::PacketKind::kJobProof;
    frame.job = job_b;
    frame.length = static_cast<uint32_t>(proof->size());
    REQUIRE(transport::WritePacket(watchdog, session.native_handle(), frame, proof->data(),
                                   frame.length).ok());
    transport::PacketHeader begin;
    begin.kind = transport::PacketKind::kBegin;
    begin.job = job_a;  // not proven on this session
    begin.transfer = 777;
    begin.offset = kFloats * sizeof(float);
    REQUIRE(transport::WritePacket(watchdog, session.native_handle(), begin, nullptr, 0).ok());
    char byte;
    CHECK(::recv(session.native_handle(), &byte, 1, 0) <= 0);
  }
  const std::string s1_log = cluster.daemon("s1").Log();
  CHECK(Contains(s1_log, "did not start with the authentication handshake"));
  CHECK(Contains(s1_log, "wrong proof from 'intruder'"));
  CHECK(Contains(s1_log, "before it proved it is in the job"));

  // ---- Everyone else was served throughout, and A's model is exact.
  a.Train(cluster, 2, 5.0f);
}

TEST_CASE("With data_plane_encryption every data session is sealed and training stays exact") {
  const std::string dir = launch::MakeTempDir("sealed");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "a", "token": ")" << kTokenA << R"("}]})";
  auto started = launch::Cluster::StartLoopback(
      {"s1", "w1"}, {"--config=" + config, "--data_plane_encryption=true"});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& cluster = **started;
  JobA a(cluster);
  a.Train(cluster, 3, 3.0f);  // pushes and gets, every byte sealed
  CHECK(Contains(cluster.daemon("s1").Log(), "authenticated the data session of w1 at 127.0.0.1:"));
  CHECK(Contains(cluster.daemon("s1").Log(), ", payloads encrypted"));

  // A host of the cluster in job A learns the setting when it registers...
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(cluster.scheduler_address(), grpc::InsecureChannelCredentials()));
  v1::RegisterHostRequest host;
  host.set_protocol_version(1);
  host.set_host("member");
  host.set_data_address("127.0.0.1:9");
  v1::RegisterHostReply registered;
  {
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-cluster-secret", ReadSecret(cluster.dir() + "/cluster.secret"));
    REQUIRE(stub->RegisterHost(&context, host, &registered).ok());
  }
  CHECK(registered.data_encryption());
  v1::RegisterEntityRequest entity;
  entity.set_job("a");
  entity.set_job_token(kTokenA);
  entity.set_role(v1::ROLE_WORKER);
  entity.set_name("member-worker");
  entity.set_host("member");
  entity.set_delay_bound(-1);  // the job's, as the API registers
  v1::RegisterEntityReply in_a;
  {
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-host", "member");
    context.AddMetadata("x-mlfabric-session", registered.session_token());
    REQUIRE(stub->RegisterEntity(&context, entity, &in_a).ok());
  }
  v1::ResolveServerRequest where_request;
  where_request.set_job("a");
  where_request.set_server("ps");
  v1::ResolveServerReply where;
  {
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-host", "member");
    context.AddMetadata("x-mlfabric-session", registered.session_token());
    context.AddMetadata("x-mlfabric-job-token", kTokenA);
    REQUIRE(stub->ResolveServer(&context, where_request, &where).ok());
  }

  // ...gets A's model over a sealed session, byte for byte...
  boost::asio::io_context io;
  transport::SendWatchdog watchdog(5);
  auto get = [&](bool sealed) -> absl::StatusOr<std::vector<float>> {
    transport::DataKeys keys;
    keys.SetClusterKey(registered.data_key());
    keys.SetJobKey(in_a.job_id(), in_a.job_data_key());
    keys.SetEncryption(sealed);
    transport::GetClient client(io, watchdog, 1, uint64_t{1} << 30, &keys, "member");
    transport::GetClient::Connection connection;
    absl::Status asked =
        AskForModel(client, where.data_address(), in_a.job_id(), 1, "ps", "member", &connection);
    if (!asked.ok()) return asked;
    auto buffer = SharedBuffer::Create(connection.header.offset);
    if (!buffer.ok()) return buffer.status();
    absl::Status received = client.Receive(connection, *buffer, [](uint64_t, uint64_t) {});
    if (!received.ok()) return received;
    std::vector<float> model(kFloats);
    std::memcpy(model.data(), buffer->data(), std::min(buffer->size(), kFloats * sizeof(float)));
    return model;
  };
  auto model = get(/*sealed=*/true);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  CHECK(*model == std::vector<float>(kFloats, 3.0f));
  // ...and a session that would not seal is refused, saying why.
  auto plain = get(/*sealed=*/false);
  CHECK(plain.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(std::string(plain.status().message()),
                 "refused: data_plane_encryption is on here and off at the initiator"));
  a.Train(cluster, 1, 4.0f);
}

TEST_CASE("A mutual-TLS cluster trains end to end; a certificate from another CA is refused") {
  const std::string dir = launch::MakeTempDir("mtls");
  const std::string make_certs = launch::BinaryPath("tools/make-certs");
  for (const auto& [ca, hosts] : {std::pair{dir + "/ours", std::string("s1 w1 w9")},
                                  std::pair{dir + "/theirs", std::string("w2")}}) {
    const std::string command = make_certs + " " + ca + " " + hosts + " > /dev/null";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  const std::string ours = dir + "/ours/";
  std::map<std::string, std::vector<std::string>> host_flags;
  for (const std::string host : {"s1", "w1"}) {
    host_flags[host] = {"--scheduler_ca_file=" + ours + "ca.pem",
                        "--tls_cert_file=" + ours + host + ".pem",
                        "--tls_key_file=" + ours + host + ".key"};
  }
  launch::ClusterOptions options;
  options.hosts = {"s1", "w1"};
  options.cluster_secret = false;  // the certificates alone authenticate hosts
  options.admin = true;
  auto created = launch::Cluster::Create(options);
  REQUIRE(created.ok());
  launch::Cluster& cluster = **created;
  absl::Status started =
      cluster.Start({"--tls_cert_file=" + ours + "scheduler.pem",
                     "--tls_key_file=" + ours + "scheduler.key",
                     "--tls_client_ca_file=" + ours + "ca.pem", "--admin_https=true"},
                    {}, host_flags);
  INFO(started.ToString());
  REQUIRE(started.ok());
  CHECK(Contains(cluster.scheduler().Log(), "(mutual TLS), hosts authenticated"));

  // The admin endpoint serves HTTPS with the scheduler's certificate, and
  // only HTTPS; a client that trusts another CA does not get through.
  const testing::HttpResult health =
      testing::Https(cluster.admin_port(), ours + "ca.pem", "GET", "/healthz");
  CHECK(health.status == 200);
  CHECK(testing::Https(cluster.admin_port(), ours + "ca.pem", "GET", "/api/v1/cluster").status ==
        200);
  CHECK(testing::Http(cluster.admin_port(), "GET", "/healthz").status == 0);
  CHECK(testing::Https(cluster.admin_port(), dir + "/theirs/ca.pem", "GET", "/healthz").status ==
        0);
  {
    const char* token = std::getenv("MLFABRIC_JOB_TOKEN");
    REQUIRE(token != nullptr);
    JobA demo(cluster, "demo", token);
    demo.Train(cluster, 4, 4.0f, "demo", token);
  }

  auto refused = [&](const std::string& host, const std::string& certs,
                     const std::string& cert_host) {
    auto daemon = launch::Subprocess::Start(
        {launch::BinaryPath("daemon/mlfabricd"), "--host=" + host,
         "--scheduler=" + cluster.scheduler_address(), "--local_socket=" + cluster.dir() + "/" + host + ".sock",
         "--register_timeout_s=2", "--scheduler_ca_file=" + ours + "ca.pem",
         "--tls_cert_file=" + certs + cert_host + ".pem",
         "--tls_key_file=" + certs + cert_host + ".key"},
        dir + "/" + host + ".log");
    REQUIRE(daemon.ok());
    const std::optional<int> code = (*daemon)->WaitFor(30);
    CHECK(code.has_value());
    CHECK(code.value_or(0) != 0);
    return (*daemon)->Log();
  };
  // Another CA's certificate: the TLS handshake fails, the daemon says so.
  const std::string other_ca = refused("w2", dir + "/theirs/", "w2");
  INFO(other_ca);
  CHECK(Contains(other_ca, "cannot register with the scheduler"));
  // Our CA's certificate, but for another host's name.
  const std::string other_name = refused("w3", ours, "w9");
  INFO(other_name);
  CHECK(Contains(other_name, "host 'w3' presented a certificate for 'w9'"));
  CHECK(Contains(cluster.scheduler().Log(), "refused RegisterHost"));
}

}  // namespace
}  // namespace mlfabric
