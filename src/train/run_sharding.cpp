// RunSharding (run_sharding.h): dist.shard and dist.offload, the settings
// they refuse, and what each step does for them.
#include "run_sharding.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "fullburn/report.h"
#include "memory_model.h"

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

Status RunSharding::Setup(const TrainSettings& settings, const Borrowed& parts,
                          bool share_to_device) {
  parts_ = parts;
  if (Status s = ShardStates(settings, share_to_device); !s.ok()) return s;
  return SetupOffload(settings);
}

// dist.offload = optimizer, after the sharding (only the parameters this
// rank updates): refused before training when the host cannot hold it.
Status RunSharding::SetupOffload(const TrainSettings& settings) {
  if (settings.dist.offload == "none") return Status::Ok();
  Optimizer* optim = parts_.optimizer;
  const int64_t needed = optim->OffloadBytes();
  const int64_t available = HostBytesAvailable(parts_.device);
  if (available >= 0 && needed > available)
    return Status::ResourceExhausted(fmt::format(
        "dist.offload = optimizer needs {} of host memory on this rank (an fp32 copy of the "
        "weights it updates, their gradients and the optimizer state) and {} is available: use "
        "more ranks with dist.shard = optimizer (1/N of it each), or dist.offload = none",
        FormatBytes(needed), FormatBytes(available)));
  if (!parts_.device.is_cuda() && parts_.rank == 0 && !parts_.quiet)
    std::fprintf(stderr,
                 "fullburn: dist.offload = optimizer on a CPU run: the state is in host memory "
                 "already, so it saves nothing (it keeps a second copy of the weights)\n");
  optim->SetOffload();
  // Unsharded, the next forward overlaps the host update, each block
  // waiting for its own parameters; sharded, the owners' values are sent
  // right after the update (or gathered from them), so it is waited for.
  if (owner_.empty()) {
    auto wait = std::make_shared<WaitForHostUpdate>(optim);
    std::vector<std::vector<torch::Tensor>> blocks;
    if (parts_.model->SetParameterGather(wait, &blocks)) {
      BlockSplit split = SplitByBlocks(*parts_.model, blocks);
      std::vector<torch::Tensor> order = split.outside;  // used first
      order.insert(order.end(), split.inside.begin(), split.inside.end());
      optim->SetUpdateOrder(order);
      gather_ = wait;
      update_overlaps_ = true;
    }
  }
  if (parts_.rank == 0 && !parts_.quiet)
    std::fprintf(stderr, "fullburn: dist.offload = optimizer: %s\n",
                 update_overlaps_ ? "the host update overlaps the next forward, block by block"
                                  : "the host update runs between the steps");
  return Status::Ok();
}

Status RunSharding::Refused(const TrainSettings& settings, bool data_parallel) {
  if (settings.dist.offload != "none" && settings.train.cuda_graphs)
    return Status::InvalidArgument(
        "dist.offload = optimizer updates on the host, outside a CUDA graph: set "
        "train.cuda_graphs = false or dist.offload = none");
  const std::string& shard = settings.dist.shard;
  if (!data_parallel || shard == "none") return Status::Ok();
  if (settings.train.cuda_graphs)
    return Status::InvalidArgument("dist.shard = " + shard +
                                   " does not run inside a CUDA graph yet: set train.cuda_graphs "
                                   "= false or dist.shard = none");
  if (settings.checkpoint.every_minutes > 0)
    return Status::InvalidArgument(
        "dist.shard = " + shard +
        " gathers the state from every rank at each checkpoint, so the ranks must checkpoint at "
        "the same steps: use checkpoint.every_steps instead of checkpoint.every_minutes");
  return Status::Ok();
}

Status RunSharding::NoBlocksToGather(const std::string& model_name) {
  return Status::InvalidArgument(
      "dist.shard = full gathers a model's parameters block by block, and " + model_name +
      " has no blocks to gather: use dist.shard = gradients, or a model with blocks (gpt, "
      "resnet18, resnet50, mlp)");
}

bool RunSharding::BucketsHeld(const TrainSettings& settings, bool data_parallel) {
  const std::string& shard = settings.dist.shard;
  return data_parallel && shard != "gradients" && shard != "full";
}

