// fullburn tune -- CMD: an unchanged PyTorch script tuned through the
// automatic markers, which apply each trial's DataLoader arguments and
// thread count from FULLBURN_TUNE_SET. One knob at a time from the best so
// far, as for fullburn train; the winner is printed as the lines to change
// in the script.
#include <fmt/format.h>

#include <cmath>

#include "cli.h"
#include "fullburn/dist.h"
#include "tune_trial.h"

namespace fullburn::cli {
namespace {

constexpr const char* kTuneSetVar = "FULLBURN_TUNE_SET";  // python/fullburn_autosteps.py reads it

class ScriptTuner : public KnobTuner {
 public:
  ScriptTuner(Tuning* t, const std::vector<std::string>& command, double min_gain,
              const std::string& budget)
      : KnobTuner(t, min_gain, budget, "as written", "the script as written"), command_(command) {}

 private:
  std::vector<std::string> Order(const std::vector<Finding>& findings) override {
    return ScriptKnobOrder(findings, t_->plan().knobs);
  }

  bool TryKnob(const std::string& knob, const std::vector<Finding>&) override {
    std::string skip;
    std::vector<Candidate> candidates = ScriptKnobCandidates(knob, Context(), &skip);
    if (!skip.empty()) Skip(knob, skip);
    for (const Candidate& c : candidates) {
      if (t_->interrupted()) return true;
      if (!t_->BudgetAllows()) return false;
      std::map<std::string, std::string> merged = OnBest(c);
      Trial trial = RunKnobTrial(knob, c.value, merged);
      Judge(&trial);
    }
    return true;
  }

  // The best trial's settings as its run recorded them; the CPUs of one of
  // its ranks (a data-parallel job's ranks on this node split them); a GPU
  // when it sampled one.
  ScriptContext Context() {
    ScriptContext ctx;
    auto events = t_->store()->LoadEvents(best_.run_id);
    int ranks = events.ok() ? ScriptRanks(*events) : 1;
    ctx.cores = RankCpus(ReadCpuView(Env::Default()), ranks);
    ctx.cuda = !std::isnan(best_.measure.gpu_util);
    if (events.ok()) ctx.current = ScriptSettings::FromEvents(*events);
    return ctx;
  }

  Trial RunOne(const std::string& knob, const std::string& value,
               const std::map<std::string, std::string>& overrides) override {
    Trial trial = NewTrial(knob, value, overrides);
    TrialSpec spec = CommandTrialSpec(*t_, knob + "=" + value, command_);
    if (!overrides.empty())
      spec.extra_env.push_back(std::string(kTuneSetVar) + "=" +
                               ScriptSettingsJson(overrides).dump());
    RunTrial(spec, t_->store(), &trial);
    if (trial.status == "ok" && !overrides.empty()) {
      // A script that builds its DataLoader in a way the markers cannot
      // reach, or sets threads through another path, ran its own settings;
      // every rank of a data-parallel job must have taken them.
      auto events = t_->store()->LoadEvents(trial.run_id);
      std::vector<RunEvent> none;
      const std::vector<RunEvent>& recorded = events.ok() ? *events : none;
      int ranks = ScriptRanks(recorded);
      for (int rank = 0; rank < ranks; ++rank) {
        std::string differs =
            ScriptSettingsMismatch(overrides, ScriptSettings::FromEvents(recorded, rank));
        if (differs.empty()) continue;
        trial.status = "failed";
        trial.reason = "the setting did not take: " +
                       (ranks > 1 ? fmt::format("rank {}: ", rank) : std::string()) + differs;
        break;
      }
    }
    return trial;
  }

  int Finish(int code, const std::string& failure) override {
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

  std::vector<std::string> command_;
};

}  // namespace

int TuneScript(Tuning* t, const std::vector<std::string>& command, double min_gain,
               const std::string& budget) {
  return ScriptTuner(t, command, min_gain, budget).Run();
}

}  // namespace fullburn::cli
