// DeviceStep (the end of a step with no host reads, what train.cuda_graphs
// captures) against the eager step the trainer runs otherwise: the CPU
// reference the GPU path is held to.
#include <gtest/gtest.h>

#include "fullburn/train.h"

namespace fullburn {
namespace {

std::shared_ptr<Model> Mlp() {
  ModelSpec s;
  s.name = "mlp";
  s.in_features = 12;
  s.hidden = 16;
  s.num_classes = 5;
  torch::manual_seed(0);
  return MakeModel(s).value();
}

std::vector<std::pair<std::string, torch::Tensor>> Params(Model& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// Poisons one gradient element on the steps that ask for it, like an fp16
// overflow would.
void Poison(Model& m, int step) {
  torch::NoGradGuard no_grad;
  torch::Tensor g = m.parameters()[0].grad();
  if (step == 1) g.view({-1})[0] = std::numeric_limits<float>::infinity();
  if (step == 4) g.view({-1})[3] = std::numeric_limits<float>::quiet_NaN();
}

struct Trace {
  std::vector<double> loss, scale;
  std::vector<bool> skipped;
  int64_t steps = 0;
  std::vector<torch::Tensor> params, state;
};

constexpr int kSteps = 9;
double Lr(int step) { return 0.05 * (1 + 0.3 * step); }  // changes every step
torch::Tensor Input(int step) {
  torch::manual_seed(100 + step);
  return torch::randn({8, 12});
}
torch::Tensor Target(int step) { return torch::arange(8).remainder(5 - step % 2); }

// The trainer's eager sequence (trainer_loop.cpp's TrainStep).
Trace Eager(const OptimizerOptions& oo, const LossScalerOptions& so, double clip) {
  auto model = Mlp();
  Optimizer opt(Params(*model), oo);
  LossScaler scaler(so);
  Trace t;
  for (int step = 1; step <= kSteps; ++step) {
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(Input(step)), Target(step));
    scaler.Scale(loss).backward();
    Poison(*model, step);
    bool skip = scaler.Update(scaler.UnscaleAndCheck(opt.params()).item<bool>());
    if (!skip) {
      if (clip > 0) torch::nn::utils::clip_grad_norm_(opt.params(), clip);
      opt.Step(Lr(step));
    }
    opt.ZeroGrad();
    t.loss.push_back(loss.item<double>());
    t.scale.push_back(scaler.scale());
    t.skipped.push_back(skip);
  }
  t.steps = opt.steps();
  for (auto& p : model->parameters()) t.params.push_back(p.detach().clone());
  for (auto& [name, s] : opt.State()) t.state.push_back(s.clone());
  return t;
}

Trace OnDevice(const OptimizerOptions& oo, const LossScalerOptions& so, double clip) {
  auto model = Mlp();
  Optimizer opt(Params(*model), oo);
  LossScaler scaler(so);
  DeviceStep ds(&opt, &scaler, clip, torch::kCPU);
  Trace t;
  for (int step = 1; step <= kSteps; ++step) {
    for (auto& p : model->parameters())
      if (p.grad().defined()) p.grad().detach().zero_();
    ds.SetLearningRate(Lr(step));
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(Input(step)), Target(step));
    ds.Scale(loss).backward();
    Poison(*model, step);
    ds.Update(loss);
    DeviceStep::Result r = ds.Publish();
    t.loss.push_back(r.loss);
    t.scale.push_back(scaler.scale());
    t.skipped.push_back(r.skipped);
  }
  t.steps = opt.steps();
  for (auto& p : model->parameters()) t.params.push_back(p.detach().clone());
  for (auto& [name, s] : opt.State()) t.state.push_back(s.clone());
  return t;
}

void ExpectSame(const Trace& eager, const Trace& device) {
  EXPECT_EQ(eager.skipped, device.skipped);
  EXPECT_EQ(eager.scale, device.scale);
  EXPECT_EQ(eager.steps, device.steps);
  ASSERT_EQ(eager.loss.size(), device.loss.size());
  for (size_t i = 0; i < eager.loss.size(); ++i)
    EXPECT_NEAR(eager.loss[i], device.loss[i], 1e-5 * std::abs(eager.loss[i])) << "step " << i + 1;
  ASSERT_EQ(eager.params.size(), device.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_TRUE(device.params[i].isfinite().all().item<bool>()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(eager.params[i], device.params[i], 1e-4, 1e-6))
        << "parameter " << i << " differs by "
        << (eager.params[i] - device.params[i]).abs().max().item<double>();
  }
  // State created lazily by the eager step is all there, equal; the device
  // step made it up front.
  ASSERT_LE(eager.state.size(), device.state.size());
  for (size_t i = 0; i < eager.state.size(); ++i)
    EXPECT_TRUE(torch::allclose(eager.state[i], device.state[i], 1e-4, 1e-6)) << "state " << i;
}

LossScalerOptions Scaler(bool enabled) {
  LossScalerOptions so;
  so.enabled = enabled;
  so.init_scale = 1024;
  so.growth_interval = 2;  // grows twice in the run, backs off twice
  return so;
}

TEST(DeviceStep, MatchesTheEagerStepForEveryOptimizerThroughSkipsAndScaleChanges) {
  OptimizerOptions sgd;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  OptimizerOptions nesterov = sgd;
  nesterov.nesterov = true;
  OptimizerOptions plain;
  plain.momentum = 0;
  OptimizerOptions adamw;
  adamw.name = "adamw";
  adamw.weight_decay = 0.01;
  OptimizerOptions lars = sgd;
  lars.name = "lars";
  lars.trust = 0.02;
  for (const OptimizerOptions& oo : {sgd, nesterov, plain, adamw, lars}) {
    SCOPED_TRACE(oo.name + (oo.nesterov ? " nesterov" : "") + (oo.momentum == 0 ? " plain" : ""));
    Trace eager = Eager(oo, Scaler(true), 0);
    ASSERT_EQ(eager.skipped,
              std::vector<bool>({true, false, false, true, false, false, false, false, false}));
    ASSERT_EQ(eager.scale.front(), 512);  // backed off once, grown later
    ExpectSame(eager, OnDevice(oo, Scaler(true), 0));
  }
}

TEST(DeviceStep, ClipsLikeClipGradNormAndSkipsWithoutAScaler) {
  OptimizerOptions adamw;
  adamw.name = "adamw";
  OptimizerOptions sgd;
  for (const OptimizerOptions& oo : {adamw, sgd}) {
    SCOPED_TRACE(oo.name);
    // A norm small enough that every taken step is clipped.
    Trace eager = Eager(oo, Scaler(false), 0.05);
    Trace unclipped = Eager(oo, Scaler(false), 0);
    ASSERT_FALSE(torch::allclose(eager.params[0], unclipped.params[0]));
    ExpectSame(eager, OnDevice(oo, Scaler(false), 0.05));
  }
}

TEST(DeviceStep, PullResumesFromTheHostsState) {
  auto model = Mlp();
  OptimizerOptions oo;
  oo.name = "adamw";
  Optimizer opt(Params(*model), oo);
  LossScaler scaler(Scaler(true));
  scaler.Restore(256, 1);  // as a resumed checkpoint would
  opt.SetSteps(41);
  DeviceStep ds(&opt, &scaler, 0, torch::kCPU);
  ds.SetLearningRate(0.01);
  torch::Tensor loss = torch::cross_entropy_loss(model->forward(Input(1)), Target(1));
  ds.Scale(loss).backward();
  ds.Update(loss);
  DeviceStep::Result r = ds.Publish();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(opt.steps(), 42);
  EXPECT_EQ(scaler.scale(), 512);  // the second finite step in a row: grown
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_NEAR(r.loss, loss.item<double>(), 1e-6);
}

}  // namespace
}  // namespace fullburn
