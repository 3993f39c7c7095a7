// dist.shard = full: parameters filled from their owners when used.
#include "sharded_params.h"

#include <algorithm>
#include <stdexcept>

namespace fullburn {

int64_t TensorBytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors)
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

BlockSplit SplitByBlocks(const torch::nn::Module& model,
                         const std::vector<std::vector<torch::Tensor>>& blocks, int segment) {
  BlockSplit split;
  segment = std::max(1, segment);
  int64_t previous = 0;
  for (size_t first = 0; first < blocks.size(); first += static_cast<size_t>(segment)) {
    int64_t bytes = 0;
    for (size_t b = first; b < std::min(blocks.size(), first + static_cast<size_t>(segment)); ++b) {
      split.inside.insert(split.inside.end(), blocks[b].begin(), blocks[b].end());
      bytes += TensorBytes(blocks[b]);
    }
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

// The unit `params` is: consecutive whole blocks, in SetBlocks' order,
// from the block of its first parameter; else no unit.
ShardedParameters::Unit ShardedParameters::UnitOf(const std::vector<torch::Tensor>& params) {
  if (params.empty()) return {};
  Slot* first = Find(params[0]);
  if (!first || first->block < 0) return {};
  size_t at = 0;
  int block = first->block;
  while (at < params.size()) {
    if (block >= static_cast<int>(blocks_.size())) return {};
    for (size_t i : blocks_[static_cast<size_t>(block)]) {
      if (at >= params.size() || Find(params[at]) != &slots_[i]) return {};
      ++at;
    }
    ++block;
  }
  return {first->block, block - first->block};
}

// The unit likely gathered after `unit`: forward climbs, backward's
// recomputes descend; after the same unit twice, the top one turns round
// (end of forward, backward begins) and the first goes on up (the next
// micro-batch's forward). Units seen before give the next one's size; else
// it is this one's (every_K's units are K blocks from the first).
ShardedParameters::Unit ShardedParameters::NextUnit(Unit unit) const {
  const int n = static_cast<int>(blocks_.size());
  const int end = unit.first + unit.count;
  const bool down = last_unit_.first == end || (last_unit_ == unit && end == n);
  if (!down) {
    if (end >= n) return {};
    auto seen = seen_units_.find(end);
    return {end, seen != seen_units_.end() ? seen->second : std::min(unit.count, n - end)};
  }
  if (unit.first == 0) return {};
  for (const auto& [first, count] : seen_units_)
    if (first + count == unit.first) return {first, count};
  const int first = std::max(0, unit.first - unit.count);
  return {first, unit.first - first};
}

std::vector<ShardedParameters::Slot*> ShardedParameters::UnitSlots(Unit unit) {
  std::vector<Slot*> out;
  for (int b = unit.first; b < unit.first + unit.count; ++b)
    for (size_t i : blocks_[static_cast<size_t>(b)]) out.push_back(&slots_[i]);
  return out;
}

// Waits for the prefetch in flight; keeps what it filled or frees it.
void ShardedParameters::FinishPrefetch(bool keep) {
  Status st = dp_->FinishBroadcast(pending_.get());
  pending_.reset();
  const Unit unit = pending_unit_;
  pending_unit_ = {};
  if (!st.ok()) throw std::runtime_error(st.message());
  if (!keep)
    for (Slot* s : UnitSlots(unit)) Free(*s);
}

Status ShardedParameters::PlaceOnDevice(const torch::Device& device, int64_t chunk_bytes,
                                        bool channels_last) {
  torch::NoGradGuard no_grad;
  for (size_t first = 0; first < slots_.size();) {
    std::vector<torch::Tensor> moved;
    int64_t bytes = 0;
    size_t end = first;
    for (; end < slots_.size(); ++end) {
      const int64_t size =
          slots_[end].numel * static_cast<int64_t>(slots_[end].param.element_size());
      if (end > first && bytes + size > chunk_bytes) break;
      bytes += size;
      moved.push_back(slots_[end].param.detach().to(device));  // (a CPU device: the same storage)
    }
    // Every rank starts from rank 0's weights, as the unsharded run does.
    if (Status s = dp_->Broadcast(moved); !s.ok()) return s;
    for (size_t i = first; i < end; ++i) {
      Slot& s = slots_[i];
      torch::Tensor t = moved[i - first];
      if (s.owner != dp_->rank()) {
        s.param.set_data(torch::empty({1}, t.options()).expand(s.shape));
        s.placeholder = true;
        continue;
      }
      // The layout after the broadcast: it sends dense tensors alike on every rank.
      if (channels_last && t.dim() == 4) t = t.contiguous(torch::MemoryFormat::ChannelsLast);
      s.param.set_data(t);
    }
    first = end;
  }
  return Status::Ok();
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
  s.placeholder = false;
}

// Each slot at its full shape (a released one gets fresh memory), and the
// tensors and their owners for a broadcast.
void ShardedParameters::Allocate(const std::vector<Slot*>& slots,
                                 std::vector<torch::Tensor>* tensors, std::vector<int>* owners) {
  for (Slot* s : slots) {
    if (s->param.numel() != s->numel || s->placeholder) {
      s->param.set_data(torch::empty(s->shape, s->param.options()));
      s->placeholder = false;
    }
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
  const Unit unit = UnitOf(params);
  for (size_t i = 0; i < slots_.size(); ++i)  // not the unit a prefetch is filling
    if (slots_[i].block >= 0 && !pending_unit_.Contains(slots_[i].block) && !is_wanted[i])
      Free(slots_[i]);
  bool filled = false;
  if (pending_ && unit.valid()) {  // every gather of a unit settles the prefetch
    filled = pending_unit_ == unit;
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
  if (unit.valid()) {
    ++block_gathers_;
    prefetched_gathers_ += filled;
    seen_units_[unit.first] = unit.count;
    const Unit next = prefetch_ ? NextUnit(unit) : Unit{};
    last_unit_ = unit;
    if (next.valid()) {
      std::vector<torch::Tensor> next_tensors;
      std::vector<int> next_owners;
      Allocate(UnitSlots(next), &next_tensors, &next_owners);
      held += TensorBytes(next_tensors);
      pending_ = dp_->StartBroadcastFromOwners(next_tensors, next_owners);
      pending_unit_ = next;
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
  for (const Slot& s : slots_)
    if (!s.placeholder) params.push_back(s.param);
  return TensorBytes(params);
}

}  // namespace fullburn
