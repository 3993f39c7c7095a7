// fullburn tune -- CMD: each trial of an unchanged PyTorch script runs under
// fullburn run with FULLBURN_TUNE_SET, which the automatic markers apply
// (the DataLoader arguments and the thread count). The tuning itself is
// TuneScript's (src/tune/script_tuner.cpp).
#include <fmt/format.h>

#include "fullburn/tune.h"
#include "tune_trial.h"

namespace fullburn::cli {
namespace {

class ScriptRunner : public ChildTrialRunner {
 public:
  explicit ScriptRunner(std::vector<std::string> command) : command_(std::move(command)) {}

  void Run(const Tuning& t, Trial* trial) override {
    TrialSpec spec = CommandTrialSpec(t, trial->knob + "=" + trial->value, command_);
    if (!trial->overrides.empty())
      spec.extra_env.push_back(std::string(kTuneSetVar) + "=" +
                               ScriptSettingsJson(trial->overrides).dump());
    RunTrial(spec, t.store(), trial);
  }

 private:
  std::vector<std::string> command_;
};

}  // namespace

std::unique_ptr<TrialRunner> ScriptTrialRunner(const std::vector<std::string>& command) {
  return std::make_unique<ScriptRunner>(command);
}

}  // namespace fullburn::cli
