// Optimizers (SGD, AdamW, LARS), the learning-rate schedule and the step
// done on the device without host reads (train component, links libtorch).
//
// Contract
// - An Optimizer is used from one thread, the one that steps it. The only
//   thread it starts is StepAsync's update with dist.offload; Step, StepAsync
//   and WaitForUpdate join it, and before State(), a checkpoint or an
//   evaluation the caller calls WaitForUpdate. An error on that thread is
//   rethrown on the caller's.
// - A saved state whose shape does not match its parameter (a checkpoint of
//   another model) comes back from LoadState as a Status naming the tensor;
//   a state it lacks starts fresh. Everything else fails only through
//   libtorch's exceptions (out of memory).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fullburn/amp.h"
#include "fullburn/status.h"
#include "fullburn/train_options.h"

namespace fullburn {

// SGD (momentum, Nesterov; torch.optim.SGD's update), AdamW (torch.optim.AdamW's
// decoupled decay and bias correction) and LARS (layer-wise trust ratio on
// top of momentum SGD, skipped for 1-D parameters as is usual). Their state
// is plain named tensors so checkpoints can snapshot it without a copy of the
// optimizer.
// Why optim.fused = true cannot run for these options on `device`: nullptr
// when it can.
const char* FusedUpdateUnused(const OptimizerOptions& o, const torch::Device& device);
// optim.foreach's setting ("true", "false" or "auto") for a run on a CUDA
// device or not: auto is the multi-tensor update on CUDA, where it measured
// +9.4% tokens/s on GPT-2 124M (H200, docs/benchmarks.md), and the loop on
// the CPU, where fewer launches buy nothing.
bool ForeachFor(const std::string& setting, bool cuda);
class Optimizer {
 public:
  Optimizer(std::vector<std::pair<std::string, torch::Tensor>> params, const OptimizerOptions& o);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  void Step(double lr);
  // Step, but with dist.offload the host update runs on a thread of its
  // own, parameter by parameter in SetUpdateOrder's order, each copied back
  // as soon as it is done: the next forward overlaps it, waiting
  // (WaitFor) only for the parameters it is about to use. The gradients are
  // copied to the host before it returns. Without offload it is Step.
  void StepAsync(double lr);
  // Blocks until `params`' updates from StepAsync are in them (others are
  // ignored); rethrows an error of the update.
  void WaitFor(const std::vector<torch::Tensor>& params);
  // Blocks until StepAsync's update is done; rethrows its error. Every
  // other method that reads parameters or state calls it first or needs
  // the caller to (State, a checkpoint, an evaluation).
  void WaitForUpdate();
  // The parameters the forward uses first, in that order (the rest after).
  void SetUpdateOrder(const std::vector<torch::Tensor>& first);
  // Step's update with no host reads, for a step a CUDA graph can capture:
  // `lr`, `keep` (1, or 0 to leave parameters and state untouched) and
  // `steps` (the step count including this one, for AdamW's bias
  // correction) are 0-dim tensors on the parameters' device. Gradients must
  // be finite (a skipped step's are zeroed first). Needs InitState().
  void StepGated(const torch::Tensor& lr, const torch::Tensor& keep, const torch::Tensor& steps);
  const OptimizerOptions& options() const { return o_; }
  // Creates every state buffer now, as zeros (the same first update as
  // creating them lazily), so a captured step never allocates state.
  void InitState();
  void SetSteps(int64_t steps) { steps_ = steps; }
  void ZeroGrad();
  std::vector<torch::Tensor> params() const;
  std::vector<std::string> names() const;  // the parameters', in params() order
  // ZeRO stage 1 (dist.shard = optimizer): only the parameters marked true
  // (params() order) are updated by Step and StepGated and keep state, so
  // this rank holds its share of the state; the others' new values come from
  // the rank that owns them (DataParallel::BroadcastFromOwners). Drops the
  // state of parameters it does not own (a full checkpoint, re-sharded).
  void SetOwned(const std::vector<bool>& owned);
  // Moves each state buffer to its parameter's device (a state loaded while
  // the parameters waited in host memory, dist.shard = full).
  void MoveStateToParameters();
  // The state slots kept per parameter: ".momentum" (SGD, LARS with
  // momentum), ".exp_avg" and ".exp_avg_sq" (AdamW), or none.
  std::vector<std::string> StateSlots() const;
  int64_t StateBytes() const;  // the state this rank holds
  // dist.offload = optimizer: the state and the update in host memory. Each
  // parameter this rank updates gets an fp32 copy on the host (pinned when
  // the parameter is on a GPU) with a staging buffer for its gradient; Step
  // copies the gradient there, updates the copy with the same formulas and
  // copies the result back into the parameter. Existing state moves to the
  // host. Call after SetOwned. Not for StepGated (a CUDA graph).
  void SetOffload();
  bool offloaded() const { return offload_; }
  // Host bytes SetOffload takes for `params` (those this rank updates): the
  // copy, the staging buffer and the state, each the parameter's size.
  int64_t OffloadBytes() const;
  int64_t steps() const { return steps_; }
  // The most memory an update with `o` allocates at once on the parameters'
  // device beyond the parameters, gradients and state (its temporaries),
  // for parameters of `param_bytes` bytes each in update order: a few times
  // the largest parameter, or with optim.foreach its group of parameters
  // (the multi-tensor update runs over groups of about 256 MiB). `gated`:
  // StepGated's formulas (CUDA graphs). The memory model's update term.
  static int64_t UpdateTemporaryBytes(const OptimizerOptions& o,
                                      const std::vector<int64_t>& param_bytes, bool gated);
  // "<param>.<state>" -> tensor, and the step count.
  std::vector<std::pair<std::string, torch::Tensor>> State() const;
  Status LoadState(const std::map<std::string, torch::Tensor>& state, int64_t steps);

