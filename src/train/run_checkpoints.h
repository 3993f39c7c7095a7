// RunCheckpoints: a training run's checkpoint writers (train component only):
// rank 0's whole file and, in a sharded run, this rank's part beside it, each
// written on a thread of its own (checkpoint.h's CheckpointWriter).
//
// Contract
// - Owns both writers and what their threads read: the cancel flag rank 0's
//   writer polls while it waits for the parts, this rank's identity, the
//   folder. Shares the run's recording (run_recording.h), into which the
//   whole file's writer records each checkpoint, so the recorder outlives
//   that thread.
// - Destruction waits for the part in flight, then the whole file, before
//   anything they read goes: the order is in the destructor.
// - A part that fails is marked for rank 0 (MarkOptimizerShardFailed) and
//   said on stderr; a whole file that fails is said and recorded by the
//   writer's status (last_status()).
// - Threads: every method from the trainer's thread; CancelParts from any.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "fullburn/checkpoint.h"
#include "run_recording.h"

namespace fullburn {

struct CheckpointPlan {
  std::string dir;  // made already
  int keep = 0;     // checkpoint.keep
  bool async = true;
  bool parts = false;         // sharded: every rank writes its part
  double part_wait_s = 0;     // rank 0: how long the whole file waits for every part
  int64_t run_id = -1;
  double run_start = 0;       // unix seconds: a checkpoint's time in the run
  int rank = 0, world = 1;
};

class RunCheckpoints {
 public:
  RunCheckpoints(CheckpointPlan plan, std::shared_ptr<RunRecording> records);
  ~RunCheckpoints();
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;

  bool parts() const { return part_ != nullptr; }
  const std::string& dir() const { return plan_.dir; }
  // This rank's part of the checkpoint at `step`, in the background; the
  // time the caller was blocked (staging) is added to part_blocked_s(). A
  // failure to stage it is marked and said, as a failed write is.
  void SavePart(int64_t step, CheckpointState state);
  // Rank 0's file at `step`; throws as CheckpointWriter::Save does.
  void SaveWhole(int64_t step, CheckpointState state);
  // Before the optimizer step writes the weights a writer may still copy.
  void BeforeUpdate();
  void WaitPart();
  void Wait();  // the whole file (and, before it, the parts it waits for)
  Status last_status() const;  // the whole file's latest Save, once written
  void Protect(int64_t step);  // kept out of the rotation (checkpoint.keep_best)
  // The loop failed: rank 0 stops waiting for parts that may never come.
  void CancelParts() { cancel_ = true; }
  double part_blocked_s() const { return part_blocked_s_; }
  double part_write_s() const { return part_write_us_.load() / 1e6; }
  std::string PartPath(int64_t step) const;
  ShardIdentity PartIdentity(int64_t step) const;

 private:
  void PartFailed(int64_t step, const std::string& path, const std::string& why);

  const CheckpointPlan plan_;
  std::shared_ptr<RunRecording> records_;
  std::atomic<bool> cancel_{false};
  std::atomic<int64_t> part_write_us_{0};  // the part writer's time writing, in total
  double part_blocked_s_ = 0;
  std::unique_ptr<CheckpointWriter> whole_;
  std::unique_ptr<CheckpointWriter> part_;  // null unless plan_.parts
};

}  // namespace fullburn
