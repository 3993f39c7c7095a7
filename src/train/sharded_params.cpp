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
  for (const auto& block : blocks) {
    split.inside.insert(split.inside.end(), block.begin(), block.end());
    split.largest_block_bytes = std::max(split.largest_block_bytes, TensorBytes(block));
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

void ShardedParameters::SetBlockParameters(const std::vector<torch::Tensor>& in_blocks) {
  for (Slot& s : slots_) s.in_block = false;
  for (const torch::Tensor& b : in_blocks)
    if (Slot* s = Find(b)) s->in_block = true;
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

void ShardedParameters::Gather(const std::vector<torch::Tensor>& params) {
  std::vector<Slot*> wanted;
  std::vector<bool> is_wanted(slots_.size(), false);
  for (const torch::Tensor& p : params)
    if (Slot* s = Find(p)) {
      wanted.push_back(s);
      is_wanted[static_cast<size_t>(s - slots_.data())] = true;
    }
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].in_block && !is_wanted[i]) Free(slots_[i]);
  std::vector<torch::Tensor> tensors;
  std::vector<int> owners;
  for (Slot* s : wanted) {
    if (s->param.numel() != s->numel)
      s->param.set_data(torch::empty(s->shape, s->param.options()));
    tensors.push_back(s->param);
    owners.push_back(s->owner);
  }
  largest_gather_bytes_ = std::max(largest_gather_bytes_, TensorBytes(tensors));
  Status st = dp_->BroadcastFromOwners(tensors, owners);
  if (!st.ok()) throw std::runtime_error(st.message());
}

void ShardedParameters::Release(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params)
    if (Slot* s = Find(p)) Free(*s);
}

void ShardedParameters::ReleaseAll() {
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
