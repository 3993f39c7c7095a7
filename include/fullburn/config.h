// Config: the options of `fullburn train` (and later `fullburn tune`), part of
// the train component but free of libtorch so the monitoring half and tests
// can read, check and document configs.
//
// Contract
// - TrainOptions() is the one source of truth: each key's type, default,
//   allowed values, help and environment variable. `fullburn train --help`
//   and docs/config.md (ConfigMarkdown) are printed from it.
// - Precedence, lowest first: default, environment (FULLBURN_<KEY>), the TOML
//   file, key=value arguments.
// - Every failure (unknown key, wrong type, value out of range, unreadable or
//   malformed file) is a Status whose one-line message names the key or the
//   file and how to fix it; an unknown key suggests the closest known one.
// - A Config is a value: copyable, no shared state, safe to read from any
//   thread once built.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

enum class OptionType { kInt, kFloat, kString, kBool };

struct OptionDef {
  const char* key;  // section.name
  OptionType type;
  const char* default_value;  // as it would be written on the command line
  const char* help;
  const char* choices = "";  // "a|b|c" for strings; "auto" allowed for ints
  const char* range = "";    // ">0" or ">=0" for numbers
};

const std::vector<OptionDef>& TrainOptions();
const OptionDef* FindOption(const std::string& key);
// FULLBURN_ + the key in capitals with '.' as '_': optim.lr -> FULLBURN_OPTIM_LR.
std::string OptionEnvVar(const OptionDef& def);

class Config {
 public:
  // Defaults only.
  Config();
  // Defaults, then the environment, then the TOML file (unless `path` is
  // empty), then the key=value overrides.
  // `base` ({section: {name: value}}, as ToJson writes) replaces the defaults
  // when given: a resumed run starts from its checkpoint's config.
  static Result<Config> Load(const std::string& path, const std::vector<std::string>& overrides,
                             bool read_environment = true, const nlohmann::json* base = nullptr);

  Status Set(const std::string& key, const std::string& value, const std::string& origin);

  int64_t Int(const std::string& key) const;
  double Float(const std::string& key) const;
  const std::string& Str(const std::string& key) const;
  bool Bool(const std::string& key) const;
  // True for an int key set to "auto".
  bool IsAuto(const std::string& key) const;

  nlohmann::json ToJson() const;  // {section: {name: value}}
  std::string ToToml() const;     // loads back to an equal Config

 private:
  Status SetJson(const OptionDef& def, const nlohmann::json& value, const std::string& origin);
  std::map<std::string, nlohmann::json> values_;
};

// Levenshtein distance: the nearest-name suggestions of configs and knobs.
size_t EditDistance(const std::string& a, const std::string& b);
// The closest known key by edit distance, or "" when nothing is close.
std::string ClosestOption(const std::string& key);
// docs/config.md.
std::string ConfigMarkdown();
// The table printed by `fullburn train --help`.
std::string ConfigHelp();

// fullburn train's flags (the config keys aside): the one table that
// `fullburn train --help` prints and fullburn-train parses with.
struct TrainFlag {
  const char* names;  // CLI11's form: "-q,--quiet"
  const char* value;  // the value's placeholder in --help ("RUN|PATH"); "" for a switch
  const char* help;
};
const std::vector<TrainFlag>& TrainFlags();
// The help of the flag named `names` exactly; throws std::out_of_range for
// an unknown one (a programming error).
const char* TrainFlagHelp(const std::string& names);
// `fullburn train --help`: usage, flags, then ConfigHelp().
std::string TrainHelp();

}  // namespace fullburn
