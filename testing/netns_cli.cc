// mlfabric-netns: the namespace network of netns_network.h from the command
// line, for eval/testbed/netns_cluster.py (and for cleaning up by hand).
// Stateless: every subcommand takes the layout flags and recomputes the
// names, so a network created by one call is managed by the next.
//
//   mlfabric-netns create --prefix=mlft- --hosts=sch,s1,w1 --rate_bps=1e9
//   mlfabric-netns set-rate --prefix=mlft- --hosts=sch,s1,w1 --host=w1 --up_bps=5e7
//   mlfabric-netns link-bytes --prefix=mlft- --hosts=sch,s1,w1
//   mlfabric-netns destroy --prefix=mlft- --hosts=sch,s1,w1
//   mlfabric-netns cleanup --prefix=mlft-h2-
//
// Subcommands: layout (names and addresses; needs no privilege), probe,
// create, destroy, set-rate, link-bytes, kill-all [--signal=9], list,
// cleanup. Layout flags: --prefix, --hosts (comma-separated), --subnet
// (A.B.C), --ifname. Output: one JSON object on stdout; on failure a
// message on stderr and exit status 1 (2 for a usage error).
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "launch/netns_network.h"

namespace mlfabric::testing {
namespace {

using nlohmann::json;
using launch::NetnsLayout;
using launch::NetnsNetwork;

constexpr char kUsage[] =
    "usage: mlfabric-netns "
    "layout|probe|create|destroy|set-rate|link-bytes|kill-all|list|cleanup "
    "[--prefix=P] [--hosts=a,b,...] [--subnet=A.B.C] [--ifname=veth0] [--rate_bps=R] "
    "[--host=H --up_bps=R --down_bps=R] [--signal=N]\n";

int Usage(const std::string& problem) {
  std::cerr << "mlfabric-netns: " << problem << "\n" << kUsage;
  return 2;
}

int Fail(const absl::Status& status) {
  std::cerr << "mlfabric-netns: " << status.message() << "\n";
  return 1;
}

json LayoutJson(const NetnsLayout& layout, const NetnsNetwork* network) {
  json hosts = json::object();
  for (const std::string& host : layout.hosts) {
    json entry = {{"namespace", layout.HostNamespace(host)},
                  {"address", layout.Address(host)},
                  {"switch_port", NetnsLayout::SwitchPort(host)}};
    if (network != nullptr) entry["wrap"] = network->Wrap(host, {});
    hosts[host] = entry;
  }
  return {{"prefix", layout.prefix},
          {"subnet", layout.Subnet()},
          {"ifname", layout.ifname},
          {"switch_namespace", layout.SwitchNamespace()},
          {"bridge", layout.Bridge()},
          {"hosts", hosts}};
}

std::optional<double> Rate(const std::map<std::string, std::string>& flags,
                           const std::string& name, bool* bad) {
  auto it = flags.find(name);
  if (it == flags.end()) return std::nullopt;
  double value = 0;
  if (!absl::SimpleAtod(it->second, &value) || value <= 0) {
    *bad = true;
    return std::nullopt;
  }
  return value;
}

// Main's --name=value flags (argv[2] on) into `flags`; what is wrong with
// them ("" when nothing).
std::string ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) return "unexpected argument '" + arg + "'";
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) return "flag '" + arg + "' needs =value";
    (*flags)[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  for (const auto& [name, value] : *flags) {
    static const char* const kKnown[] = {"prefix", "hosts",   "subnet", "ifname", "rate_bps",
                                         "host",   "up_bps", "down_bps", "signal"};
    bool known = false;
    for (const char* k : kKnown) known = known || name == k;
    if (!known) return "unknown flag --" + name;
  }
  return "";
}

