// RunInput: the training data of one run of `fullburn train` (train
// component only): its source and where the run is in it (the epoch, and
// the samples of the epoch every rank together read), which a checkpoint
// saves and a resumed run starts from, whatever its world size and batch.
//
// Contract
// - Owns the source; an image or dataset source's loader threads stop in
//   the source's destructor.
// - Every method runs on the training thread.
// - Next's error is the source's status (an unreadable sample past
//   data.bad_samples, a failed read).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "sources.h"

namespace fullburn {

class RunInput {
 public:
  // The source, reading `samples_per_batch` samples a batch over every rank
  // together (the micro-batch times the world size).
  void Open(std::unique_ptr<BatchSource> source, int64_t samples_per_batch);
  const BatchSource& source() const { return *source_; }

  // The next batch; where the epoch ran out, the next epoch starts.
  Status Next(TrainBatch* batch);
  // Optimizer steps of `accumulate` micro-batches in one epoch, at least 1.
  int64_t StepsPerEpoch(int64_t accumulate) const;
  int64_t epoch() const { return epoch_; }
  // The samples of this epoch every rank together read: what a checkpoint
  // saves as epoch_samples.
  int64_t EpochSamplesRead() const { return epoch_skip_ + next_batch_ * samples_per_batch_; }
  // A checkpoint's position: its epoch and epoch_samples; one written
  // before epoch_samples counted batches of this run's size (next_batch).
  void Restore(int64_t epoch, int64_t epoch_samples, int64_t next_batch);
  // The loop's start: the epoch goes on after the samples read.
  void StartAtPosition();
  // A batch for the memory probe, from the run's own source (a second
  // source would hold a second copy of an in-memory dataset); the loop's
  // StartAtPosition starts the epoch over after it.
  Status DrawProbe(TrainBatch* probe);
  std::optional<LoaderStats> loader_stats() const { return source_->loader_stats(); }

 private:
  std::unique_ptr<BatchSource> source_;
  int64_t samples_per_batch_ = 0;
  int64_t epoch_ = 0, next_batch_ = 0;
  // Samples of the epoch read before next_batch_ counted from 0 (a resumed
  // run's start).
  int64_t epoch_skip_ = 0;
};

}  // namespace fullburn
