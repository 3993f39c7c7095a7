// `fullburn train`: checkpoint snapshots and restore.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include "fullburn/diagnose.h"
#include "trainer.h"

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

// The generators a run draws from, by their name in a checkpoint: the CPU's,
// and on a GPU the CUDA one, which dropout there draws from (without it a
// resumed H200 run's losses were 0.24 apart with dropout 0.1, equal with 0).
// A CPU checkpoint resumed on a GPU has no rng.cuda: that one goes on from
// the seed, as after any change of device.
std::vector<std::pair<std::string, at::Generator>> Generators(const torch::Device& device) {
  std::vector<std::pair<std::string, at::Generator>> out = {
      {"rng.cpu", at::detail::getDefaultCPUGenerator()}};
  if (device.is_cuda()) out.emplace_back("rng.cuda", at::globalContext().defaultGenerator(device));
  return out;
}

}  // namespace

CheckpointState Trainer::Snapshot() {
  optim_->WaitForUpdate();  // dist.offload: the step's update in the weights
  CheckpointState s;
  // Weights and optimizer state change only in the optimizer step: they are
  // copied while the next forward/backward runs. Buffers (BatchNorm running
  // statistics) change in forward, so they are copied now.
  // With dist.shard = full each rank's part holds its own parameters too.
  if (!params_sharded_)
    for (auto& p : ctx_.model->named_parameters())
      s.until_update.emplace_back("model." + p.key(), p.value());
  for (auto& b : ctx_.model->named_buffers()) s.tensors.emplace_back("model." + b.key(), b.value());
  // Sharded, each rank wrote its own part beside this file (WriteOptimizerShard).
  if (shard_owner_.empty())
    for (auto& [name, t] : optim_->State()) s.until_update.emplace_back("optim." + name, t);
  for (auto& [name, gen] : Generators(ctx_.device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.tensors.emplace_back(name, gen.get_state());
  }
  nlohmann::json meta{{"step", step_},
                      {"epoch", epoch_},
                      {"epoch_samples", EpochSamplesRead()},
                      {"optim_steps", optim_->steps()},
                      {"loss_scale", scaler_->scale()},
                      {"scaler_growth_tracker", scaler_->growth_tracker()},
                      {"skipped_steps", skipped_},
                      {"run_id", run_.id},
                      {"optim_shards", shard_owner_.empty() ? 0 : rank_.world_size},
                      {"config", cfg_.ToJson()}};
  if (std::isfinite(best_val_loss_))
    meta.update({{"best_val_loss", best_val_loss_},
                 {"best_step", best_step_},
                 {"best_checkpoint", best_checkpoint_}});
  s.state_json = meta.dump();
  return s;
}

Status Trainer::Restore() {
  std::map<std::string, torch::Tensor> byname(resume_->state.tensors.begin(),
                                              resume_->state.tensors.end());
  torch::NoGradGuard no_grad;
  auto load_into = [&](const std::string& name, torch::Tensor& dst) -> Status {
    auto it = byname.find("model." + name);
    if (it == byname.end())
      return Status::InvalidArgument("checkpoint " + resume_->path + " has no tensor model." +
                                     name +
                                     ": it was written for a different model (check model.name)");
    if (it->second.sizes() != dst.sizes())
      return Status::InvalidArgument(
          "checkpoint " + resume_->path + " holds model." + name + " of shape " +
          c10::str(it->second.sizes()) + ", this config builds " + c10::str(dst.sizes()) +
          ": the dataset or model differs from the checkpoint's (classes, width, sizes, "
          "model.pad_vocab)");
    dst.copy_(it->second);
    return Status::Ok();
  };
  for (auto& p : ctx_.model->named_parameters())
    if (Status s = load_into(p.key(), p.value()); !s.ok()) return s;
  for (auto& b : ctx_.model->named_buffers())
    if (Status s = load_into(b.key(), b.value()); !s.ok()) return s;
  std::map<std::string, torch::Tensor> optim;
  for (auto& [name, t] : byname)
    if (name.rfind("optim.", 0) == 0) optim[name.substr(6)] = t;
  const nlohmann::json& m = resume_->meta;
  if (Status s = optim_->LoadState(optim, m.value("optim_steps", int64_t{0})); !s.ok()) return s;
  for (auto& [name, gen] : Generators(ctx_.device))
    if (auto it = byname.find(name); it != byname.end()) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->second);
    }
  scaler_->Restore(m.value("loss_scale", scaler_->scale()),
                   m.value("scaler_growth_tracker", int64_t{0}));
  step_ = m.value("step", int64_t{0});
  epoch_ = m.value("epoch", int64_t{0});
  // epoch_samples: the samples of this epoch every rank together read.
  // Checkpoints from before it counted batches of this run's size (next_batch).
  epoch_skip_ = m.value("epoch_samples", int64_t{0});
  next_batch_ = m.contains("epoch_samples") ? 0 : m.value("next_batch", int64_t{0});
  skipped_ = m.value("skipped_steps", int64_t{0});
  best_val_loss_ = m.value("best_val_loss", INFINITY);  // checkpoint.keep_best goes on from it
  best_checkpoint_ = m.value("best_checkpoint", std::string());
  best_step_ = m.value("best_step", int64_t{-1});
  last_ckpt_step_ = step_;
  std::fprintf(stderr, "fullburn: resuming from %s (step %lld, epoch %lld)\n",
               resume_->path.c_str(), static_cast<long long>(step_),
               static_cast<long long>(epoch_));
  return Status::Ok();
}

