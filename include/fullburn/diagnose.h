// Diagnose: turns a run's telemetry samples and (from `fullburn train`) its
// per-step records into findings: the cause, the evidence, the share of wall
// time it costs, and the fix.
//
// Contract
// - Pure functions of their inputs (no I/O, no clocks, no libtorch); safe
//   from any thread. Rules and thresholds are the table in diagnose.cpp,
//   written down in docs/diagnosis.md with their sources.
// - Causes are the catalog's (causes.h): a finding carries its CauseId, and
//   the catalog's stable name is what JSON, Prometheus and docs show.
// - Findings are sorted by the share of wall time lost, largest first; then
//   opportunities that cost no time yet (memory_headroom). A run with no
//   problem also gets a `healthy` finding, so the list is never empty.
// - Partial data gives partial findings: a run without GPUs, without step
//   records, or still running is diagnosed from what is there, and the
//   evidence says what was missing.
#pragma once

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/causes.h"
#include "fullburn/stacks.h"
#include "fullburn/store.h"

namespace fullburn {

struct Finding {
  CauseId cause = CauseId::kHealthy;
  std::string title;     // one line for people
  std::string evidence;  // metrics, window and thresholds that fired
  double share_lost = 0; // of wall time (0 for opportunities such as memory_headroom)
  double confidence = 0; // 0..1
  std::string fix;       // the knob and a suggested value
  // Where in the job's code its time went, from the run's Python stacks
  // (stacks.h; the catalog's stack_phases): "train.py:42 Photos.__getitem__
  // -> PIL Image.resize 83% of the DataLoader workers' work, ...". "": no
  // stacks, or none for this cause.
  std::string where;
  std::string name() const { return CauseName(cause); }  // "input_workers"
};

std::vector<Finding> Diagnose(const RunData& run);

// The run's stack summary (its last `stacks` event; empty without one).
StackSummary RunStacks(const RunData& run);
// The "where" of a finding of `cause` from `stacks` ("" when none): the
// catalog's stack phases, or `phases` when given ("evaluation").
std::string WhereOf(CauseId cause, const StackSummary& stacks, const std::string& phases = "");

// Per-layer times of a `fullburn run --layers` job (its last `layers`
// event, python/fullburn_layers.py): each top-level child of the model, its
// median forward and backward time per step and the bytes autograd saved
// for backward in its forward.
struct LayerTime {
  std::string name, type;
  int64_t params = 0;
  double forward_s = 0, backward_s = 0;
  int64_t activation_bytes = 0;
};
struct RunLayerTimes {
  std::string device, model;  // "cuda" | "cpu"; the model's class
  int64_t steps = 0;          // steps the medians are over
  double hooks_s_per_step = 0;  // the hooks' own host time
  std::vector<LayerTime> layers;
  bool empty() const { return layers.empty(); }
};
RunLayerTimes RunLayers(const RunData& run);
// A table: layer, type, forward, backward, share of the layers' time, activations.
std::string RenderLayers(const RunLayerTimes& layers, size_t max_shown = 12);
// "h 71% of the layers' forward and backward, lm_head 20%": the top `n`.
std::string TopLayers(const RunLayerTimes& layers, size_t n = 2);

// Model FLOPs utilization: the FLOPs the step hooks counted in one training
// step (a "flops" event, python/fullburn_flops.py) at the median step time,
// of the job's GPUs' peak: flops / step_s / (peak × GPUs per rank), the peak
// the dense bf16 tensor-core one (fp16 on GPUs without bf16) from the table
// in gpu_peaks.h, or the run's peak_tflops (FULLBURN_PEAK_TFLOPS).
struct Mfu {
  double value = NAN;  // 0..1; NaN: unknown, `why` says why
  double flops_per_step = NAN;
  double step_s = NAN;       // median step time
  double peak_tflops = NAN;  // per GPU
  int gpus = 0;              // per rank
  std::string peak_from;     // "H100 SXM (its datasheet)", or "FULLBURN_PEAK_TFLOPS"
  // Ops that compute without a FLOP formula ran (a custom kernel, flash-attn
  // without one): the count, and so MFU, is a lower bound.
  std::vector<std::string> uncounted;
  std::string why;
  bool counted = false;  // the hooks tried (a "flops" event: a count or why not)
  bool known() const { return !std::isnan(value); }
  // "MFU 38.2%: 1.31 TFLOP/step in 92.1 ms of 989 TFLOPS bf16 × 1 GPU (H100 SXM)"; or "MFU -: why".
  std::string Text() const;
};
Mfu ComputeMfu(const RunData& run);
// "  MFU 38.2%: ...\n" for a run whose hooks counted (or tried to); "" for the rest.
std::string RenderMfu(const Mfu& m);
// {value, flops_per_step, step_s, peak_tflops, gpus, peak_from, lower_bound,
// uncounted, why}; value null when unknown.
nlohmann::json MfuJson(const Mfu& m);
// " | MFU 38%" for the live line; "" while unknown.
std::string RenderLiveMfu(const Mfu& m);

// The GPU readings the findings rest on, over the job's GPUs: on a shared
// node, GPUs that ran none of the job's processes are left out. NaN: no reading.
struct JobGpus {
  double util_pct = NAN;              // mean over the job's GPUs of each one's median
  double mem_peak_share = NAN;        // the largest peak used / total among them
  std::vector<std::string> left_out;  // "GPU 3", "GPU 1 of rank 4's node"
};
JobGpus ReadJobGpus(const RunData& run);

// The part of a run between `from` and `to` (seconds into it) as a run of
// its own, its times from `from`: the readings inside it, the steps and the
// timed events (saves, evaluations) wholly inside it, the checkpoints
// written inside it, and the job's settings (dataloader, torch events)
// whatever their time. A run that went on past `to` ends there (no exit
// code: its end is not in the window); one that ended inside keeps its end.
RunData RunWindow(const RunData& run, double from, double to);

// What limits a run now, while it runs (fullburn run's live line): the
// diagnosis of its last kWindowS seconds, so the start-up is soon behind it
// and a change of phase shows. Fed what the recorder already has: each
// snapshot's readings, the new steps and events. Not thread-safe: one
// recorder thread feeds and asks. Times are seconds since the run's start.
class LiveDiagnosis {
 public:
  static constexpr double kWindowS = 60;  // "now"
  static constexpr double kEveryS = 10;   // at most one diagnosis this often
  static constexpr double kMinS = 20;     // of steps (of readings, without steps) before the first

