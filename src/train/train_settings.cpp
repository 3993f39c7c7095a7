// The one table that ties each option of fullburn train to its typed field.
#include "fullburn/train_settings.h"

#include <functional>
#include <set>
#include <utility>
#include <vector>

namespace fullburn {
namespace {

struct Binding {
  const char* key;
  OptionType type;
  std::function<void(const Config&, TrainSettings&)> read;
  std::function<void(const TrainSettings&, nlohmann::json&)> write;
};

void ReadInto(const Config& c, const char* key, int64_t& out) { out = c.Int(key); }
void ReadInto(const Config& c, const char* key, double& out) { out = c.Float(key); }
void ReadInto(const Config& c, const char* key, std::string& out) { out = c.Str(key); }
void ReadInto(const Config& c, const char* key, bool& out) { out = c.Bool(key); }
void ReadInto(const Config& c, const char* key, AutoInt& out) {
  out.automatic = c.IsAuto(key);
  out.value = c.Int(key);
}

// {section: {name: value}}, as Config::ToJson writes it.
template <typename Value>
void WriteFrom(nlohmann::json& out, const std::string& key, const Value& value) {
  size_t dot = key.find('.');
  out[key.substr(0, dot)][key.substr(dot + 1)] = value;
}
void WriteFrom(nlohmann::json& out, const std::string& key, const AutoInt& value) {
  if (value.automatic)
    WriteFrom(out, key, std::string("auto"));
  else
    WriteFrom(out, key, value.value);
}

template <typename Field>
constexpr OptionType TypeOf();
template <>
constexpr OptionType TypeOf<int64_t>() { return OptionType::kInt; }
template <>
constexpr OptionType TypeOf<AutoInt>() { return OptionType::kInt; }
template <>
constexpr OptionType TypeOf<double>() { return OptionType::kFloat; }
template <>
constexpr OptionType TypeOf<std::string>() { return OptionType::kString; }
template <>
constexpr OptionType TypeOf<bool>() { return OptionType::kBool; }

// The field's path is the key: FULLBURN_FIELD(optim.lr) binds "optim.lr" to
// settings.optim.lr, so a field that does not exist does not compile.
#define FULLBURN_FIELD(path)                                                             \
  Binding {                                                                              \
    #path, TypeOf<decltype(std::declval<TrainSettings&>().path)>(),                      \
        [](const Config& c, TrainSettings& s) { ReadInto(c, #path, s.path); },           \
        [](const TrainSettings& s, nlohmann::json& j) { WriteFrom(j, #path, s.path); }   \
  }

// A field whose name is not its key's (a base struct's field of another
// meaning has the key's name).
#define FULLBURN_FIELD_AS(key, path)                                                    \
  Binding {                                                                              \
    key, TypeOf<decltype(std::declval<TrainSettings&>().path)>(),                        \
        [](const Config& c, TrainSettings& s) { ReadInto(c, key, s.path); },             \
        [](const TrainSettings& s, nlohmann::json& j) { WriteFrom(j, key, s.path); }     \
  }

const std::vector<Binding>& Bindings() {
  static const std::vector<Binding> kBindings = {
      FULLBURN_FIELD(data.source), FULLBURN_FIELD(data.path), FULLBURN_FIELD(data.val_path),
      FULLBURN_FIELD(data.image_size), FULLBURN_FIELD(data.threads), FULLBURN_FIELD(data.prefetch),
      FULLBURN_FIELD(data.cache_mb), FULLBURN_FIELD(data.bad_samples), FULLBURN_FIELD(data.seq_len),
      FULLBURN_FIELD(data.synthetic_samples), FULLBURN_FIELD(data.features),
      FULLBURN_FIELD(data.classes), FULLBURN_FIELD(data.vocab),
      FULLBURN_FIELD(model.name), FULLBURN_FIELD(model.width), FULLBURN_FIELD(model.channels_last),
      FULLBURN_FIELD(model.hidden), FULLBURN_FIELD(model.layers), FULLBURN_FIELD(model.heads),
      FULLBURN_FIELD(model.dropout), FULLBURN_FIELD(model.pad_vocab),
      FULLBURN_FIELD(model.fused_loss), FULLBURN_FIELD(model.loss_kernel),
      FULLBURN_FIELD(model.norm_kernel), FULLBURN_FIELD(model.checkpoint),
      FULLBURN_FIELD(train.device), FULLBURN_FIELD(train.epochs), FULLBURN_FIELD(train.steps),
      FULLBURN_FIELD(train.batch_size), FULLBURN_FIELD(train.accumulate),
      FULLBURN_FIELD(train.precision), FULLBURN_FIELD(train.tf32), FULLBURN_FIELD(train.cudnn_benchmark),
      FULLBURN_FIELD(train.cuda_graphs), FULLBURN_FIELD(train.clip_grad_norm),
      FULLBURN_FIELD(train.seed), FULLBURN_FIELD(train.threads),
      FULLBURN_FIELD(train.keep_host_memory), FULLBURN_FIELD(train.time_every),
      FULLBURN_FIELD(train.log_every_s), FULLBURN_FIELD(train.time_limit_s),
      FULLBURN_FIELD(train.memory_budget_mb), FULLBURN_FIELD(train.memory_report),
      FULLBURN_FIELD(train.max_batch_size), FULLBURN_FIELD(train.max_skipped_steps),
      FULLBURN_FIELD(optim.name), FULLBURN_FIELD(optim.lr), FULLBURN_FIELD(optim.scale_lr),
      FULLBURN_FIELD(optim.base_batch), FULLBURN_FIELD(optim.momentum),
      FULLBURN_FIELD(optim.nesterov), FULLBURN_FIELD(optim.weight_decay), FULLBURN_FIELD(optim.beta1),
      FULLBURN_FIELD(optim.beta2), FULLBURN_FIELD(optim.eps),
      FULLBURN_FIELD(optim.trust), FULLBURN_FIELD_AS("optim.foreach", optim.foreach_setting), FULLBURN_FIELD(optim.fused),
      FULLBURN_FIELD(optim.warmup_steps), FULLBURN_FIELD(optim.schedule),
      FULLBURN_FIELD(optim.min_lr),
      FULLBURN_FIELD(amp.init_scale), FULLBURN_FIELD(amp.growth_factor),
      FULLBURN_FIELD(amp.backoff_factor), FULLBURN_FIELD(amp.growth_interval),
      FULLBURN_FIELD(checkpoint.dir), FULLBURN_FIELD(checkpoint.every_steps),
      FULLBURN_FIELD(checkpoint.every_minutes), FULLBURN_FIELD(checkpoint.at_end),
      FULLBURN_FIELD(checkpoint.keep), FULLBURN_FIELD(checkpoint.keep_best),
      FULLBURN_FIELD(checkpoint.async),
      FULLBURN_FIELD(profile.steps),
      FULLBURN_FIELD(eval.every_steps), FULLBURN_FIELD(eval.every_epochs),
      FULLBURN_FIELD(eval.at_end), FULLBURN_FIELD(eval.max_samples),
      FULLBURN_FIELD(dist.backend), FULLBURN_FIELD(dist.timeout_s), FULLBURN_FIELD(dist.bucket_mb),
      FULLBURN_FIELD(dist.first_bucket_mb), FULLBURN_FIELD(dist.overlap),
      FULLBURN_FIELD(dist.compress), FULLBURN_FIELD(dist.shard), FULLBURN_FIELD(dist.prefetch),
      FULLBURN_FIELD(dist.offload),
  };
  return kBindings;
}

#undef FULLBURN_FIELD_AS
#undef FULLBURN_FIELD

}  // namespace

TrainSettings ReadSettings(const Config& config) {
  TrainSettings s;
  for (const Binding& b : Bindings()) b.read(config, s);
  // What a part's struct takes from another section.
  s.model.vocab = s.data.vocab;
  s.model.seq_len = s.data.seq_len;
  s.amp.enabled = s.train.precision == "fp16";
  return s;
}

TrainSettings DefaultSettings() { return ReadSettings(Config()); }

Result<TrainSettings> ReadStoredSettings(const std::string& config_json) {
  nlohmann::json stored = nlohmann::json::parse(config_json, nullptr, false);
  if (!stored.is_object() || !(stored.contains("train") || stored.contains("data")))
    return Status::InvalidArgument("the run's stored config is not a fullburn train config");
  // Load's base is the same {section: {name: value}}: every value checked as
  // when it was set, keys that are no option skipped.
  auto config = Config::Load("", {}, /*read_environment=*/false, &stored);
  if (!config.ok()) return config.status();
  return ReadSettings(*config);
}

nlohmann::json SettingsJson(const TrainSettings& settings) {
  nlohmann::json out = nlohmann::json::object();
  for (const Binding& b : Bindings()) b.write(settings, out);
  return out;
}

std::string JobIdentity(TrainSettings s) {
  const TrainSettings defaults = DefaultSettings();
  s.train.device = defaults.train.device;
  s.train.threads = defaults.train.threads;
  s.train.memory_budget_mb = defaults.train.memory_budget_mb;
  s.data.threads = defaults.data.threads;
  s.data.prefetch = defaults.data.prefetch;
  s.data.cache_mb = defaults.data.cache_mb;
  return SettingsJson(s).dump();
}

std::string SettingsTableProblems() {
  std::string problems;
  std::set<std::string> bound;
  for (const Binding& b : Bindings()) {
    const OptionDef* def = FindOption(b.key);
    if (!bound.insert(b.key).second) problems += std::string(b.key) + ": bound twice\n";
    if (def == nullptr)
      problems += std::string(b.key) + ": a field of TrainSettings with no option in TrainOptions()\n";
    else if (def->type != b.type)
      problems += std::string(b.key) + ": the field's type is not the option's\n";
  }
  for (const OptionDef& d : TrainOptions())
    if (bound.count(d.key) == 0)
      problems += std::string(d.key) + ": an option with no field in TrainSettings (train_settings.h)\n";
  return problems;
}

}  // namespace fullburn
