// RunEvaluation (run_evaluation.h): the held-out source, when evaluations
// are due, each rank's share of the held-out loss and accuracy summed over
// the ranks, and the best loss so far.
#include "run_evaluation.h"

#include <limits>
#include <vector>

#include "fullburn/amp.h"

namespace fullburn {

std::string RunEvaluation::HeldOutPath(const TrainSettings& settings,
                                       const std::string& datasets_dir) {
  const std::string& source = settings.data.source;
  if (source != "images" && source != "tokens") return "";
  std::string val = settings.data.val_path;
  if (source == "images" && val.empty() && settings.data.path.empty())
    val = DefaultImagesPath(datasets_dir, static_cast<int>(settings.data.classes), true);
  return val;
}

Status RunEvaluation::Open(const TrainSettings& settings, const Source& held_out,
                           int64_t steps_per_epoch) {
  every_steps_ = settings.eval.every_steps;
  every_epoch_steps_ = settings.eval.every_epochs * steps_per_epoch;
  at_end_ = settings.eval.at_end;
  max_samples_ = settings.eval.max_samples;
  bool periodic = every_steps_ > 0 || every_epoch_steps_ > 0;
  if (!periodic && !at_end_) return Status::Ok();
  const std::string& source = settings.data.source;
  SourceSpec es = held_out.spec;
  es.train = false;
  es.tensors = held_out.tensors;
  es.dataset = held_out.dataset;
  bool program = source == "tensors" || source == "dataset";
  if (program && !es.tensors && !es.dataset) {
    if (!periodic) return Status::Ok();  // nothing held out: no evaluation at the end either
    return Status::InvalidArgument(
        std::string("eval.every_steps / eval.every_epochs need held-out data: hand it over as "
                    "TrainerOptions::") +
        (source == "tensors" ? "val_data" : "val_dataset") + ", or set them to 0");
  }
  if (source == "images" || source == "tokens") {
    es.path = HeldOutPath(settings, held_out.datasets_dir);
    if (es.path.empty()) {
      if (!periodic) return Status::Ok();  // nothing held out: no evaluation at the end either
      return Status::InvalidArgument(
          "eval.every_steps / eval.every_epochs need held-out data: set data.val_path (" +
          std::string(source == "tokens" ? "a token file, such as nanoGPT's val.bin"
                                         : "an image folder or pack") +
          ") or set them to 0");
    }
    // The default's held-out split is made on first use.
    if (source == "images" && settings.data.val_path.empty())
      if (auto made = DefaultImages(held_out.datasets_dir,
                                    static_cast<int>(settings.data.classes), true);
          !made.ok())
        return made.status();
  }
  auto src = OpenSource(settings, es);
  if (!src.ok()) {
    return Status::InvalidArgument("held-out data (data.val_path): " + src.status().message());
  }
  source_ = std::move(*src);
  return Status::Ok();
}

bool RunEvaluation::Due(int64_t step, int64_t total_steps) const {
  if (!source_ || step == 0) return false;
  bool due = (every_steps_ > 0 && step % every_steps_ == 0) ||
             (every_epoch_steps_ > 0 && step % every_epoch_steps_ == 0);
  return due && !(step == total_steps && at_end_);
}

Status RunEvaluation::Evaluate(const Borrowed& parts, nlohmann::json* out) {
  *out = nlohmann::json();
  if (!source_) return Status::Ok();
  // Rank r reads max/world samples, one more while r < max % world: max in all.
  const int64_t world = parts.world_size;
  double cap = max_samples_ > 0
                   ? static_cast<double>(max_samples_ / world + (parts.rank < max_samples_ % world))
                   : std::numeric_limits<double>::infinity();
  std::vector<double> sums(4,
                           0.0);  // loss, correct, targets (tokens for a language model), samples
  Model& model = *parts.model;
  {
    torch::NoGradGuard no_grad;
    model.eval();
    // Back in training mode however the pass ends (an out-of-memory is
    // the caller's to report).
    struct TrainAgain {
      Model& m;
      ~TrainAgain() { m.train(); }
    } train_again{model};
    source_->StartEpoch(0, 0);
    TrainBatch b;
    while (sums[3] < cap && source_->Next(&b)) {
      int64_t keep = b.inputs.size(0);
      if (cap - sums[3] < keep) keep = static_cast<int64_t>(cap - sums[3]);
      AutocastGuard autocast(parts.device.type(), parts.autocast);
      torch::Tensor logits = model.forward(b.inputs.narrow(0, 0, keep)).to(torch::kFloat);
      torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
      torch::Tensor target = b.targets.narrow(0, 0, keep).reshape({-1});
      sums[0] += torch::cross_entropy_loss(flat, target, {}, at::Reduction::Sum).item<double>();
      sums[1] += flat.argmax(1).eq(target).sum().item<double>();
      sums[2] += static_cast<double>(target.size(0));
      sums[3] += static_cast<double>(keep);
    }
  }
  if (parts.sharded) parts.sharded->ReleaseAll();
  if (!source_->status().ok())
    return Status::InvalidArgument("held-out data (data.val_path): " +
                                   source_->status().message());
  if (parts.dp) {
    auto all = parts.dp->SumOverRanks(sums);
    if (!all.ok()) return all.status();
    sums = *all;
  }
  if (sums[2] == 0) return Status::Ok();
  *out = {{"val_loss", sums[0] / sums[2]},
          {"val_accuracy", sums[1] / sums[2]},
          {"val_samples", sums[3]}};
  return Status::Ok();
}

bool RunEvaluation::TakeIfBest(double val_loss) {
  if (!(val_loss < best_.val_loss)) return false;
  best_.val_loss = val_loss;
  return true;
}

void RunEvaluation::BestWrittenAt(int64_t step, const std::string& checkpoint) {
  best_.step = step;
  best_.checkpoint = checkpoint;
}

}  // namespace fullburn
