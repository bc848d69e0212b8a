#include "tools/run/elastic_plan.h"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"

namespace mlfabric::run {

absl::StatusOr<std::vector<HostfileEntry>> ParseDiscoveryOutput(const std::string& text,
                                                                const std::string& script) {
  std::vector<HostfileEntry> entries;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string content(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (content.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("host discovery script ", script,
                                                     ": line ", number, " '", content, "': ", why,
                                                     " (expected host or host:slots)"));
    };
    if (content.find_first_of(" \t") != std::string::npos) return bad("more than one word");
    HostfileEntry entry;
    const size_t colon = content.rfind(':');
    entry.host = content.substr(0, colon);
    if (colon != std::string::npos &&
        (!absl::SimpleAtoi(content.substr(colon + 1), &entry.slots) || entry.slots < 1)) {
      return bad("slots must be an integer >= 1");
    }
    if (entry.host.empty()) return bad("no host name");
    if (!seen.insert(entry.host).second) return bad("host listed twice");
    entries.push_back(entry);
  }
  return entries;
}

std::vector<RankStop> ElasticPlan::SetHosts(const std::vector<HostfileEntry>& hosts) {
  hosts_.clear();
  std::map<std::string, int> slots;
  for (const HostfileEntry& entry : hosts) {
    if (blacklisted(entry.host)) continue;
    hosts_.push_back(entry);
    slots[entry.host] = entry.slots;
  }
  for (auto it = started_hosts_.begin(); it != started_hosts_.end();) {
    it = slots.count(*it) ? std::next(it) : started_hosts_.erase(it);
  }
  std::vector<RankStop> stops;
  for (auto& [number, rank] : ranks_) {
    if (rank.stopping) continue;
    auto listed = slots.find(rank.host);
    if (listed != slots.end() && rank.slot < listed->second) continue;
    rank.stopping = true;
    stops.push_back({number, rank.host, listed == slots.end()});
  }
  return stops;
}

std::vector<RankStart> ElasticPlan::Fill() {
  std::vector<RankStart> starts;
  if (finishing_) return starts;
  std::set<std::pair<std::string, int>> taken;
  for (const auto& [number, rank] : ranks_) taken.insert({rank.host, rank.slot});
  int next = 0;
  for (const HostfileEntry& host : hosts_) {
    // alive() counts the starts so far: they are held as they are made.
    for (int slot = 0; slot < host.slots && alive() < limits_.max_np; ++slot) {
      if (taken.count({host.host, slot})) continue;
      while (ranks_.count(next)) ++next;
      RankStart start;
      start.rank = next++;
      start.host = host.host;
      start.slot = slot;
      start.host_slots = host.slots;
      start.host_appeared = started_hosts_.count(host.host) == 0;
      starts.push_back(start);
      // Held already, so that the next number is free.
      ranks_[start.rank] = Rank{host.host, slot, false};
    }
  }
  if (running() < limits_.min_np) {
    // Not enough to run: start none, wait for more slots.
    for (const RankStart& start : starts) ranks_.erase(start.rank);
    starts.clear();
  }
  for (RankStart& start : starts) {
    started_hosts_.insert(start.host);
    start.size = running();
    start.local_size = 0;
    for (const auto& [number, rank] : ranks_) {
      start.local_size += rank.host == start.host && !rank.stopping ? 1 : 0;
    }
  }
  return starts;
}

std::string ElasticPlan::Exited(int number, int code, bool stopped) {
  auto found = ranks_.find(number);
  if (found == ranks_.end()) return absl::StrCat("rank ", number, " is not known");
  const std::string host = found->second.host;
  ranks_.erase(found);
  std::string said = absl::StrCat("rank ", number, " on ", host, " exited with ", code);
  if (stopped) return said + " (stopped)";
  if (code == 0) {
    if (!finishing_) said += "; the job is finishing: no rank starts or is replaced from now";
    finishing_ = true;
    return said;
  }
  if (finishing_) {
    if (exit_code_ == 0) exit_code_ = code;
    return said + "; not replaced, the job is finishing";
  }
  const int failures = ++failures_[host];
  absl::StrAppend(&said, ": failure ", failures, " of ", limits_.host_failure_limit, " on ",
                  host);
  if (failures >= limits_.host_failure_limit) {
    blacklist_.insert(host);
    hosts_.erase(std::remove_if(hosts_.begin(), hosts_.end(),
                                [&](const HostfileEntry& entry) { return entry.host == host; }),
                 hosts_.end());
    return said + "; " + host + " is blacklisted: no rank starts there again";
  }
  const bool listed = std::any_of(hosts_.begin(), hosts_.end(),
                                  [&](const HostfileEntry& entry) { return entry.host == host; });
  return said + (listed ? "; replacing it" : "; not replaced, its host is not listed");
}

int ElasticPlan::running() const {
  int count = 0;
  for (const auto& [number, rank] : ranks_) count += rank.stopping ? 0 : 1;
  return count;
}

std::vector<std::string> ElasticPlan::hosts() const {
  std::vector<std::string> names;
  for (const HostfileEntry& host : hosts_) names.push_back(host.host);
  return names;
}

std::vector<int> ElasticPlan::RanksOn(const std::string& host) const {
  std::vector<int> numbers;
  for (const auto& [number, rank] : ranks_) {
    if (rank.host == host) numbers.push_back(number);
  }
  return numbers;
}

}  // namespace mlfabric::run
