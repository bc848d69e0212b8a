// The cluster launcher: the namespace layout and prerequisite decisions
// (pure, no privilege), the mlfabric-netns command's layout output, a
// loopback cluster end to end, and, as root, a namespace cluster: daemons
// serving in their namespaces, shaping changed at run time and visible in a
// transfer's duration, per-host byte counters, exec inside a host, and
// cleanup by prefix. Without root the namespace cases print
// "SKIPPED: <reason>" (a failure under MLFABRIC_REQUIRE_PREREQS=1).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "launch/cluster.h"
#include "launch/netns_network.h"
#include "launch/process.h"
#include "testing/prereq.h"

namespace mlfabric::launch {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST_CASE("Layout: names and addresses of every host, the switch and the root link") {
  NetnsLayout layout;
  layout.prefix = "mlft-";
  layout.hosts = {"sch", "s1", "w1"};
  REQUIRE(layout.Validate().ok());
  // The subnet eval's prefixes always had (zlib.crc32 of the prefix).
  CHECK(layout.Subnet() == "10.139.39");
  CHECK(SubnetForPrefix("mlft-t123-") == "10.138.50");
  CHECK(layout.HostNamespace("w1") == "mlft-w1");
  CHECK(layout.SwitchNamespace() == "mlft-sw");
  CHECK(layout.Bridge() == "mlft-br0");
  CHECK(NetnsLayout::SwitchPort("w1") == "p-w1");
  CHECK(layout.Address("sch") == "10.139.39.2");
  CHECK(layout.Address("w1") == "10.139.39.4");
  CHECK(layout.Address("nobody").empty());
  CHECK(layout.RootAddress() == "10.139.39.1");
  CHECK(layout.RootInterface() == "mlft-gw");
  CHECK(layout.Namespaces() ==
        std::vector<std::string>{"mlft-sch", "mlft-s1", "mlft-w1", "mlft-sw"});
  layout.subnet = "10.1.2";
  CHECK(layout.Address("s1") == "10.1.2.3");
}

TEST_CASE("Layout: what cannot become names or addresses is rejected, saying why") {
  auto problem = [](NetnsLayout layout) { return std::string(layout.Validate().message()); };
  NetnsLayout good;
  good.hosts = {"a", "b"};
  REQUIRE(good.Validate().ok());
  NetnsLayout l = good;
  l.hosts = {};
  CHECK(Contains(problem(l), "between 1 and 250 hosts"));
  l = good;
  l.hosts = {"a", "a"};
  CHECK(Contains(problem(l), "duplicate host name 'a'"));
  l = good;
  l.hosts = {"thirteen-char"};
  CHECK(Contains(problem(l), "1-12 characters"));
  l = good;
  l.hosts = {"a b"};
  CHECK(Contains(problem(l), "'a b'"));
  l = good;
  l.hosts = {"sw"};
  CHECK(Contains(problem(l), "switch"));
  l = good;
  l.prefix = "much-too-long-";
  CHECK(Contains(problem(l), "prefix"));
  l = good;
  l.prefix = "";
  CHECK(Contains(problem(l), "prefix"));
  l = good;
  l.subnet = "10.1.256";
  CHECK(Contains(problem(l), "subnet"));
  l = good;
  l.subnet = "10.1";
  CHECK(Contains(problem(l), "subnet"));
  CHECK(good.Validate().code() == absl::StatusCode::kOk);
  CHECK(l.Validate().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Prerequisites: a missing tool or privilege is named") {
  CHECK(NetnsPrerequisiteProblem(0, "/usr/sbin/ip", "/usr/sbin/tc").empty());
  const std::string no_tc = NetnsPrerequisiteProblem(0, "/usr/sbin/ip", "");
  CHECK(Contains(no_tc, "tc tool"));
  CHECK_FALSE(Contains(no_tc, "ip "));
  CHECK(Contains(NetnsPrerequisiteProblem(0, "", ""), "ip and tc tools"));
  const std::string not_root = NetnsPrerequisiteProblem(1000, "/usr/sbin/ip", "/usr/sbin/tc");
  CHECK(Contains(not_root, "root"));
  CHECK(Contains(not_root, "uid 1000"));
}

TEST_CASE("mlfabric-netns layout prints names and addresses as JSON, and rejects bad input") {
  const std::string cli = BinaryPath("testing/mlfabric-netns");
  CommandResult layout = RunCommand({cli, "layout", "--prefix=mlft-", "--hosts=sch,s1"});
  INFO(layout.output);
  REQUIRE(layout.exit_code == 0);
  CHECK(Contains(layout.output, R"("subnet":"10.139.39")"));
  CHECK(Contains(layout.output, R"("s1":{"address":"10.139.39.3","namespace":"mlft-s1")"));
  CHECK(Contains(layout.output, R"("switch_namespace":"mlft-sw")"));
  CommandResult bad = RunCommand({cli, "layout", "--prefix=mlft-", "--hosts=a,a"});
  CHECK(bad.exit_code == 1);
  CHECK(Contains(bad.output, "duplicate host name"));
  CHECK(RunCommand({cli, "frobnicate"}).exit_code == 2);
  CHECK(RunCommand({cli, "layout", "--hosts=a", "--colour=red"}).exit_code == 2);
}

TEST_CASE("Loopback: scheduler and daemons start with their flags and stop with the cluster") {
  std::string dir;
  pid_t scheduler_pid = -1, daemon_pid = -1, app_pid = -1;
  {
    auto cluster = Cluster::StartLoopback(
        {"s1", "w1"}, {"--admin_port=0", "--admin_port_file={dir}/admin.port"}, {},
        {{"w1", {"--uplink_bps=1e9"}}});
    INFO(cluster.status().ToString());
    REQUIRE(cluster.ok());
    Cluster& c = **cluster;
    dir = c.dir();
    CHECK(c.topology() == Topology::kLoopback);
    CHECK(Contains(c.scheduler_address(), "127.0.0.1:"));
    CHECK(c.HostAddress("w1") == "127.0.0.1");
    // "{dir}" became the cluster's directory.
    CHECK(WaitUntil([&] { return !ReadFile(dir + "/admin.port").empty(); }, 10));
    for (const std::string host : {"s1", "w1"}) {
      CHECK(c.daemon(host).Running());
      CHECK(std::filesystem::exists(c.Socket(host)));
    }
    CHECK(Contains(c.daemon("w1").Log(), "serving"));
    auto app = c.StartApp("sleeper", {"/bin/sleep", "600"});
    REQUIRE(app.ok());
    scheduler_pid = c.scheduler().pid();
    daemon_pid = c.daemon("w1").pid();
    app_pid = (*app)->pid();
    CHECK(Alive(app_pid));
    // Per-host links exist only with namespaces.
    CHECK(c.SetRate("w1", 1e6, std::nullopt).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(c.ReadLinkBytes().status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(c.network() == nullptr);
  }
  // Everything it started was reaped, and its directory is gone.
  CHECK_FALSE(Alive(scheduler_pid));
  CHECK_FALSE(Alive(daemon_pid));
  CHECK_FALSE(Alive(app_pid));
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("Loopback: a daemon that cannot start fails Start with its log") {
  auto cluster = Cluster::StartLoopback({"w1"}, {}, {"--no_such_flag=1"});
  REQUIRE_FALSE(cluster.ok());
  CHECK(Contains(std::string(cluster.status().message()), "daemon w1 did not start"));
  CHECK(Contains(std::string(cluster.status().message()), "no_such_flag"));
}

// Sink on `port`: prints the byte count when the sender closes.
constexpr char kSink[] =
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 7071)); s.listen(); print('listening', flush=True)\n"
    "c, _ = s.accept(); n = 0\n"
    "while True:\n"
    "    d = c.recv(65536)\n"
    "    if not d: break\n"
    "    n += len(d)\n"
    "print('received', n, flush=True)\n";
// Sends 1 MB to argv[1]:7071 and waits for the sink to close.
constexpr char kSender[] =
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], 7071))\n"
    "s.sendall(b'x' * 1000000); s.shutdown(socket.SHUT_WR); s.recv(1)\n";

