// RunEvaluation: held-out evaluation for one run of `fullburn train` (train
// component only): the held-out source, when evaluations are due
// (eval.every_steps, eval.every_epochs, eval.at_end), each rank's share of
// the held-out loss and accuracy summed over the ranks, and the best loss so
// far (checkpoint.keep_best).
//
// Contract
// - Owns the held-out source; borrows the model, data parallel (null on one
//   rank) and the sharded parameters (dist.shard = full) for each Evaluate
//   call only.
// - Starts no thread of its own (an image or dataset source's loader
//   threads stop in the source's destructor); every method runs on the
//   training thread.
// - Every rank evaluates together (the sums are a collective), so a rank
//   reads max_samples / world_size of the data and none waits on another
//   past the collective timeout.
// - Errors are Status: held-out data that is missing where an evaluation is
//   asked for, unreadable, or a collective that failed; an out-of-memory or
//   other exception from the model is the caller's to catch.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "fullburn/dist_torch.h"
#include "fullburn/models.h"
#include "fullburn/train_settings.h"
#include "sharded_params.h"
#include "sources.h"

namespace fullburn {

class RunEvaluation {
 public:
  // The held-out data evaluation reads ("" for none; synthetic data draws
  // its own held-out samples); nothing is created here. `datasets_dir`
  // holds the default image folder's splits.
  static std::string HeldOutPath(const TrainSettings& settings, const std::string& datasets_dir);
  // What the held-out source is read with: the training source's spec, and
  // the program's own held-out tensors or dataset (TrainerOptions).
  struct Source {
    SourceSpec spec;
    std::string datasets_dir;
    const TensorData* tensors = nullptr;  // data.source = tensors: val_data
    std::shared_ptr<Dataset> dataset;     // data.source = dataset: val_dataset
  };
  // Opens the held-out source where an evaluation is asked for (the default
  // image folder's held-out split made on first use); `steps_per_epoch`
  // turns eval.every_epochs into steps. Without held-out data, an
  // evaluation at the end only is dropped, a periodic one refused.
  Status Open(const TrainSettings& settings, const Source& source, int64_t steps_per_epoch);
  bool enabled() const { return source_ != nullptr; }
  // Whether a periodic evaluation is due after `step`; the last step's is
  // the one at the end (eval.at_end).
  bool Due(int64_t step, int64_t total_steps) const;

  struct Borrowed {
    Model* model = nullptr;
    DataParallel* dp = nullptr;  // null: one rank
    // dist.shard = full: the pass gathered the other ranks' parameters,
    // released after it; null otherwise.
    ShardedParameters* sharded = nullptr;
    torch::Device device = torch::kCPU;
    std::optional<torch::ScalarType> autocast;
    int rank = 0, world_size = 1;
  };
  // This rank's share of the held-out data through the model (in eval mode,
  // under autocast, no gradients), summed over the ranks: {val_loss,
  // val_accuracy, val_samples}; empty when there was nothing to evaluate.
  Status Evaluate(const Borrowed& parts, nlohmann::json* out);

  // checkpoint.keep_best: the lowest held-out loss so far and the
  // checkpoint that holds it (a resumed run's from its checkpoint).
  struct Best {
    double val_loss = INFINITY;
    int64_t step = -1;
    std::string checkpoint;
  };
  // A held-out loss below the best so far becomes the best (true); the
  // checkpoint of its step, which then holds it, is named by BestWrittenAt.
  bool TakeIfBest(double val_loss);
  void BestWrittenAt(int64_t step, const std::string& checkpoint);
  const Best& best() const { return best_; }
  void RestoreBest(const Best& best) { best_ = best; }

 private:
  std::unique_ptr<BatchSource> source_;  // null: no evaluation
  int64_t every_steps_ = 0, every_epoch_steps_ = 0;
  bool at_end_ = false;
  int64_t max_samples_ = 0;
  Best best_;
};

}  // namespace fullburn
