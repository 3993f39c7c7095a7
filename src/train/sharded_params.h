// Internal to train: dist.shard = full (ZeRO stage 3). Each parameter lives
// whole only on the rank that owns it (DataParallel::ShardOwners, the same
// owners as its optimizer state and gradient); the other ranks hold an
// empty tensor in its place and fill it from the owner, by broadcast, just
// before it is used.
//
// Contract
// - Gather(params) is a collective: every rank calls it with the same list
//   (the model's blocks in order). It first lets go of every other block's
//   parameters still held (backward leaves the last block it recomputed
//   gathered: autograd accumulates its gradients after the block returns),
//   then fills `params` from their owners. Throws std::runtime_error with
//   DataParallel's one-line message when a rank is lost.
// - A gather unit is one block, or a run of consecutive blocks gathered
//   together (model.checkpoint = every_K gathers K at a time); any other
//   list (the parameters outside blocks) is no unit.
// - Prefetch (SetBlocks with prefetch on): once a unit is filled, the next
//   unit's broadcast starts, so it travels while this one computes; the
//   next is guessed from the order of the last two gathers (forward goes up
//   the blocks, backward's recomputes come down) and the units seen so far.
//   Every rank guesses alike, so the collectives still meet; a wrong guess
//   is finished and dropped. A rank then holds two units at a time.
// - Release and ReleaseAll only free memory (no communication but finishing
//   a prefetch every rank started): the trainer calls ReleaseAll after each
//   optimizer step and after an evaluation.
// - held_bytes(): the parameter bytes this rank holds now.
// - Training thread and autograd's (backward runs on one thread at a time).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "fullburn/dist_torch.h"
#include "fullburn/models.h"

namespace fullburn {

// The bytes of `tensors`' elements.
int64_t TensorBytes(const std::vector<torch::Tensor>& tensors);

// A model's parameters as Model::SetParameterGather's blocks split them:
// those in blocks (in block order), those outside (held for the step, used
// first), the largest gather unit's bytes (`segment` blocks in a row from
// the first, as model.checkpoint = every_K gathers them; 1: each block) and
// the most two units in a row hold (a unit and the one a prefetch fills
// beside it).
struct BlockSplit {
  std::vector<torch::Tensor> inside, outside;
  int64_t largest_block_bytes = 0, largest_pair_bytes = 0;
};
BlockSplit SplitByBlocks(const torch::nn::Module& model,
                         const std::vector<std::vector<torch::Tensor>>& blocks, int segment = 1);

class ShardedParameters : public ParameterGather {
 public:
  // `params` and `owner` as DataParallel::ShardOwners gives them.
  ShardedParameters(DataParallel* dp, const std::vector<torch::Tensor>& params,
                    const std::vector<int>& owner);
  // The blocks Model::SetParameterGather named, in forward order: their
  // parameters are released by another block's Gather (the others only by
  // ReleaseAll), and with `prefetch` the next block's broadcast starts as
  // soon as a block is filled.
  void SetBlocks(const std::vector<std::vector<torch::Tensor>>& blocks, bool prefetch);
  // For a model still in host memory (built there so no rank holds it
  // whole on the device): moves each parameter to `device` with rank 0's
  // values and keeps it whole only on its owner. The others become a
  // placeholder of their shape over one element (autograd's gradient
  // accumulator, which DataParallel::Attach hooks, records the shape and
  // device it first sees: attach after this, then ReleaseAll empties them).
  // A collective; parameters travel in chunks of up to `chunk_bytes` (at
  // least one parameter), so the device holds the rank's share plus one
  // chunk. `channels_last`: 4-d parameters take that layout on the device.
  // On a CPU device the owners' parameters stay where they are. A lost
  // rank: DataParallel's Status.
  Status PlaceOnDevice(const torch::Device& device, int64_t chunk_bytes, bool channels_last);
  bool Owns(const torch::Tensor& p) const;
  void Gather(const std::vector<torch::Tensor>& params) override;
  void Release(const std::vector<torch::Tensor>& params) override;
  void ReleaseAll();
  int64_t held_bytes() const;
  int64_t total_numel() const;  // every parameter's elements, gathered or not
  // The most parameter bytes one Gather fills (the largest block's, with a
  // prefetch the next unit's too, or the parameters outside blocks): what a
  // rank holds above its share at a time.
  int64_t largest_gather_bytes() const { return largest_gather_bytes_; }
  // Unit gathers so far, and those a prefetch had already filled.
  int64_t block_gathers() const { return block_gathers_; }
  int64_t prefetched_gathers() const { return prefetched_gathers_; }

 private:
  struct Slot {
    torch::Tensor param;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int owner = 0;
    int block = -1;            // its index in SetBlocks' list; -1: outside blocks
    bool placeholder = false;  // PlaceOnDevice's stand-in: holds no values
  };
  // Blocks first .. first + count - 1; count 0: no unit.
  struct Unit {
    int first = -1, count = 0;
    bool valid() const { return count > 0; }
    bool operator==(const Unit& o) const { return first == o.first && count == o.count; }
    bool Contains(int block) const { return block >= first && block < first + count; }
  };
  Slot* Find(const torch::Tensor& p);
  void Free(Slot& s);
  Unit UnitOf(const std::vector<torch::Tensor>& params);
  Unit NextUnit(Unit unit) const;
  static void Allocate(const std::vector<Slot*>& slots, std::vector<torch::Tensor>* tensors,
                       std::vector<int>* owners);
  void FinishPrefetch(bool keep);
  std::vector<Slot*> UnitSlots(Unit unit);

  DataParallel* dp_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, size_t> index_;  // by TensorImpl
  int64_t largest_gather_bytes_ = 0;
  std::vector<std::vector<size_t>> blocks_;  // slot indices, forward order
  bool prefetch_ = false;
  Unit last_unit_, pending_unit_;
  std::map<int, int> seen_units_;  // first block -> blocks, of the units gathered
  std::unique_ptr<DataParallel::PendingBroadcast, void (*)(DataParallel::PendingBroadcast*)>
      pending_{nullptr, nullptr};
  int64_t block_gathers_ = 0, prefetched_gathers_ = 0;
};

}  // namespace fullburn
