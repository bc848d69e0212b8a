#include "monitor/tc_capacity.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mlfabric::monitor {

absl::StatusOr<double> ParseTcRate(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a tc rate: '", text, "'"));
  }
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit == "bit") scale = 1;
  else if (unit == "kbit") scale = 1e3;
  else if (unit == "mbit") scale = 1e6;
  else if (unit == "gbit") scale = 1e9;
  else if (unit == "tbit") scale = 1e12;
  else if (unit == "bps") scale = 8;
  else if (unit == "kbps") scale = 8e3;
  else if (unit == "mbps") scale = 8e6;
  else if (unit == "gbps") scale = 8e9;
  else return absl::InvalidArgumentError(absl::StrCat("unknown tc rate unit in '", text, "'"));
  return value * scale;
}

absl::StatusOr<double> ParseHtbClassCeil(const std::string& tc_output,
                                         const std::string& classid) {
  std::istringstream lines(tc_output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> tokens;
    for (std::string word; words >> word;) tokens.push_back(word);
    if (tokens.size() < 3 || tokens[0] != "class" || tokens[1] != "htb" || tokens[2] != classid) {
      continue;
    }
    std::string rate, ceil;
    for (size_t i = 3; i + 1 < tokens.size(); ++i) {
      if (tokens[i] == "rate") rate = tokens[i + 1];
      if (tokens[i] == "ceil") ceil = tokens[i + 1];
    }
    if (!ceil.empty()) return ParseTcRate(ceil);
    if (!rate.empty()) return ParseTcRate(rate);
    return absl::InvalidArgumentError(absl::StrCat("htb class ", classid, " shows no rate"));
  }
  return absl::NotFoundError(absl::StrCat("no htb class ", classid, " in tc output"));
}

absl::StatusOr<double> TcClassCapacity::Read() const {
  for (char c : interface_) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat("bad interface name '", interface_, "'"));
    }
  }
  const std::string command = absl::StrCat("tc class show dev ", interface_, " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError("cannot run tc");
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::UnavailableError(
        absl::StrCat("`tc class show dev ", interface_, "` failed (is iproute2 installed?)"));
  }
  return ParseHtbClassCeil(output, classid_);
}

}  // namespace mlfabric::monitor
