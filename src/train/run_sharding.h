// RunSharding: dist.shard and dist.offload for one run of `fullburn train`
// (train component only): which rank owns which parameters' optimizer state
// (dist.shard = optimizer), their gradients (gradients), the parameters
// themselves (full), and the optimizer's update in host memory
// (dist.offload = optimizer), with what each step does for them.
//
// Contract
// - Borrows the run's optimizer, model and data parallel (null on one rank)
//   at Setup; they outlive it. Owns the sharded parameters (full) and the
//   gather the model's blocks call (full, or offload's wait for the host
//   update); the model holds the gather too, so it outlives the part.
// - Starts no thread: the host update's thread is the optimizer's own and
//   stops in its destructor; every method runs on the training thread.
// - Before Setup, or on one rank, or with dist.shard = none: nothing is
//   sharded, and Update is the optimizer's step.
// - Errors are Status: a collective that failed, a refused setting, host
//   memory too small for dist.offload.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fullburn/dist_torch.h"
#include "fullburn/models.h"
#include "fullburn/optim.h"
#include "fullburn/train_settings.h"
#include "sharded_params.h"

namespace fullburn {

class RunSharding {
 public:
  // What dist.shard and dist.offload refuse, known from the settings alone:
  // asked once the ranks are connected, before the model is built or a
  // batch size searched.
  static Status Refused(const TrainSettings& settings, bool data_parallel);
  // dist.shard = full with a model that has no blocks to gather.
  static Status NoBlocksToGather(const std::string& model_name);
  // Whole gradient buckets held between steps (gradients not sharded).
  static bool BucketsHeld(const TrainSettings& settings, bool data_parallel);

  struct Borrowed {
    Optimizer* optimizer = nullptr;
    Model* model = nullptr;
    DataParallel* dp = nullptr;  // null: one rank
    torch::Device device = torch::kCPU;
    bool channels_last = false;
    int rank = 0;
    bool quiet = false;
  };
  // dist.shard, then dist.offload. `share_to_device`: dist.shard = full whose
  // model waits in host memory (no probe); each rank moves only its own
  // parameters to the device here.
  Status Setup(const TrainSettings& settings, const Borrowed& parts, bool share_to_device);

  bool optimizer_sharded() const { return !owner_.empty(); }
  bool gradients_sharded() const { return gradients_sharded_; }
  const std::vector<int>& owners() const { return owner_; }  // empty: not sharded
  // dist.shard = full: this rank's parameters and its gathers; null otherwise.
  ShardedParameters* parameters() const { return parameters_.get(); }
  // What the model gathers through (full's parameters, or offload's wait for
  // the host update); null: nothing.
  const std::shared_ptr<ParameterGather>& gather() const { return gather_; }

  // The inf/NaN verdict of every rank: sharded gradients were each checked
  // by their owner only.
  Result<bool> AnyRank(bool found_inf) const;
  // clip_grad_norm_, over every rank's gradients where they are sharded.
  Status ClipGradients(double max_norm);
  // The optimizer's update at `lr`: overlapping the next forward (offload,
  // unsharded), and each owner's values sent to the other ranks (sharded
  // state; with full, gathered at their next use instead).
  Status Update(double lr);
  // At the step's end, and after an evaluation: full releases the others'
  // parameters.
  void ReleaseOthers();

 private:
  Status ShardStates(const TrainSettings& settings, bool share_to_device);
  Status SetupOffload(const TrainSettings& settings);
  Status PlaceShareOnDevice(double bucket_mb);

  Borrowed parts_;
  std::vector<int> owner_;
  bool gradients_sharded_ = false;
  std::shared_ptr<ShardedParameters> parameters_;
  std::shared_ptr<ParameterGather> gather_;
  bool update_overlaps_ = false;
};

}  // namespace fullburn
