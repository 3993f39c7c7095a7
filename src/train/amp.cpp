// Autocast guard and the dynamic loss scaler.
#include <ATen/autocast_mode.h>

#include "fullburn/autocast_state.h"
#include "fullburn/amp.h"

namespace fullburn {
using autocast_state::Dtype;
using autocast_state::Enabled;
using autocast_state::SetDtype;
using autocast_state::SetEnabled;

AutocastGuard::AutocastGuard(torch::DeviceType device, std::optional<torch::ScalarType> dtype)
    : device_(device) {
  if (!dtype) return;
  active_ = true;
  prev_enabled_ = Enabled(device);
  prev_dtype_ = Dtype(device);
  SetEnabled(device, true);
  SetDtype(device, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The cache holds the lower-precision copies of weights made during this
  // forward; they go stale at the next optimizer step.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetEnabled(device_, prev_enabled_);
  SetDtype(device_, prev_dtype_);
}

torch::Tensor LossScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params,
                                          bool foreach) const {
  torch::NoGradGuard no_grad;
  if (foreach) {
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    if (grads.empty()) return torch::zeros({}, torch::kBool);
    if (o_.enabled) at::_foreach_mul_(grads, 1.0 / scale_);
    // The L1 norms: inf/NaN exactly when the sums below are (|x| summed
    // overflows where x summed may not, at the same edge of float32).
    std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 1);
    return torch::stack(norms).sum(torch::kFloat).isfinite().logical_not();
  }
  // One read of each gradient and no tensor-sized temporaries: a sum is
  // inf/NaN exactly when an element is (or when finite values overflow
  // float32 in the sum, which only gradients already at the edge reach).
  std::vector<torch::Tensor> sums;
  double inv = 1.0 / scale_;
  for (const torch::Tensor& p : params) {
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.enabled) g.mul_(inv);
    sums.push_back(g.sum(torch::kFloat));
  }
  if (sums.empty()) return torch::zeros({}, torch::kBool);
  return torch::stack(sums).sum().isfinite().logical_not();
}

bool LossScaler::Update(bool found_inf) {
  if (!o_.enabled) return found_inf;
  if (found_inf) {
    scale_ *= o_.backoff_factor;
    tracker_ = 0;
    return true;
  }
  if (++tracker_ >= o_.growth_interval) {
    scale_ *= o_.growth_factor;
    tracker_ = 0;
  }
  return false;
}

}  // namespace fullburn
