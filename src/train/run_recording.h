// RunRecording: what a training run records goes through it (train component
// only): the recorder (recorder.h: the sampler, the steps' flushes, the live
// finding) and the spill that keeps what the store refuses.
//
// Contract
// - Owns the recorder and the spill; shares the store and the GPU source,
//   which the recorder's sampler thread reads, so those outlive it whatever
//   order their other owners go in.
// - Whatever writes records from a thread of its own (a checkpoint writer)
//   holds a shared_ptr to it, so the recorder outlives that thread too.
// - Destruction stops the recorder (its sampler thread, its last write)
//   before the spill it writes into goes: the order is in the destructor,
//   not in the declaration of fields.
// - Threads: recorder() as recorder.h says; the rest from the trainer's thread.
#pragma once

#include <memory>

#include "fullburn/recorder.h"
#include "fullburn/spill.h"
#include "fullburn/store.h"
#include "fullburn/telemetry.h"

namespace fullburn {

class RunRecording {
 public:
  // `gpus`: what the sampler reads (null: no GPU readings; o.gpus is set
  // from it). `keep_refused`: a rank that writes a store keeps what it
  // refuses in a spill (spill.h); a forwarding rank writes none.
  RunRecording(std::shared_ptr<RunStore> store, std::shared_ptr<GpuSource> gpus, const RunInfo& run,
               Recorder::Options o, bool keep_refused);
  ~RunRecording();
  RunRecording(const RunRecording&) = delete;
  RunRecording& operator=(const RunRecording&) = delete;

  Recorder& recorder() { return *recorder_; }
  SpillFile* spill() { return spill_.get(); }  // null: none
  RunStore* store() { return store_.get(); }

 private:
  std::shared_ptr<RunStore> store_;
  std::shared_ptr<GpuSource> gpus_;
  std::unique_ptr<SpillFile> spill_;
  std::unique_ptr<Recorder> recorder_;
};

}  // namespace fullburn
