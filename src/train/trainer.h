// The trainer's internals shared by its files (train component only).
#pragma once

#include <chrono>

#include "fullburn/report.h"
#include "fullburn/store.h"
#include "fullburn/train.h"
#include "sources.h"

namespace fullburn {

inline double MonoNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The model plus what one step needs, built from the config.
struct StepContext {
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;  // bf16 / fp16, none for fp32
  bool sync_timing = false;                   // CUDA: synchronize on timed steps
  std::shared_ptr<Model> model;
  bool per_position = false;
  bool channels_last = false;
};

// One micro-batch: forward and loss (divided by `accumulate`), backward.
// Returns the undivided loss as a 0-dim tensor on the device (no sync).
struct MicroTimes {
  double forward_s = 0, backward_s = 0;
};
torch::Tensor ForwardBackward(const StepContext& ctx, const TrainBatch& b, int accumulate,
                              const LossScaler& scaler, bool timed, MicroTimes* times);

// The largest micro-batch that fits and trains fastest (train.batch_size =
// auto): doubles from 1 until an out-of-memory or max_batch, bisects between
// the last fit and the first failure, then keeps the fitting size with the
// best measured samples/s among those at most 90% of the limit (headroom for
// what a trial does not hold). Every trial is reported through `trial`.
struct BatchTrial {
  int64_t batch = 0;
  bool fits = false;
  double samples_per_s = 0;
  int64_t peak_bytes = 0;
  std::string error;
};
struct BatchSearchOptions {
  int64_t max_batch = 4096;  // also capped by the samples in one epoch
  int steps = 3;             // timed steps per trial after one warm-up step
  OptimizerOptions optimizer;
};
// Trials run on batches drawn from `probe` (real samples, so shapes and
// values are the data's) and leave the model's weights as they found them.
Result<int64_t> SearchBatchSize(StepContext* ctx, const TrainBatch& probe, const BatchSearchOptions& o,
                                const std::function<void(const BatchTrial&)>& trial);

bool IsOutOfMemory(const std::exception& e);
void FreeDeviceCache(const torch::Device& device);

}  // namespace fullburn
