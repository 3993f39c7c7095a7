// `fullburn train`: checkpoint snapshots, restore, evaluation.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include "fullburn/diagnose.h"
#include "trainer.h"

namespace fullburn {

CheckpointState Trainer::Snapshot() {
  CheckpointState s;
  // Weights and optimizer state change only in the optimizer step: they are
  // copied while the next forward/backward runs. Buffers (BatchNorm running
  // statistics) change in forward, so they are copied now.
  for (auto& p : ctx_.model->named_parameters())
    s.until_update.emplace_back("model." + p.key(), p.value());
  for (auto& b : ctx_.model->named_buffers()) s.tensors.emplace_back("model." + b.key(), b.value());
  for (auto& [name, t] : optim_->State()) s.until_update.emplace_back("optim." + name, t);
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.tensors.emplace_back("rng.cpu", gen.get_state());
  }
  nlohmann::json meta{{"step", step_},
                      {"epoch", epoch_},
                      {"epoch_samples", EpochSamplesRead()},
                      {"optim_steps", optim_->steps()},
                      {"loss_scale", scaler_->scale()},
                      {"scaler_growth_tracker", scaler_->growth_tracker()},
                      {"skipped_steps", skipped_},
                      {"run_id", run_.id},
                      {"config", cfg_.ToJson()}};
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
          ": the dataset or model differs from the checkpoint's (classes, width, sizes)");
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
  if (auto it = byname.find("rng.cpu"); it != byname.end()) {
    auto gen = at::detail::getDefaultCPUGenerator();
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
  last_ckpt_step_ = step_;
  std::fprintf(stderr, "fullburn: resuming from %s (step %lld, epoch %lld)\n",
               resume_->path.c_str(), static_cast<long long>(step_),
               static_cast<long long>(epoch_));
  return Status::Ok();
}

void Trainer::Checkpoint(bool final_one) {
  if (rank_.rank != 0) return;  // every rank holds the same weights
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
  if (!final_one) return;
  // The end state may be the periodic checkpoint of this same step, written
  // in the background: wait for it and check it landed.
  ckpt_->Wait();
  if (!saved || !ckpt_->last_status().ok()) FinalCheckpointLost();
}

// The run trained but its end state is not on disk: that is a failure, and
// the user needs to know which checkpoint still holds the work.
void Trainer::FinalCheckpointLost() {
  exit_code = kExitFailed;
  auto cks = store_->LoadCheckpoints(run_.id);
  std::string newest = cks.ok() && !cks->empty()
                           ? fmt::format(
                                 "the newest intact one is step {} ({}): "
                                 "fullburn train --resume {} continues from it",
                                 cks->back().step, cks->back().path, run_.id)
                           : "no checkpoint of this run was written";
  std::fprintf(stderr,
               "fullburn: the final checkpoint (step %lld) was not written, so the trained weights "
               "are not saved; free space in checkpoint.dir; %s\n",
               static_cast<long long>(step_), newest.c_str());
}

std::string Trainer::DatasetsDir() const { return StoreDir(store_->path()) + "/datasets"; }

// The held-out images Evaluate() reads ("" for none); nothing is created.
std::string Trainer::ResolvedValPath() const {
  if (cfg_.Str("data.source") != "images") return "";
  std::string val = cfg_.Str("data.val_path");
  if (val.empty() && cfg_.Str("data.path").empty())
    val = DefaultImagesPath(DatasetsDir(), static_cast<int>(cfg_.Int("data.classes")), true);
  return val;
}

nlohmann::json Trainer::Evaluate() {
  nlohmann::json out;
  double started = MonoNow();
  SourceSpec es = spec_;
  es.train = false;
  es.rank = 0;  // rank 0 evaluates the whole held-out set
  es.world_size = 1;
  if (cfg_.Str("data.source") == "images") {
    es.path = ResolvedValPath();
    if (es.path.empty()) return out;
    // The default's held-out split is made on first use.
    if (cfg_.Str("data.val_path").empty() &&
        !DefaultImages(DatasetsDir(), static_cast<int>(cfg_.Int("data.classes")), true).ok())
      return out;
  }
  auto src = OpenSource(cfg_, es);
  if (!src.ok()) {
    std::fprintf(stderr, "fullburn: evaluation skipped: %s\n", src.status().message().c_str());
    return out;
  }
  torch::NoGradGuard no_grad;
  ctx_.model->eval();
  (*src)->StartEpoch(0, 0);
  TrainBatch b;
  double loss = 0, correct = 0, count = 0;
  int64_t batches = 0;
  while (batches < 50 && (*src)->Next(&b)) {
    AutocastGuard autocast(ctx_.device.type(), ctx_.autocast);
    torch::Tensor logits = ctx_.model->forward(b.inputs).to(torch::kFloat);
    torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
    torch::Tensor target = b.targets.reshape({-1});
    loss += torch::cross_entropy_loss(flat, target, {}, at::Reduction::Sum).item<double>();
    correct += flat.argmax(1).eq(target).sum().item<double>();
    count += static_cast<double>(target.size(0));
    ++batches;
  }
  ctx_.model->train();
  if (count == 0) return out;
  out = {{"val_loss", loss / count},
         {"val_accuracy", correct / count},
         {"val_samples", count},
         {"duration_s", MonoNow() - started}};
  RunEvent event{Env::Default()->UnixSeconds() - run_.start_time, "evaluation", out.dump()};
  store_->AddEvent(run_.id, event);
  if (events_out_) {
    std::fputs(RunEventLine(event, run_.start_time).c_str(), events_out_.get());
    std::fflush(events_out_.get());
  }
  return out;
}

}  // namespace fullburn
