// The data plane's benchmarks, printed as one table (daemon/README.md):
//
//   bazel run -c opt //bench:dataplane_benchmark [-- --gib=1 --rounds=3]
//   ... -- --json FILE           also writes the run in the structure of
//                                docs/results/dataplane.json (docs/results.md
//                                §4), or adds it to FILE when FILE exists
//   ... -- --compare_auth=true   adds sets with data-plane authentication off
//                                and on, alternated, and their ratio
//   ... -- --compare_encryption=true  the same with payload encryption on
//                                (data_plane_encryption) against authentication
//                                alone, with each one's CPU per GB
//
//  1. Daemon-to-daemon goodput over loopback: the real scheduler (FIFO
//     planner, so each transfer starts at once), two real mlfabricd and a
//     pusher/server pair; 1 GiB pushes, one at a time, timed by the
//     receiving daemon's own arrival trace (first packet to last byte). The
//     baseline is a raw Boost.Asio TCP stream on the same loopback path in
//     this process: the same bytes in the same 32 KiB + 44-byte frames,
//     blocking writes and reads, no CRC, no queue, no pacing, into a warm
//     buffer — and once more into a fresh memfd mapping, as the daemon
//     receives, to show what first-touch page faults cost. Rounds alternate
//     raw and daemon transfers so both see the same load; medians are
//     printed. Target: the daemon reaches >= 95% of the raw socket.
//  3. Weighted-sum kernel GB/s against memcpy on the same buffers:
//     //aggregator:reduce_benchmark's 64 MiB float32 rows (target >= 80%).
//  4. CPU seconds per GB moved, of the sending and the receiving daemon
//     (user + system from /proc, over the pushes only), and their context
//     switches per MiB (every thread's, /proc/<pid>/task/*/status).
// Benchmark 2 (preemption on a shaped link) needs network namespaces:
// //bench:preemption_benchmark.
//
// Every ratio is taken within one run on one machine; absolute figures
// depend on the machine and on what else runs on it.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "common/config.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/apps/dataplane_trace.h"

namespace mlfabric::bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using launch::BinaryPath;
using launch::ReadFile;
using launch::WaitUntil;
// Keys kept in the order written, as docs/results/ files read.
using Json = nlohmann::ordered_json;

constexpr size_t kPayloadBytes = 32 << 10;  // the daemon's default
constexpr size_t kHeaderBytes = 44;         // Mercury header (daemon/transport/packet.h)

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// Raw Asio baseline: one TCP connection on loopback, the same framing
// sizes, blocking writes of header + payload (gathered, as the daemon
// does) and reads straight into the destination buffer. With
// `fresh_sink`, the destination is a new shared-memory mapping (memfd, as
// the daemon's receive buffers are), so its page faults are paid during
// the transfer; otherwise a buffer faulted in beforehand.
double MeasureRawSocket(const std::vector<uint8_t>& source, bool fresh_sink) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const uint16_t port = acceptor.local_endpoint().port();
  const size_t bytes = source.size();
  std::vector<uint8_t> warm_sink;
  uint8_t* sink = nullptr;
  int fd = -1;
  if (fresh_sink) {
    fd = ::memfd_create("raw-sink", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return 0;
    void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) return 0;
    sink = static_cast<uint8_t*>(mapped);
  } else {
    warm_sink.assign(bytes, 0);
    sink = warm_sink.data();
  }
  double seconds = 0;
  std::thread receiver([&] {
    tcp::socket socket(io);
    acceptor.accept(socket);
    socket.set_option(tcp::no_delay(true));
    uint8_t header[kHeaderBytes];
    double first = -1;
    for (size_t offset = 0; offset < bytes; offset += kPayloadBytes) {
      asio::read(socket, asio::buffer(header, sizeof(header)));
      if (first < 0) first = Now();
      const size_t length = std::min(kPayloadBytes, bytes - offset);
      asio::read(socket, asio::buffer(sink + offset, length));
    }
    seconds = Now() - first;
  });
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  socket.set_option(tcp::no_delay(true));
  uint8_t header[kHeaderBytes] = {};
  for (size_t offset = 0; offset < bytes; offset += kPayloadBytes) {
    const size_t length = std::min(kPayloadBytes, bytes - offset);
    std::array<asio::const_buffer, 2> frame = {asio::buffer(header, sizeof(header)),
                                               asio::buffer(source.data() + offset, length)};
    asio::write(socket, frame);
  }
  receiver.join();
  if (fresh_sink) {
    ::munmap(sink, bytes);
    ::close(fd);
  }
  return static_cast<double>(bytes) / seconds;
}

