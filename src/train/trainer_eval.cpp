// `fullburn train`: held-out evaluation, during training (eval.every_steps,
// eval.every_epochs) and at its end (eval.at_end), through the evaluation
// part (run_evaluation.h): the step's record of it, checkpoint.keep_best.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "trainer_impl.h"

namespace fullburn {

std::string Trainer::DatasetsDir() const { return StoreLayout(store_->path()).Datasets(); }

Status Trainer::SetupEval() {
  return evaluation_.Open(
      set_, {spec_, DatasetsDir(), opt_.val_data ? &*opt_.val_data : nullptr, opt_.val_dataset},
      input_.StepsPerEpoch(accumulate_));
}

Status Trainer::Evaluate(nlohmann::json* out) {
  *out = nlohmann::json();
  try {
    return EvaluateShare(out);
  } catch (const std::exception& e) {
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
  if (!evaluation_.enabled()) return Status::Ok();
  model_.optimizer().WaitForUpdate();
  double started = MonoNow();
  nlohmann::json held_out;
  if (Status s = evaluation_.Evaluate({model_.ctx().model.get(), dp_.get(), sharding_.parameters(),
                                       model_.ctx().device, model_.ctx().autocast, rank_.rank, rank_.world_size},
                                      &held_out);
      !s.ok())
    return s;
  if (held_out.empty()) return Status::Ok();
  *out = std::move(held_out);
  out->update({{"step", step_}, {"epoch", input_.epoch()}, {"duration_s", MonoNow() - started}});
  KeepIfBest(out);
  if (rank_.rank != 0) return Status::Ok();
  RunEvent event{Env::Default()->UnixSeconds() - run_.start_time, "evaluation", out->dump()};
  RecordEvent(event, /*to_events_file=*/true);
  return Status::Ok();
}

// checkpoint.keep_best: a new lowest held-out loss checkpoints this step
// (unless it is written already) and shields it from the rotation.
void Trainer::KeepIfBest(nlohmann::json* eval) {
  if (!set_.checkpoint.keep_best || !evaluation_.TakeIfBest((*eval)["val_loss"].get<double>()))
    return;
  (*eval)["best"] = true;
  Checkpoint(false);  // on every rank: a sharded state is gathered first
  if (rank_.rank != 0) return;
  checkpoints_->Protect(step_);
  const std::string path = CheckpointPath(checkpoints_->dir(), step_);
  evaluation_.BestWrittenAt(step_, path);
  (*eval)["checkpoint"] = path;
}

std::string EvaluationLine(const nlohmann::json& eval) {
  return fmt::format(
      "held-out at step {}: loss {:.4f}, accuracy {:.1f}% ({:g} samples, {:.1f} s){}",
      eval["step"].get<int64_t>(), eval["val_loss"].get<double>(),
      100 * eval["val_accuracy"].get<double>(), eval["val_samples"].get<double>(),
      eval["duration_s"].get<double>(), eval.value("best", false) ? ", the best so far" : "");
}

}  // namespace fullburn
