// fullburn tune: short measured trials, one knob at a time, each a run linked
// to the tuning; the winner written as a config `fullburn train` takes as is.
// --grid: the same for any command, over the combinations given.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include "child.h"
#include "cli.h"
#include "fullburn/config.h"
#include "fullburn/dist.h"
#include "fullburn/env.h"
#include "fullburn/report.h"
#include "fullburn/tune.h"
#include "fullburn/tuner.h"
#include "tune_trial.h"

namespace fullburn::cli {
namespace {

struct TuneOptions {
  CommonOptions common;
  std::vector<std::string> args;  // CONFIG.toml and key=value, or the command with --grid
  std::vector<std::string> grids;
  std::string budget = "10m", trial, objective = "samples_per_s", knobs, output, metric_regex;
  bool free_batch = false;
  double min_gain = 0.03;
};

constexpr double kDefaultTrainTrialS = 20, kDefaultGridTrialS = 60;
// Start-up, data set creation and the batch-size search come before a
// training trial's clock starts.
constexpr double kTrainTrialAllowanceS = 180;

Status CheckPowerReadings() {
  auto gpus = OpenGpus();
  if (!gpus.ok()) return gpus.status();
  if (!(*gpus)->available())
    return Status::InvalidArgument(
        "--objective samples_per_joule needs GPU power readings, and there are none (" +
        (*gpus)->unavailable_reason() + "): use --objective samples_per_s");
  for (const GpuSample& g : (*gpus)->Collect({}, 0))
    if (g.power_w) return Status::Ok();
  return Status::InvalidArgument(
      "--objective samples_per_joule needs GPU power readings, and NVML reports none for these "
      "GPUs: use --objective samples_per_s");
}

// Whether the command line had "--" after "tune": a command to tune follows
// (CLI11 gives the words before and after it as one list).
bool CommandAfterDashes() {
  std::vector<std::string> argv = OwnCommandLine();
  auto tune = std::find(argv.begin(), argv.end(), "tune");
  return tune != argv.end() && std::find(tune, argv.end(), "--") != argv.end();
}

Result<TunePlan> MakePlan(const TuneOptions& o) {
  TunePlan p;
  p.grid = !o.grids.empty();
  p.script = !p.grid && CommandAfterDashes();
  auto objective = ParseObjective(o.objective);
  if (!objective.ok()) return objective.status();
  p.objective = *objective;
  auto budget = ParseDuration(o.budget);
  if (!budget.ok()) return Status::InvalidArgument("--budget: " + budget.status().message());
  p.budget_s = *budget;
  auto trial = o.trial.empty()
                   ? Result<double>(p.grid || p.script ? kDefaultGridTrialS : kDefaultTrainTrialS)
                   : ParseDuration(o.trial);
  if (!trial.ok()) return Status::InvalidArgument("--trial: " + trial.status().message());
  p.trial_s = *trial;
  if (p.budget_s < p.trial_s)
    return Status::InvalidArgument(
        fmt::format("--budget {} is shorter than one trial (--trial {}): raise --budget or "
                    "lower --trial",
                    FormatDuration(p.budget_s), FormatDuration(p.trial_s)));
  if (!o.metric_regex.empty()) {
    if (!p.grid)
      return Status::InvalidArgument(
          "--metric-regex measures an external command: use it with --grid");
    try {
      std::regex re(o.metric_regex);
    } catch (const std::regex_error& e) {
      return Status::InvalidArgument("--metric-regex '" + o.metric_regex +
                                     "' is not a regular expression: " + e.what());
    }
    if (p.objective == Objective::kSamplesPerJoule)
      return Status::InvalidArgument(
          "--metric-regex gives a rate, not energy: use --objective samples_per_s with it");
  }
  if (p.grid) {
    std::set<std::string> names;
    for (const std::string& spec : o.grids) {
      auto axis = ParseGridAxis(spec);
      if (!axis.ok()) return axis.status();
      if (!names.insert(axis->name).second)
        return Status::InvalidArgument("--grid " + axis->name +
                                       " is given twice: list all its values in one --grid");
      p.axes.push_back(*axis);
    }
    if (o.args.empty())
      return Status::InvalidArgument(
          "--grid needs a command: fullburn tune --grid 'batch=64,128' -- CMD --batch {batch}");
    for (const auto& combo : ExpandGrid(p.axes))
      if (auto cmd = Substitute(o.args, combo); !cmd.ok()) return cmd.status();
    if (!o.knobs.empty())
      return Status::InvalidArgument(
          "--knobs tunes fullburn train; with --grid the axes are the knobs");
  } else if (p.script) {
    if (o.args.empty())
      return Status::InvalidArgument(
          "fullburn tune -- needs a command: fullburn tune -- python train.py");
    if (!o.knobs.empty()) {
      auto knobs = ParseKnobList(o.knobs, ScriptKnobs());
      if (!knobs.ok()) return knobs.status();
      p.knobs = *knobs;
    }
  } else {
    if (!o.knobs.empty()) {
      auto knobs = ParseKnobList(o.knobs);
      if (!knobs.ok()) return knobs.status();
      p.knobs = *knobs;
    }
    for (const std::string& a : o.args) {
      if (a.find('=') != std::string::npos)
        p.overrides.push_back(a);
      else if (p.config_path.empty())
        p.config_path = a;
      else
        return Status::InvalidArgument(
            "two config files given ('" + p.config_path + "' and '" + a +
            "'): give one, and key=value for the rest (a command goes after --)");
    }
    auto config = Config::Load(p.config_path, p.overrides);
    if (!config.ok()) return config.status();
    if (TrainingExecutable().empty())
      return Status::InvalidArgument("tuning fullburn train needs the training half (fullburn-train), which " +
                                     WithoutTrainingHalf() + "; or use --grid");
  }
  if (p.objective == Objective::kSamplesPerJoule)
    if (Status s = CheckPowerReadings(); !s.ok()) return s;
  return p;
}

// ---- The child-process runners ----------------------------------------------

// A trial of fullburn train: the config with the knob's values, a fixed
// stretch of training recorded as a run of the tuning.
class TrainRunner : public ChildTrialRunner {
 public:
  TrainRunner() : exe_(TrainingExecutable()) {}