// iperf3 (the named reference) on the same loopback path: one TCP
// stream of `bytes` with its default 128 KiB writes, as its receiver
// measured it. nullopt when iperf3 is not installed (tools/deps/bench.deb)
// or did not run.
std::optional<double> MeasureIperf3(int64_t bytes) {
  const std::string iperf = "/usr/bin/iperf3";
  if (::access(iperf.c_str(), X_OK) != 0) return std::nullopt;
  uint16_t port = 0;
  {
    asio::io_context io;
    tcp::acceptor probe(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = probe.local_endpoint().port();
  }
  const std::string dir = launch::MakeTempDir("iperf3");
  auto server = launch::Subprocess::Start(
      {iperf, "-s", "-1", "-B", "127.0.0.1", "-p", std::to_string(port)}, dir + "/server.log");
  if (!server.ok()) return std::nullopt;
  for (int attempt = 0; attempt < 50; ++attempt) {
    // A file per attempt: an attempt made before the server listened
    // leaves its own error report.
    const std::string json = absl::StrCat(dir, "/client", attempt, ".json");
    auto client = launch::Subprocess::Start({iperf, "-c", "127.0.0.1", "-p", std::to_string(port),
                                             "-n", std::to_string(bytes), "-J"},
                                            json);
    if (!client.ok()) return std::nullopt;
    const std::optional<int> code = (*client)->WaitFor(120);
    // iperf3 -J exits 0 even when it could not connect; the report says.
    auto report = nlohmann::json::parse(ReadFile(json), nullptr, false);
    const bool refused = !report.is_discarded() && report.contains("error") &&
                         report["error"].is_string() &&
                         report["error"].get<std::string>().find("unable to connect") !=
                             std::string::npos;
    if (code.has_value() && *code == 0 && !refused) {
      if (report.is_discarded()) return std::nullopt;
      const auto& received = report["end"]["sum_received"]["bits_per_second"];
      if (!received.is_number()) return std::nullopt;
      (*server)->Stop();
      return received.get<double>() / 8;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // server not listening yet
  }
  (*server)->Stop();
  return std::nullopt;
}

struct Round {
  double daemon_bytes_per_s = 0;
  double iperf3_bytes_per_s = 0;     // 0: not measured
  double raw_bytes_per_s = 0;        // warm destination buffer
  double raw_fresh_bytes_per_s = 0;  // fresh memfd destination, like the daemon's
  double sender_cpu_s_per_gb = 0;
  double receiver_cpu_s_per_gb = 0;
  double sender_switches_per_mib = 0;  // context switches, all threads
  double receiver_switches_per_mib = 0;
};

// Rounds alternate the daemon and the raw socket so both see the same
// machine load; each round's daemon transfer is timed by the receiving
// daemon's own arrival trace (first packet to last byte).
// `plane`: the data plane's session handshake and job proofs
// (daemon/transport/data_auth.h), on by default; off, or with payload
// encryption too (payload_cipher.h), for the comparisons.
enum class DataPlane { kPlain, kAuthenticated, kEncrypted };

const char* Describe(DataPlane plane) {
  switch (plane) {
    case DataPlane::kPlain: return "authentication off";
    case DataPlane::kAuthenticated: return "authentication on";
    case DataPlane::kEncrypted: return "authentication and encryption on";
  }
  return "";
}

// The two daemons' CPU time and context switches at one moment of a round.
struct DaemonCounters {
  absl::StatusOr<double> sender_cpu, receiver_cpu;
  absl::StatusOr<int64_t> sender_switches, receiver_switches;
};

DaemonCounters ReadCounters(launch::Cluster& c) {
  return {ProcessCpuSeconds(c.daemon("w1").pid()), ProcessCpuSeconds(c.daemon("s1").pid()),
          ProcessContextSwitches(c.daemon("w1").pid()),
          ProcessContextSwitches(c.daemon("s1").pid())};
}

// The daemons' CPU per GB and context switches per MiB of transfer `a`,
// from the counters before and after it (left at 0 where one is missing).
void SetDaemonCosts(const DaemonCounters& before, const DaemonCounters& after, const Arrival& a,
                    Round* round) {
  const double gb = a.bytes / 1e9;
  if (before.sender_cpu.ok() && after.sender_cpu.ok()) {
    round->sender_cpu_s_per_gb = (*after.sender_cpu - *before.sender_cpu) / gb;
  }
  if (before.receiver_cpu.ok() && after.receiver_cpu.ok()) {
    round->receiver_cpu_s_per_gb = (*after.receiver_cpu - *before.receiver_cpu) / gb;
  }
  const double mib = a.bytes / double{1 << 20};
  if (before.sender_switches.ok() && after.sender_switches.ok()) {
    round->sender_switches_per_mib =
        static_cast<double>(*after.sender_switches - *before.sender_switches) / mib;
  }
  if (before.receiver_switches.ok() && after.receiver_switches.ok()) {
    round->receiver_switches_per_mib =
        static_cast<double>(*after.receiver_switches - *before.receiver_switches) / mib;
  }
}

// Whether the receiving daemon reused a receive buffer for its last
// transfer (its debug log says per transfer): a new one pays a page fault
// per 4 KiB.
bool PooledBuffer(const std::string& s1_log) {
  const size_t last_buffer = s1_log.rfind(" receive buffer");
  return last_buffer != std::string::npos &&
         s1_log.rfind("reusing a pooled", last_buffer) != std::string::npos &&
         s1_log.rfind("reusing a pooled", last_buffer) > s1_log.rfind('\n', last_buffer);
}

// When the sending daemon stopped checksumming the push ahead of the
// sender (it starts when the push arrives, and stops when it is done or
// the transfer's first packet goes, after which the sender sums each
// packet itself), relative to the first packet: ~0 = the transfer began
// before all packets were summed ahead.
std::string ChecksumsAhead(const std::string& w1_log) {
  // Sealed sessions have no checksums (the tag replaces the CRC).
  std::string checksums = "no checksums ahead";
  const size_t done = w1_log.rfind(" s, done at ");
  const size_t sending = w1_log.rfind("sending transfer ");
  if (done != std::string::npos && sending != std::string::npos) {
    const double done_s = std::atof(w1_log.c_str() + done + 12);
    const size_t from = w1_log.find(" from ", sending);
    const double first_s = std::atof(w1_log.c_str() + from + 6);
    checksums = absl::StrFormat("checksums ahead until %+.0f ms from the first packet",
                                1e3 * (done_s - first_s));
  }
  return checksums;
}

absl::StatusOr<std::vector<Round>> MeasureRounds(int64_t bytes, int rounds,
                                                 DataPlane plane = DataPlane::kAuthenticated) {
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1"},
      // The warm-up round's receive buffer is new: on the development VM
      // first touching a fresh GiB took 7-10 s, past the default 10 s a
      // transfer may run over its planned end before it is failed.
      {"--planner=fifo", "--transfer_slack_s=120",
       plane == DataPlane::kPlain ? "--data_plane_auth=false" : "--data_plane_auth=true",
       plane == DataPlane::kEncrypted ? "--data_plane_encryption=true"
                                      : "--data_plane_encryption=false"},
      // Pacing far above loopback speed: the path, not the token bucket, limits.
      {"--log_level=debug", "--uplink_bps=1e12", "--downlink_bps=1e12"});
  if (!cluster.ok()) return cluster.status();
  launch::Cluster& c = **cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + c.Socket("s1"), "--verify=false"});
  if (!server.ok()) return server.status();
  const std::vector<uint8_t> source(static_cast<size_t>(bytes), 1);
  std::vector<Round> out;
  // Round 0 warms up: the receiving daemon's first transfer of a size gets
  // a new buffer (a page fault per 4 KiB); a running daemon reuses them, as
  // training pushes the same sizes every iteration. It is printed, not
  // counted.
  for (int r = 0; r <= rounds; ++r) {
    Round round;
    round.raw_bytes_per_s = MeasureRawSocket(source, /*fresh_sink=*/false);
    round.iperf3_bytes_per_s = MeasureIperf3(bytes).value_or(0);
    const std::string go_file = absl::StrCat(c.dir(), "/go", r);
    auto pusher = c.StartApp(
        absl::StrCat("pusher", r),
        {BinaryPath("testing/apps/dataplane_pusher"), "--socket=" + c.Socket("w1"),
         absl::StrCat("--name=bench", r), "--bytes=" + std::to_string(bytes),
         absl::StrCat("--seed=", r + 1), "--go_file=" + go_file});
    if (!pusher.ok()) return pusher.status();
    if (!WaitUntil([&] { return (*pusher)->Log().find("ready") != std::string::npos; }, 60)) {
      return absl::DeadlineExceededError("the pusher did not start: " + (*pusher)->Log());
    }
    const DaemonCounters before = ReadCounters(c);
    std::ofstream(go_file) << "go\n";
    if ((*pusher)->WaitFor(600) != 0) {
      return absl::InternalError("the push was not applied: " + (*pusher)->Log());
    }
    const DaemonCounters after = ReadCounters(c);
    const std::vector<Arrival> arrivals = ParseArrivals(c.daemon("s1").Log());
    if (arrivals.size() != static_cast<size_t>(r + 1)) {  // one per push, warm-up included
      return absl::DataLossError(absl::StrCat("expected ", r + 1, " arrival lines in the ",
                                              "receiving daemon's log, found ", arrivals.size()));
    }
    const Arrival& a = arrivals.back();
    round.daemon_bytes_per_s = a.bytes / (a.complete_s - a.first_packet_s);
    SetDaemonCosts(before, after, a, &round);
    round.raw_fresh_bytes_per_s = MeasureRawSocket(source, /*fresh_sink=*/true);
    const bool pooled = PooledBuffer(c.daemon("s1").Log());
    const std::string checksums = ChecksumsAhead(c.daemon("w1").Log());
    std::printf("  %s %d: daemon %.2f GB/s (%s receive buffer; %s), iperf3 %.2f GB/s, raw socket "
                "%.2f GB/s (fresh memfd sink %.2f GB/s), daemon CPU %.3f + %.3f s/GB\n",
                r == 0 ? "warm-up" : "round", r, round.daemon_bytes_per_s / 1e9,
                pooled ? "pooled" : "new", checksums.c_str(), round.iperf3_bytes_per_s / 1e9,
                round.raw_bytes_per_s / 1e9, round.raw_fresh_bytes_per_s / 1e9,
                round.sender_cpu_s_per_gb, round.receiver_cpu_s_per_gb);
    if (r > 0) out.push_back(round);
  }
  return out;
}

