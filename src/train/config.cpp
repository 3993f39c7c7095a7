// Reading, checking and printing `fullburn train` configs.
#include "fullburn/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace fullburn {
namespace {

const char* TypeName(OptionType t) {
  switch (t) {
    case OptionType::kInt: return "integer";
    case OptionType::kFloat: return "number";
    case OptionType::kString: return "string";
    case OptionType::kBool: return "true/false";
  }
  return "";
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty() || !out.empty()) out.push_back(cur);
  return out;
}

// What a value of type t must be, with its article, for "... is not X".
std::string Expected(OptionType t) {
  switch (t) {
    case OptionType::kInt:
      return "an integer";
    case OptionType::kFloat:
      return "a number";
    case OptionType::kString:
      return "a string";
    case OptionType::kBool:
      return "true or false";
  }
  return "";
}

// The keys of a section ("model" -> model.name, model.width, ...), to answer
// a section name given where a key belongs.
std::string SectionKeys(const std::string& section) {
  std::string keys;
  for (const OptionDef& d : TrainOptions())
    if (std::string(d.key).rfind(section + ".", 0) == 0)
      keys += (keys.empty() ? "" : ", ") + std::string(d.key);
  return keys;
}

std::string UnknownKey(const std::string& key, const std::string& origin) {
  std::string msg = "unknown config key '" + key + "' (" + origin + ")";
  if (std::string keys = SectionKeys(key); !keys.empty())
    return msg + ": '" + key + "' is a section; give one of its keys: " + keys;
  std::string close = ClosestOption(key);
  if (!close.empty()) return msg + ": did you mean '" + close + "'?";
  return msg + ": see 'fullburn train --help' for the keys";
}

// A command-line or environment string as the option's type.
Result<nlohmann::json> ParseValue(const OptionDef& def, const std::string& text) {
  std::string bad = "'" + text + "' is not " + Expected(def.type);
  switch (def.type) {
    case OptionType::kString: return nlohmann::json(text);
    case OptionType::kBool:
      if (text == "true" || text == "1" || text == "yes" || text == "on") return nlohmann::json(true);
      if (text == "false" || text == "0" || text == "no" || text == "off") return nlohmann::json(false);
      return Status::InvalidArgument(bad);
    case OptionType::kInt: {
      if (text == "auto") return nlohmann::json("auto");
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE) return Status::InvalidArgument(bad);
      return nlohmann::json(static_cast<int64_t>(v));
    }
    case OptionType::kFloat: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v)) return Status::InvalidArgument(bad);
      return nlohmann::json(v);
    }
  }
  return Status::InvalidArgument(bad);
}

std::string Describe(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// A TOML float as written (shortest round trip; TOML's inf and nan too).
std::string FloatText(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return nlohmann::json(x).dump();
}

// TOML node as the option's type (integers are accepted for numbers).
Result<nlohmann::json> FromToml(const OptionDef& def, const toml::node& node) {
  switch (def.type) {
    case OptionType::kString:
      if (auto v = node.value<std::string>(); v && node.is_string()) return nlohmann::json(*v);
      break;
    case OptionType::kBool:
      if (node.is_boolean()) return nlohmann::json(*node.value<bool>());
      break;
    case OptionType::kInt:
      if (node.is_integer()) return nlohmann::json(*node.value<int64_t>());
      if (node.is_string() && *node.value<std::string>() == "auto") return nlohmann::json("auto");
      break;
    case OptionType::kFloat:
      if (node.is_integer() || node.is_floating_point()) return nlohmann::json(*node.value<double>());
      break;
  }
  std::string shown = node.is_string()            ? "\"" + *node.value<std::string>() + "\""
                      : node.is_integer()         ? std::to_string(*node.value<int64_t>())
                      : node.is_floating_point()  ? FloatText(*node.value<double>())
                      : node.is_boolean()         ? (*node.value<bool>() ? "true" : "false")
                      : node.is_array()           ? "an array"
                                                  : "this value";
  return Status::InvalidArgument(shown + " is not " + Expected(def.type));
}

void Flatten(const toml::table& table, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>* out) {
  for (const auto& [k, node] : table) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table())
      Flatten(*sub, key, out);
    else
      out->emplace_back(key, &node);
  }
}

}  // namespace

const OptionDef* FindOption(const std::string& key) {
  for (const OptionDef& d : TrainOptions())
    if (key == d.key) return &d;
  return nullptr;
}

