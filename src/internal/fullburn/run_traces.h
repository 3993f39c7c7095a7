// The profiler traces `fullburn run --profile` attached to a run (its
// `profile` events) and their analysis, for the run's end, `fullburn
// diagnose`, `fullburn report` and the trainer's summary (docs/analyze.md,
// "From a run").
//
// Contract: reads the trace files the run's events name; a build without the trace analyzer (no simdjson) says so in `error`. Its own
// small library (fullburn_run_traces), so the CLI and the trainer share it
// without either including the other.
#pragma once

#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/store.h"

namespace fullburn {

struct RunTraces {
  std::vector<std::string> paths;  // the trace files, one per rank
  std::string steps;               // "20-25": the steps they hold
  std::vector<Finding> findings;   // the analysis' findings, the job's
  std::string text;                // the whole report (fullburn analyze's)
  std::string error;               // why there is no analysis ("" when there is)
};

// Nothing when the run has no `profile` event; otherwise the files' analysis,
// or the one-line reason it could not be made (a file gone, no simdjson).
RunTraces AnalyzeRunTraces(const RunData& run);


}  // namespace fullburn