// The reduce benchmark's float32 64 MiB row: memcpy, 1-thread and multi GB/s.
struct ReduceRow {
  double memcpy_gbps = 0, single_gbps = 0, multi_gbps = 0;
  std::string output;
};

ReduceRow MeasureReduce() {
  ReduceRow row;
  const std::string log = launch::MakeTempDir("reduce") + "/reduce.log";
  auto process = launch::Subprocess::Start({BinaryPath("aggregator/reduce_benchmark")}, log);
  if (!process.ok() || (*process)->WaitFor(300) != 0) return row;
  row.output = ReadFile(log);
  std::istringstream lines(row.output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string type, single_pct, multi_pct;
    long long size = 0;
    if (fields >> type >> size >> row.memcpy_gbps >> row.single_gbps >> single_pct >>
            row.multi_gbps >> multi_pct &&
        type == "float32" && size == (64 << 20)) {
      return row;
    }
  }
  row = ReduceRow{0, 0, 0, row.output};
  return row;
}

// The table of benchmarks 1, 3 and 4 (medians over `rounds`, of
// `rounds_count` rounds of `gib` GiB each).
void PrintTable(const std::vector<Round>& rounds, const ReduceRow& reduce, double gib,
                int64_t rounds_count) {
  auto median = [&](double Round::*field) {
    std::vector<double> values;
    for (const Round& r : rounds) values.push_back(r.*field);
    return Median(values);
  };
  // Rounds where iperf3 did not run (printed as 0.00) are left out of its figures.
  std::vector<double> ratios, fresh_ratios, iperf3_ratios;
  for (const Round& r : rounds) {
    if (r.iperf3_bytes_per_s > 0) iperf3_ratios.push_back(r.daemon_bytes_per_s / r.iperf3_bytes_per_s);
    ratios.push_back(r.daemon_bytes_per_s / r.raw_bytes_per_s);
    fresh_ratios.push_back(r.daemon_bytes_per_s / r.raw_fresh_bytes_per_s);
  }
  const double daemon = median(&Round::daemon_bytes_per_s);
  const double raw = median(&Round::raw_bytes_per_s);
  const double raw_fresh = median(&Round::raw_fresh_bytes_per_s);
  std::printf("\n| # | figure (median of %lld rounds) | measured | target |\n"
              "| --- | --- | --- | --- |\n",
              static_cast<long long>(rounds_count));
  std::printf("| 1 | daemon-to-daemon goodput, loopback, %.2f GiB transfers | %.2f GB/s (%.1f Gbit/s) | |\n",
              gib, daemon / 1e9, daemon * 8 / 1e9);
  if (iperf3_ratios.empty()) {
    std::printf("| 1 | iperf3, same path | not measured: /usr/bin/iperf3 is missing (tools/bootstrap installs it) | |\n");
  } else {
    std::vector<double> measured;
    for (const Round& r : rounds) {
      if (r.iperf3_bytes_per_s > 0) measured.push_back(r.iperf3_bytes_per_s);
    }
    const double iperf3 = Median(measured);
    std::printf("| 1 | iperf3, same path, one stream | %.2f GB/s (%.1f Gbit/s) | |\n", iperf3 / 1e9,
                iperf3 * 8 / 1e9);
  }
  std::printf("| 1 | raw Asio socket, same path and frames, warm buffer | %.2f GB/s (%.1f Gbit/s) | |\n",
              raw / 1e9, raw * 8 / 1e9);
  std::printf("| 1 | raw Asio socket into a fresh memfd buffer | %.2f GB/s (%.1f Gbit/s) | |\n",
              raw_fresh / 1e9, raw_fresh * 8 / 1e9);
  if (!iperf3_ratios.empty()) {
    std::printf("| 1 | daemon / iperf3 (per-round ratio) | %.0f%% | >= 95%% |\n",
                100 * Median(iperf3_ratios));
  }
  std::printf("| 1 | daemon / raw socket (per-round ratio) | %.0f%% | >= 95%% |\n",
              100 * Median(ratios));
  std::printf("| 1 | daemon / raw socket into fresh memfd | %.0f%% | |\n",
              100 * Median(fresh_ratios));
  std::printf("| 3 | weighted sum float32 64 MiB, 1 thread / memcpy | %.2f / %.2f GB/s = %.0f%% | >= 80%% |\n",
              reduce.single_gbps, reduce.memcpy_gbps, 100 * reduce.single_gbps / reduce.memcpy_gbps);
  std::printf("| 3 | weighted sum float32 64 MiB, multi-thread / memcpy | %.2f / %.2f GB/s = %.0f%% | >= 80%% |\n",
              reduce.multi_gbps, reduce.memcpy_gbps, 100 * reduce.multi_gbps / reduce.memcpy_gbps);
  std::printf("| 4 | sending daemon CPU per GB moved | %.3f CPU-s/GB | |\n",
              median(&Round::sender_cpu_s_per_gb));
  std::printf("| 4 | receiving daemon CPU per GB moved | %.3f CPU-s/GB | |\n",
              median(&Round::receiver_cpu_s_per_gb));
  std::printf("| 4 | sending / receiving daemon context switches per MiB moved | %.2f / %.2f | "
              "<= 4 (1 per 256 KiB) |\n",
              median(&Round::sender_switches_per_mib), median(&Round::receiver_switches_per_mib));
}

