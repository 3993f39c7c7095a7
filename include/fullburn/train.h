// Train: the training runtime behind `fullburn train` (training half, links
// libtorch; the monitoring half never includes this header).
//
// Contract
// - One training thread owns a Trainer, its model, optimizer and data source.
//   The only other threads are the loader's workers, the telemetry sampler
//   and the checkpoint writer, each behind its own component's contract.
// - Expected failures (bad config, data that does not fit the model, a model
//   that does not fit in memory at batch 1, divergence, a corrupt checkpoint)
//   come back as a Status with a one-line message naming the problem and the
//   fix; checkpoints already written are never touched by a failure.
// - Pieces usable from any libtorch loop: AutocastGuard, LossScaler,
//   Optimizer, LrSchedule, the checkpoint reader/writer.
// - The whole runtime for a program's own network and data: RunTraining
//   with TrainerOptions::model and train_data or dataset (examples/cpp_api). An
//   installed fullburn exports it as the CMake target fullburn::train.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fullburn/config.h"
#include "fullburn/models.h"
#include "fullburn/status.h"
#include "fullburn/torch_loader.h"

namespace fullburn {

// "libtorch 1.13.1, CPU only" or "libtorch 2.x, CUDA with N device(s)".
std::string TorchDescription();

// ---- Mixed precision -----------------------------------------------------------

// Turns autocast on for `device` with `dtype` for its lifetime and restores the
// previous state on exit, clearing the autocast cache when the outermost guard
// ends (the cast weights are only valid for one forward). Disabled guards
// (fp32) change nothing. Works with libtorch 1.13's and 2.x's APIs.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device, std::optional<torch::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool active_ = false, prev_enabled_ = false;
  torch::ScalarType prev_dtype_ = torch::kFloat;
};

// Dynamic loss scaling with torch.cuda.amp.GradScaler's semantics: the loss is
// multiplied by the scale before backward; gradients are unscaled (before any
// clipping) and checked for inf/NaN; a step with non-finite gradients is
// skipped and the scale multiplied by backoff_factor; after growth_interval
// finite steps in a row it is multiplied by growth_factor.
struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};
class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& o) : o_(o), scale_(o.init_scale) {}
  torch::Tensor Scale(const torch::Tensor& loss) const { return o_.enabled ? loss * scale_ : loss; }
  // Divides the gradients by the scale (when enabled) and returns a 0-dim
  // tensor on their device: 1 when any is inf/NaN. No host sync. `foreach`
  // (optim.foreach's verdict): multi-tensor ops, a few kernels for every
  // gradient instead of one or two per parameter, the same verdict.
  torch::Tensor UnscaleAndCheck(const std::vector<torch::Tensor>& params,
                                bool foreach = false) const;
  // After the step's check: true when the optimizer step must be skipped.
  bool Update(bool found_inf);
  bool enabled() const { return o_.enabled; }
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  const LossScalerOptions& options() const { return o_; }
  void Restore(double scale, int64_t tracker) {
    scale_ = scale;
    tracker_ = tracker;
  }

 private:
  LossScalerOptions o_;
  double scale_;
  int64_t tracker_ = 0;
};

// ---- Optimizers and schedule ------------------------------------------------------

// SGD (momentum, Nesterov; torch.optim.SGD's update), AdamW (torch.optim.AdamW's
// decoupled decay and bias correction) and LARS (layer-wise trust ratio on
// top of momentum SGD, skipped for 1-D parameters as is usual). Their state
// is plain named tensors so checkpoints can snapshot it without a copy of the
// optimizer.
struct OptimizerOptions {
  std::string name = "sgd";
  double momentum = 0.9, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, trust = 0.001;
  bool nesterov = false;
  // AdamW and SGD: one multi-tensor kernel per operation over every
  // parameter (torch's _foreach_*) instead of a loop over parameters, for
  // fewer kernel launches on a GPU. The same update up to rounding (an
  // operation's order within the formula differs). LARS always loops.
  bool foreach = false;
  // The multi-tensor update runs over groups of parameters of about this
  // many bytes (a group closes at the parameter that reaches it): AdamW's
  // denominator is one temporary the size of a group, so a 1.5B-parameter
  // model holds 256 MiB for it, not 6 GB. On an H200 the whole-list
  // temporary was the step's peak with model.checkpoint = blocks (29.4 GiB
  // measured, 24.6 predicted without it). GPT-2 124M (0.5 GB of fp32
  // parameters) takes two groups: a few more launches per step.
  int64_t foreach_group_bytes = int64_t{256} << 20;
  // AdamW and SGD on a CUDA device: each group's update in one kernel
  // (torch's _fused_adamw_, libtorch 2.1 or later; _fused_sgd_, 2.3), reading
  // each parameter, gradient and state once and writing them once, with no
  // temporaries, where the multi-tensor path makes about nine passes
  // (AdamW) or three (SGD). The same formulas up to rounding. Set only
  // where it runs (FusedUpdateUnused); the groups are the multi-tensor
  // path's, and SGD's first step, which makes the momentum, loops.
  bool fused = false;
};
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
  // StepAsync's thread and what it has done.
  std::thread worker_;
  std::mutex update_mu_;
  std::condition_variable update_cv_;
  std::vector<bool> updated_;
  std::exception_ptr update_error_;
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