TEST_CASE("Namespaces: per-host addresses, daemons, run-time shaping, counters, exec, cleanup") {
  ClusterOptions options;
  options.topology = Topology::kNetns;
  options.hosts = {"a", "b"};
  options.admin = true;
  auto created = Cluster::Create(options);
  if (!created.ok()) {
    REQUIRE(created.status().code() == absl::StatusCode::kFailedPrecondition);
    MLFABRIC_SKIP_TEST(std::string(created.status().message()));
  }
  const std::string python = FindTool("python3");
  if (python.empty()) MLFABRIC_SKIP_TEST("python3 is not installed (the traffic generator)");
  std::unique_ptr<Cluster> cluster = std::move(*created);
  const std::string prefix = cluster->network()->layout().prefix;
  const std::vector<std::string> namespaces = NetnsNetwork::ListNamespaces(prefix);
  CHECK(namespaces.size() == 3);  // a, b and the switch

  // Daemons in their namespaces reach the scheduler in the root namespace.
  auto started = cluster->Start({}, {"--log_level=debug"});
  INFO(started.ToString());
  REQUIRE(started.ok());
  CHECK(cluster->admin_port() > 0);
  CHECK(cluster->HostAddress("b") == cluster->network()->layout().Address("b"));
  auto addresses = cluster->Exec("a", {"ip", "-4", "addr", "show", "veth0"});
  REQUIRE(addresses.ok());
  CHECK(Contains(*addresses, cluster->HostAddress("a") + "/24"));

  // b's downlink at 8 Mbit/s: 1 MB from a takes about a second, never less
  // than the shaping allows (one-sided: noise only makes it slower).
  REQUIRE(cluster->SetRate("b", std::nullopt, 8e6).ok());
  REQUIRE(cluster->SetRate("a", 20e6, std::nullopt).ok());
  auto classes = cluster->Exec("a", {"tc", "class", "show", "dev", "veth0"});
  REQUIRE(classes.ok());
  CHECK(Contains(*classes, "rate 20Mbit"));
  auto before = cluster->ReadLinkBytes();
  REQUIRE(before.ok());
  auto sink = cluster->StartAppInHost("b", "sink", {python, "-c", kSink});
  REQUIRE(sink.ok());
  REQUIRE(WaitUntil([&] { return Contains((*sink)->Log(), "listening"); }, 30));
  const auto t0 = std::chrono::steady_clock::now();
  auto sent = cluster->Exec("a", {python, "-c", kSender, cluster->HostAddress("b")});
  INFO((sent.ok() ? std::string() : sent.status().ToString()) << (*sink)->Log());
  REQUIRE(sent.ok());
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE((*sink)->WaitFor(30) == 0);
  CHECK(Contains((*sink)->Log(), "received 1000000"));
  std::printf("1 MB through an 8 Mbit/s downlink: %.2f s\n", elapsed_s);
  CHECK(elapsed_s >= 0.5);
  auto after = cluster->ReadLinkBytes();
  REQUIRE(after.ok());
  CHECK(after->at("a").up - before->at("a").up >= 1000000);
  CHECK(after->at("b").down - before->at("b").down >= 1000000);
  CHECK(cluster->SetRate("nobody", 1e6, 1e6).code() == absl::StatusCode::kNotFound);

  // Destruction stops the daemons and deletes every namespace.
  const pid_t daemon_pid = cluster->daemon("a").pid();
  cluster.reset();
  CHECK_FALSE(Alive(daemon_pid));
  CHECK(NetnsNetwork::ListNamespaces(prefix).empty());
}