// What a comparison of two data planes found: goodput with / without (the
// ratio of the medians of daemon / raw socket) and the sending daemon's CPU
// per GB with and without.
struct Comparison {
  double goodput_ratio = 0, cpu_with = 0, cpu_without = 0;
};

// Sets of the compared setting and the table's (authentication on),
// alternated (table, other, table, other); each round normalised by the
// raw socket of the same round, so the machine's load cancels out.
std::optional<Comparison> CompareDataPlanes(const std::vector<Round>& rounds, int64_t bytes,
                                            int64_t rounds_count, DataPlane other,
                                            const char* what) {
  std::vector<Round> base = rounds, others;
  for (int set = 0; set < 3; ++set) {
    const DataPlane plane = set == 1 ? DataPlane::kAuthenticated : other;
    std::printf("%s, set %d:\n", Describe(plane), set + 2);
    auto more = MeasureRounds(bytes, static_cast<int>(rounds_count), plane);
    if (!more.ok()) {
      std::fprintf(stderr, "dataplane_benchmark: %s\n",
                   std::string(more.status().message()).c_str());
      return std::nullopt;
    }
    auto& into = plane == DataPlane::kAuthenticated ? base : others;
    into.insert(into.end(), more->begin(), more->end());
  }
  auto ratio = [](const std::vector<Round>& rs) {
    std::vector<double> v;
    for (const Round& r : rs) v.push_back(r.daemon_bytes_per_s / r.raw_bytes_per_s);
    return Median(v);
  };
  auto cpu = [](const std::vector<Round>& rs, double Round::*field) {
    std::vector<double> v;
    for (const Round& r : rs) v.push_back(r.*field);
    return Median(v);
  };
  for (const auto* rs : {&base, &others}) {
    const DataPlane plane = rs == &base ? DataPlane::kAuthenticated : other;
    std::printf("| 1 | daemon / raw socket, %s (%zu rounds) | %.0f%% | |\n", Describe(plane),
                rs->size(), 100 * ratio(*rs));
    std::printf("| 4 | sending / receiving daemon CPU per GB, %s | %.3f / %.3f CPU-s/GB | |\n",
                Describe(plane), cpu(*rs, &Round::sender_cpu_s_per_gb),
                cpu(*rs, &Round::receiver_cpu_s_per_gb));
  }
  // Authentication is measured by what it costs the plain data plane,
  // encryption by what it costs the authenticated one.
  const bool auth = other == DataPlane::kPlain;
  const std::vector<Round>& with = auth ? base : others;
  const std::vector<Round>& without = auth ? others : base;
  Comparison out{ratio(with) / ratio(without), cpu(with, &Round::sender_cpu_s_per_gb),
                 cpu(without, &Round::sender_cpu_s_per_gb)};
  std::printf("| 1 | goodput %s (ratio of the medians) | %.0f%% | %s |\n", what,
              100 * out.goodput_ratio, auth ? ">= 95%" : "");
  return out;
}

