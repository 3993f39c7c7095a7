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

namespace fullburn {

class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor input) = 0;
  // Switches activation checkpointing on a built model (model.checkpoint's
  // values: the memory model probes each); false where the model has no
  // blocks to checkpoint: a program's own model unless it overrides this.
  virtual bool SetCheckpointing(const std::string& /*mode*/) { return false; }
  // The training loss: the mean cross-entropy of forward(input) over
  // logits.reshape(-1, C) in fp32 against targets.reshape(-1). A model whose
  // output layer computes it without keeping the logits overrides it (GPT
  // with ModelSpec::fused_loss); the trainer calls it for every training step.
  virtual torch::Tensor ForwardLoss(torch::Tensor input, const torch::Tensor& targets);
};

// Activation checkpointing (model.checkpoint): fn(x) runs without keeping
// its intermediate activations, only x; backward runs it again, with the CPU
// and CUDA random generators (dropout) and autocast as the forward had them,
// and back-propagates through the recomputed graph, so gradients are those of
// fn(x) itself (bit-equal on CPU). `params`: what fn reads that needs
// gradients; `buffers`: state fn updates (BatchNorm's running statistics),
// put back after the recompute. Without grad mode it is fn(x). fn is kept
// until backward: capture by value.
torch::Tensor CheckpointForward(std::function<torch::Tensor(const torch::Tensor&)> fn,
                                const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                                const std::vector<torch::Tensor>& buffers = {});
// A sub-module of a program's own Model, checkpointed:
//   x = fullburn::Checkpointed(block_, x);  // in forward(), for a ModuleHolder block_
template <typename Holder>
torch::Tensor Checkpointed(Holder module, const torch::Tensor& x) {
  return CheckpointForward([module](const torch::Tensor& t) mutable { return module->forward(t); },
                           x, module->parameters(), module->buffers());
}

struct ModelSpec {
  std::string name = "resnet18";  // resnet18 | resnet50 | mlp | lstm | gpt
  int64_t num_classes = 10;       // classes, or the vocabulary for gpt
  double width = 1.0;             // ResNet width multiplier
  int64_t in_features = 0;        // mlp: flattened input size
  int64_t vocab = 256;            // lstm/gpt token vocabulary
  // gpt: embedding/output rows rounded up to a multiple of this (64 turns
  // 50257 into 50304, a shape the matrix units run much faster); the padded
  // rows start at zero and are cut from the logits, so the loss and the
  // outputs equal the unpadded model's. 1: none.
  int64_t pad_vocab = 1;
  // gpt: the output layer and the loss in one function over chunks of
  // positions (loss_rows each; 0: about 256 MiB of fp32 logits on a GPU,
  // 32 MiB on a CPU), keeping no
  // logits for backward, which recomputes them chunk by chunk.
  bool fused_loss = false;
  int64_t loss_rows = 0;
  int64_t seq_len = 128;          // gpt context (positional table size)
  int64_t hidden = 512, layers = 2, heads = 4;
  double dropout = 0;
  // Activation checkpointing: "none"; "blocks" (each GPT block, each ResNet
  // stage recomputed in backward); "every_K" (segments of K blocks or stages,
  // each keeping only its input: less memory, a larger recompute at a time).
  std::string checkpoint = "none";
};

Result<std::shared_ptr<Model>> MakeModel(const ModelSpec& spec);

int64_t ParameterCount(const torch::nn::Module& m);

}  // namespace fullburn
