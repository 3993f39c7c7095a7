// fullburn tune -- CMD: an unchanged PyTorch script tuned through the
// automatic markers, which apply each trial's DataLoader arguments and
// thread count from FULLBURN_TUNE_SET. One knob at a time from the best so
// far, as for fullburn train; the winner is printed as the lines to change
// in the script.
#include <fmt/format.h>

#include "child.h"
#include "cli.h"
#include "fullburn/dist.h"
#include "tune_trial.h"

namespace fullburn::cli {
namespace {

constexpr const char* kTuneSetVar = "FULLBURN_TUNE_SET";  // python/fullburn_autosteps.py reads it

class ScriptTuner {
 public:
  ScriptTuner(Tuning* t, const std::vector<std::string>& command, double min_gain,
              const std::string& budget)
      : t_(t), command_(command), min_gain_(min_gain), budget_(budget) {}

  int Run() {
    Trial start = RunOne("start", "as written", {});
    if (start.status == "ok") start.verdict = "start";
    bool ok = start.status == "ok";
    t_->Record(start);
    if (!ok)
      return Finish(t_->interrupted() ? 130 : 1,
                    "the script as written failed (" + start.reason + "): nothing to compare with");
    best_ = t_->trials().back();
    MeasureNoise();
    start_ = best_;
    auto data = t_->store()->LoadRun(std::to_string(best_.run_id));
    std::vector<Finding> findings = data.ok() ? Diagnose(*data) : std::vector<Finding>{};
    std::vector<std::string> order = ScriptKnobOrder(findings, t_->plan().knobs);
    std::fprintf(stderr,
                 "tune: run-to-run noise %.0f%%; the start's top finding is %s; knobs in this "
                 "order: %s\n",
                 noise_ * 100, findings.empty() ? "none" : findings.front().cause.c_str(),
                 fmt::format("{}", fmt::join(order, ", ")).c_str());
    for (size_t k = 0; k < order.size() && !t_->interrupted(); ++k) {
      if (!TryKnob(order[k])) {
        for (size_t r = k; r < order.size(); ++r)
          Skip(order[r], "budget (" + budget_ + ") used up");
        break;
      }
    }
    return Finish(t_->interrupted() ? 130 : 0, "");
  }

 private:
  bool TryKnob(const std::string& knob) {
    std::string skip;
    std::vector<Candidate> candidates = ScriptKnobCandidates(knob, Context(), &skip);
    if (!skip.empty()) Skip(knob, skip);
    for (const Candidate& c : candidates) {
      if (t_->interrupted()) return true;
      if (!t_->BudgetAllows()) return false;
      std::map<std::string, std::string> merged = best_.overrides;
      for (const auto& [key, v] : c.overrides) merged[key] = v;
      Trial trial = RunOne(knob, c.value, merged);
      bool kept = false;
      if (trial.status == "ok")
        trial.verdict = Verdict(trial, best_, std::max(min_gain_, noise_), &kept);
      t_->Record(trial);
      if (kept) best_ = t_->trials().back();
    }
    return true;
  }

  void MeasureNoise() {
    if (!t_->BudgetAllows()) return;
    Trial again = RunOne("start", "again", {});
    if (again.status == "ok") {
      double a = best_.measure.value, b = again.measure.value;
      noise_ = std::abs(a - b) / ((a + b) / 2);
      again.verdict = fmt::format("run-to-run noise {:.0f}%", noise_ * 100);
      best_.measure.value = (a + b) / 2;
      best_.measure.spread = std::max(best_.measure.spread, again.measure.spread);
    }
    t_->Record(again);
  }

  ScriptContext Context() {
    ScriptContext ctx;
    ctx.cores = RankCpus(ReadCpuView(Env::Default()), 1);
    auto run = t_->store()->LoadRun(std::to_string(best_.run_id));
    if (!run.ok()) return ctx;
    ctx.current = ScriptSettings::FromEvents(run->events);
    for (const auto& [name, series] : run->samples)
      if (name.rfind("gpu", 0) == 0 && name.find(".util") != std::string::npos && !series.empty())
        ctx.cuda = true;
    return ctx;
  }