// The run's figures as docs/results/dataplane.json holds them (the §4 table
// of docs/results.md): the per-round goodput ratio's median, and the
// daemons' CPU per GB and context switches per MiB as ranges over runs.
Json RunJson(const std::vector<Round>& rounds) {
  auto median = [&](double Round::*field) {
    std::vector<double> values;
    for (const Round& r : rounds) values.push_back(r.*field);
    return Median(values);
  };
  std::vector<double> ratios;
  for (const Round& r : rounds) ratios.push_back(r.daemon_bytes_per_s / r.raw_bytes_per_s);
  auto range = [](double v) { return Json{{"min", v}, {"max", v}}; };
  return {{"goodput_daemon_over_raw", {Median(ratios)}},
          {"cpu_s_per_gb",
           {{"sending", range(median(&Round::sender_cpu_s_per_gb))},
            {"receiving", range(median(&Round::receiver_cpu_s_per_gb))}}},
          {"context_switches_per_mib",
           {{"sending", range(median(&Round::sender_switches_per_mib))},
            {"receiving", range(median(&Round::receiver_switches_per_mib))}}}};
}

// A {min, max} range widened to hold `more`'s.
Json Widen(const Json& range, const Json& more) {
  return {{"min", std::min(range.at("min").get<double>(), more.at("min").get<double>())},
          {"max", std::max(range.at("max").get<double>(), more.at("max").get<double>())}};
}

