// Mixed precision for any libtorch loop: autocast on and off for a scope,
// and dynamic loss scaling (train component, links libtorch).
//
// Contract
// - An AutocastGuard belongs to the thread that made it (autocast state is
//   per thread) and must end on it; guards nest.
// - A LossScaler is plain state, not thread-safe: the training thread owns it.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "fullburn/train_options.h"

namespace fullburn {

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
class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& o) : o_(o), scale_(o.init_scale) {}
  torch::Tensor Scale(const torch::Tensor& loss) const { return o_.enabled ? loss * scale_ : loss; }
  // Divides the gradients by the scale (when enabled) and returns a 0-dim
  // tensor on their device (a CPU one when none has a gradient): 1 when any
  // is inf/NaN. No host sync. `foreach` (optim.foreach's verdict):
  // multi-tensor ops, a few kernels for every gradient instead of one or two
  // per parameter, the same verdict.
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

}  // namespace fullburn
