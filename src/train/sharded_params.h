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
// - Release and ReleaseAll only free memory (no communication): the trainer
//   calls ReleaseAll after each optimizer step and after an evaluation.
// - held_bytes(): the parameter bytes this rank holds now.
// - Training thread and autograd's (backward runs on one thread at a time).
#pragma once

#include <torch/torch.h>

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
// first), and the largest block's bytes.
struct BlockSplit {
  std::vector<torch::Tensor> inside, outside;
  int64_t largest_block_bytes = 0;
};
BlockSplit SplitByBlocks(const torch::nn::Module& model,
                         const std::vector<std::vector<torch::Tensor>>& blocks);

class ShardedParameters : public ParameterGather {
 public:
  // `params` and `owner` as DataParallel::ShardOwners gives them.
  ShardedParameters(DataParallel* dp, const std::vector<torch::Tensor>& params,
                    const std::vector<int>& owner);
  // The parameters Model::SetParameterGather named: released by the next
  // block's Gather; the others only by ReleaseAll.
  void SetBlockParameters(const std::vector<torch::Tensor>& in_blocks);
  bool Owns(const torch::Tensor& p) const;
  void Gather(const std::vector<torch::Tensor>& params) override;
  void Release(const std::vector<torch::Tensor>& params) override;
  void ReleaseAll();
  int64_t held_bytes() const;
  int64_t total_numel() const;  // every parameter's elements, gathered or not
  // The most parameter bytes one Gather fills (the largest block's, or the
  // parameters outside blocks): what a rank holds above its share at a time.
  int64_t largest_gather_bytes() const { return largest_gather_bytes_; }

 private:
  struct Slot {
    torch::Tensor param;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int owner = 0;
    bool in_block = false;
  };
  Slot* Find(const torch::Tensor& p);
  void Free(Slot& s);

  DataParallel* dp_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, size_t> index_;  // by TensorImpl
  int64_t largest_gather_bytes_ = 0;
};

}  // namespace fullburn