// ---- Checkpoints -------------------------------------------------------------------

// A checkpoint is a safetensors file (loadable by Python's safetensors as
// is): tensors named model.*, optim.*, rng.*; its __metadata__ holds
// "fullburn" (the training state as JSON: step, epoch, loader position, loss
// scaler, config) and "crc32" of the data section, verified on load.
struct CheckpointState {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  // Tensors the caller will not change until it calls
  // CheckpointWriter::BeforeUpdate() (weights and optimizer state: only the
  // optimizer step writes them), so they are copied on the writer thread
  // while the next forward and backward run.
  std::vector<std::pair<std::string, torch::Tensor>> until_update;
  std::string state_json = "{}";
};

// Writes atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A reader never sees a partial file.
Status WriteCheckpointFile(const std::string& path, const CheckpointState& state, int64_t* bytes);
// Reads and verifies (size, header, checksum); errors name the file and why.
Result<CheckpointState> ReadCheckpointFile(const std::string& path);
// Sharded optimizer state (dist.shard): each rank's own part of a step's
// optimizer state, in a file beside the step's checkpoint (whose metadata
// says how many: "optim_shards").
std::string OptimizerShardPath(const std::string& checkpoint_path, int rank, int world);
// ReadCheckpointFile, and for a sharded checkpoint every rank's state file
// beside it, verified each, their tensors added: the whole state, whatever
// world size wrote it. A missing or damaged part is an error naming it.
Result<CheckpointState> ReadCheckpointWithShards(const std::string& path);
// Which checkpoint a part belongs to, in its metadata and its failure marker.
struct ShardIdentity {
  int64_t step = -1, run_id = -1;
  int rank = -1, world = -1;
};
// The identity as a part's metadata holds it.
std::string ShardIdentityJson(const ShardIdentity& id);
// The marker a rank leaves beside its part when writing it failed
// (PART.failed, holding the identity and why), for rank 0 to read.
void MarkOptimizerShardFailed(const std::string& part_path, const ShardIdentity& id,
                              const std::string& why);
// Rank 0, before it writes a sharded step's file: waits until every rank's
// part of that checkpoint is in its folder (each renamed into place whole;
// a part's metadata must name this step and run, so a stale file of an
// earlier attempt does not count). A rank's failure marker, `cancel` or
// `timeout_s` without every part ends the wait with an error, and the step's
// parts are removed: no step file will name them.
Status WaitForOptimizerShards(const std::string& checkpoint_path, const ShardIdentity& id,
                              const std::atomic<bool>& cancel, double timeout_s);

// The asynchronous writer: Save() copies `tensors` to host memory (a write
// still in flight is waited for first); the writer thread copies
// `until_update`, then serializes, checksums and writes. The loop is blocked
// for the first copy and, in BeforeUpdate(), only if the second is not done
// by the time the next optimizer step comes. Keeps the
// newest `keep` files of its directory. `done` is called on the writer thread.
// The host copies live in buffers kept from one checkpoint to the next (no
// fresh allocation and page faults per snapshot; the memory is the state's size).
class CheckpointWriter {
 public:
  struct Written {
    int64_t step;
    std::string path;
    int64_t bytes;
    double stall_s, write_s;
    Status status;
  };
  CheckpointWriter(std::string dir, int keep, bool async, std::function<void(const Written&)> done);
  ~CheckpointWriter();  // waits for the write in flight
  // Returns the seconds the caller was blocked.
  double Save(int64_t step, CheckpointState state);
  // Call before changing any `until_update` tensor; returns seconds blocked.
  double BeforeUpdate();
  void Wait();
  // Where a step's file goes (default: CheckpointPath(dir, step)); with
  // keep < 0 nothing is rotated. For a sharded run's parts.
  void SetPath(std::function<std::string(int64_t step)> path);
  // Runs on the writer thread once the state is staged, just before the
  // file is written; an error skips the file and is that Save's outcome.
  // Rank 0 of a sharded run waits there for every rank's part.
  void SetBeforeWrite(std::function<Status(int64_t step)> hook);
  Status status() const;       // the first failed write, if any
  Status last_status() const;  // the latest Save's outcome once written (Wait() first)
  // The checkpoint of `step` survives the keep-the-newest rotation (the best
  // held-out loss so far, checkpoint.keep_best); -1: none.
  void Protect(int64_t step);