std::string OptionEnvVar(const OptionDef& def) {
  std::string out = "FULLBURN_";
  for (const char* c = def.key; *c; ++c) out += *c == '.' ? '_' : static_cast<char>(std::toupper(*c));
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// What other tools call a key (PyTorch scripts' argparse flags, Lightning's
// Trainer, Hugging Face's TrainingArguments, nanoGPT): the name an ML
// engineer types first, mapped to ours. Compared without a section and
// with '-' as '_', so "train.learning_rate" and "--num-workers" find theirs.
struct OtherName {
  const char* name;
  const char* ours;
};
constexpr OtherName kOtherNames[] = {
    {"learning_rate", "optim.lr"},
    {"num_workers", "data.threads"},
    {"workers", "data.threads"},
    {"dataloader_num_workers", "data.threads"},
    {"prefetch_factor", "data.prefetch"},
    {"batch", "train.batch_size"},
    {"micro_batch", "train.batch_size"},
    {"micro_batch_size", "train.batch_size"},
    {"per_device_train_batch_size", "train.batch_size"},
    {"gradient_accumulation_steps", "train.accumulate"},
    {"accumulate_grad_batches", "train.accumulate"},
    {"grad_accum", "train.accumulate"},
    {"max_steps", "train.steps"},
    {"max_iters", "train.steps"},
    {"max_epochs", "train.epochs"},
    {"num_train_epochs", "train.epochs"},
    {"gradient_clip_val", "train.clip_grad_norm"},
    {"max_grad_norm", "train.clip_grad_norm"},
    {"grad_clip", "train.clip_grad_norm"},
    {"optimizer", "optim.name"},
    {"lr_scheduler", "optim.schedule"},
    {"scheduler", "optim.schedule"},
    {"warmup", "optim.warmup_steps"},
    {"warmup_iters", "optim.warmup_steps"},
    {"mixed_precision", "train.precision"},
    {"dtype", "train.precision"},
    {"arch", "model.name"},
    {"eval_interval", "eval.every_steps"},
    {"val_check_interval", "eval.every_steps"},
    {"check_val_every_n_epoch", "eval.every_epochs"},
    {"save_every", "checkpoint.every_steps"},
    {"save_steps", "checkpoint.every_steps"},
    {"save_total_limit", "checkpoint.keep"},
    {"output_dir", "checkpoint.dir"},
    {"out_dir", "checkpoint.dir"},
    {"resume", "--resume RUN|PATH"},
    {"resume_from_checkpoint", "--resume RUN|PATH"},
};

// "train.Learning-Rate" -> "learning_rate": the part after the last '.'.
std::string BareName(const std::string& key) {
  std::string bare = key.substr(key.rfind('.') + 1);
  while (!bare.empty() && bare[0] == '-') bare.erase(0, 1);
  for (char& c : bare)
    c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return bare;
}

}  // namespace

std::string ClosestOption(const std::string& key) {
  std::string bare = BareName(key);
  for (const OtherName& o : kOtherNames)
    if (bare == o.name) return o.ours;
  std::string best;
  size_t best_d = std::string::npos;
  bool has_section = key.find('.') != std::string::npos;
  for (const OptionDef& d : TrainOptions()) {
    std::string k = d.key;
    // "lr" alone, or in the wrong section ("train.lr"), means optim.lr: the
    // names without their sections are compared too, a wrong section
    // costing one edit.
    size_t dist =
        std::min(EditDistance(key, k), EditDistance(bare, BareName(k)) + (has_section ? 1 : 0));
    if (dist < best_d) {
      best_d = dist;
      best = k;
    }
  }
  return best_d <= std::max<size_t>(2, key.size() / 3) ? best : "";
}

Config::Config() {
  for (const OptionDef& d : TrainOptions()) values_[d.key] = ParseValue(d, d.default_value).value();
}

