// TrainSettings: the options of `fullburn train` as typed fields, read from a
// Config once, so the trainer names `settings.optim.lr`, which the compiler
// checks, instead of looking up "optim.lr" by string.
//
// Contract
// - One field per option of TrainOptions(), named as its key (data.path is
//   `data.path`; one exception, optim.foreach is `optim.foreach_setting`)
//   and of its type; `ReadSettings` fills every field.
// - The sections a training part takes are that part's own options struct
//   (train_options.h): settings.model is a ModelSpec, settings.optim an
//   OptimizerOptions, settings.amp a LossScalerOptions, settings.dist a
//   DistOptions, filled here once; a part is handed its section, never a
//   copy made field by field. What such a struct holds beside the options
//   (the model's classes, the resolved optim.foreach) is said below.
//   `SettingsTableProblems` says where the two disagree (a config test runs
//   it), so an option added without its field, or a field without its
//   option, fails the tests.
// - train.batch_size may be "auto": an `AutoInt`.
// - A value: copy it freely; it is stale once the Config it was read from
//   changes (read it again).
// - What a run stored (its config JSON) is read back through the same table
//   (ReadStoredSettings): diagnose and tune name fields, not keys, too.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fullburn/config.h"
#include "fullburn/train_options.h"

namespace fullburn {

// An integer option that may be set to "auto".
struct AutoInt {
  int64_t value = 0;  // 0 when automatic
  bool automatic = false;
};

struct TrainSettings {
  struct Data {
    std::string source;
    std::string path;
    std::string val_path;
    int64_t image_size = 0;
    int64_t threads = 0;
    int64_t prefetch = 0;
    int64_t cache_mb = 0;
    std::string bad_samples;
    int64_t seq_len = 0;
    int64_t synthetic_samples = 0;
    int64_t features = 0;
    int64_t classes = 0;
    int64_t vocab = 0;
  } data;
  // The part's own struct (train_options.h) with what only the trainer
  // reads beside it. num_classes and in_features come from the training
  // source when the model is built; vocab and seq_len are data.vocab and
  // data.seq_len, copied in by ReadSettings; loss_rows has no option.
  struct Model : ModelSpec {
    bool channels_last = false;
  } model;
  struct Train {
    std::string device;
    int64_t epochs = 0;
    int64_t steps = 0;
    AutoInt batch_size;
    int64_t accumulate = 0;
    std::string precision;
    bool tf32 = false;
    bool cudnn_benchmark = false;
    bool cuda_graphs = false;
    double clip_grad_norm = 0;
    int64_t seed = 0;
    int64_t threads = 0;
    bool keep_host_memory = false;
    int64_t time_every = 0;
    double log_every_s = 0;
    double time_limit_s = 0;
    int64_t memory_budget_mb = 0;
    bool memory_report = false;
    int64_t max_batch_size = 0;
    int64_t max_skipped_steps = 0;
  } train;
  // foreach is optim.foreach's verdict for the run's device, which the
  // trainer gives its copy (ForeachFor); the option's own value ("auto",
  // "true", "false") is foreach_setting.
  struct Optim : OptimizerOptions {
    double lr = 0;
    bool scale_lr = false;
    int64_t base_batch = 0;
    std::string foreach_setting;
    int64_t warmup_steps = 0;
    std::string schedule;
    double min_lr = 0;
  } optim;
  LossScalerOptions amp;  // enabled: train.precision = fp16, set by ReadSettings
  struct Checkpoint {
    std::string dir;
    int64_t every_steps = 0;
    double every_minutes = 0;
    bool at_end = false;
    int64_t keep = 0;
    bool keep_best = false;
    bool async = false;
  } checkpoint;
  struct Profile {
    std::string steps;
  } profile;
  struct Eval {
    int64_t every_steps = 0;
    int64_t every_epochs = 0;
    bool at_end = false;
    int64_t max_samples = 0;
  } eval;
  // config_hash is the trainer's to fill (JobIdentity).
  struct Dist : DistOptions {
    std::string shard;
    bool prefetch = false;
    std::string offload;
  } dist;
};

TrainSettings ReadSettings(const Config& config);
// Every option at its default.
TrainSettings DefaultSettings();
// A run's stored config ({section: {name: value}}, as Config::ToJson writes
// it, beside whatever else the run stored): options it leaves out keep their
// defaults, keys that are no option (resolved.*, a key a later fullburn
// dropped) are ignored. An error where it is not a trainer's config (no train
// or data section) or a value is not of its option's type.
Result<TrainSettings> ReadStoredSettings(const std::string& config_json);
// {section: {name: value}}, as Config::ToJson; "auto" for an automatic AutoInt.
nlohmann::json SettingsJson(const TrainSettings& settings);
// What every rank must train alike, as one string to hash: the settings
// without those that describe a rank's machine (its device, threads, memory
// budget, loader and cache), which may differ between ranks.
std::string JobIdentity(TrainSettings settings);
// Options with no field, fields with no option, or a field of another type
// than its option, one per line; "" when the two match.
std::string SettingsTableProblems();

}  // namespace fullburn