 private:
  bool StepForeach(double lr);  // false: not for this optimizer or state yet
  // One group of StepForeach's lists (m and v empty where there is no such state).
  void StepForeachGroup(double lr, const std::vector<torch::Tensor>& p,
                        const std::vector<torch::Tensor>& g, const std::vector<torch::Tensor>& m,
                        const std::vector<torch::Tensor>& v);
  void Update(double lr);       // Step's formulas on each Param's p
  struct Param;
  void UpdateOne(Param& s, torch::Tensor p, const torch::Tensor& g, double lr);
  struct Param {
    std::string name;
    torch::Tensor p, buf1, buf2;  // momentum / exp_avg, exp_avg_sq
    bool owned = true;            // updated here (always, unsharded)
    torch::Tensor host, host_grad;  // dist.offload = optimizer
  };
  OptimizerOptions o_;
  std::vector<Param> params_;
  int64_t steps_ = 0;
  bool offload_ = false;
  std::unordered_map<const void*, size_t> index_;  // TensorImpl -> params_
  std::vector<size_t> update_order_;
  // StepAsync's thread and what it has done (optim.cpp).
  struct AsyncUpdate;
  std::unique_ptr<AsyncUpdate> async_;
};

// Linear warm-up to the peak, then cosine decay to min_lr (or constant).
struct LrSchedule {
  double peak = 0.1, min_lr = 0;
  int64_t warmup = 0, total = 1;
  bool cosine = true;
  double At(int64_t step) const;  // step counts from 1
};

// ---- A step without host reads ------------------------------------------------------

// The end of a training step (unscale, inf/NaN check, clipping, optimizer
// update, loss-scale update) done entirely on the device: the learning rate
// and the scaler's state are tensors and the inf/NaN verdict gates the
// update instead of a host branch, so the whole step can be captured in a
// CUDA graph. The math is LossScaler's, clip_grad_norm_'s and
// Optimizer::Step's; tests hold it to them on CPU. The host-side Optimizer
// and LossScaler stay the state of record: Pull() copies theirs to the
// device before the first step, Publish() reads the device's back after each
// step in one copy, so records and checkpoints see one state.
// Not thread-safe; the training thread owns it.
class DeviceStep {
 public:
  struct Result {
    double loss = 0;
    bool skipped = false;
  };
  DeviceStep(Optimizer* optim, LossScaler* scaler, double clip_norm, torch::Device device);
  // Host to device: the scaler's scale and growth tracker, the step count.
  void Pull();
  // Outside the step (not captured): this step's learning rate.
  void SetLearningRate(double lr);
  // Inside the step: the loss to call backward on.
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Inside the step, after backward: `loss` is the step's mean loss (0-dim).
  void Update(const torch::Tensor& loss);
  // After the step: one device-to-host read; updates the host state.
  Result Publish();

 private:
  Optimizer* optim_;
  LossScaler* scaler_;
  double clip_norm_;
  torch::Tensor lr_, scale_, tracker_, steps_, out_;
};

}  // namespace fullburn
