// `fullburn train`: held-out evaluation, during training (eval.every_steps,
// eval.every_epochs) and at its end (eval.at_end). Every rank evaluates its
// share of the held-out data and the sums are all-reduced, so an evaluation
// costs 1/world_size of the time and no rank waits on another past the
// collective timeout.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "trainer_impl.h"

namespace fullburn {

std::string Trainer::DatasetsDir() const { return StoreLayout(store_->path()).Datasets(); }

// The held-out data evaluation reads ("" for none; synthetic data draws its
// own held-out samples); nothing is created here.
std::string Trainer::ResolvedValPath() const {
  const std::string& source = set_.data.source;
  if (source != "images" && source != "tokens") return "";
  std::string val = set_.data.val_path;
  if (source == "images" && val.empty() && set_.data.path.empty())
    val = DefaultImagesPath(DatasetsDir(), static_cast<int>(set_.data.classes), true);
  return val;
}

Status Trainer::SetupEval() {
  eval_every_steps_ = set_.eval.every_steps;
  eval_every_epoch_steps_ = set_.eval.every_epochs * StepsPerEpoch();
  bool periodic = eval_every_steps_ > 0 || eval_every_epoch_steps_ > 0;
  if (!periodic && !set_.eval.at_end) return Status::Ok();
  const std::string& source = set_.data.source;
  SourceSpec es = spec_;
  es.train = false;
  es.tensors = opt_.val_data ? &*opt_.val_data : nullptr;
  es.dataset = opt_.val_dataset;
  bool program = source == "tensors" || source == "dataset";
  if (program && !es.tensors && !es.dataset) {
    if (!periodic) return Status::Ok();  // nothing held out: no evaluation at the end either
    return Status::InvalidArgument(
        std::string("eval.every_steps / eval.every_epochs need held-out data: hand it over as "
                    "TrainerOptions::") +
        (source == "tensors" ? "val_data" : "val_dataset") + ", or set them to 0");
  }
  if (source == "images" || source == "tokens") {
    es.path = ResolvedValPath();
    if (es.path.empty()) {
      if (!periodic) return Status::Ok();  // nothing held out: no evaluation at the end either
      return Status::InvalidArgument(
          "eval.every_steps / eval.every_epochs need held-out data: set data.val_path (" +
          std::string(source == "tokens" ? "a token file, such as nanoGPT's val.bin"
                                         : "an image folder or pack") +
          ") or set them to 0");
    }
    // The default's held-out split is made on first use.
    if (source == "images" && set_.data.val_path.empty())
      if (auto made =
              DefaultImages(DatasetsDir(), static_cast<int>(set_.data.classes), true);
          !made.ok())
        return made.status();
  }
  auto src = OpenSource(set_, es);
  if (!src.ok()) {
    return Status::InvalidArgument("held-out data (data.val_path): " + src.status().message());
  }
  eval_source_ = std::move(*src);
  return Status::Ok();
}

bool Trainer::EvaluationDue() const {
  if (!eval_source_ || step_ == 0) return false;
  bool due = (eval_every_steps_ > 0 && step_ % eval_every_steps_ == 0) ||
             (eval_every_epoch_steps_ > 0 && step_ % eval_every_epoch_steps_ == 0);
  // The last step's evaluation is the one at the end.
  return due && !(step_ == total_steps_ && set_.eval.at_end);
}

Status Trainer::Evaluate(nlohmann::json* out) {
  *out = nlohmann::json();
  try {
    return EvaluateShare(out);
  } catch (const std::exception& e) {
    ctx_.model->train();
    std::string what = e.what();
    if (IsOutOfMemory(e))
      return Status::ResourceExhausted(fmt::format(
          "out of memory evaluating at step {}: lower train.batch_size (evaluation reads batches "
          "of the training size); checkpoints so far are intact",
          step_));
    return Status::Internal(
        fmt::format("evaluation at step {} failed: {}", step_, what.substr(0, what.find('\n'))));
  }
}

Status Trainer::EvaluateShare(nlohmann::json* out) {
  if (!eval_source_) return Status::Ok();
  optim_->WaitForUpdate();
  double started = MonoNow();
  int64_t max_samples = set_.eval.max_samples;
  // Rank r reads max/world samples, one more while r < max % world: max in all.
  double cap = max_samples > 0 ? static_cast<double>(max_samples / rank_.world_size +
                                                     (rank_.rank < max_samples % rank_.world_size))
                               : std::numeric_limits<double>::infinity();
  std::vector<double> sums(4,
                           0.0);  // loss, correct, targets (tokens for a language model), samples
  {
    torch::NoGradGuard no_grad;
    ctx_.model->eval();
    eval_source_->StartEpoch(0, 0);
    TrainBatch b;
    while (sums[3] < cap && eval_source_->Next(&b)) {
      int64_t keep = b.inputs.size(0);
      if (cap - sums[3] < keep) keep = static_cast<int64_t>(cap - sums[3]);
      AutocastGuard autocast(ctx_.device.type(), ctx_.autocast);
      torch::Tensor logits = ctx_.model->forward(b.inputs.narrow(0, 0, keep)).to(torch::kFloat);
      torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
      torch::Tensor target = b.targets.narrow(0, 0, keep).reshape({-1});
      sums[0] += torch::cross_entropy_loss(flat, target, {}, at::Reduction::Sum).item<double>();
      sums[1] += flat.argmax(1).eq(target).sum().item<double>();
      sums[2] += static_cast<double>(target.size(0));
      sums[3] += static_cast<double>(keep);
    }
    ctx_.model->train();
  }
  sharding_.ReleaseOthers();
  if (!eval_source_->status().ok())
    return Status::InvalidArgument("held-out data (data.val_path): " +
                                   eval_source_->status().message());
  if (dp_) {
    auto all = dp_->SumOverRanks(sums);
    if (!all.ok()) return all.status();
    sums = *all;
  }
  if (sums[2] == 0) return Status::Ok();
  *out = {{"step", step_},
          {"epoch", epoch_},
          {"val_loss", sums[0] / sums[2]},
          {"val_accuracy", sums[1] / sums[2]},
          {"val_samples", sums[3]},
          {"duration_s", MonoNow() - started}};
  KeepIfBest(out);
  if (rank_.rank != 0) return Status::Ok();
  RunEvent event{Env::Default()->UnixSeconds() - run_.start_time, "evaluation", out->dump()};
  RecordEvent(event, /*to_events_file=*/true);
  return Status::Ok();
}

// checkpoint.keep_best: a new lowest held-out loss checkpoints this step
// (unless it is written already) and shields it from the rotation.
void Trainer::KeepIfBest(nlohmann::json* eval) {
  if (!set_.checkpoint.keep_best || !((*eval)["val_loss"].get<double>() < best_val_loss_))
    return;
  best_val_loss_ = (*eval)["val_loss"].get<double>();
  (*eval)["best"] = true;
  Checkpoint(false);  // on every rank: a sharded state is gathered first
  if (rank_.rank != 0) return;
  checkpoints_->Protect(step_);
  best_step_ = step_;
  best_checkpoint_ = CheckpointPath(checkpoints_->dir(), step_);
  (*eval)["checkpoint"] = best_checkpoint_;
}

std::string EvaluationLine(const nlohmann::json& eval) {
  return fmt::format(
      "held-out at step {}: loss {:.4f}, accuracy {:.1f}% ({:g} samples, {:.1f} s){}",
      eval["step"].get<int64_t>(), eval["val_loss"].get<double>(),
      100 * eval["val_accuracy"].get<double>(), eval["val_samples"].get<double>(),
      eval["duration_s"].get<double>(), eval.value("best", false) ? ", the best so far" : "");
}

}  // namespace fullburn