// `run` (RunJson) added to `file`, the figures of earlier runs: the goodput
// ratios appended, the ranges widened.
void AddRun(const Json& run, Json* file) {
  auto& goodput = (*file)["goodput_daemon_over_raw"];
  goodput.push_back(run["goodput_daemon_over_raw"][0]);
  for (const char* figure : {"cpu_s_per_gb", "context_switches_per_mib"}) {
    for (const char* daemon : {"sending", "receiving"}) {
      (*file)[figure][daemon] = Widen((*file)[figure][daemon], run[figure][daemon]);
    }
  }
}

// The short commit of the tree this runs from (bazel run's workspace), or
// null.
Json Commit() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string command = absl::StrCat("git -C '", workspace ? workspace : ".",
                                           "' rev-parse --short HEAD 2>/dev/null");
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[64];
    while (std::fgets(buffer, sizeof(buffer), pipe)) out += buffer;
    ::pclose(pipe);
  }
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  return out.empty() ? Json(nullptr) : Json(out);
}

// The command that measured this run, without --json.
std::string MeasuredCommand(int argc, char** argv) {
  std::string command = "bazel run -c opt //bench:dataplane_benchmark --";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      ++i;
    } else if (arg.rfind("--json=", 0) != 0) {
      absl::StrAppend(&command, " ", arg);
    }
  }
  return command;
}