TEST_CASE("Namespaces: a taken prefix is refused, and cleanup by prefix removes a leftover") {
  if (absl::Status usable = NetnsNetwork::CheckPrerequisites("mlct-"); !usable.ok()) {
    REQUIRE(usable.code() == absl::StatusCode::kFailedPrecondition);
    MLFABRIC_SKIP_TEST(std::string(usable.message()));
  }
  NetnsLayout layout;
  layout.prefix = "mlct" + std::to_string(::getpid() % 100000) + "-";
  layout.hosts = {"x", "y"};
  auto network = NetnsNetwork::Create(layout, 1e9);
  INFO(network.status().ToString());
  REQUIRE(network.ok());
  (*network)->Release();  // as a killed run would leave it
  network->reset();
  CHECK(NetnsNetwork::ListNamespaces(layout.prefix).size() == 3);
  auto again = NetnsNetwork::Create(layout, 1e9);
  CHECK(again.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(Contains(std::string(again.status().message()), "cleanup --prefix=" + layout.prefix));
  CHECK(NetnsNetwork::ListNamespaces(layout.prefix).size() == 3);  // not touched
  const std::vector<std::string> removed = NetnsNetwork::CleanupPrefix(layout.prefix);
  CHECK(removed.size() == 3);
  CHECK(NetnsNetwork::ListNamespaces(layout.prefix).empty());
}

}  // namespace
}  // namespace mlfabric::launch
