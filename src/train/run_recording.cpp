#include "run_recording.h"

#include "fullburn/env.h"

namespace fullburn {

RunRecording::RunRecording(std::shared_ptr<RunStore> store, std::shared_ptr<GpuSource> gpus,
                           const RunInfo& run, Recorder::Options o, bool keep_refused)
    : store_(std::move(store)), gpus_(std::move(gpus)) {
  if (keep_refused) spill_ = std::make_unique<SpillFile>(Env::Default(), store_->path(), run);
  o.spill = spill_.get();
  o.gpus = gpus_.get();
  recorder_ = std::make_unique<Recorder>(Env::Default(), store_.get(), run, std::move(o));
}

RunRecording::~RunRecording() {
  recorder_.reset();  // its writers add to the spill
  spill_.reset();
}

}  // namespace fullburn