 private:
  void Write(int64_t step, CheckpointState state, double stall_s);
  void Failed(int64_t step, double stall_s, const Status& s);
  std::string PathOf(int64_t step) const;
  void RecordLocked(const Status& s);  // the latest outcome, and the first failure (mu_ held)
  torch::Tensor& Staging(const std::string& name, const torch::Tensor& like);
  void Stage(std::vector<std::pair<std::string, torch::Tensor>>* tensors, bool parallel);
  std::map<std::string, torch::Tensor> staging_;  // host copies, reused
  std::condition_variable staged_cv_;
  bool staged_ = true;       // the until_update tensors are copied (under mu_)
  double fence_wait_s_ = 0;  // BeforeUpdate's wait for the checkpoint in flight
  std::string dir_;
  int keep_;
  bool async_;
  std::function<void(const Written&)> done_;
  std::function<std::string(int64_t)> path_;
  std::function<Status(int64_t)> before_write_;
  std::thread thread_;
  mutable std::mutex mu_;
  Status error_;
  Status last_;
  int64_t protected_step_ = -1;  // under mu_
};

// Where CheckpointWriter puts the checkpoint of `step`: DIR/step-00001234.safetensors.
std::string CheckpointPath(const std::string& dir, int64_t step);
// Checkpoint files of a directory, newest (highest step) first.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// ---- The trainer ---------------------------------------------------------------------

// Samples a program holds in memory (C++ API): `inputs` [N, ...] and
// `targets` [N] of class indices, or [N, T] of one per position (a language
// model's next tokens). Moved to the training device whole; each epoch reads
// them in a new order (train.seed), every rank its share, as with the other
// sources. The run's config says data.source = tensors.
struct TensorData {
  torch::Tensor inputs, targets;
};

struct TrainerOptions {
  std::string config_path;             // TOML file; empty: none
  std::vector<std::string> overrides;  // key=value
  std::optional<Config> config;        // C++ API: a built config instead of the two above
  bool print_config = false;           // print the effective config and stop
  std::string store_path;              // empty: the default store
  std::string name;
  std::string resume;                 // a run id / "last" or a checkpoint file
  std::optional<int64_t> parent_run;  // the tuning this run is a trial of
  bool quiet = false;
  std::vector<std::string> command;  // argv, stored with the run
  // C++ API only: a network of the program's own instead of model.name (the
  // run's config then says model.name = custom, and model_name names it in
  // the run's name), and data of its own instead of data.source: samples in
  // memory (train_data: data.source = tensors) or made on demand on the
  // loader's threads (dataset, a torch_loader.h Dataset: data.source =
  // dataset, read with data.threads and data.prefetch); val_data and
  // val_dataset are held out, for eval.*. A run trained so resumes from its
  // program, which hands the same network and data over again with `resume`.
  std::shared_ptr<Model> model;
  std::string model_name;
  std::optional<TensorData> train_data, val_data;
  std::shared_ptr<Dataset> dataset, val_dataset;
};

// Runs `fullburn train` end to end: data, model, the loop, telemetry, the run
// store, checkpoints, the final evaluation. Returns the process exit code
// (0 on success) after printing any error as one line.
int RunTraining(const TrainerOptions& options);

// Process-wide (glibc mallopt): freed host memory stays in the process for
// reuse instead of going back to the OS (train.keep_host_memory). No-op
// elsewhere. Irreversible for the process.
void KeepHostMemory();

// For tests and the batch-size search: a CPU allocator that fails like an
// out-of-memory once more than `budget_bytes` are live (0: no limit).
// Installed process-wide on first use; thread-safe.
void SetCpuMemoryBudget(int64_t budget_bytes);
// Allocations made by this thread while one lives are not counted: host
// memory a GPU run would hold outside the device (checkpoint staging).
struct NotCountedInBudget {
  NotCountedInBudget();
  ~NotCountedInBudget();
  NotCountedInBudget(const NotCountedInBudget&) = delete;
  NotCountedInBudget& operator=(const NotCountedInBudget&) = delete;
};
int64_t CpuMemoryBudget();  // 0: no limit
int64_t CpuBytesInUse();
int64_t CpuPeakBytes();
void ResetCpuPeakBytes();

}  // namespace fullburn
