// fullburn tune -- CMD: an unchanged PyTorch script tuned through the
// automatic markers, which apply each trial's DataLoader arguments and
// thread count from FULLBURN_TUNE_SET. One knob at a time from the best so
// far, as for fullburn train; the winner is said as the lines to change in
// the script.
#include <fmt/format.h>

#include <cmath>

#include "fullburn/report.h"
#include "fullburn/tuner.h"

namespace fullburn {
namespace {

class ScriptTuner : public KnobTuner {
 public:
  ScriptTuner(Tuning* t, TrialRunner* runner, const std::vector<std::string>& command,
              double min_gain, const std::string& budget)
      : KnobTuner(t, runner, min_gain, budget, "as written", "the script as written", "as written"),
        command_(command) {}

 private:
  std::vector<std::string> Order(const std::vector<Finding>& findings) override {
    return ScriptKnobOrder(findings, t_->plan().knobs);
  }

  std::vector<Candidate> Candidates(const std::string& knob, const std::vector<Finding>&,
                                    std::string* skip_reason) override {
    return ScriptKnobCandidates(knob, Context(), skip_reason);
  }

  // The best trial's settings as its run recorded them; the CPUs of one of
  // its ranks (a data-parallel job's ranks on this node split them); a GPU
  // when it sampled one.
  ScriptContext Context() {
    ScriptContext ctx;
    auto events = t_->store()->LoadEvents(best_.run_id);
    int ranks = events.ok() ? ScriptRanks(*events) : 1;
    ctx.cores = RankCpus(ReadCpuView(t_->env()), ranks);
    ctx.cuda = !std::isnan(best_.measure.gpu_util);
    if (events.ok()) ctx.current = ScriptSettings::FromEvents(*events);
    return ctx;
  }

  // A script that builds its DataLoader in a way the markers cannot reach,
  // or sets threads through another path, ran its own settings; every rank
  // of a data-parallel job must have taken them.
  void Check(Trial* trial) override {
    if (trial->status != TrialStatus::kOk || trial->overrides.empty()) return;
    auto events = t_->store()->LoadEvents(trial->run_id);
    std::vector<RunEvent> none;
    const std::vector<RunEvent>& recorded = events.ok() ? *events : none;
    int ranks = ScriptRanks(recorded);
    for (int rank = 0; rank < ranks; ++rank) {
      std::string differs =
          ScriptSettingsMismatch(trial->overrides, ScriptSettings::FromEvents(recorded, rank));
      if (differs.empty()) continue;
      trial->status = TrialStatus::kFailed;
      trial->reason = "the setting did not take: " +
                      (ranks > 1 ? fmt::format("rank {}: ", rank) : std::string()) + differs;
      break;
    }
  }

  std::string Conclude(const std::string& head, nlohmann::json* result, int*) override {
    nlohmann::json settings = ScriptSettingsJson(best_.overrides);
    std::string summary = head + "\n  in the script: " + ScriptAdvice(best_.overrides);
    if (!best_.overrides.empty())
      summary += fmt::format("\n  or unchanged: {}='{}' fullburn run -- {}", kTuneSetVar,
                             settings.dump(), JoinedCommand(command_));
    (*result)["settings"] = settings;
    (*result)["advice"] = ScriptAdvice(best_.overrides);
    return summary;
  }

  std::vector<std::string> command_;
};

}  // namespace

int TuneScript(Tuning* t, TrialRunner* runner, const std::vector<std::string>& command,
               double min_gain, const std::string& budget) {
  return ScriptTuner(t, runner, command, min_gain, budget).Run();
}

}  // namespace fullburn
