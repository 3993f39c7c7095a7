// Internal to fullburn tune: running one trial as a child process, the
// TrialRunner the tuning loop (src/internal/fullburn/tuner.h) is given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fullburn/store.h"
#include "fullburn/tune.h"
#include "fullburn/tuner.h"

namespace fullburn::cli {

struct TrialSpec {
  std::vector<std::string> argv;  // records a run with --parent tuning_id
  int64_t tuning_id = 0;
  double timeout_s = 0;
  // The stretch measured (--trial): the child ran it all when it lasted this long.
  double length_s = 0;
  // --grid: a command still running at the trial's end is stopped and
  // measured; fullburn-train stops itself, so running past it is a failure.
  bool stop_is_normal = false;
  std::string metric_regex;  // measure the output instead of the step records
  std::vector<std::string> extra_env;  // NAME=value for the child
  Objective objective = Objective::kSamplesPerSecond;
};

// Runs the child (output to trial->log), then fills status, reason, run_id,
// wall_s and the measure. Never throws; a failure is the trial's status.
void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial);

// A trial of `command` under `fullburn run`, recorded as a run of the
// tuning named `label` ("tune 3 #2: workers=4"), stopped at --trial and
// measured from what it recorded (--grid, and an unchanged script).
TrialSpec CommandTrialSpec(const Tuning& t, const std::string& label,
                           const std::vector<std::string>& command);

// What every child-process runner shares: Ctrl-C is the signal the command
// forwarded to its child, and the pack knob's pack is written here.
class ChildTrialRunner : public TrialRunner {
 public:
  bool Interrupted() const override;
  Status WritePack(const PackJob& job) override;
};

// fullburn tune -- CMD: trials of an unchanged PyTorch script with
// FULLBURN_TUNE_SET (cmd_tune_script.cpp).
std::unique_ptr<TrialRunner> ScriptTrialRunner(const std::vector<std::string>& command);

}  // namespace fullburn::cli
