// The end of a training step without host reads (what a CUDA graph captures).
#include "fullburn/optim.h"

namespace fullburn {

DeviceStep::DeviceStep(Optimizer* optim, LossScaler* scaler, double clip_norm, torch::Device device)
    : optim_(optim), scaler_(scaler), clip_norm_(clip_norm) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  lr_ = torch::zeros({}, f32);
  scale_ = torch::ones({}, f32);
  tracker_ = torch::zeros({}, f32);
  // Float64: a float32 count stops at 2^24 steps.
  steps_ = torch::zeros({}, f32.dtype(torch::kDouble));
  // One address for the step's outputs: a graph replay writes them there.
  out_ = torch::zeros({5}, f32.dtype(torch::kDouble));
  optim_->InitState();
  Pull();
}

void DeviceStep::Pull() {
  // fill_ with a host number is a kernel argument, not a copy: fine between
  // replays, never called inside a capture.
  scale_.fill_(scaler_->enabled() ? scaler_->scale() : 1.0);
  tracker_.fill_(static_cast<double>(scaler_->growth_tracker()));
  steps_.fill_(static_cast<double>(optim_->steps()));
}

void DeviceStep::SetLearningRate(double lr) { lr_.fill_(lr); }

torch::Tensor DeviceStep::Scale(const torch::Tensor& loss) const {
  return scaler_->enabled() ? loss * scale_ : loss;
}

void DeviceStep::Update(const torch::Tensor& loss) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : optim_->params())
    if (p.grad().defined()) grads.push_back(p.grad());
  std::vector<torch::Tensor> sums;
  torch::Tensor inv = scale_.reciprocal();
  for (torch::Tensor& g : grads) {
    if (scaler_->enabled()) g.mul_(inv);
    sums.push_back(g.sum(torch::kFloat));
  }
  torch::Tensor found = sums.empty()
                            ? torch::zeros_like(lr_)
                            : torch::stack(sums).sum().isfinite().logical_not().to(torch::kFloat);
  torch::Tensor keep = 1 - found;
  // A skipped step's gradients feed a zero-weight update; inf * 0 would be NaN.
  for (torch::Tensor& g : grads) g.nan_to_num_(0, 0, 0);
  if (clip_norm_ > 0 && !grads.empty()) {
    std::vector<torch::Tensor> norms;
    for (torch::Tensor& g : grads) norms.push_back(g.norm(2));
    torch::Tensor coef = (clip_norm_ / (torch::stack(norms).norm(2) + 1e-6)).clamp_max(1.0);
    for (torch::Tensor& g : grads) g.mul_(coef);
  }
  steps_.add_(keep);
  optim_->StepGated(lr_, keep, steps_);
  if (scaler_->enabled()) {
    // GradScaler's update: back off on inf/NaN (tracker to 0), grow after
    // growth_interval finite steps in a row (tracker to 0), else count.
    const LossScalerOptions& o = scaler_->options();
    torch::Tensor counted = (tracker_ + 1) * keep;
    torch::Tensor grow = counted.ge(static_cast<double>(o.growth_interval)).to(torch::kFloat);
    scale_.mul_(found * o.backoff_factor + keep * (grow * o.growth_factor + (1 - grow)));
    tracker_.copy_(counted * (1 - grow));
  }
  out_.copy_(torch::stack({loss.detach().to(torch::kDouble), found.to(torch::kDouble),
                           scale_.to(torch::kDouble), tracker_.to(torch::kDouble), steps_}));
}

DeviceStep::Result DeviceStep::Publish() {
  torch::Tensor host = out_.cpu();
  const double* v = host.data_ptr<double>();
  Result r;
  r.loss = v[0];
  r.skipped = v[1] != 0;
  if (scaler_->enabled()) scaler_->Restore(v[2], static_cast<int64_t>(v[3]));
  optim_->SetSteps(static_cast<int64_t>(v[4]));
  return r;
}

}  // namespace fullburn
