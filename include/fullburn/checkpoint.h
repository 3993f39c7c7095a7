// Checkpoints: safetensors files of a training state, written atomically and
// in the background, read back verified, sharded runs' parts beside them
// (train component, links libtorch).
//
// Contract
// - Readers never see a partial file; a failed write never touches the
//   checkpoints already written. A read or write error is a Status naming
//   the file; CheckpointWriter::Save throws on the caller's thread when the
//   host copy cannot be made (out of memory).
// - A CheckpointWriter is driven by one thread (Save, BeforeUpdate, Wait);
//   each Save writes on a thread of its own (the caller's when not async),
//   one checkpoint in flight at most, and its `done` callback runs there.
//   status() and last_status() may be read from any thread.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

// A checkpoint is a safetensors file (loadable by Python's safetensors as
// is): tensors named model.*, optim.*, rng.*; its __metadata__ holds
// "fullburn" (the training state as JSON: step, epoch, loader position, loss
// scaler, config) and "crc32" of the data section, verified on load.
struct CheckpointState {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  // Tensors the caller will not change until it calls
  // CheckpointWriter::BeforeUpdate() (weights and optimizer state: only the
  // optimizer step writes them), so they are copied on the writer thread
  // while the next forward and backward run.
  std::vector<std::pair<std::string, torch::Tensor>> until_update;
  std::string state_json = "{}";
};

// Writes atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A reader never sees a partial file.
Status WriteCheckpointFile(const std::string& path, const CheckpointState& state, int64_t* bytes);
// Reads and verifies (size, header, checksum); errors name the file and why.
Result<CheckpointState> ReadCheckpointFile(const std::string& path);
// Sharded optimizer state (dist.shard): each rank's own part of a step's
// optimizer state, in a file beside the step's checkpoint (whose metadata
// says how many: "optim_shards").
std::string OptimizerShardPath(const std::string& checkpoint_path, int rank, int world);
// ReadCheckpointFile, and for a sharded checkpoint every rank's state file
// beside it, verified each, their tensors added: the whole state, whatever
// world size wrote it. A missing or damaged part is an error naming it.
Result<CheckpointState> ReadCheckpointWithShards(const std::string& path);
// Which checkpoint a part belongs to, in its metadata and its failure marker.
struct ShardIdentity {
  int64_t step = -1, run_id = -1;
  int rank = -1, world = -1;
};
// The identity as a part's metadata holds it.
std::string ShardIdentityJson(const ShardIdentity& id);
// The marker a rank leaves beside its part when writing it failed
// (PART.failed, holding the identity and why), for rank 0 to read.
void MarkOptimizerShardFailed(const std::string& part_path, const ShardIdentity& id,
                              const std::string& why);
// Rank 0, before it writes a sharded step's file: waits until every rank's
// part of that checkpoint is in its folder (each renamed into place whole;
// a part's metadata must name this step and run, so a stale file of an
// earlier attempt does not count). A rank's failure marker, `cancel` or
// `timeout_s` without every part ends the wait with an error, and the step's
// parts are removed: no step file will name them.
Status WaitForOptimizerShards(const std::string& checkpoint_path, const ShardIdentity& id,
                              const std::atomic<bool>& cancel, double timeout_s);

// The asynchronous writer: Save() copies `tensors` to host memory (a write
// still in flight is waited for first); the writer thread copies
// `until_update`, then serializes, checksums and writes. The loop is blocked
// for the first copy and, in BeforeUpdate(), only if the second is not done
// by the time the next optimizer step comes. Keeps the
// newest `keep` files of its directory. `done` is called on the writing thread.
// The host copies live in buffers kept from one checkpoint to the next (no
// fresh allocation and page faults per snapshot; the memory is the state's size).
class CheckpointWriter {
 public:
  struct Written {
    int64_t step;
    std::string path;
    int64_t bytes;
    double stall_s, write_s;
    Status status;
  };
  CheckpointWriter(std::string dir, int keep, bool async, std::function<void(const Written&)> done);
  ~CheckpointWriter();  // waits for the write in flight
  // Returns the seconds the caller was blocked.
  double Save(int64_t step, CheckpointState state);
  // Call before changing any `until_update` tensor; returns seconds blocked.
  double BeforeUpdate();
  void Wait();
  // Where a step's file goes (default: CheckpointPath(dir, step)); with
  // keep < 0 nothing is rotated. For a sharded run's parts.
  void SetPath(std::function<std::string(int64_t step)> path);
  // Runs on the writer thread once the state is staged, just before the
  // file is written; an error skips the file and is that Save's outcome.
  // Rank 0 of a sharded run waits there for every rank's part.
  void SetBeforeWrite(std::function<Status(int64_t step)> hook);
  Status status() const;       // the first failed write, if any
  Status last_status() const;  // the latest Save's outcome once written (Wait() first)
  // The checkpoint of `step` survives the keep-the-newest rotation (the best
  // held-out loss so far, checkpoint.keep_best); -1: none.
  void Protect(int64_t step);

 private:
  void Write(int64_t step, CheckpointState state, double stall_s);
  void Failed(int64_t step, double stall_s, const Status& s);
  std::string PathOf(int64_t step) const;
  void RecordLocked(const Status& s);  // the latest outcome, and the first failure (mu held)
  torch::Tensor& Staging(const std::string& name, const torch::Tensor& like);
  void Stage(std::vector<std::pair<std::string, torch::Tensor>>* tensors, bool parallel);
  struct Rep;  // the writer thread, its staging buffers and outcomes (checkpoint.cpp)
  std::unique_ptr<Rep> rep_;
};

// Where CheckpointWriter puts the checkpoint of `step`: DIR/step-00001234.safetensors.
std::string CheckpointPath(const std::string& dir, int64_t step);
// Checkpoint files of a directory, newest (highest step) first.
std::vector<std::string> ListCheckpoints(const std::string& dir);

}  // namespace fullburn