  void Run(const Tuning& t, Trial* trial) override {
    TrialSpec spec;
    spec.argv = {exe_, "train"};
    const TunePlan& p = t.plan();
    if (!p.config_path.empty()) spec.argv.push_back(p.config_path);
    for (const std::string& kv : p.overrides) spec.argv.push_back(kv);
    // A trial is a fixed stretch of training: no checkpoints, no evaluation, no early end.
    for (const char* kv : {"checkpoint.at_end=false", "checkpoint.every_steps=0",
                           "checkpoint.every_minutes=0", "eval.at_end=false", "eval.every_steps=0",
                           "eval.every_epochs=0", "train.steps=1000000000"})
      spec.argv.push_back(kv);
    spec.argv.push_back(fmt::format("train.time_limit_s={}", p.trial_s));
    for (const auto& [key, v] : trial->overrides) spec.argv.push_back(key + "=" + v);
    spec.argv.insert(spec.argv.end(), {"-q", "--parent", std::to_string(t.id()), "--name",
                                       fmt::format("tune {} #{}: {}={}", t.id(),
                                                   t.trials().size() + 1, trial->knob,
                                                   trial->value),
                                       "--store", t.store()->path()});
    spec.tuning_id = t.id();
    spec.timeout_s = p.trial_s + kTrainTrialAllowanceS;
    spec.length_s = p.trial_s;
    spec.objective = p.objective;
    RunTrial(spec, t.store(), trial);
  }

 private:
  std::string exe_;
};

// --grid: the command with the combination's values, under fullburn run.
class GridRunner : public ChildTrialRunner {
 public:
  GridRunner(std::vector<std::string> command, std::string metric_regex)
      : command_(std::move(command)), metric_regex_(std::move(metric_regex)) {}

  void Run(const Tuning& t, Trial* trial) override {
    Result<std::vector<std::string>> command =
        Substitute(command_, trial->overrides);  // checked before any trial
    TrialSpec spec = CommandTrialSpec(t, trial->value, *command);
    spec.metric_regex = metric_regex_;
    RunTrial(spec, t.store(), trial);
  }

