// RunMemory: the memory model applied to one run of `fullburn train`
// (train component only; docs/memory.md): train.memory_report's probe and
// its `memory` event, the batch search's table of the largest micro-batch
// by memory setting, and the advice after an out-of-memory.
//
// Contract
// - Owns the probed MemoryModel and what the device holds besides the
//   model (the data source's buffers, the evaluation set); borrows the rest
//   (Borrowed): the run's settings, its step context, optimizer, data
//   parallel, sharding and input, which outlive it. Attach once they exist.
// - No threads: every method runs on the training thread. A probe runs
//   forward and backward; with data parallel every rank probes (the
//   gathers are collectives), with sync off.
// - Advice only: a probe that runs out of memory leaves the report out and
//   training goes on; other exceptions are errors (ProbeIfWanted's Status,
//   or thrown from OutOfMemoryAdvice's probe, which then gives none).
// - What it finds goes into the run as `memory` events, which it hands back
//   as JSON for the caller to record.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fullburn/dist_torch.h"
#include "fullburn/optim.h"
#include "fullburn/train_settings.h"
#include "memory_model.h"
#include "run_input.h"
#include "run_sharding.h"
#include "step_context.h"

namespace fullburn {

class RunMemory {
 public:
  // The run wants the memory model: train.memory_report, or a batch search
  // (whose table it prints).
  static bool Wanted(const TrainSettings& settings, bool batch_searched);
  // Empty when the weights and a gradient for each fit on the device next to
  // what it holds (or its memory is unknown), else how much is missing. On
  // the CPU the weights are in that memory already.
  static std::string WholeModelShortfall(const StepContext& ctx);

  struct Borrowed {
    const TrainSettings* settings = nullptr;  // the trainer's, read again as it changes
    StepContext* ctx = nullptr;
    const Optimizer* optimizer = nullptr;
    DataParallel* dp = nullptr;  // null without data parallel
    const RunSharding* sharding = nullptr;
    RunInput* input = nullptr;  // draws the probe's batch
    int rank = 0, world = 1;
    bool quiet = false;
    int64_t batch = 0, accumulate = 1;  // the run's micro-batch and accumulation
    bool batch_searched = false;
  };
  void Attach(const Borrowed& borrowed) { b_ = borrowed; }

  // Where Wanted: probes at the run's micro-batch (a quarter of it after an
  // out-of-memory, none after a second), and prints the table after a
  // batch search.
  Status ProbeIfWanted();
  // At the loop's start: what the device holds besides the model counted
  // again, and its peak reset, so the measured peak is the steps'.
  void StartCount();
  // The `memory` event with the measured peak beside the prediction (rank 0
  // prints it); none without a probe.
  std::optional<nlohmann::json> MeasuredEvent() const;
  // After an out-of-memory in a step: the model's parts and the setting
  // that would fit, for the error, and its `memory` event in `event` (left
  // as it is where it cannot tell: then ""). Probes at a quarter of the
  // batch where the run had no probe.
  std::string OutOfMemoryAdvice(nlohmann::json* event);

 private:
  Status Probe(int64_t batch);
  // The model's parameter parts for this run (`optimizer` gives the state's
  // slots) and its activation lines probed at `small` and `large`.
  MemoryModel ProbedModel(const Optimizer& optimizer, const TrainBatch& probe, int64_t small,
                          int64_t large);
  void ProbeFusedLoss(const TrainBatch& probe, int64_t small, int64_t large, MemoryModel* m);
  void CountOther(const MemoryModel& m);
  int64_t Budget() const;  // bytes the model's prediction may take
  nlohmann::json Json(bool measured) const;
  void PrintTable();

  Borrowed b_;
  std::optional<MemoryModel> model_;
  int64_t other_bytes_ = 0;  // in use at the start besides weights and buckets
};

}  // namespace fullburn
