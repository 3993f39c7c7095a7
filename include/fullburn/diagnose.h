// Diagnose: turns a run's telemetry samples and (from `fullburn train`) its
// per-step records into findings: the cause, the evidence, the share of wall
// time it costs, and the fix.
//
// Contract
// - Pure functions of their inputs (no I/O, no clocks, no libtorch); safe
//   from any thread. Rules and thresholds are the table in diagnose.cpp,
//   written down in docs/diagnosis.md with their sources.
// - Cause identifiers are stable (JSON output and docs use them): a cause is
//   never renamed, only added.
// - Findings are sorted by the share of wall time lost, largest first. A run
//   with no problem gets one `healthy` finding, never an empty list.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fullburn/store.h"

namespace fullburn {

struct Finding {
  std::string cause;     // input_cpu, input_io, input_workers, small_batch, ...
  std::string title;     // one line for people
  std::string evidence;  // metrics, window and thresholds that fired
  double share_lost = 0; // of wall time (0 for opportunities such as memory_headroom)
  double confidence = 0; // 0..1
  std::string fix;       // the knob and a suggested value
};

std::vector<Finding> Diagnose(const RunInfo& run, const std::map<std::string, Series>& samples,
                              const std::vector<StepRecord>& steps);

std::string RenderFindings(const std::vector<Finding>& findings, size_t max_shown = 3);
nlohmann::json FindingsJson(const std::vector<Finding>& findings);

}  // namespace fullburn