  explicit LiveDiagnosis(RunInfo run) {
    kept_.run = std::move(run);
    kept_.run.end_time.reset();  // a run still going
    kept_.run.exit_code.reset();
  }
  void AddReadings(double t, const std::vector<std::pair<std::string, double>>& readings);
  void AddSteps(const std::vector<StepRecord>& steps);
  void AddEvents(const std::vector<RunEvent>& events);
  // The top finding of the window ending at `t` (one costing >= 5%, else
  // `healthy`), re-diagnosed when kEveryS have passed; none before kMinS.
  const std::optional<Finding>& Update(double t);
  // The steps kept: the window's, and those added since the last cut.
  const std::vector<StepRecord>& steps() const { return kept_.steps; }
  // MFU over the window, as of the last Update.
  const Mfu& mfu() const { return mfu_; }

 private:
  RunData kept_;  // the window so far (settings whatever their age), times from the run's start
  double first_t_ = NAN, first_step_t_ = NAN, last_update_ = -1e300;
  double longest_step_s_ = 0;
  std::optional<Finding> top_;
  Mfu mfu_;
};

// " | now: input_workers ~48%", " | now: no bottleneck"; "" for none, or for
// a healthy finding that rests on nothing measured (no GPU, no steps).
std::string RenderLiveFinding(const std::optional<Finding>& top);

std::string RenderFindings(const std::vector<Finding>& findings, size_t max_shown = 3);
// [{cause, title, time_lost_pct, confidence, evidence, fix}, ...]
nlohmann::json FindingsJson(const std::vector<Finding>& findings);

}  // namespace fullburn
