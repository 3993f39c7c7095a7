// Recording a process tree into a run: what `fullburn run` (a command it
// starts) and `fullburn attach` (a process already running) share.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli.h"
#include "fullburn/report.h"
#include "fullburn/spill.h"

namespace fullburn::cli {

// The options of a recording command (run, attach), defined once.
struct RecordOptions {
  CommonOptions common;
  std::string name;  // empty: the command
  bool quiet = false;
  double peak_tflops = 0;  // > 0: MFU's peak per GPU, in place of the table's
};
// --name, -q/--quiet, --interval, --store and --peak-tflops; `what` names the default name.
void AddRecordOptions(CLI::App* app, RecordOptions* opts, const std::string& what);

struct Recording {
  const Env* env = nullptr;
  GpuSource* gpus = nullptr;
  RunStore* store = nullptr;
  RunInfo info;      // begun in the store
  int root_pid = 0;  // the tree sampled, every info.interval_s
  int adopter_pid = -1;  // > 0: this recorder adopts the tree's orphans (fullburn run)
  bool quiet = false;                 // no live line
  EventFileReader* events = nullptr;  // the job's step events; null: none
  SpillFile* spill = nullptr;         // where what the store refuses goes (spill.h)
};

// Samples until `wait` returns, storing every snapshot and the step events,
// with the live line (and what limits the job now) on a terminal. Returns
// what `wait` returned, once the last snapshot and events are stored.
int RecordUntil(const Recording& rec, const std::function<int()>& wait);

// The run's end into the store, or into the spill when the store refuses
// it (a finished job is never left to read as interrupted); then what the
// spill holds goes to the store if it takes writes now, else its file and
// the import command are named.
void EndRun(const Recording& rec, double end_time, std::optional<int> exit_code,
            const std::string& status);

// After the run is finished in the store: the summary, the steps, the
// findings and where the run is stored (nothing when quiet).
void PrintRunEnd(const Recording& rec);

std::string GpusJson(const GpuSource& gpus);
// The run's config keys the record options set (peak_tflops), added to `config`.
void AddRecordConfig(const RecordOptions& opts, nlohmann::json* config);
// One line for GPU models the peak table lacks, when no --peak-tflops is
// given: MFU then needs it.
void NoteIfNoPeak(const GpuSource& gpus, const RecordOptions& opts);

}  // namespace fullburn::cli