  Trial RunOne(const std::string& knob, const std::string& value,
               const std::map<std::string, std::string>& overrides) {
    Trial trial;
    trial.knob = knob;
    trial.value = value;
    trial.overrides = overrides;
    trial.log = t_->NextLog();
    TrialSpec spec;
    spec.argv = {SelfExecutable(),
                 "run",
                 "-q",
                 "--parent",
                 std::to_string(t_->id()),
                 "--name",
                 fmt::format("tune {} #{}: {}={}", t_->id(), t_->trials().size() + 1, knob, value),
                 "--store",
                 t_->store()->path(),
                 "--"};
    spec.argv.insert(spec.argv.end(), command_.begin(), command_.end());
    spec.tuning_id = t_->id();
    spec.timeout_s = t_->plan().trial_s;
    spec.stop_is_normal = true;  // a script still training at the trial's end is measured
    spec.objective = t_->plan().objective;
    if (!overrides.empty())
      spec.extra_env.push_back(std::string(kTuneSetVar) + "=" +
                               ScriptSettingsJson(overrides).dump());
    RunTrial(spec, t_->store(), &trial);
    if (trial.status == "ok" && !overrides.empty()) {
      // A script that builds its DataLoader in a way the markers cannot
      // reach, or sets threads through another path, ran its own settings.
      auto run = t_->store()->LoadRun(std::to_string(trial.run_id));
      std::string differs =
          run.ok() ? ScriptSettingsMismatch(overrides, ScriptSettings::FromEvents(run->events))
                   : run.status().message();
      if (!differs.empty()) {
        trial.status = "failed";
        trial.reason = "the setting did not take: " + differs;
      }
    }
    return trial;
  }

  void Skip(const std::string& knob, const std::string& reason) {
    Trial t;
    t.knob = knob;
    t.value = "-";
    t.status = "skipped";
    t.reason = reason;
    t_->Record(t);
  }

  int Finish(int code, const std::string& failure) {
    nlohmann::json result{{"objective", ObjectiveName(t_->plan().objective)}};
    if (!failure.empty()) {
      t_->Finish("tuning " + std::to_string(t_->id()) + " stopped: " + failure, result, code);
      return code;
    }
    double ratio = best_.measure.value / start_.measure.value;
    nlohmann::json settings = ScriptSettingsJson(best_.overrides);
    std::string summary =
        fmt::format("tuning {}: {:.1f} {} vs {:.1f} as written ({:.2f}x){}\n  in the script: {}",
                    t_->id(), best_.measure.value, best_.measure.unit, start_.measure.value, ratio,
                    t_->interrupted() ? ", interrupted" : "", ScriptAdvice(best_.overrides));
    if (!best_.overrides.empty())
      summary += fmt::format("\n  or unchanged: {}='{}' fullburn run -- {}", kTuneSetVar,
                             settings.dump(), JoinedCommand(command_));
    result["start"] = start_.measure.value;
    result["best"] = best_.measure.value;
    result["ratio"] = ratio;
    result["best_trial"] = best_.index;
    result["overrides"] = best_.overrides;
    result["settings"] = settings;
    result["advice"] = ScriptAdvice(best_.overrides);
    t_->Finish(summary, result, code);
    return code;
  }

  Tuning* t_;
  std::vector<std::string> command_;
  double min_gain_;
  std::string budget_;
  Trial best_, start_;
  double noise_ = 0;
};

}  // namespace

int TuneScript(Tuning* t, const std::vector<std::string>& command, double min_gain,
               const std::string& budget) {
  return ScriptTuner(t, command, min_gain, budget).Run();
}

}  // namespace fullburn::cli
