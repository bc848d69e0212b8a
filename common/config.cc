#include "common/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace mlfabric {

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  CommandLine cl;
  cl.program = argc > 0 ? argv[0] : "";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) cl.positional.push_back(argv[i]);
      break;
    }
    if (arg.rfind("--", 0) != 0) {
      cl.positional.push_back(arg);
      continue;
    }
    std::string key = arg.substr(2);
    std::string value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key == "help" || key == "h") {
      cl.help = true;
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", key, " needs a value"));
    }
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("malformed flag '", arg, "'"));
    if (key == "config") {
      cl.config_path = value;
    } else {
      cl.flags[key] = value;
    }
  }
  return cl;
}

absl::StatusOr<nlohmann::json> LoadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open config file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseJsonText(text.str(), path);
}

absl::StatusOr<nlohmann::json> ParseJsonText(const std::string& text, const std::string& source) {
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Re-parse with exceptions for the position of the error.
    try {
      (void)nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  }
  return parsed;
}

ConfigReader::ConfigReader(nlohmann::json object, std::string source,
                           std::map<std::string, std::string> flags)
    : source_(std::move(source)), flags_(std::move(flags)) {
  if (!object.is_null() && !object.is_object()) {
    errors_.push_back(absl::StrCat(source_, ": the top level must be a JSON object"));
    object = nlohmann::json::object();
  }
  object_ = std::make_shared<const nlohmann::json>(std::move(object));
}

absl::StatusOr<ConfigReader> ConfigReader::FromCommandLine(const CommandLine& cl) {
  nlohmann::json object = nlohmann::json::object();
  std::string source = "built-in defaults";
  if (!cl.config_path.empty()) {
    auto loaded = LoadJsonFile(cl.config_path);
    if (!loaded.ok()) return loaded.status();
    object = std::move(*loaded);
    source = cl.config_path;
  }
  return ConfigReader(std::move(object), source, cl.flags);
}

std::string ConfigReader::Where(const std::string& key) const {
  if (flags_.count(key)) return absl::StrCat("flag --", key);
  return absl::StrCat("config key '", key, "' (", source_, ")");
}

const nlohmann::json* ConfigReader::FileValue(const std::string& key) {
  known_.insert(key);
  if (!object_->is_object()) return nullptr;
  auto it = object_->find(key);
  return it == object_->end() ? nullptr : &*it;
}

void ConfigReader::AddError(const std::string& key, const std::string& message) {
  errors_.push_back(absl::StrCat(Where(key), ": ", message));
}

void ConfigReader::Int(const std::string& key, int64_t* out, int64_t min, int64_t max) {
  const nlohmann::json* value = FileValue(key);
  int64_t parsed = 0;
  if (auto flag = flags_.find(key); flag != flags_.end()) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(flag->second.c_str(), &end, 10);
    if (flag->second.empty() || *end != '\0' || errno == ERANGE) {
      AddError(key, absl::StrCat("expected an integer, got '", flag->second, "'"));
      return;
    }
    parsed = v;
  } else if (value != nullptr) {
    if (!value->is_number_integer()) {
      AddError(key, absl::StrCat("expected an integer, got ", value->type_name(), " ", value->dump()));
      return;
    }
    parsed = value->get<int64_t>();
  } else {
    return;
  }
  if (parsed < min || parsed > max) {
    AddError(key, absl::StrCat("value ", parsed, " is out of range [", min, ", ", max, "]"));
    return;
  }
  *out = parsed;
}

void ConfigReader::Double(const std::string& key, double* out, double min, double max) {
  const nlohmann::json* value = FileValue(key);
  double parsed = 0;
  if (auto flag = flags_.find(key); flag != flags_.end()) {
    char* end = nullptr;
    const double v = std::strtod(flag->second.c_str(), &end);
    if (flag->second.empty() || *end != '\0') {
      AddError(key, absl::StrCat("expected a number, got '", flag->second, "'"));
      return;
    }
    parsed = v;
  } else if (value != nullptr) {
    if (!value->is_number()) {
      AddError(key, absl::StrCat("expected a number, got ", value->type_name(), " ", value->dump()));
      return;
    }
    parsed = value->get<double>();
  } else {
    return;
  }
  if (!std::isfinite(parsed) || parsed < min || parsed > max) {
    AddError(key, absl::StrCat("value ", parsed, " is out of range [", min, ", ", max, "]"));
    return;
  }
  *out = parsed;
}

