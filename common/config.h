// Typed configuration from JSON files and command-line flags (docs/architecture.md §8).
//
// Precedence: built-in default < JSON file < command-line flag. A process
// declares one config struct with documented defaults and reads it with a
// ConfigReader; keys that no field claims, values of the wrong type and
// values out of range are errors that name the key and where it came from.
//
//   struct SchedulerConfig { int64_t grpc_port = 50051; double batch_interval_ms = 100; };
//
//   ASSIGN_OR_RETURN(CommandLine cl, ParseCommandLine(argc, argv));
//   ASSIGN_OR_RETURN(ConfigReader reader, ConfigReader::FromCommandLine(cl));
//   SchedulerConfig config;
//   reader.Int("grpc_port", &config.grpc_port, 1, 65535);
//   reader.Double("batch_interval_ms", &config.batch_interval_ms, 1, 60000);
//   RETURN_IF_ERROR(reader.Finish());   // first error, or "unknown key"
//
// Flags are spelled `--key=value` or `--key value` with the JSON key names;
// `--config=FILE` names the JSON file and `--help` is reported separately.
// Thread safety: none; use from one thread during start-up.
#ifndef MLFABRIC_COMMON_CONFIG_H_
#define MLFABRIC_COMMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
// The declarations only: the JSON parser's header costs about 1.3 s of
// compile time per file that includes it (gcc, -O2), and every file that
// sees a daemon's or the scheduler's config includes this one. Those that
// read JSON include "nlohmann/json.hpp" themselves.
#include "nlohmann/json_fwd.hpp"

namespace mlfabric {

struct CommandLine {
  std::string program;
  std::string config_path;                  // from --config, may be empty
  std::map<std::string, std::string> flags; // every other --key=value
  bool help = false;
  std::vector<std::string> positional;
};

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

// Reads and parses a JSON file; the error names the file and the parse error.
absl::StatusOr<nlohmann::json> LoadJsonFile(const std::string& path);
// The same for text already read; `source` names it in errors.
absl::StatusOr<nlohmann::json> ParseJsonText(const std::string& text, const std::string& source);

class ConfigReader {
 public:
  // `object` must be a JSON object (or null for "no file"); `source` names it
  // in errors (e.g. the file path).
  ConfigReader(nlohmann::json object, std::string source,
               std::map<std::string, std::string> flags = {});

  // Loads cl.config_path (if any) and takes cl.flags as overrides.
  static absl::StatusOr<ConfigReader> FromCommandLine(const CommandLine& cl);

  // Each reads `key` if present (flag first, then file) into `*out`, leaving
  // the default in place when absent; a type or range error is recorded.
  void Int(const std::string& key, int64_t* out, int64_t min, int64_t max);
  void Double(const std::string& key, double* out, double min, double max);
  void Bool(const std::string& key, bool* out);
  void String(const std::string& key, std::string* out);
  // One of `allowed`.
  void Enum(const std::string& key, std::string* out, const std::vector<std::string>& allowed);
  void StringList(const std::string& key, std::vector<std::string>* out);
  // The raw JSON value of a structured key (e.g. a list of objects), for the
  // caller to read with a nested ConfigReader; marks the key as known.
  bool Raw(const std::string& key, nlohmann::json* out);

  // Records an error found by the caller (e.g. a cross-field check).
  void AddError(const std::string& key, const std::string& message);

  // The first error recorded, else an error for any key nobody read, else OK.
  absl::Status Finish() const;

 private:
  std::string Where(const std::string& key) const;
  const nlohmann::json* FileValue(const std::string& key);

  // Never null; shared by copies of this reader (it is read, not changed).
  std::shared_ptr<const nlohmann::json> object_;
  std::string source_;
  std::map<std::string, std::string> flags_;
  std::set<std::string> known_;
  std::vector<std::string> errors_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_CONFIG_H_
