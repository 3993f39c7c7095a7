// `fullburn train`: dist.shard and dist.offload: which rank owns which
// parameters' state (and, with full, the parameters), the host update, the
// settings refused before training, and sharded gradient clipping.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "trainer_impl.h"

namespace fullburn {
namespace {

// dist.offload without sharding: the model waits, block by block, for the
// host update of the parameters it is about to use (Optimizer::StepAsync).
class WaitForHostUpdate : public ParameterGather {
 public:
  explicit WaitForHostUpdate(Optimizer* optimizer) : optimizer_(optimizer) {}
  void Gather(const std::vector<torch::Tensor>& params) override { optimizer_->WaitFor(params); }
  void Release(const std::vector<torch::Tensor>&) override {}
  bool keeps_parameters() const override { return true; }

 private:
  Optimizer* optimizer_;
};

}  // namespace

Status Trainer::SetupSharding() {
  if (Status s = ShardStates(); !s.ok()) return s;
  return SetupOffload();
}

// dist.offload = optimizer, after the sharding (only the parameters this
// rank updates): refused before training when the host cannot hold it.
Status Trainer::SetupOffload() {
  if (set_.dist.offload == "none") return Status::Ok();
  const int64_t needed = optim_->OffloadBytes();
  const int64_t available = HostBytesAvailable(ctx_.device);
  if (available >= 0 && needed > available)
    return Status::ResourceExhausted(fmt::format(
        "dist.offload = optimizer needs {} of host memory on this rank (an fp32 copy of the "
        "weights it updates, their gradients and the optimizer state) and {} is available: use "
        "more ranks with dist.shard = optimizer (1/N of it each), or dist.offload = none",
        FormatBytes(needed), FormatBytes(available)));
  if (!ctx_.device.is_cuda() && rank_.rank == 0 && !opt_.quiet)
    std::fprintf(stderr,
                 "fullburn: dist.offload = optimizer on a CPU run: the state is in host memory "
                 "already, so it saves nothing (it keeps a second copy of the weights)\n");
  optim_->SetOffload();
  // Unsharded, the next forward overlaps the host update, each block
  // waiting for its own parameters; sharded, the owners' values are sent
  // right after the update (or gathered from them), so it is waited for.
  if (shard_owner_.empty()) {
    auto wait = std::make_shared<WaitForHostUpdate>(optim_.get());
    std::vector<std::vector<torch::Tensor>> blocks;
    if (ctx_.model->SetParameterGather(wait, &blocks)) {
      BlockSplit split = SplitByBlocks(*ctx_.model, blocks);
      std::vector<torch::Tensor> order = split.outside;  // used first
      order.insert(order.end(), split.inside.begin(), split.inside.end());
      optim_->SetUpdateOrder(order);
      model_gather_ = wait;
      update_overlaps_ = true;
    }
  }
  if (rank_.rank == 0 && !opt_.quiet)
    std::fprintf(stderr, "fullburn: dist.offload = optimizer: %s\n",
                 update_overlaps_ ? "the host update overlaps the next forward, block by block"
                                  : "the host update runs between the steps");
  return Status::Ok();
}

// What dist.shard and dist.offload refuse, known from the config: Setup
// asks once the ranks are connected, before the model is built or a batch
// size searched.
Status Trainer::RefusedMemorySettings() const {
  if (set_.dist.offload != "none" && set_.train.cuda_graphs)
    return Status::InvalidArgument(
        "dist.offload = optimizer updates on the host, outside a CUDA graph: set "
        "train.cuda_graphs = false or dist.offload = none");
  const std::string shard = set_.dist.shard;
  if (!dp_ || shard == "none") return Status::Ok();
  if (set_.train.cuda_graphs)
    return Status::InvalidArgument("dist.shard = " + shard +
                                   " does not run inside a CUDA graph yet: set train.cuda_graphs "
                                   "= false or dist.shard = none");
  if (set_.checkpoint.every_minutes > 0)
    return Status::InvalidArgument(
        "dist.shard = " + shard +
        " gathers the state from every rank at each checkpoint, so the ranks must checkpoint at "
        "the same steps: use checkpoint.every_steps instead of checkpoint.every_minutes");
  return Status::Ok();
}

// dist.shard = full needs a model with blocks to gather.
Status Trainer::NoBlocksToGather() const {
  return Status::InvalidArgument(
      "dist.shard = full gathers a model's parameters block by block, and " +
      set_.model.name +
      " has no blocks to gather: use dist.shard = gradients, or a model with blocks (gpt, "
      "resnet18, resnet50, mlp)");
}

Status Trainer::ShardStates() {
  const std::string shard = set_.dist.shard;
  if (shard == "none") return Status::Ok();
  if (!dp_) {
    if (rank_.rank == 0 && !opt_.quiet)
      std::fprintf(stderr,
                   "fullburn: dist.shard = %s does nothing on one rank (every state is whole "
                   "here); training unsharded\n",
                   shard.c_str());
    return Status::Ok();
  }
  shard_owner_ = DataParallel::ShardOwners(optim_->params(), dp_->world_size());
  std::vector<bool> owned;
  for (int owner : shard_owner_) owned.push_back(owner == dp_->rank());
  optim_->SetOwned(owned);  // a resumed run's full state, re-sharded
  if (shard == "full") {
    params_sharded_ = std::make_shared<ShardedParameters>(dp_.get(), optim_->params(), shard_owner_);
    if (share_to_device_)
      if (Status s = PlaceShareOnDevice(); !s.ok()) return s;
  }
  if (shard == "gradients" || shard == "full") {
    if (Status s = dp_->ShardGradients(optim_->params(), shard_owner_); !s.ok()) return s;
    grads_sharded_ = true;
  }
  if (shard == "full") {
    std::vector<std::vector<torch::Tensor>> blocks;
    if (!ctx_.model->SetParameterGather(params_sharded_, &blocks)) {
      params_sharded_.reset();
      return NoBlocksToGather();
    }
    params_sharded_->SetBlocks(blocks, set_.dist.prefetch);
    model_gather_ = params_sharded_;
    params_sharded_->ReleaseAll();  // each rank keeps its own parameters only
  }
  return Status::Ok();
}

// Stage 3 without a probe: the model waited in host memory (a resumed
// run's state too); now each rank's own parameters go to the device, a
// bucket's worth at a time, and the rest of the model (buffers, parameters
// the optimizer does not take) whole, all with rank 0's values. The
// gradient hooks are attached only then: a parameter moved to another
// device gets a new gradient accumulator (Variable::set_data), and the
// accumulator records the parameter's shape, so the others' parameters
// are still placeholders of their shape when it is made.
Status Trainer::PlaceShareOnDevice() {
  torch::NoGradGuard no_grad;
  const int64_t chunk = static_cast<int64_t>(set_.dist.bucket_mb * 1e6);
  const int64_t total_bytes = TensorBytes(optim_->params());  // before the others' are dropped
  std::set<const void*> sharded;
  for (const torch::Tensor& p : optim_->params()) sharded.insert(p.unsafeGetTensorImpl());
  if (Status s = params_sharded_->PlaceOnDevice(ctx_.device, chunk, ctx_.channels_last); !s.ok())
    return s;
  std::vector<torch::Tensor> rest;
  for (torch::Tensor p : ctx_.model->parameters())
    if (!sharded.count(p.unsafeGetTensorImpl())) {
      p.set_data(p.data().to(ctx_.device));
      rest.push_back(p);
    }
  for (torch::Tensor b : ctx_.model->buffers()) {
    if (b.device() != ctx_.device) b.set_data(b.data().to(ctx_.device));
    rest.push_back(b);
  }
  if (Status s = dp_->Broadcast(rest); !s.ok()) return s;
  optim_->MoveStateToParameters();
  // (ShardGradients lays the buckets out by the placeholders' shapes too.)
  if (Status s = dp_->Attach(ctx_.model->parameters(), false); !s.ok()) return s;
  if (rank_.rank == 0 && !opt_.quiet)
    std::fprintf(stderr,
                 "fullburn: dist.shard = full: each rank moved only its own parameters to %s "
                 "(%s of %s here)\n",
                 ctx_.device.str().c_str(), FormatBytes(params_sharded_->held_bytes()).c_str(),
                 FormatBytes(static_cast<double>(total_bytes)).c_str());
  return Status::Ok();
}

// clip_grad_norm_ over gradients spread across the ranks: the squared norms
// of each rank's own gradients summed over ranks, then the same scale.
Status Trainer::ClipShardedGradients(double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> squares;
  for (const torch::Tensor& p : optim_->params())
    if (p.grad().defined())  // the norm in double, without a double copy of the gradient
      squares.push_back(
          at::linalg_vector_norm(p.grad(), 2, c10::nullopt, false, torch::kDouble).square());
  double local = squares.empty() ? 0.0 : torch::stack(squares).sum().item<double>();  // one read
  Result<std::vector<double>> total = dp_->SumOverRanks({local});
  if (!total.ok()) return total.status();
  double coef = max_norm / (std::sqrt((*total)[0]) + 1e-6);
  if (coef < 1)
    for (const torch::Tensor& p : optim_->params())
      if (p.grad().defined()) p.grad().mul_(coef);
  return Status::Ok();
}

}  // namespace fullburn