// A relative --json path is taken from where `bazel run` was started.
std::string JsonPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  return path.empty() || path[0] == '/' || !cwd ? path : absl::StrCat(cwd, "/", path);
}

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char date[16];
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  return date;
}

// `a` and `b` joined by `word` unless `a` already holds `b`.
std::string Join(const std::string& a, const std::string& word, const std::string& b) {
  return a.empty() || a.find(b) != std::string::npos ? (a.empty() ? b : a) : a + word + b;
}

constexpr const char* kJsonNote =
    "Written by dataplane_benchmark --json: goodput_daemon_over_raw is the 'daemon / raw socket "
    "(per-round ratio)' median of each run; the CPU (CPU-s per GB moved) and context-switch "
    "(per MiB) figures are the range over the runs ({min, max}) of each run's medians; "
    "encryption and authentication are goodput with / without (ratio of the medians) and the "
    "sending daemon's CPU per GB with and without. A run with --json FILE adds itself to FILE "
    "when it exists; preemption is //bench:preemption_benchmark's (root), kept from the file. "
    "targets are the goals, not measurements.";

// The runs `path` holds already (checked before this run starts), or a new
// file's first fields.
absl::StatusOr<Json> EarlierRuns(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0 && ::access(path.substr(0, slash).c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--json ", path, ": no writable directory ", path.substr(0, slash)));
  }
  std::ifstream in(path);
  if (!in) {
    return Json{{"what", "The data plane: 1 GiB pushes between two daemons over loopback against "
                         "a raw Asio socket pair with the same frames; payload encryption, "
                         "authentication and preemption on a shaped link (docs/results.md §4)"},
                {"date", ""}, {"commit", nullptr}, {"command", Json::array()}, {"note", ""}};
  }
  Json file = Json::parse(in, nullptr, false);
  if (file.is_discarded() || !file.contains("goodput_daemon_over_raw") ||
      !file["goodput_daemon_over_raw"].is_array() || !file.contains("cpu_s_per_gb") ||
      !file.contains("context_switches_per_mib") || !file["date"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--json ", path, ": exists but is not the JSON of dataplane_benchmark runs "
        "(docs/results/dataplane.json's structure)"));
  }
  return file;
}

