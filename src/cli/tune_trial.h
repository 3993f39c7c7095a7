// Internal to fullburn tune: running one trial as a child process.
#pragma once

#include <string>
#include <vector>

#include "fullburn/store.h"
#include "fullburn/tune.h"

namespace fullburn::cli {

struct TrialSpec {
  std::vector<std::string> argv;  // records a run with --parent tuning_id
  int64_t tuning_id = 0;
  double timeout_s = 0;
  // --grid: a command still running at the trial's end is stopped and
  // measured; fullburn-train stops itself, so running past it is a failure.
  bool stop_is_normal = false;
  std::string metric_regex;  // measure the output instead of the step records
  Objective objective = Objective::kSamplesPerSecond;
};

// <store directory>/tune-<id>: the trials' output files.
std::string TrialLogDir(const std::string& store_path, int64_t tuning_id);

// Runs the child (output to trial->log), then fills status, reason, run_id,
// wall_s and the measure. Never throws; a failure is the trial's status.
void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial);

}  // namespace fullburn::cli