Status RunSharding::ShardStates(const TrainSettings& settings, bool share_to_device) {
  const std::string& shard = settings.dist.shard;
  if (shard == "none") return Status::Ok();
  DataParallel* dp = parts_.dp;
  Optimizer* optim = parts_.optimizer;
  if (!dp) {
    if (parts_.rank == 0 && !parts_.quiet)
      std::fprintf(stderr,
                   "fullburn: dist.shard = %s does nothing on one rank (every state is whole "
                   "here); training unsharded\n",
                   shard.c_str());
    return Status::Ok();
  }
  owner_ = DataParallel::ShardOwners(optim->params(), dp->world_size());
  std::vector<bool> owned;
  for (int owner : owner_) owned.push_back(owner == dp->rank());
  optim->SetOwned(owned);  // a resumed run's full state, re-sharded
  if (shard == "full") {
    parameters_ = std::make_shared<ShardedParameters>(dp, optim->params(), owner_);
    if (share_to_device)
      if (Status s = PlaceShareOnDevice(settings.dist.bucket_mb); !s.ok()) return s;
  }
  if (shard == "gradients" || shard == "full") {
    if (Status s = dp->ShardGradients(optim->params(), owner_); !s.ok()) return s;
    gradients_sharded_ = true;
  }
  if (shard == "full") {
    std::vector<std::vector<torch::Tensor>> blocks;
    if (!parts_.model->SetParameterGather(parameters_, &blocks)) {
      parameters_.reset();
      return NoBlocksToGather(settings.model.name);
    }
    parameters_->SetBlocks(blocks, settings.dist.prefetch);
    gather_ = parameters_;
    parameters_->ReleaseAll();  // each rank keeps its own parameters only
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
Status RunSharding::PlaceShareOnDevice(double bucket_mb) {
  torch::NoGradGuard no_grad;
  const torch::Device device = parts_.device;
  Optimizer* optim = parts_.optimizer;
  const int64_t chunk = static_cast<int64_t>(bucket_mb * 1e6);
  const int64_t total_bytes = TensorBytes(optim->params());  // before the others' are dropped
  std::set<const void*> sharded;
  for (const torch::Tensor& p : optim->params()) sharded.insert(p.unsafeGetTensorImpl());
  if (Status s = parameters_->PlaceOnDevice(device, chunk, parts_.channels_last); !s.ok())
    return s;
  std::vector<torch::Tensor> rest;
  for (torch::Tensor p : parts_.model->parameters())
    if (!sharded.count(p.unsafeGetTensorImpl())) {
      p.set_data(p.data().to(device));
      rest.push_back(p);
    }
  for (torch::Tensor b : parts_.model->buffers()) {
    if (b.device() != device) b.set_data(b.data().to(device));
    rest.push_back(b);
  }
  if (Status s = parts_.dp->Broadcast(rest); !s.ok()) return s;
  optim->MoveStateToParameters();
  // (ShardGradients lays the buckets out by the placeholders' shapes too.)
  if (Status s = parts_.dp->Attach(parts_.model->parameters(), false); !s.ok()) return s;
  if (parts_.rank == 0 && !parts_.quiet)
    std::fprintf(stderr,
                 "fullburn: dist.shard = full: each rank moved only its own parameters to %s "
                 "(%s of %s here)\n",
                 device.str().c_str(), FormatBytes(parameters_->held_bytes()).c_str(),
                 FormatBytes(static_cast<double>(total_bytes)).c_str());
  return Status::Ok();
}

Result<bool> RunSharding::AnyRank(bool found_inf) const {
  if (!gradients_sharded_) return found_inf;
  return parts_.dp->AnyRank(found_inf);
}

// Over gradients spread across the ranks: the squared norms of each rank's
// own gradients summed over ranks, then the same scale.
Status RunSharding::ClipGradients(double max_norm) {
  const std::vector<torch::Tensor>& params = parts_.optimizer->params();
  if (!gradients_sharded_) {
    torch::nn::utils::clip_grad_norm_(params, max_norm);
    return Status::Ok();
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> squares;
  for (const torch::Tensor& p : params)
    if (p.grad().defined())  // the norm in double, without a double copy of the gradient
      squares.push_back(
          at::linalg_vector_norm(p.grad(), 2, c10::nullopt, false, torch::kDouble).square());
  double local = squares.empty() ? 0.0 : torch::stack(squares).sum().item<double>();  // one read
  Result<std::vector<double>> total = parts_.dp->SumOverRanks({local});
  if (!total.ok()) return total.status();
  double coef = max_norm / (std::sqrt((*total)[0]) + 1e-6);
  if (coef < 1)
    for (const torch::Tensor& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  return Status::Ok();
}

Status RunSharding::Update(double lr) {
  if (update_overlaps_)
    parts_.optimizer->StepAsync(lr);  // the next forward waits block by block
  else
    parts_.optimizer->Step(lr);
  // Sharded: this rank updated its parameters; the others come from their
  // owners (with dist.shard = full, at their next use).
  if (!owner_.empty() && !parameters_)
    return parts_.dp->BroadcastFromOwners(parts_.optimizer->params(), owner_);
  return Status::Ok();
}

void RunSharding::ReleaseOthers() {
  if (parameters_) parameters_->ReleaseAll();
}

}  // namespace fullburn