Status Config::SetJson(const OptionDef& def, const nlohmann::json& v, const std::string& origin) {
  std::string where = std::string(def.key) + " = " + Describe(v) + " (" + origin + ")";
  // A checkpoint's config is JSON of any shape (a damaged or edited file):
  // a value of another type would throw here or later in Str() and Int().
  bool fits = def.type == OptionType::kString  ? v.is_string()
              : def.type == OptionType::kBool  ? v.is_boolean()
              : def.type == OptionType::kFloat ? v.is_number()
                                               : v.is_number_integer() || v.is_string();
  if (!fits) {
    const char* kinds[] = {"an integer", "a number", "a string", "true or false"};
    return Status::InvalidArgument(where + ": must be " + kinds[static_cast<int>(def.type)]);
  }
  std::string choices = def.choices;
  if (def.type == OptionType::kString && !choices.empty()) {
    std::vector<std::string> allowed = Split(choices, '|');
    if (std::find(allowed.begin(), allowed.end(), v.get<std::string>()) == allowed.end())
      return Status::InvalidArgument(where + ": use one of " + choices);
  }
  if (v.is_string() && def.type == OptionType::kInt && choices != "auto")
    return Status::InvalidArgument(where + ": 'auto' is not allowed here; give an integer");
  if (v.is_number()) {
    double x = v.get<double>();
    std::string range = def.range;
    bool ok = range.empty() || (range == ">0" && x > 0) || (range == ">=0" && x >= 0) ||
              (range == ">1" && x > 1);
    if (!ok) return Status::InvalidArgument(where + ": must be " + range);
  }
  values_[def.key] = v;
  return Status::Ok();
}

Status Config::Set(const std::string& key, const std::string& value, const std::string& origin) {
  const OptionDef* def = FindOption(key);
  if (!def) return Status::InvalidArgument(UnknownKey(key, origin));
  Result<nlohmann::json> v = ParseValue(*def, value);
  if (!v.ok())
    return Status::InvalidArgument(key + " (" + origin + "): " + v.status().message() +
                                   "; see 'fullburn train --help'");
  return SetJson(*def, *v, origin);
}

Result<Config> Config::Load(const std::string& path, const std::vector<std::string>& overrides,
                            bool read_environment, const nlohmann::json* base) {
  Config c;
  if (base) {
    for (const auto& [section, entries] : base->items()) {
      if (!entries.is_object()) continue;
      for (const auto& [name, value] : entries.items()) {
        const OptionDef* def = FindOption(section + "." + name);
        // A key a later fullburn dropped is ignored; the rest must still check.
        if (!def) continue;
        if (Status s = c.SetJson(*def, value, "checkpoint config"); !s.ok()) return s;
      }
    }
  }
  if (read_environment) {
    for (const OptionDef& d : TrainOptions()) {
      std::string var = OptionEnvVar(d);
      if (const char* v = std::getenv(var.c_str()); v && *v)
        if (Status s = c.Set(d.key, v, "environment " + var); !s.ok()) return s;
    }
  }
  if (!path.empty()) {
    toml::table parsed;
    try {
      parsed = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      std::string what(e.description());
      if (what.find("File could not be opened") != std::string::npos)
        return Status::NotFound("config file " + path +
                                " cannot be read: check the path (or leave it out for the defaults)");
      return Status::InvalidArgument("config file " + path + " line " +
                                     std::to_string(e.source().begin.line) + ": " + what +
                                     " (TOML syntax)");
    }
    std::vector<std::pair<std::string, const toml::node*>> entries;
    Flatten(parsed, "", &entries);
    for (const auto& [key, node] : entries) {
      std::string origin = path + " line " + std::to_string(node->source().begin.line);
      const OptionDef* def = FindOption(key);
      if (!def) return Status::InvalidArgument(UnknownKey(key, origin));
      Result<nlohmann::json> v = FromToml(*def, *node);
      if (!v.ok()) return Status::InvalidArgument(key + " (" + origin + "): " + v.status().message());
      if (Status s = c.SetJson(*def, *v, origin); !s.ok()) return s;
    }
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("'" + o + "' is not key=value: write e.g. train.batch_size=128");
    if (Status s = c.Set(o.substr(0, eq), o.substr(eq + 1), "command line"); !s.ok()) return s;
  }
  return c;
}

int64_t Config::Int(const std::string& key) const {
  const nlohmann::json& v = values_.at(key);
  return v.is_number() ? v.get<int64_t>() : 0;
}
double Config::Float(const std::string& key) const { return values_.at(key).get<double>(); }
const std::string& Config::Str(const std::string& key) const {
  return values_.at(key).get_ref<const std::string&>();
}
bool Config::Bool(const std::string& key) const { return values_.at(key).get<bool>(); }
bool Config::IsAuto(const std::string& key) const { return values_.at(key).is_string(); }

nlohmann::json Config::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, v] : values_) {
    size_t dot = key.find('.');
    j[key.substr(0, dot)][key.substr(dot + 1)] = v;
  }
  return j;
}

