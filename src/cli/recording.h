// Recording a process tree into a run: what `fullburn run` (a command it
// starts) and `fullburn attach` (a process already running) share.
#pragma once

#include <functional>
#include <string>

#include "cli.h"
#include "fullburn/report.h"

namespace fullburn::cli {

// The options of a recording command (run, attach), defined once.
struct RecordOptions {
  CommonOptions common;
  std::string name;  // empty: the command
  bool quiet = false;
};
// --name, -q/--quiet, --interval and --store; `what` names the default name.
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
};

// Samples until `wait` returns, storing every snapshot and the step events,
// with the live line (and what limits the job now) on a terminal. Returns
// what `wait` returned, once the last snapshot and events are stored.
int RecordUntil(const Recording& rec, const std::function<int()>& wait);

// After the run is finished in the store: the summary, the steps, the
// findings and where the run is stored (nothing when quiet).
void PrintRunEnd(const Recording& rec);

std::string GpusJson(const GpuSource& gpus);

}  // namespace fullburn::cli