 private:
  std::vector<std::string> command_;
  std::string metric_regex_;
};

int Tune(const TuneOptions& o) {
  auto plan = MakePlan(o);
  if (!plan.ok()) return Fail(plan.status().message());
  InstallSignalForwarding();
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  RunInfo info;
  info.name =
      plan->grid || plan->script
          ? "tune: " + o.args.front()
          : "tune: fullburn train" + (plan->config_path.empty() ? "" : " " + plan->config_path);
  info.command = OwnCommandLine();
  info.cwd = CurrentDir();
  info.start_time = Env::Default()->UnixSeconds();
  info.recorder_pid = static_cast<int>(::getpid());
  info.config_json = nlohmann::json{{"tuning",
                                     {{"objective", o.objective},
                                      {"budget_s", plan->budget_s},
                                      {"trial_s", plan->trial_s},
                                      {"knobs", plan->knobs},
                                      {"grid", o.grids},
                                      {"free_batch", o.free_batch},
                                      {"min_gain", o.min_gain}}}}
                         .dump();
  auto id = (*store)->BeginRun(info);
  if (!id.ok()) return Fail(id.status().message());
  info.id = *id;
  std::fprintf(stderr,
               "tune: tuning %lld, budget %s, %s per trial; trials are runs of their own (fullburn "
               "report %lld)\n",
               static_cast<long long>(info.id), FormatDuration(plan->budget_s).c_str(),
               FormatDuration(plan->trial_s).c_str(), static_cast<long long>(info.id));
  Tuning tuning(store->get(), info, *plan);
  if (plan->script)
    return TuneScript(&tuning, ScriptTrialRunner(o.args).get(), o.args, o.min_gain, o.budget);
  if (plan->grid) {
    GridRunner runner(o.args, o.metric_regex);
    return TuneGrid(&tuning, &runner, o.args, o.min_gain, o.budget);
  }
  TrainRunner runner;
  TrainTuneOptions train;
  train.min_gain = o.min_gain;
  train.budget = o.budget;
  train.free_batch = o.free_batch;
  train.output = o.output;
  return TuneTrain(&tuning, &runner, train);
}

}  // namespace

void SetupTune(CLI::App& app) {
  auto o = std::make_shared<TuneOptions>();
  CLI::App* tune = app.add_subcommand("tune",
                                      "Find faster settings by measuring short trials, one knob at "
                                      "a time (or a --grid for any command)");
  std::string knobs;
  for (const KnobDef& k : TuneKnobs())
    knobs +=
        fmt::format("  {:<16} {}{}\n", k.name, k.help, *k.key ? fmt::format(" ({})", k.key) : "");
  std::string script_knobs;
  for (const KnobDef& k : ScriptKnobs())
    script_knobs += fmt::format("  {:<18} {}\n", k.name, k.help);
  tune->footer(
      "Usage: fullburn tune [CONFIG.toml] [key=value ...] [OPTIONS]\n"
      "       fullburn tune --grid 'batch=64,128' [--grid ...] [OPTIONS] -- CMD ... {batch} ...\n"
      "       fullburn tune [OPTIONS] -- python train.py ...   (an unchanged PyTorch script)\n"
      "Knobs (docs/tune.md):\n" +
      knobs + "Knobs of a PyTorch script (fullburn tune -- CMD):\n" + script_knobs);
  tune->add_option("args", o->args,
                   "CONFIG.toml and key=value overrides; or the command after -- (with --grid, "
                   "or a PyTorch script to tune as it is)");
  tune->add_option("--budget", o->budget, "Time for the whole tuning (90s, 10m, 1h)")
      ->capture_default_str();
  tune->add_option("--trial", o->trial,
                   "Training time per trial (default 20s); with --grid, a command still running "
                   "after it (default "
                   "60s) is stopped and measured");
  tune->add_option("--objective", o->objective,
                   "samples_per_s, or samples_per_joule (needs GPU power readings)")
      ->capture_default_str();
  tune->add_option("--knobs", o->knobs,
                   "Only these knobs, comma-separated (default: all, bottleneck first)");
  tune->add_flag(
      "--free-batch", o->free_batch,
      "Let the batch-size search change the effective batch (default: train.accumulate keeps it)");
  tune->add_option("--min-gain", o->min_gain,
                   "Keep a change only if it is this much faster (and beyond the noise)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  tune->add_option("-o,--output", o->output,
                   "The winning config (default: fullburn-tuned-TUNING.toml here)");
  tune->add_option("--grid", o->grids,
                   "NAME=V1,V2,...: values for {NAME} in the command; repeat for more axes")
      ->allow_extra_args(false);  // one value per --grid, so "-- CMD" is never taken for more
  tune->add_option("--metric-regex", o->metric_regex,
                   "With --grid: rank by the number this pattern (its first group) finds in the "
                   "output, instead of "
                   "step markers");
  AddStoreOption(tune, &o->common);
  tune->callback([o] { ExitCode() = Tune(*o); });
}

}  // namespace fullburn::cli
