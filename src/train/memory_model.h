// Internal to train: the memory model (docs/memory.md). What one rank holds
// at the peak of a training step, by part, for each dist.shard and
// model.checkpoint setting, from the parameters, the optimizer and a probe
// of the activation memory a step adds per sample.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "fullburn/status.h"
#include "fullburn/optim.h"

namespace fullburn {

struct StepContext;
struct TrainBatch;

// `update`: what the optimizer's update holds besides the weights and the
// state, the gradients this rank keeps and the update's temporaries. It
// comes after backward, with the activations gone, so the peak is the larger
// of the two moments.
struct MemoryParts {
  int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, update = 0;
  int64_t total() const { return weights + optimizer + std::max(gradients + activations, update); }
};

// A step's activations, fitted from probes: fixed + per_sample * batch, and
// above `knee` samples (when > 0) per_sample_above for each sample more: a
// loss computed a chunk of rows at a time (Model::LossChunkRows) holds one
// chunk's logits however large the batch.
struct ActivationFit {
  double fixed = 0, per_sample = 0;
  int64_t knee = 0;
  double per_sample_above = 0;
  double At(int64_t batch) const {
    if (knee <= 0 || batch <= knee) return fixed + per_sample * static_cast<double>(batch);
    return fixed + per_sample * static_cast<double>(knee) +
           per_sample_above * static_cast<double>(batch - knee);
  }
};

struct MemoryModel {
  int64_t weight_bytes = 0;        // every parameter
  int64_t grad_bytes = 0;          // the trainable ones' gradients
  int64_t largest_grad_bytes = 0;  // one shard may exceed 1/N by this
  int64_t state_bytes = 0;         // the optimizer's state for every parameter
  int64_t largest_state_bytes = 0;
  int64_t bucket_bytes = 0;  // dist.bucket_mb
  // The update's temporaries (Optimizer::UpdateTemporaryBytes): updating
  // every parameter, and a 1/N share of them (dist.shard).
  int64_t update_temp_bytes = 0, update_temp_share_bytes = 0;
  // dist.shard = full: what a rank gathers on top of its share at a time
  // (the parameters outside blocks, held for the step, and the largest
  // block); -1: the model has no blocks to gather (full is not offered).
  int64_t gather_bytes = -1;
  // dist.offload = optimizer on a GPU: the state is in host memory, not the
  // device's (on a CPU run both are the same memory: nothing changes).
  bool state_on_host = false;
  int world = 1;
  int64_t accumulate = 1;  // train.accumulate: above 1 gradients live across micro-batches
  int64_t probed_small = 0, probed_large = 0;        // the micro-batches the lines were probed at
  std::map<std::string, ActivationFit> activations;  // by model.checkpoint mode probed
  // The same with model.fused_loss switched on, where the run's model has a
  // loss to fuse and does not yet (by the mode probed: the run's own, or
  // blocks for dist.shard = full).
  std::map<std::string, ActivationFit> fused_activations;

  // One rank at micro-batch `batch`; `checkpoint` (with `fused_loss`, in
  // fused_activations) must have been probed.
  MemoryParts Predict(int64_t batch, const std::string& shard, const std::string& checkpoint,
                      bool fused_loss = false) const;
  // Whether Predict can answer for model.fused_loss = true at this setting.
  bool CanPredictFused(const std::string& shard, const std::string& checkpoint) const;
  // The largest micro-batch (at most `max_batch`) whose prediction is within
  // `limit` bytes; 0 when not even one sample fits.
  int64_t LargestBatch(int64_t limit, const std::string& shard, const std::string& checkpoint,
                       int64_t max_batch, bool fused_loss = false) const;
  // The dist.shard values that mean something here (all of them with 2+ ranks).
  std::vector<std::string> ShardSettings() const;
};

// The probed activation line Predict reads for a setting: stage 3 recomputes
// every block in backward, so its `none` is `blocks`.
std::string ActivationMode(const std::string& shard, const std::string& checkpoint, int world);

// The parameter and optimizer parts (activations are probed); `gated`:
// the update is StepGated's (train.cuda_graphs).
MemoryModel MemoryModelFor(const std::vector<torch::Tensor>& params, const Optimizer& optimizer,
                           int world, double bucket_mb, bool gated = false);

// Peak accounting on the training device: the counting allocator on CPU
// (installed by the first reset), the caching allocator's statistics on CUDA.
void ResetDevicePeak(const torch::Device& device);
int64_t DevicePeakBytes(const torch::Device& device);
int64_t DeviceBytesInUse(const torch::Device& device);
// The memory one rank may use: train.memory_budget_mb on CPU (0: no limit);
// on CUDA the driver's free memory plus what torch's caching allocator holds
// already, so not the CUDA context's or another process's share of the GPU.
int64_t DeviceMemoryLimit(const torch::Device& device);
// The caching allocator's peak reserved bytes since ResetDevicePeak (on
// CUDA: what the tensors needed from the driver, fragmentation included);
// -1 elsewhere.
int64_t DeviceReservedPeakBytes(const torch::Device& device);
// On CUDA, the caching allocator's cached blocks given back to the driver
// (after the device finishes), so a reserved peak counted from here holds
// this stretch's own fragmentation, not what the probes and the batch
// search left cached. Nothing elsewhere.
void ReleaseDeviceCache(const torch::Device& device);
// After an out-of-memory: waits for the device (CUDA), so the failed step's
// tensors, released as its exception unwound, are free for what follows.
void FreeDeviceCache(const torch::Device& device);
// Whether libtorch's exception is an out-of-memory (CUDA's, or the CPU
// budget's).
bool IsOutOfMemory(const std::exception& e);
// The one line of an out-of-memory error worth showing a user.
std::string DescribeOutOfMemory(const std::exception& e);
// What more this process may allocate on the device now: the budget less
// what is in use on CPU, the driver's free memory and the allocator's cache
// on CUDA; -1 when unknown (a CPU run without train.memory_budget_mb).
int64_t DeviceBytesFree(const torch::Device& device);
// Host memory dist.offload may take: on a CPU run with train.memory_budget_mb
// what the budget leaves, else MemAvailable (/proc/meminfo, through Env);
// -1 when unknown.
int64_t HostBytesAvailable(const torch::Device& device);

// The bytes a forward and backward at `batch` (samples drawn from `probe`)
// adds above what was in use before it: activations and temporaries, and
// gradients unless `grads_in_place` (below). Gradients, BatchNorm
// statistics and the CPU generator are put back. A data-parallel caller
// turns gradient sync off first (the other ranks do not probe). Throws what
// the step throws (an out-of-memory among them).
// `grads_in_place`: every gradient exists (zeros) before the pass, as data
// parallel's buckets make them, so the line is activations alone; else they
// are none first, as one process's set-to-none leaves them, and the
// gradients backward makes are in the line.
int64_t ProbeStepBytes(StepContext* ctx, const TrainBatch& probe, int64_t batch,
                       bool grads_in_place);
// Probes at `small` and `large` (> small) and fits the line through them,
// for the model's current checkpoint mode. With `knee` > 0 (the samples of
// one loss chunk) the line bends there: probed on both sides of it when it
// lies between; when both sizes are below it, also at 2 * knee if that is at
// most 8 * large and fits (else the line goes on: an over-prediction).
ActivationFit ProbeActivations(StepContext* ctx, const TrainBatch& probe, int64_t small,
                               int64_t large, bool grads_in_place, int64_t knee = 0);

}  // namespace fullburn
