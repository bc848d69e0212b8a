#include "daemon/nicprio/tc_commands.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mlfabric::nicprio {
namespace {

// tc reads a bare number as BYTES per second; always give units.
std::string Rate(double bps) {
  return absl::StrCat(std::max<int64_t>(1, std::llround(bps / 1000)), "kbit");
}

absl::Status Validate(const NicPrioConfig& config, const std::vector<NicJob>& jobs,
                      const std::vector<size_t>& ranking) {
  const std::string& dev = config.interface;
  if (dev.empty() || dev.size() > 15 ||
      dev.find_first_of(" /\t\n:") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interface '", dev, "' is not a valid Linux interface name"));
  }
  if (!(config.link_rate_bps >= 1000) || !std::isfinite(config.link_rate_bps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("link_rate_bps must be >= 1000, got ", config.link_rate_bps));
  }
  if (!(config.min_rate_bps >= 1000) || config.min_rate_bps > config.link_rate_bps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_rate_bps must be in [1000, link_rate_bps], got ", config.min_rate_bps));
  }
  if (config.max_bands < 1 || config.max_bands > 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bands must be in 1..7, got ", config.max_bands));
  }
  if (jobs.empty()) return absl::InvalidArgumentError("no jobs");
  if (jobs.size() > kMaxJobs) {
    return absl::InvalidArgumentError(
        absl::StrCat(jobs.size(), " jobs; at most ", kMaxJobs, " are supported"));
  }
  absl::flat_hash_map<uint16_t, size_t> port_owner;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].ports.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", jobs[i].name, "' has no ports"));
    }
    for (uint16_t port : jobs[i].ports) {
      if (port == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("job '", jobs[i].name, "': port 0 is not a server port"));
      }
      auto [it, inserted] = port_owner.emplace(port, i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "port ", port, " is listed for job '", jobs[it->second].name,
            "' and job '", jobs[i].name, "'"));
      }
    }
  }
  std::vector<size_t> sorted = ranking;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != i) sorted.clear();
  }
  if (sorted.size() != jobs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranking [", absl::StrJoin(ranking, ","),
        "] is not a permutation of the ", jobs.size(), " job indices"));
  }
  return absl::OkStatus();
}

TcCommand JobClass(const NicPrioConfig& config, const char* verb, size_t job,
                   int band) {
  return {"tc", "class", verb, "dev", config.interface, "parent", "1:1",
          "classid", JobClassId(job), "htb", "rate", Rate(config.min_rate_bps),
          "ceil", Rate(config.link_rate_bps), "prio", absl::StrCat(band)};
}

}  // namespace

std::string JobClassId(size_t index) {
  return absl::StrFormat("1:%x", 0x10 + index);
}

int BandForRank(const NicPrioConfig& config, size_t rank) {
  return static_cast<int>(std::min<size_t>(rank, config.max_bands - 1));
}

absl::StatusOr<std::vector<TcCommand>> SetupCommands(
    const NicPrioConfig& config, const std::vector<NicJob>& jobs,
    const std::vector<size_t>& ranking) {
  if (absl::Status s = Validate(config, jobs, ranking); !s.ok()) return s;
  const std::string& dev = config.interface;
  std::vector<TcCommand> commands;
  commands.push_back({"tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
                      "htb", "default", "ff"});
  commands.push_back({"tc", "class", "add", "dev", dev, "parent", "1:",
                      "classid", "1:1", "htb", "rate", Rate(config.link_rate_bps),
                      "ceil", Rate(config.link_rate_bps)});
  std::vector<int> band(jobs.size());
  for (size_t rank = 0; rank < ranking.size(); ++rank) {
    band[ranking[rank]] = BandForRank(config, rank);
  }
  for (size_t job = 0; job < jobs.size(); ++job) {
    commands.push_back(JobClass(config, "add", job, band[job]));
  }
  commands.push_back({"tc", "class", "add", "dev", dev, "parent", "1:1",
                      "classid", kDefaultClassId, "htb", "rate",
                      Rate(config.min_rate_bps), "ceil", Rate(config.link_rate_bps),
                      "prio", "7"});
  for (size_t job = 0; job < jobs.size(); ++job) {
    for (uint16_t port : jobs[job].ports) {
      for (const char* direction : {"sport", "dport"}) {
        commands.push_back({"tc", "filter", "add", "dev", dev, "parent", "1:",
                            "protocol", "ip", "prio", "1", "u32", "match", "ip",
                            direction, absl::StrCat(port), "0xffff", "flowid",
                            JobClassId(job)});
      }
    }
  }
  return commands;
}

absl::StatusOr<std::vector<TcCommand>> RankCommands(
    const NicPrioConfig& config, const std::vector<NicJob>& jobs,
    const std::vector<size_t>& ranking) {
  if (absl::Status s = Validate(config, jobs, ranking); !s.ok()) return s;
  std::vector<TcCommand> commands;
  for (size_t rank = 0; rank < ranking.size(); ++rank) {
    commands.push_back(
        JobClass(config, "change", ranking[rank], BandForRank(config, rank)));
  }
  return commands;
}

std::vector<TcCommand> TeardownCommands(const NicPrioConfig& config) {
  return {{"tc", "qdisc", "del", "dev", config.interface, "root"}};
}

std::string FormatCommand(const TcCommand& command) {
  return absl::StrJoin(command, " ");
}

}  // namespace mlfabric::nicprio