void ConfigReader::Bool(const std::string& key, bool* out) {
  const nlohmann::json* value = FileValue(key);
  if (auto flag = flags_.find(key); flag != flags_.end()) {
    if (flag->second == "true" || flag->second == "1") {
      *out = true;
    } else if (flag->second == "false" || flag->second == "0") {
      *out = false;
    } else {
      AddError(key, absl::StrCat("expected true or false, got '", flag->second, "'"));
    }
  } else if (value != nullptr) {
    if (!value->is_boolean()) {
      AddError(key, absl::StrCat("expected true or false, got ", value->type_name(), " ",
                                 value->dump()));
      return;
    }
    *out = value->get<bool>();
  }
}

void ConfigReader::String(const std::string& key, std::string* out) {
  const nlohmann::json* value = FileValue(key);
  if (auto flag = flags_.find(key); flag != flags_.end()) {
    *out = flag->second;
  } else if (value != nullptr) {
    if (!value->is_string()) {
      AddError(key, absl::StrCat("expected a string, got ", value->type_name(), " ", value->dump()));
      return;
    }
    *out = value->get<std::string>();
  }
}

void ConfigReader::Enum(const std::string& key, std::string* out,
                        const std::vector<std::string>& allowed) {
  std::string parsed = *out;
  const size_t errors_before = errors_.size();
  String(key, &parsed);
  if (errors_.size() != errors_before) return;
  for (const std::string& option : allowed) {
    if (option == parsed) {
      *out = parsed;
      return;
    }
  }
  AddError(key, absl::StrCat("'", parsed, "' is not one of: ", absl::StrJoin(allowed, ", ")));
}

void ConfigReader::StringList(const std::string& key, std::vector<std::string>* out) {
  const nlohmann::json* value = FileValue(key);
  if (auto flag = flags_.find(key); flag != flags_.end()) {
    out->clear();
    std::stringstream items(flag->second);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (!item.empty()) out->push_back(item);
    }
  } else if (value != nullptr) {
    if (!value->is_array()) {
      AddError(key, absl::StrCat("expected a list of strings, got ", value->type_name()));
      return;
    }
    std::vector<std::string> parsed;
    for (size_t i = 0; i < value->size(); ++i) {
      if (!(*value)[i].is_string()) {
        AddError(key, absl::StrCat("item ", i, ": expected a string, got ", (*value)[i].type_name()));
        return;
      }
      parsed.push_back((*value)[i].get<std::string>());
    }
    *out = std::move(parsed);
  }
}

bool ConfigReader::Raw(const std::string& key, nlohmann::json* out) {
  const nlohmann::json* value = FileValue(key);
  if (flags_.count(key)) {
    AddError(key, "cannot be set from the command line; put it in the --config file");
    return false;
  }
  if (value == nullptr) return false;
  *out = *value;
  return true;
}

absl::Status ConfigReader::Finish() const {
  if (!errors_.empty()) return absl::InvalidArgumentError(errors_.front());
  for (const auto& [key, value] : flags_) {
    if (!known_.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key,
                                                     " (see --help for the accepted flags)"));
    }
  }
  if (object_->is_object()) {
    for (const auto& item : object_->items()) {
      if (!known_.count(item.key())) {
        std::vector<std::string> keys(known_.begin(), known_.end());
        return absl::InvalidArgumentError(
            absl::StrCat(source_, ": unknown config key '", item.key(),
                         "'; known keys: ", absl::StrJoin(keys, ", ")));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mlfabric