Status Trainer::Checkpoint(bool final_one) {
  // Sharded, every rank saves the state it owns beside the step's file, in
  // the background (part_ckpt_); rank 0's writer writes that file only once
  // every part landed (WaitForOptimizerShards), so a checkpoint is whole or
  // absent. The ranks all come here at the same steps (step-based triggers,
  // a shared stop, evaluations), but need not wait for each other.
  if (part_ckpt_ && step_ != last_ckpt_step_) {
    try {
      shard_write_s_ += part_ckpt_->Save(step_, PartState());
    } catch (const std::exception& e) {  // staging ran out of memory, say
      std::string what = e.what();
      PartFailed(step_, PartPath(step_), what.substr(0, what.find('\n')));
    }
  }
  if (rank_.rank != 0) {
    last_ckpt_step_ = step_;
    if (final_one && part_ckpt_) part_ckpt_->Wait();  // rank 0 reports a lost one
    return Status::Ok();  // every rank holds the same weights
  }
  bool saved = true;
  if (step_ != last_ckpt_step_) {
    last_ckpt_step_ = step_;
    last_ckpt_time_ = MonoNow();
    try {
      ckpt_->Save(step_, Snapshot());
    } catch (const std::exception& e) {  // the previous checkpoint stands
      std::string what = e.what();
      std::fprintf(
          stderr,
          "\nfullburn: checkpoint at step %lld failed (%s); earlier checkpoints are intact\n",
          static_cast<long long>(step_), what.substr(0, what.find('\n')).c_str());
      saved = false;
    }
  }
  if (!final_one) return Status::Ok();
  // The end state may be the periodic checkpoint of this same step, written
  // in the background: wait for it and check it landed.
  ckpt_->Wait();
  if (!saved || !ckpt_->last_status().ok()) return FinalCheckpointLost();
  return Status::Ok();
}

// The run trained but its end state is not on disk: that is a failure, and
// the user needs to know which checkpoint still holds the work.
Status Trainer::FinalCheckpointLost() {
  if (recorder_) recorder_->Sync();  // the checkpoints written so far are in the store
  auto cks = store_->LoadCheckpoints(run_.id);
  std::string newest = cks.ok() && !cks->empty()
                           ? fmt::format(
                                 "the newest intact one is step {} ({}): "
                                 "fullburn train --resume {} continues from it",
                                 cks->back().step, cks->back().path, run_.id)
                           : "no checkpoint of this run was written";
  return Status::IoError(fmt::format(
      "the final checkpoint (step {}) was not written, so the trained weights are not saved; "
      "free space in checkpoint.dir; {}",
      step_, newest));
}

}  // namespace fullburn

namespace fullburn {

Status Trainer::SetupSharding() {
  if (Status s = ShardStates(); !s.ok()) return s;
  return SetupOffload();
}

// dist.offload = optimizer, after the sharding (only the parameters this
// rank updates): refused before training when the host cannot hold it.
Status Trainer::SetupOffload() {
  if (cfg_.Str("dist.offload") == "none") return Status::Ok();
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
  if (cfg_.Str("dist.offload") != "none" && cfg_.Bool("train.cuda_graphs"))
    return Status::InvalidArgument(
        "dist.offload = optimizer updates on the host, outside a CUDA graph: set "
        "train.cuda_graphs = false or dist.offload = none");
  const std::string shard = cfg_.Str("dist.shard");
  if (!dp_ || shard == "none") return Status::Ok();
  if (cfg_.Bool("train.cuda_graphs"))
    return Status::InvalidArgument("dist.shard = " + shard +
                                   " does not run inside a CUDA graph yet: set train.cuda_graphs "
                                   "= false or dist.shard = none");
  if (cfg_.Float("checkpoint.every_minutes") > 0)
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
      cfg_.Str("model.name") +
      " has no blocks to gather: use dist.shard = gradients, or a model with blocks (gpt, "
      "resnet18, resnet50, mlp)");
}

Status Trainer::ShardStates() {
  const std::string shard = cfg_.Str("dist.shard");
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
    params_sharded_->SetBlocks(blocks, cfg_.Bool("dist.prefetch"));
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
  const int64_t chunk = static_cast<int64_t>(cfg_.Float("dist.bucket_mb") * 1e6);
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

// This rank's part of the checkpoint at `step` was not written: the marker
// rank 0 waits for, and a line here.
void Trainer::PartFailed(int64_t step, const std::string& path, const std::string& why) {
  ShardIdentity id = PartIdentity(step);  // not step_: this may run on the writer's thread
  MarkOptimizerShardFailed(path, id, why);
  std::fprintf(stderr, "\nfullburn: rank %d: this rank's part of the checkpoint at step %lld failed (%s)\n",
               id.rank, static_cast<long long>(step), why.c_str());
}

std::string Trainer::PartPath(int64_t step) const {
  return OptimizerShardPath(CheckpointPath(ckpt_dir_, step), rank_.rank, rank_.world_size);
}

ShardIdentity Trainer::PartIdentity(int64_t step) const {
  ShardIdentity id;
  id.step = step;
  id.run_id = run_.id;
  id.rank = rank_.rank;
  id.world = rank_.world_size;
  return id;
}

// This rank's optimizer state and, with dist.shard = full, the parameters it
// owns: all of it changes only in the optimizer step, so part_ckpt_ copies
// it on its own thread while the next forward and backward run (the loop's
// BeforeUpdate fences the step behind the copy).
CheckpointState Trainer::PartState() {
  CheckpointState mine;
  for (auto& [name, t] : optim_->State()) mine.until_update.emplace_back("optim." + name, t);
  if (params_sharded_)  // the parameters this rank owns (the others are empty here)
    for (auto& p : ctx_.model->named_parameters())
      if (params_sharded_->Owns(p.value()))
        mine.until_update.emplace_back("model." + p.key(), p.value());
  mine.state_json = ShardIdentityJson(PartIdentity(step_));
  return mine;
}

}  // namespace fullburn
