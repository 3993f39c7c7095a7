// fullburn tune: short measured trials, one knob at a time, each a run linked
// to the tuning; the winner written as a config `fullburn train` takes as is.
// --grid: the same for any command, over the combinations given.
#include <fmt/format.h>
#include <sys/statvfs.h>
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
#include "fullburn/pipeline.h"
#include "fullburn/report.h"
#include "fullburn/tune.h"
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

Result<Plan> MakePlan(const TuneOptions& o) {
  Plan p;
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

// ---- fullburn train trials --------------------------------------------------

class TrainTuner : public KnobTuner {
 public:
  TrainTuner(Tuning* tuning, const TuneOptions& o)
      : KnobTuner(tuning, o.min_gain, o.budget, "as given", "the starting config"),
        o_(o),
        exe_(TrainingExecutable()) {}

 private:
  std::vector<std::string> Order(const std::vector<Finding>& findings) override {
    return KnobOrder(findings, t_->plan().knobs);
  }

  bool TryKnob(const std::string& knob, const std::vector<Finding>& findings) override {
    TuneContext ctx = Context(findings);
    std::string skip;
    std::vector<Candidate> candidates = KnobCandidates(knob, ctx, &skip);
    if (!skip.empty()) Skip(knob, skip);
    for (const Candidate& c : candidates) {
      if (t_->interrupted()) return true;
      if (!t_->BudgetAllows()) return false;
      std::map<std::string, std::string> merged = OnBest(c);
      if (c.pack) {
        if (Status packed = WritePackFor(*c.pack); !packed.ok()) {
          Trial failed;
          failed.knob = knob;
          failed.value = c.value;
          failed.overrides = merged;
          failed.status = "failed";
          failed.reason = packed.message();
          t_->Record(failed);
          continue;
        }
      }
      Trial trial = RunKnobTrial(knob, c.value, merged);
      if (knob == "batch" && trial.status == "ok") trial = SettleBatch(trial, ctx);
      Judge(&trial);
    }
    return true;
  }

  // The pack knob's data, written once per tuning into its directory. The
  // time it takes counts against the budget like a trial's.
  Status WritePackFor(const PackJob& job) {
    if (PackReader::IsPack(job.dst)) return Status::Ok();
    auto folder = ScanImageFolder(job.src);
    if (!folder.ok()) return folder.status();
    std::string parent = job.dst.substr(0, job.dst.rfind('/'));
    struct statvfs fsinfo {};
    if (::statvfs(parent.c_str(), &fsinfo) == 0) {
      double free_bytes =
          static_cast<double>(fsinfo.f_bavail) * static_cast<double>(fsinfo.f_frsize);
      if (Status room = CheckPackSpace(folder->files.size(), job.max_side, free_bytes, parent);
          !room.ok())
        return room;
    }
    std::fprintf(stderr, "tune: packing the %zu images of %s into %s (raw, max side %d)\n",
                 folder->files.size(), job.src.c_str(), job.dst.c_str(), job.max_side);
    double started = TuneClock();
    PackOptions po;
    po.format = PackFormat::kRaw;
    po.max_side = job.max_side;
    auto report = WritePack(*folder, job.src, job.dst, po);
    if (!report.ok())  // WritePack has removed what it wrote
      return Status::IoError("packing " + job.src + " failed: " + report.status().message());
    packed_ = job;
    std::fprintf(
        stderr, "tune: packed %lld images (%.0f MiB) in %.1fs%s\n",
        static_cast<long long>(report->images), report->bytes / 1048576.0, TuneClock() - started,
        report->skipped ? fmt::format(", {} unreadable left out", report->skipped).c_str() : "");
    return Status::Ok();
  }

  // The search trial chose a micro-batch; keep the effective batch by
  // accumulation, measuring again when that changes what was measured.
  Trial SettleBatch(Trial search, const TuneContext& ctx) {
    std::map<std::string, std::string> searched = FlatConfig(search.run_id);
    int64_t chosen = 0, effective = 0;
    try {
      chosen = std::stoll(searched.at("train.batch_size"));
      effective = std::stoll(ctx.config.at("train.batch_size")) *
                  std::stoll(ctx.config.at("train.accumulate"));
    } catch (const std::exception&) {
      search.status = "failed";
      search.reason =
          "run " + std::to_string(search.run_id) + " does not record the chosen batch size";
      return search;
    }
    std::map<std::string, std::string> overrides = best_.overrides;
    overrides.erase("train.max_batch_size");
    if (!ctx.keep_effective_batch) {
      overrides["train.batch_size"] = std::to_string(chosen);
      search.overrides = overrides;
      search.value = std::to_string(chosen);
      return search;
    }
    auto [micro, accumulate] = KeepEffectiveBatch(chosen, effective);
    overrides["train.batch_size"] = std::to_string(micro);
    overrides["train.accumulate"] = std::to_string(accumulate);
    if (micro == chosen && accumulate == 1) {
      search.overrides = overrides;
      search.value = std::to_string(micro);
      return search;
    }
    search.verdict = fmt::format("search chose {}", chosen);
    t_->Record(search);
    return RunKnobTrial("batch", fmt::format("{} x {}", micro, accumulate), overrides);
  }

  TuneContext Context(const std::vector<Finding>& findings) {
    TuneContext ctx;
    ctx.config = FlatConfig(best_.run_id);
    ctx.cuda = ctx.config["resolved.device"].rfind("cuda", 0) == 0;
    ctx.cores = RankCpus(ReadCpuView(Env::Default()), 1);  // what one trial may use
    ctx.host_memory_bytes = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<double>(::sysconf(_SC_PAGESIZE));
    ctx.input_bound = InputBound(findings);
    ctx.knobs_chosen = !t_->plan().knobs.empty();
    ctx.keep_effective_batch = !o_.free_batch;
    ctx.pack_dir = t_->PackDir();
    ctx.data_is_pack = PackReader::IsPack(ctx.config["resolved.data_path"]);
    return ctx;
  }

  // A run's effective config, flattened ("train.batch_size"); its samples are not needed.
  std::map<std::string, std::string> FlatConfig(int64_t run_id) {
    auto run = t_->store()->GetRun(std::to_string(run_id));
    if (!run.ok()) return {};
    RunData only_info;
    only_info.run = *run;
    return Digest(only_info, {}).config;
  }

  Trial RunOne(const std::string& knob, const std::string& value,
               const std::map<std::string, std::string>& overrides) override {
    Trial trial = NewTrial(knob, value, overrides);
    TrialSpec spec;
    spec.argv = {exe_, "train"};
    const Plan& p = t_->plan();
    if (!p.config_path.empty()) spec.argv.push_back(p.config_path);
    for (const std::string& kv : p.overrides) spec.argv.push_back(kv);
    // A trial is a fixed stretch of training: no checkpoints, no evaluation, no early end.
    for (const char* kv : {"checkpoint.at_end=false", "checkpoint.every_steps=0",
                           "checkpoint.every_minutes=0", "eval.at_end=false", "eval.every_steps=0",
                           "eval.every_epochs=0", "train.steps=1000000000"})
      spec.argv.push_back(kv);
    spec.argv.push_back(fmt::format("train.time_limit_s={}", p.trial_s));
    for (const auto& [key, v] : overrides) spec.argv.push_back(key + "=" + v);
    spec.argv.insert(spec.argv.end(), {"-q", "--parent", std::to_string(t_->id()), "--name",
                                       fmt::format("tune {} #{}: {}={}", t_->id(),
                                                   t_->trials().size() + 1, knob, value),
                                       "--store", t_->store()->path()});
    spec.tuning_id = t_->id();
    spec.timeout_s = p.trial_s + kTrainTrialAllowanceS;
    spec.length_s = p.trial_s;
    spec.objective = p.objective;
    RunTrial(spec, t_->store(), &trial);
    return trial;
  }

  // The winner as a complete config file; the summary line.
  int Finish(int code, const std::string& failure) override {
    const Plan& p = t_->plan();
    nlohmann::json result{{"objective", ObjectiveName(p.objective)}};
    if (!failure.empty()) {
      t_->Finish("tuning " + std::to_string(t_->id()) + " stopped: " + failure, result, code);
      return code;
    }
    std::vector<std::string> overrides = p.overrides, changed;
    for (const auto& [key, v] : best_.overrides) changed.push_back(key + "=" + v);
    overrides.insert(overrides.end(), changed.begin(), changed.end());
    auto config = Config::Load(p.config_path, overrides);
    std::string path =
        o_.output.empty() ? fmt::format("fullburn-tuned-{}.toml", t_->id()) : o_.output;
    double ratio = best_.measure.value / start_.measure.value;
    std::string header = fmt::format(
        "# fullburn tune (tuning run {}): {:.1f} {} with these settings, {:.1f} at the start "
        "({:.2f}x).\n"
        "# Changed: {}\n",
        t_->id(), best_.measure.value, best_.measure.unit, start_.measure.value, ratio,
        changed.empty() ? "nothing" : fmt::format("{}", fmt::join(changed, " ")));
    auto path_it = best_.overrides.find("data.path");
    if (packed_ && path_it != best_.overrides.end() && path_it->second == packed_->dst)
      header += fmt::format(
          "# data.path is a pack the tuner wrote; to rebuild it: fullburn pack {} {} --format raw "
          "--max-side {}\n",
          packed_->src, packed_->dst, packed_->max_side);
    Status written =
        config.ok() ? WriteFileAtomically(path, header + config->ToToml()) : config.status();
    std::string summary = fmt::format(
        "tuning {}: {:.1f} {} vs {:.1f} at the start ({:.2f}x){}; ", t_->id(), best_.measure.value,
        best_.measure.unit, start_.measure.value, ratio, t_->interrupted() ? ", interrupted" : "");
    summary += written.ok() ? "config written to " + path + " (fullburn train " + path + ")"
                            : "the config could not be written: " + written.message();
    result["config_path"] = written.ok() ? path : "";
    result["start"] = start_.measure.value;
    result["best"] = best_.measure.value;
    result["ratio"] = ratio;
    result["best_trial"] = best_.index;
    result["overrides"] = best_.overrides;
    t_->Finish(summary, result, written.ok() ? code : 1);
    return written.ok() ? code : 1;
  }

  const TuneOptions& o_;
  std::string exe_;
  std::optional<PackJob> packed_;
};

// ---- --grid: any command -----------------------------------------------------

std::string GridValue(const std::vector<GridAxis>& axes,
                      const std::map<std::string, std::string>& combo) {
  std::string value;
  for (const GridAxis& a : axes)
    value += (value.empty() ? "" : " ") + a.name + "=" + combo.at(a.name);
  return value;
}

// A grid has no start to improve on: each combination is judged against the
// fastest before it, and a faster median within the noise is called a tie.
std::string GridVerdict(const Trial& trial, const std::vector<Trial>& before, double min_gain) {
  if (trial.status != "ok") return "";
  int best = BestTrial(before);
  if (best < 0) return "first";
  const Trial& b = before[best];
  double gain = 0;
  if (BeatsBest(trial.measure, b.measure, min_gain, &gain))
    return fmt::format("fastest so far ({:+.0f}%)", gain * 100);
  double back = 0;
  if (!BeatsBest(b.measure, trial.measure, min_gain, &back))
    return fmt::format("ties #{} ({:+.0f}%, within the noise)", b.index, gain * 100);
  return fmt::format("{:+.0f}% vs #{}", gain * 100, b.index);
}

int TuneGrid(Tuning* t, const TuneOptions& o) {
  const Plan& p = t->plan();
  std::vector<std::map<std::string, std::string>> combos = ExpandGrid(p.axes);
  size_t i = 0;
  for (; i < combos.size() && !t->interrupted(); ++i) {
    if (!t->trials().empty() && !t->BudgetAllows()) break;
    Trial trial;
    trial.knob = "grid";
    trial.value = GridValue(p.axes, combos[i]);
    trial.overrides = combos[i];
    trial.log = t->NextLog();
    Result<std::vector<std::string>> command =
        Substitute(o.args, combos[i]);  // checked before any trial
    TrialSpec spec = CommandTrialSpec(*t, trial.value, *command);
    spec.metric_regex = o.metric_regex;
    RunTrial(spec, t->store(), &trial);
    trial.verdict = GridVerdict(trial, t->trials(), o.min_gain);
    t->Record(trial);
  }
  for (; i < combos.size(); ++i) {
    Trial skipped;
    skipped.knob = "grid";
    skipped.value = GridValue(p.axes, combos[i]);
    skipped.status = "skipped";
    skipped.reason = t->interrupted() ? "interrupted" : "budget (" + o.budget + ") used up";
    t->Record(skipped);
  }
  int code = t->interrupted() ? 130 : 0;
  nlohmann::json result{{"objective", ObjectiveName(p.objective)}};
  int best_index = BestTrial(t->trials());
  if (best_index < 0) {
    t->Finish(
        fmt::format(
            "tuning {}: no trial could be measured (the reasons are above; the outputs in {})",
            t->id(), t->LogDir()),
        result, code ? code : 1);
    return code ? code : 1;
  }
  const Trial& best = t->trials()[best_index];
  std::string command = JoinedCommand(*Substitute(o.args, best.overrides));
  result["best"] = best.measure.value;
  result["best_trial"] = best.index;
  result["overrides"] = best.overrides;
  result["command"] = command;
  std::string ties;
  result["ties"] = nlohmann::json::array();
  for (int i : TiedWithBest(t->trials(), best_index, o.min_gain)) {
    const Trial& tie = t->trials()[i];
    result["ties"].push_back(tie.index);
    ties += fmt::format("{}#{} {}", ties.empty() ? "" : ", ", tie.index, tie.value);
  }
  if (!ties.empty())
    ties = fmt::format(
        "\n  as fast within the noise (pick the one that costs least; --min-gain {:.0f}%): {}",
        o.min_gain * 100, ties);
  t->Finish(fmt::format("tuning {}: best {} at {:.1f} {} (trial #{}, run {}){}\n  {}{}", t->id(),
                        best.value, best.measure.value, best.measure.unit, best.index, best.run_id,
                        t->interrupted() ? ", interrupted" : "", command, ties),
            result, code);
  return code;
}

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
  if (plan->script) return TuneScript(&tuning, o.args, o.min_gain, o.budget);
  return plan->grid ? TuneGrid(&tuning, o) : TrainTuner(&tuning, o).Run();
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