std::string Config::ToToml() const {
  std::ostringstream o;
  o.precision(17);
  std::string section;
  for (const OptionDef& d : TrainOptions()) {
    std::string key = d.key;
    size_t dot = key.find('.');
    if (key.substr(0, dot) != section) {
      section = key.substr(0, dot);
      o << (o.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
    }
    const nlohmann::json& v = values_.at(key);
    o << key.substr(dot + 1) << " = ";
    if (v.is_string())
      o << nlohmann::json(v).dump();  // a JSON string is a valid TOML basic string
    else if (d.type == OptionType::kFloat && v.get<double>() == std::floor(v.get<double>()) &&
             std::fabs(v.get<double>()) < 1e15)
      o << static_cast<int64_t>(v.get<double>()) << ".0";
    else
      o << v.dump();
    o << "\n";
  }
  return o.str();
}

std::string ConfigMarkdown() {
  std::ostringstream o;
  o << "# `fullburn train` configuration\n\n"
       "Generated by `fullburn train --help-config --markdown`; a test keeps this file equal to "
       "it.\n\n"
       "Give a TOML file (`fullburn train run.toml`), `key=value` arguments "
       "(`fullburn train train.batch_size=128 optim.lr=0.2`), or environment variables. "
       "Precedence, lowest first: default, environment, file, arguments. The effective "
       "configuration is stored with the run (`fullburn runs show RUN --json`) and "
       "`fullburn train --print-config` prints it as TOML.\n\n"
       "| key | type | default | environment | meaning |\n|---|---|---|---|---|\n";
  for (const OptionDef& d : TrainOptions()) {
    std::string type = TypeName(d.type);
    if (*d.choices) type = d.type == OptionType::kInt ? "integer or `auto`" : std::string("`") + d.choices + "`";
    if (*d.range) type += std::string(" ") + d.range;
    std::string def = *d.default_value ? std::string("`") + d.default_value + "`" : "(empty)";
    for (size_t p = 0; (p = type.find('|', p)) != std::string::npos; p += 2) type.replace(p, 1, "\\|");
    o << "| `" << d.key << "` | " << type << " | " << def << " | `" << OptionEnvVar(d) << "` | "
      << d.help << " |\n";
  }
  return o.str();
}

std::string ConfigHelp() {
  std::ostringstream o;
  o << "Config keys (TOML file, key=value, or the environment variable):\n";
  for (const OptionDef& d : TrainOptions()) {
    std::string def = *d.default_value ? d.default_value : "\"\"";
    o << "  " << d.key << " = " << def;
    if (*d.choices && d.type == OptionType::kString) o << "  [" << d.choices << "]";
    o << "  (" << OptionEnvVar(d) << ")\n      " << d.help << "\n";
  }
  return o.str();
}

const std::vector<TrainFlag>& TrainFlags() {
  static const std::vector<TrainFlag> flags = {
      {"--resume", "RUN|PATH",
       "Continue a run from its last good checkpoint (a run id or 'last'), or a checkpoint file"},
      {"--name", "NAME", "Name of the run (default: model and data)"},
      {"--parent", "RUN", "Record the run as part of another (fullburn tune's trials)"},
      {"--store", "PATH", "Run store (env FULLBURN_STORE)"},
      {"-q,--quiet", "", "No live progress line, no end-of-run summary"},
      {"--print-config", "", "Print the effective config as TOML and exit"},
      {"--help-config", "[--markdown]", "Every config key with its default (docs/config.md)"},
  };
  return flags;
}

const char* TrainFlagHelp(const std::string& names) {
  for (const TrainFlag& f : TrainFlags())
    if (names == f.names) return f.help;
  throw std::out_of_range("no fullburn train flag " + names);
}

std::string TrainHelp() {
  std::ostringstream o;
  o << "fullburn train: train a model with libtorch and record every step\n\n"
       "Usage: fullburn train [CONFIG.toml] [key=value ...] [OPTIONS]\n\n"
       "With no arguments: trains a small ResNet on a synthetic JPEG image set (created on "
       "first\nuse beside the run store) for a few minutes, on the GPU when libtorch sees "
       "one.\n\nOptions:\n";
  for (const TrainFlag& f : TrainFlags()) {
    std::string names = f.names;
    if (size_t comma = names.find(','); comma != std::string::npos) names.replace(comma, 1, ", ");
    std::string left = names + (*f.value ? std::string(" ") + f.value : "");
    o << "  " << left << std::string(left.size() < 26 ? 26 - left.size() : 1, ' ') << f.help
      << "\n";
  }
  o << "\n" << ConfigHelp();
  return o.str();
}

}  // namespace fullburn
