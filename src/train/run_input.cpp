// RunInput (run_input.h): the training source and the run's position in it.
#include "run_input.h"

#include <algorithm>

namespace fullburn {

void RunInput::Open(std::unique_ptr<BatchSource> source, int64_t samples_per_batch) {
  source_ = std::move(source);
  samples_per_batch_ = samples_per_batch;
}

Status RunInput::Next(TrainBatch* batch) {
  while (!source_->Next(batch)) {
    if (!source_->status().ok()) return source_->status();
    ++epoch_;
    epoch_skip_ = next_batch_ = 0;
    source_->StartEpoch(static_cast<int>(epoch_), 0);
  }
  ++next_batch_;
  return Status::Ok();
}

int64_t RunInput::StepsPerEpoch(int64_t accumulate) const {
  return std::max<int64_t>(1, source_->batches_per_epoch() / accumulate);
}

void RunInput::Restore(int64_t epoch, int64_t epoch_samples, int64_t next_batch) {
  epoch_ = epoch;
  epoch_skip_ = epoch_samples;
  next_batch_ = next_batch;
}

void RunInput::StartAtPosition() {
  epoch_skip_ += next_batch_ * samples_per_batch_;
  next_batch_ = 0;
  source_->StartEpoch(static_cast<int>(epoch_), epoch_skip_);
}

Status RunInput::DrawProbe(TrainBatch* probe) {
  source_->StartEpoch(static_cast<int>(epoch_), epoch_skip_);
  if (source_->Next(probe)) return Status::Ok();
  if (!source_->status().ok()) return source_->status();
  // A checkpoint at an epoch's end resumes with nothing left of it: any
  // batch does for a probe.
  source_->StartEpoch(static_cast<int>(epoch_) + 1, 0);
  if (source_->Next(probe)) return Status::Ok();
  return source_->status().ok() ? Status::Internal("the data source gave no batch to probe")
                                : source_->status();
}

}  // namespace fullburn
