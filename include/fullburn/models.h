// Models: the architectures `fullburn train` builds by name (training half,
// links libtorch).
//
// Contract
// - Shapes and parameter names follow the well-known definitions (torchvision's
//   ResNet, nanoGPT's GPT-2) so state dicts and results compare with PyTorch.
// - Every model maps a batch of inputs to logits whose last dimension is the
//   class (or vocabulary) count; the trainer's loss is cross-entropy over
//   logits.reshape(-1, C) and targets.reshape(-1).
// - Users plug in their own network by deriving from Model (forward) and
//   handing it to the trainer through train.h.
// - Construction is deterministic given torch::manual_seed. Not thread-safe:
//   one training thread owns a model.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fullburn/status.h"
#include "fullburn/train_options.h"

namespace fullburn {

// dist.shard = full (ZeRO stage 3): where a model's parameters live between
// uses. A model given one gathers each block's parameters just before the
// block runs (and before backward recomputes it) and releases them after the
// block's forward; the parameters outside blocks (embeddings, the stem, the
// head) are gathered at the start of forward and held until the trainer
// releases everything after the step. Gather is a collective: every rank
// calls it with the same parameters in the same order, and it throws when a
// rank is lost (the step fails with that message).
class ParameterGather {
 public:
  virtual ~ParameterGather() = default;
  virtual void Gather(const std::vector<torch::Tensor>& params) = 0;
  virtual void Release(const std::vector<torch::Tensor>& params) = 0;
  // True where Gather only waits for parameters that stay whole (an
  // offloaded optimizer's update, dist.offload): the blocks are then not
  // recomputed for it, and Release does nothing.
  virtual bool keeps_parameters() const { return false; }
};

class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor input) = 0;
  // Switches activation checkpointing on a built model (model.checkpoint's
  // values: the memory model probes each); false where the model has no
  // blocks to checkpoint: a program's own model unless it overrides this.
  virtual bool SetCheckpointing(const std::string& /*mode*/) { return false; }
  // dist.shard = full: blocks gathered one at a time through `gather` (and,
  // since backward needs them again, recomputed there as with
  // model.checkpoint = blocks); `blocks` receives each block's parameters,
  // gathered and released together (the rest are held for the whole step).
  // A null `gather` only tells the blocks (the memory model's question).
  // False where the model has no blocks to gather.
  virtual bool SetParameterGather(std::shared_ptr<ParameterGather> /*gather*/,
                                  std::vector<std::vector<torch::Tensor>>* /*blocks*/) {
    return false;
  }
  // The training loss: the mean cross-entropy of forward(input) over
  // logits.reshape(-1, C) in fp32 against targets.reshape(-1). A model whose
  // output layer computes it without keeping the logits overrides it (GPT
  // with ModelSpec::fused_loss); the trainer calls it for every training step.
  virtual torch::Tensor ForwardLoss(torch::Tensor input, const torch::Tensor& targets);
  // Where ForwardLoss works through the output rows (positions) a chunk at a
  // time, the rows of a chunk: the loss's transient memory stops growing
  // with the batch there (the memory model's knee). 0: it does not (no
  // such loss, or it is switched off).
  virtual int64_t LossChunkRows() const { return 0; }
  // Turns that chunked loss on or off (the memory probe asks what
  // model.fused_loss would hold); false where the model has none. While it
  // is on, GPT's loss runs chunk by chunk through ATen, not through
  // model.loss_kernel = cuda's kernels.
  virtual bool SetFusedLoss(bool /*on*/) { return false; }
};

// Activation checkpointing (model.checkpoint): fn(x) runs without keeping
// its intermediate activations, only x; backward runs it again, with the CPU
// and CUDA random generators (dropout) and autocast as the forward had them,
// and back-propagates through the recomputed graph, so gradients are those of
// fn(x) itself (bit-equal on CPU). `params`: what fn reads that needs
// gradients; `buffers`: state fn updates (BatchNorm's running statistics),
// put back after the recompute. Without grad mode it is fn(x). fn is kept
// until backward: capture by value. With `gather` (dist.shard = full),
// `params` are gathered before fn runs, in forward and in the recompute,
// and released after forward (backward's are released by the next Gather or
// after the step: autograd still accumulates into them when it returns).
torch::Tensor CheckpointForward(std::function<torch::Tensor(const torch::Tensor&)> fn,
                                const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                                const std::vector<torch::Tensor>& buffers = {},
                                const std::shared_ptr<ParameterGather>& gather = nullptr);
// A sub-module of a program's own Model, checkpointed:
//   x = fullburn::Checkpointed(block_, x);  // in forward(), for a ModuleHolder block_
template <typename Holder>
torch::Tensor Checkpointed(Holder module, const torch::Tensor& x) {
  return CheckpointForward([module](const torch::Tensor& t) mutable { return module->forward(t); },
                           x, module->parameters(), module->buffers());
}

// Whether this build has fullburn's own CUDA kernels (ModelSpec::loss_kernel
// and norm_kernel = "cuda"): configured with -DFULLBURN_CUDA_KERNELS=ON where
// nvcc and a CUDA libtorch are.
bool CudaKernelsBuilt();

// Which of scaled_dot_product_attention's kernels gpt's causal attention
// takes for these shapes on `device` in `dtype` when training (the backward
// needed): "flash", "efficient" (memory-efficient), "cudnn", "math" (the
// unfused fallback, which holds the positions x positions scores) or
// another backend's number; "" where this libtorch cannot say (before 2.0).
std::string AttentionKernel(int64_t heads, int64_t head_dim, int64_t positions,
                            torch::ScalarType dtype, const torch::Device& device, double dropout);

// model.checkpoint: blocks per recomputed segment (blocks: 1, every_K: K), 0
// for none, -1 when the value is not one of them. dist.shard = full gathers
// a segment's blocks together (at least one).
int CheckpointSegment(const std::string& checkpoint);

// The parameters of `m` that are not in `inside` (dist.shard = full: those
// held for the whole step rather than gathered block by block).
std::vector<torch::Tensor> ParametersOutside(const torch::nn::Module& m,
                                             const std::vector<torch::Tensor>& inside);


Result<std::shared_ptr<Model>> MakeModel(const ModelSpec& spec);

int64_t ParameterCount(const torch::nn::Module& m);

}  // namespace fullburn
