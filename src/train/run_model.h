// RunModel: the model of one run of `fullburn train` and what updates it
// (train component only): the step context (the model, its device,
// autocast's dtype, the timed steps' phase events), the optimizer, the loss
// scaler and the learning-rate schedule.
//
// Contract
// - Owns them; the optimizer's offload thread (dist.offload) is the
//   optimizer's own, joined in its destructor. The other parts borrow what
//   they need (the sharding the optimizer and the model, the memory model
//   the step context) and do not outlive the trainer that holds this.
// - Every method runs on the training thread.
// - Setup order: the device side of ctx() (the trainer's SetupDevice), Build
//   (or the program's own model), then SetupUpdate; optimizer() and scaler()
//   exist only after SetupUpdate.
// - Build's error is MakeModel's (an unknown model.name, a shape the model
//   cannot take): a Status naming the option.
#pragma once

#include <cstdint>
#include <memory>

#include "fullburn/amp.h"
#include "fullburn/models.h"
#include "fullburn/optim.h"
#include "fullburn/status.h"
#include "fullburn/train_settings.h"
#include "sources.h"
#include "step_context.h"

namespace fullburn {

class RunModel {
 public:
  StepContext& ctx() { return ctx_; }
  const StepContext& ctx() const { return ctx_; }
  bool built() const { return ctx_.model != nullptr; }

  // The update optim.* asks for on this device: optim.foreach's verdict,
  // and optim.fused off where it cannot run (rank 0 says why, once).
  static OptimizerOptions UpdateOptions(const TrainSettings& settings, const torch::Device& device,
                                        bool say);
  // model.*: the built-in model for `source`'s classes and features, or
  // `program_model` (a program's own network, C++ API) as it is. `say`:
  // rank 0 tells where fullburn's kernels cannot run and, for gpt on a GPU,
  // which attention kernel runs. The model stays on the host; the caller
  // places it.
  Status Build(const TrainSettings& settings, const BatchSource& source,
               std::shared_ptr<Model> program_model, bool say);
  // The optimizer over the model's parameters as they are now, the loss
  // scaler (amp.*) and the schedule over `total_steps` (optim.lr, scaled
  // by `effective_batch` / optim.base_batch with optim.scale_lr).
  void SetupUpdate(const TrainSettings& settings, const OptimizerOptions& update,
                   int64_t total_steps, int64_t effective_batch);

  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  LossScaler& scaler() { return *scaler_; }
  const LossScaler& scaler() const { return *scaler_; }
  const LrSchedule& schedule() const { return schedule_; }

 private:
  // Which SDPA kernel gpt's attention runs on this GPU, on one line.
  void SayAttentionKernel(const ModelSpec& ms) const;

  StepContext ctx_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  LrSchedule schedule_;
};

}  // namespace fullburn
