// `fullburn train`: checkpoints: the writers (sharded runs' parts beside rank
// 0's file), the state snapshot, the final one's check, and --resume's restore.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include "fullburn/diagnose.h"
#include "trainer_impl.h"

namespace fullburn {
namespace {

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
  model_.optimizer().WaitForUpdate();  // dist.offload: the step's update in the weights
  CheckpointState s;
  // Weights and optimizer state change only in the optimizer step: they are
  // copied while the next forward/backward runs. Buffers (BatchNorm running
  // statistics) change in forward, so they are copied now.
  // With dist.shard = full each rank's part holds its own parameters too.
  if (!sharding_.parameters())
    for (auto& p : model_.ctx().model->named_parameters())
      s.until_update.emplace_back("model." + p.key(), p.value());
  for (auto& b : model_.ctx().model->named_buffers()) s.tensors.emplace_back("model." + b.key(), b.value());
  // Sharded, each rank wrote its own part beside this file (WriteOptimizerShard).
  if (!sharding_.optimizer_sharded())
    for (auto& [name, t] : model_.optimizer().State()) s.until_update.emplace_back("optim." + name, t);
  for (auto& [name, gen] : Generators(model_.ctx().device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.tensors.emplace_back(name, gen.get_state());
  }
  nlohmann::json meta{{"step", step_},
                      {"epoch", input_.epoch()},
                      {"epoch_samples", input_.EpochSamplesRead()},
                      {"optim_steps", model_.optimizer().steps()},
                      {"loss_scale", model_.scaler().scale()},
                      {"scaler_growth_tracker", model_.scaler().growth_tracker()},
                      {"skipped_steps", skipped_},
                      {"run_id", run_.id},
                      {"optim_shards", sharding_.optimizer_sharded() ? rank_.world_size : 0},
                      {"config", cfg_.ToJson()}};
  if (const RunEvaluation::Best& best = evaluation_.best(); std::isfinite(best.val_loss))
    meta.update({{"best_val_loss", best.val_loss},
                 {"best_step", best.step},
                 {"best_checkpoint", best.checkpoint}});
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
  for (auto& p : model_.ctx().model->named_parameters())
    if (Status s = load_into(p.key(), p.value()); !s.ok()) return s;
  for (auto& b : model_.ctx().model->named_buffers())
    if (Status s = load_into(b.key(), b.value()); !s.ok()) return s;
  std::map<std::string, torch::Tensor> optim;
  for (auto& [name, t] : byname)
    if (name.rfind("optim.", 0) == 0) optim[name.substr(6)] = t;
  const nlohmann::json& m = resume_->meta;
  if (Status s = model_.optimizer().LoadState(optim, m.value("optim_steps", int64_t{0})); !s.ok()) return s;
  for (auto& [name, gen] : Generators(model_.ctx().device))
    if (auto it = byname.find(name); it != byname.end()) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->second);
    }
  model_.scaler().Restore(m.value("loss_scale", model_.scaler().scale()),
                   m.value("scaler_growth_tracker", int64_t{0}));
  step_ = m.value("step", int64_t{0});
  // epoch_samples: the samples of this epoch every rank together read.
  // Checkpoints from before it counted batches of this run's size (next_batch).
  input_.Restore(m.value("epoch", int64_t{0}), m.value("epoch_samples", int64_t{0}),
                 m.contains("epoch_samples") ? 0 : m.value("next_batch", int64_t{0}));
  skipped_ = m.value("skipped_steps", int64_t{0});
  evaluation_.RestoreBest({m.value("best_val_loss", INFINITY),  // checkpoint.keep_best goes on
                           m.value("best_step", int64_t{-1}),
                           m.value("best_checkpoint", std::string())});
  last_ckpt_step_ = step_;
  std::fprintf(stderr, "fullburn: resuming from %s (step %lld, epoch %lld)\n",
               resume_->path.c_str(), static_cast<long long>(step_),
               static_cast<long long>(input_.epoch()));
  return Status::Ok();
}

Status Trainer::Checkpoint(bool final_one) {
  // Sharded, every rank saves the state it owns beside the step's file, in
  // the background (checkpoints_'s part writer); rank 0's writer writes that file only once
  // every part landed (WaitForOptimizerShards), so a checkpoint is whole or
  // absent. The ranks all come here at the same steps (step-based triggers,
  // a shared stop, evaluations), but need not wait for each other.
  if (checkpoints_->parts() && step_ != last_ckpt_step_) checkpoints_->SavePart(step_, PartState());
  if (rank_.rank != 0) {
    last_ckpt_step_ = step_;
    if (final_one) checkpoints_->WaitPart();  // rank 0 reports a lost one
    return Status::Ok();  // every rank holds the same weights
  }
  bool saved = true;
  if (step_ != last_ckpt_step_) {
    last_ckpt_step_ = step_;
    last_ckpt_time_ = MonoNow();
    try {
      checkpoints_->SaveWhole(step_, Snapshot());
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
  checkpoints_->Wait();
  if (!saved || !checkpoints_->last_status().ok()) return FinalCheckpointLost();
  return Status::Ok();
}

// The run trained but its end state is not on disk: that is a failure, and
// the user needs to know which checkpoint still holds the work.
Status Trainer::FinalCheckpointLost() {
  if (records_) records_->recorder().Sync();  // the checkpoints written so far are in the store
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

Status Trainer::OpenCheckpoints() {
  std::string dir = set_.checkpoint.dir;
  if (dir.empty()) dir = StoreLayout(store_->path()).Checkpoints(run_.id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create checkpoint.dir " + dir + ": " + ec.message());
  CheckpointPlan plan;
  plan.dir = dir;
  plan.keep = static_cast<int>(set_.checkpoint.keep);
  plan.async = set_.checkpoint.async;
  plan.parts = sharding_.optimizer_sharded();
  // As long as the ranks wait for each other anywhere: a part later than
  // that is a rank gone or a folder the ranks do not share.
  plan.part_wait_s = set_.dist.timeout_s;
  plan.run_id = run_.id;
  plan.run_start = run_.start_time;
  plan.rank = rank_.rank;
  plan.world = rank_.world_size;
  checkpoints_ = std::make_unique<RunCheckpoints>(std::move(plan), records_);
  // A resumed run writing into the same folder keeps the best one it inherited.
  if (const RunEvaluation::Best& best = evaluation_.best();
      best.step >= 0 && std::filesystem::path(best.checkpoint).parent_path() == dir)
    checkpoints_->Protect(best.step);
  mono_start_ = MonoNow();
  last_ckpt_time_ = mono_start_;
  if (!opt_.quiet && rank_.rank == 0) live_ = std::make_unique<LiveStatus>(STDERR_FILENO);
  return Status::Ok();
}

// This rank's optimizer state and, with dist.shard = full, the parameters it
// owns: all of it changes only in the optimizer step, so its part writer copies
// it on its own thread while the next forward and backward run (the loop's
// BeforeUpdate fences the step behind the copy).
CheckpointState Trainer::PartState() {
  CheckpointState mine;
  for (auto& [name, t] : model_.optimizer().State()) mine.until_update.emplace_back("optim." + name, t);
  if (ShardedParameters* own = sharding_.parameters())  // the others are empty here
    for (auto& p : model_.ctx().model->named_parameters())
      if (own->Owns(p.value()))
        mine.until_update.emplace_back("model." + p.key(), p.value());
  mine.state_json = ShardIdentityJson(checkpoints_->PartIdentity(step_));
  return mine;
}

}  // namespace fullburn