// Main's subcommands on an existing network: destroy, set-rate,
// link-bytes and kill-all.
int RunOnNetwork(const std::string& command, const NetnsLayout& layout,
                 std::map<std::string, std::string>& flags, NetnsNetwork& net) {
  if (command == "destroy") {
    if (absl::Status done = net.Destroy(); !done.ok()) return Fail(done);
    std::cout << json{{"destroyed", layout.Namespaces()}}.dump() << "\n";
    return 0;
  }
  if (command == "set-rate") {
    if (!flags.count("host")) return Usage("set-rate needs --host");
    bool bad = false;
    const std::optional<double> up = Rate(flags, "up_bps", &bad);
    const std::optional<double> down = Rate(flags, "down_bps", &bad);
    if (bad) return Usage("--up_bps and --down_bps must be positive numbers");
    if (absl::Status set = net.SetRate(flags["host"], up, down); !set.ok()) return Fail(set);
    std::cout << json{{"host", flags["host"]}}.dump() << "\n";
    return 0;
  }
  if (command == "link-bytes") {
    auto counters = net.ReadLinkBytes();
    if (!counters.ok()) return Fail(counters.status());
    json out = json::object();
    for (const auto& [host, bytes] : *counters) {
      out[host] = {{"up", bytes.up}, {"down", bytes.down}};
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  // kill-all
  int signal = SIGKILL;
  if (flags.count("signal") && !absl::SimpleAtoi(flags["signal"], &signal)) {
    return Usage("--signal must be a number");
  }
  std::cout << json{{"signalled", net.SignalAll(signal)}}.dump() << "\n";
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage("no subcommand");
  const std::string command = argv[1];
  static const char* const kCommands[] = {"layout", "probe",     "create",   "destroy", "set-rate",
                                          "link-bytes", "kill-all", "list", "cleanup"};
  bool known_command = false;
  for (const char* c : kCommands) known_command = known_command || command == c;
  if (!known_command) return Usage("unknown subcommand '" + command + "'");
  std::map<std::string, std::string> flags;
  if (const std::string error = ParseFlags(argc, argv, &flags); !error.empty()) {
    return Usage(error);
  }
  const std::string prefix = flags.count("prefix") ? flags["prefix"] : "mlft-";

  if (command == "list" || command == "cleanup") {
    if (prefix.empty()) return Usage("--prefix must not be empty");
    const std::vector<std::string> names = command == "list"
                                               ? NetnsNetwork::ListNamespaces(prefix)
                                               : NetnsNetwork::CleanupPrefix(prefix);
    std::cout << json{{command == "list" ? "namespaces" : "removed", names}}.dump() << "\n";
    return 0;
  }
  if (command == "probe") {
    const absl::Status usable = NetnsNetwork::CheckPrerequisites(prefix);
    std::cout << json{{"available", usable.ok()}, {"reason", std::string(usable.message())}}.dump()
              << "\n";
    return 0;
  }

  NetnsLayout layout;
  layout.prefix = prefix;
  if (flags.count("hosts")) layout.hosts = absl::StrSplit(flags["hosts"], ',', absl::SkipEmpty());
  if (flags.count("subnet")) layout.subnet = flags["subnet"];
  if (flags.count("ifname")) layout.ifname = flags["ifname"];
  if (absl::Status valid = layout.Validate(); !valid.ok()) return Fail(valid);
  if (command == "layout") {
    std::cout << LayoutJson(layout, nullptr).dump() << "\n";
    return 0;
  }
  if (command == "create") {
    bool bad = false;
    const double rate_bps = Rate(flags, "rate_bps", &bad).value_or(1e9);
    if (bad) return Usage("--rate_bps must be a positive number");
    auto network = NetnsNetwork::Create(layout, rate_bps);
    if (!network.ok()) return Fail(network.status());
    (*network)->Release();  // it outlives this process: `destroy` deletes it
    std::cout << LayoutJson(layout, network->get()).dump() << "\n";
    return 0;
  }
  auto network = NetnsNetwork::Attach(layout);
  if (!network.ok()) return Fail(network.status());
  return RunOnNetwork(command, layout, flags, **network);
}

}  // namespace
}  // namespace mlfabric::testing

int main(int argc, char** argv) { return mlfabric::testing::Main(argc, argv); }
