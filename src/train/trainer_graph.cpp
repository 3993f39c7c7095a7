// `fullburn train` with train.cuda_graphs: the whole step (every micro-batch's
// forward and backward, unscale, clipping, optimizer, loss scaler) replayed
// from one CUDA graph. The step reads its batches from static tensors the
// loop copies each step's batches into, and the end of the step runs on the
// device (DeviceStep), so the only host read is the one after the replay.
#include <fmt/format.h>

#include "trainer_impl.h"

namespace fullburn {
namespace {

// Real steps run eagerly before the capture: autograd, cuBLAS and the
// allocator do their first-use work there, not inside the graph.
constexpr int kGraphWarmupSteps = 3;

bool SameShapes(const std::vector<TrainBatch>& a, const std::vector<TrainBatch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].inputs.sizes() != b[i].inputs.sizes() || a[i].targets.sizes() != b[i].targets.sizes())
      return false;
  return true;
}

}  // namespace

void Trainer::StepBody(const std::vector<TrainBatch>& micro) {
  {
    // The captured step begins from zero gradients in place: after the
    // warm-up the .grad tensors exist and keep their addresses.
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : model_.optimizer().params())
      if (p.grad().defined()) p.grad().zero_();
  }
  torch::Tensor loss_sum;
  for (const TrainBatch& b : micro) {
    torch::Tensor loss = ForwardLoss(model_.ctx(), b);
    device_step_->Scale(micro.size() > 1 ? loss / static_cast<double>(micro.size()) : loss)
        .backward();
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  device_step_->Update(loss_sum / static_cast<double>(micro.size()));
}

Status Trainer::GraphedTrainStep(bool timed, StepRecord* rec) {
  (void)timed;  // one replay: the phases cannot be told apart, only the step
  double start = MonoNow();
  double wait = 0;
  int64_t samples = 0;
  std::vector<TrainBatch> micro(static_cast<size_t>(accumulate_));
  for (TrainBatch& b : micro) {
    if (Status s = NextBatch(&b, &wait); !s.ok()) return s;
    samples += b.samples;
  }
  if (!device_step_) {
    device_step_ = std::make_unique<DeviceStep>(&model_.optimizer(), &model_.scaler(),
                                                set_.train.clip_grad_norm, model_.ctx().device);
    graph_ = std::make_unique<CudaGraph>();
    for (const TrainBatch& b : micro)
      static_batches_.push_back({b.inputs.clone(), b.targets.clone(), b.samples});
  }
  double lr = model_.schedule().At(step_ + 1);
  device_step_->SetLearningRate(lr);
  checkpoints_->BeforeUpdate();  // the step writes the weights a checkpoint may still be copying
  if (!SameShapes(micro, static_batches_)) {
    StepBody(micro);  // a short batch (skipped samples): eager, same math
  } else {
    for (size_t i = 0; i < micro.size(); ++i) {
      static_batches_[i].inputs.copy_(micro[i].inputs, /*non_blocking=*/true);
      static_batches_[i].targets.copy_(micro[i].targets, /*non_blocking=*/true);
    }
    if (graph_warmups_ < kGraphWarmupSteps) {
      ++graph_warmups_;
      StepBody(static_batches_);
    } else {
      if (!graph_captured_) {
        if (Status s = graph_->Capture([this] { StepBody(static_batches_); }); !s.ok()) {
          return s;
        }
        graph_captured_ = true;
        std::fprintf(stderr, "fullburn: step %lld captured in a CUDA graph; replaying it\n",
                     static_cast<long long>(step_ + 1));
      }
      graph_->Replay();  // a capture only records: this runs the step
    }
  }
  DeviceStep::Result r = device_step_->Publish();
  return CloseStep({start, wait, lr, r.loss, r.skipped, samples}, rec);
}

}  // namespace fullburn
