// The profiler traces `fullburn run --profile` attached to a run (its
// `profile` events) and their analysis, for the run's end, `fullburn
// diagnose` and `fullburn report` (docs/analyze.md, "From a run").
#pragma once

#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/store.h"

namespace fullburn::cli {

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

// Where fullburn run --profile has a run's traces written: beside the store,
// traces/run-ID.
std::string TraceDir(const std::string& store_path, int64_t run_id);

}  // namespace fullburn::cli
