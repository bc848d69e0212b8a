#include "testing/apps/dataplane_trace.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mlfabric::bench {

std::vector<Arrival> ParseArrivals(const std::string& daemon_log) {
  std::vector<Arrival> arrivals;
  std::istringstream lines(daemon_log);
  std::string line;
  const std::string marker = "received transfer ";
  while (std::getline(lines, line)) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + marker.size()));
    Arrival a;
    std::string bytes_key, priority_key, first_key, complete_key;
    if (fields >> a.transfer_id >> bytes_key >> a.bytes >> priority_key >> a.priority >>
            first_key >> a.first_packet_s >> complete_key >> a.complete_s &&
        bytes_key == "bytes" && priority_key == "priority" && first_key == "first_packet_s" &&
        complete_key == "complete_s") {
      arrivals.push_back(a);
    }
  }
  return arrivals;
}

std::optional<Arrival> FindArrival(const std::vector<Arrival>& arrivals, uint64_t transfer_id) {
  for (const Arrival& a : arrivals) {
    if (a.transfer_id == transfer_id) return a;
  }
  return std::nullopt;
}

std::vector<Delivered> ParseDeliveries(const std::string& server_log) {
  std::vector<Delivered> out;
  std::istringstream lines(server_log);
  std::string line;
  const std::string marker = ": update sequence ";
  while (std::getline(lines, line)) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + marker.size()));
    Delivered d;
    std::string transfer_key, bytes_key, worker_key, count_key;
    int64_t count = 0;
    if (!(fields >> d.sequence >> transfer_key >> d.transfer_id >> bytes_key >> d.bytes >>
          worker_key >> d.worker >> count_key >> count)) {
      continue;
    }
    std::getline(fields, d.verdict);
    if (!d.verdict.empty() && d.verdict[0] == ' ') d.verdict.erase(0, 1);
    out.push_back(d);
  }
  return out;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("cannot create a socket");
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string request = absl::StrCat("GET ", target,
                                           " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                           "Connection: close\r\n\r\n");
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return absl::UnavailableError("cannot send the request");
  }
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  ::close(fd);
  if (response.rfind("HTTP/1.1 200", 0) != 0) {
    return absl::UnavailableError(
        absl::StrCat("GET ", target, " answered: ", response.substr(0, 200)));
  }
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::DataLossError("response without a body");
  return response.substr(body + 4);
}

absl::StatusOr<std::vector<PlannedTransfer>> FetchPlannedTransfers(int admin_port,
                                                                   const std::string& server) {
  auto body = HttpGet(admin_port, "/api/v1/transfers");
  if (!body.ok()) return body.status();
  const nlohmann::json json = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.contains("recent") || !json["recent"].is_array()) {
    return absl::DataLossError(absl::StrCat("/api/v1/transfers is not the expected JSON: ",
                                            body->substr(0, 200)));
  }
  std::vector<PlannedTransfer> out;
  for (const nlohmann::json& t : json["recent"]) {
    if (t.value("server", "") != server) continue;
    PlannedTransfer p;
    p.transfer_id = t.value("transfer_id", uint64_t{0});
    p.batch_id = t.value("batch_id", uint64_t{0});
    p.server = server;
    p.src = t.value("src", "");
    p.bytes = t.value("bytes", int64_t{0});
    p.start_s = t.value("start_s", 0.0);
    p.end_s = t.value("end_s", 0.0);
    out.push_back(p);
  }
  return out;
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the parenthesised command name (which may hold spaces).
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("no /proc/", pid, "/stat"));
  }
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // Field 3 (state) is first here; utime and stime are fields 14 and 15.
  for (int i = 3; i < 14; ++i) fields >> field;
  long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) {
    return absl::DataLossError(absl::StrCat("cannot parse /proc/", pid, "/stat"));
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

absl::StatusOr<int64_t> ProcessContextSwitches(pid_t pid) {
  std::error_code error;
  const std::filesystem::path tasks = absl::StrCat("/proc/", pid, "/task");
  std::filesystem::directory_iterator it(tasks, error);
  if (error) return absl::NotFoundError(absl::StrCat("no ", tasks.string(), ": ", error.message()));
  int64_t total = 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) break;
    std::ifstream in(it->path() / "status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
          line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        total += std::atoll(line.c_str() + line.find(':') + 1);
      }
    }
  }
  return total;
}

}  // namespace mlfabric::bench
