// dist.shard = full: parameters filled from their owners when used.
#include "sharded_params.h"

#include <algorithm>
#include <stdexcept>

namespace fullburn {

int64_t TensorBytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

BlockSplit SplitByBlocks(const torch::nn::Module& model,
                         const std::vector<std::vector<torch::Tensor>>& blocks) {
  BlockSplit split;
  int64_t previous = 0;
  for (const auto& block : blocks) {
    split.inside.insert(split.inside.end(), block.begin(), block.end());
    const int64_t bytes = TensorBytes(block);
    split.largest_block_bytes = std::max(split.largest_block_bytes, bytes);
    split.largest_pair_bytes = std::max(split.largest_pair_bytes, previous + bytes);
    previous = bytes;
  }
  split.outside = ParametersOutside(model, split.inside);
  return split;
}

ShardedParameters::ShardedParameters(DataParallel* dp, const std::vector<torch::Tensor>& params,
                                     const std::vector<int>& owner)
    : dp_(dp) {
  for (size_t i = 0; i < params.size(); ++i) {
    Slot s;
    s.param = params[i];
    s.shape = params[i].sizes().vec();
    s.numel = params[i].numel();
    s.owner = owner[i];
    index_[params[i].unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back(std::move(s));
  }
}

void ShardedParameters::SetBlocks(const std::vector<std::vector<torch::Tensor>>& blocks,
                                  bool prefetch) {
  prefetch_ = prefetch;
  blocks_.clear();
  for (Slot& s : slots_) s.block = -1;
  for (const auto& block : blocks) {
    std::vector<size_t> indices;
    for (const torch::Tensor& p : block)
      if (Slot* s = Find(p)) {
        s->block = static_cast<int>(blocks_.size());
        indices.push_back(static_cast<size_t>(s - slots_.data()));
      }
    blocks_.push_back(std::move(indices));
  }
}

// The block `params` is (by its first parameter), or -1: the parameters
// outside blocks, or a list that is no block of SetBlocks'.
int ShardedParameters::BlockOf(const std::vector<torch::Tensor>& params) {
  if (params.empty()) return -1;
  Slot* s = Find(params[0]);
  if (!s) return -1;
  const int b = s->block;
  return b >= 0 && blocks_[static_cast<size_t>(b)].size() == params.size() ? b : -1;
}

// The block likely gathered after `block`: forward climbs, backward's
// recomputes descend; after the same block twice, the last one turns round
// (end of forward, backward begins) and the first goes on up (the next
// micro-batch's forward).
int ShardedParameters::NextBlock(int block) const {
  const int n = static_cast<int>(blocks_.size());
  int step = 1;
  if (last_block_ == block + 1 || (last_block_ == block && block == n - 1)) step = -1;
  int next = block + step;
  return next >= 0 && next < n ? next : -1;
}

std::vector<ShardedParameters::Slot*> ShardedParameters::BlockSlots(int block) {
  std::vector<Slot*> out;
  for (size_t i : blocks_[static_cast<size_t>(block)]) out.push_back(&slots_[i]);
  return out;
}

// Waits for the prefetch in flight; keeps what it filled or frees it.
void ShardedParameters::FinishPrefetch(bool keep) {
  Status st = dp_->FinishBroadcast(pending_.get());
  pending_.reset();
  const int block = pending_block_;
  pending_block_ = -1;
  if (!st.ok()) throw std::runtime_error(st.message());
  if (!keep)
    for (Slot* s : BlockSlots(block)) Free(*s);
}

bool ShardedParameters::Owns(const torch::Tensor& p) const {
  auto it = index_.find(p.unsafeGetTensorImpl());
  return it != index_.end() && slots_[it->second].owner == dp_->rank();
}

ShardedParameters::Slot* ShardedParameters::Find(const torch::Tensor& p) {
  auto it = index_.find(p.unsafeGetTensorImpl());
  return it == index_.end() ? nullptr : &slots_[it->second];
}

// An empty tensor of the same dtype and device in place of the values: the
// parameter object (and autograd's accumulator on it, and the optimizer's
// and the buckets' references) stays the same.
void ShardedParameters::Free(Slot& s) {
  if (s.owner == dp_->rank() || s.param.numel() == 0) return;
  s.param.set_data(torch::empty({0}, s.param.options()));
}

// Each slot at its full shape (a released one gets fresh memory), and the
// tensors and their owners for a broadcast.
void ShardedParameters::Allocate(const std::vector<Slot*>& slots,
                                 std::vector<torch::Tensor>* tensors, std::vector<int>* owners) {
  for (Slot* s : slots) {
    if (s->param.numel() != s->numel)
      s->param.set_data(torch::empty(s->shape, s->param.options()));
    tensors->push_back(s->param);
    owners->push_back(s->owner);
  }
}

void ShardedParameters::Gather(const std::vector<torch::Tensor>& params) {
  std::vector<Slot*> wanted;
  std::vector<bool> is_wanted(slots_.size(), false);
  for (const torch::Tensor& p : params)
    if (Slot* s = Find(p)) {
      wanted.push_back(s);
      is_wanted[static_cast<size_t>(s - slots_.data())] = true;
    }
  const int block = BlockOf(params);
  for (size_t i = 0; i < slots_.size(); ++i)  // not the block a prefetch is filling
    if (slots_[i].block >= 0 && slots_[i].block != pending_block_ && !is_wanted[i])
      Free(slots_[i]);
  bool filled = false;
  if (pending_ && block >= 0) {  // every gather of a block settles the prefetch
    filled = pending_block_ == block;
    FinishPrefetch(filled);
  }
  std::vector<torch::Tensor> tensors;
  std::vector<int> owners;
  Allocate(wanted, &tensors, &owners);
  int64_t held = TensorBytes(tensors);
  if (!filled) {
    Status st = dp_->BroadcastFromOwners(tensors, owners);
    if (!st.ok()) throw std::runtime_error(st.message());
  }
  if (block >= 0) {
    ++block_gathers_;
    prefetched_gathers_ += filled;
    const int next = prefetch_ ? NextBlock(block) : -1;
    last_block_ = block;
    if (next >= 0) {
      std::vector<torch::Tensor> next_tensors;
      std::vector<int> next_owners;
      Allocate(BlockSlots(next), &next_tensors, &next_owners);
      held += TensorBytes(next_tensors);
      pending_ = dp_->StartBroadcastFromOwners(next_tensors, next_owners);
      pending_block_ = next;
    }
  }
  largest_gather_bytes_ = std::max(largest_gather_bytes_, held);
}

void ShardedParameters::Release(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params)
    if (Slot* s = Find(p)) Free(*s);
}

void ShardedParameters::ReleaseAll() {
  if (pending_) FinishPrefetch(false);
  for (Slot& s : slots_) Free(s);
}

int64_t ShardedParameters::total_numel() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.numel;
  return n;
}

int64_t ShardedParameters::held_bytes() const {
  std::vector<torch::Tensor> params;
  for (const Slot& s : slots_) params.push_back(s.param);
  return TensorBytes(params);
}

}  // namespace fullburn