// Writes `file` (EarlierRuns) with this run's figures added to `path`, in
// the structure of docs/results/dataplane.json.
absl::Status WriteJson(const std::string& path, Json file, const Json& run,
                       const std::optional<Comparison>& auth,
                       const std::optional<Comparison>& encryption, const std::string& command) {
  if (file.contains("goodput_daemon_over_raw")) {
    AddRun(run, &file);
  } else {
    file.update(run);
  }
  file["date"] = Join(file["date"].get<std::string>(), " to ", Today());
  const Json commit = Commit();
  if (commit.is_string()) {
    file["commit"] = Join(file["commit"].is_string() ? file["commit"].get<std::string>() : "",
                          " and ", commit.get<std::string>());
  }
  if (!file["command"].is_array()) file["command"] = Json::array({file["command"]});
  if (std::find(file["command"].begin(), file["command"].end(), command) == file["command"].end()) {
    file["command"].push_back(command);
  }
  file["note"] = kJsonNote;
  if (encryption) {
    file["encryption"] = {{"goodput_ratio", encryption->goodput_ratio},
                          {"cpu_s_per_gb_with", encryption->cpu_with},
                          {"cpu_s_per_gb_without", encryption->cpu_without}};
  }
  if (auth) file["authentication"] = {{"date", Today()}, {"goodput_ratio", auth->goodput_ratio}};
  if (!file.contains("targets")) {
    file["targets"] = {{"goodput", "≥ 95 %"}, {"cpu", "≤ 1.5× the raw socket's"},
                       {"context_switches", "≤ 4 per MiB"}, {"encryption", "≥ 80 %"},
                       {"authentication", "≥ 95 %"}, {"preemption", "≤ 2 packet-times"}};
  }
  std::ofstream out(path + ".tmp");
  out << file.dump(2) << "\n";
  if (!out.flush() || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--json ", path, ": cannot write it"));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "dataplane_benchmark: " << cl.status().message() << "\n";
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  double gib = 1;
  int64_t rounds_count = 3;
  reader.Double("gib", &gib, 0.01, 8);
  reader.Int("rounds", &rounds_count, 1, 100);
  bool compare_auth = false;
  reader.Bool("compare_auth", &compare_auth);
  bool compare_encryption = false;
  reader.Bool("compare_encryption", &compare_encryption);
  std::string json_path;
  reader.String("json", &json_path);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "dataplane_benchmark: " << status.message() << "\n";
    return 2;
  }
  json_path = JsonPath(json_path);
  absl::StatusOr<Json> earlier = json_path.empty() ? Json::object() : EarlierRuns(json_path);
  if (!earlier.ok()) {
    std::cerr << "dataplane_benchmark: " << earlier.status().message() << "\n";
    return 2;
  }
  const int64_t bytes = static_cast<int64_t>(gib * (1 << 30)) / 4 * 4;
  std::printf("dataplane_benchmark: %lld rounds of %.2f GiB, %zu KiB packets, %u CPUs\n",
              static_cast<long long>(rounds_count), gib, kPayloadBytes >> 10,
              std::thread::hardware_concurrency());

  std::printf("benchmarks 1 and 4: %lld rounds of (raw socket, daemon, raw socket into a fresh "
              "memfd) over loopback\n",
              static_cast<long long>(rounds_count));
  auto rounds = MeasureRounds(bytes, static_cast<int>(rounds_count));
  if (!rounds.ok()) {
    std::fprintf(stderr, "dataplane_benchmark: %s\n", std::string(rounds.status().message()).c_str());
    return 1;
  }
  std::printf("benchmark 3: //aggregator:reduce_benchmark\n");
  const ReduceRow reduce = MeasureReduce();
  if (reduce.memcpy_gbps <= 0) {
    std::fprintf(stderr, "dataplane_benchmark: no float32 64 MiB row from reduce_benchmark:\n%s",
                 reduce.output.c_str());
    return 1;
  }
  PrintTable(*rounds, reduce, gib, rounds_count);
  std::optional<Comparison> auth, encryption;
  if (compare_auth &&
      !(auth = CompareDataPlanes(*rounds, bytes, rounds_count, DataPlane::kPlain,
                                 "with authentication / without"))) {
    return 1;
  }
  if (compare_encryption &&
      !(encryption = CompareDataPlanes(*rounds, bytes, rounds_count, DataPlane::kEncrypted,
                                       "with encryption / without"))) {
    return 1;
  }
  if (!json_path.empty()) {
    const absl::Status written =
        WriteJson(json_path, *std::move(earlier), RunJson(*rounds), auth, encryption,
                  MeasuredCommand(argc, argv));
    if (!written.ok()) {
      std::cerr << "dataplane_benchmark: " << written.message() << "\n";
      return 1;
    }
    std::printf("dataplane_benchmark: wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mlfabric::bench

int main(int argc, char** argv) { return mlfabric::bench::Main(argc, argv); }
