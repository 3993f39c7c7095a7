// The options of the training parts: the model's architecture (ModelSpec),
// the optimizer, loss scaling and data parallel, as plain structs with no
// libtorch in them (training half's options; the monitoring half reads them
// too).
//
// Contract
// - Plain values: copy them freely; a part keeps its own copy.
// - `fullburn train` fills them once, from its option table, as the bases of
//   TrainSettings' sections (settings.model is a ModelSpec, settings.optim
//   an OptimizerOptions, settings.amp a LossScalerOptions, settings.dist a
//   DistOptions), so a part takes its section as it is. A program using the
//   parts alone fills them itself; the defaults here are the parts' own, and
//   the option table's (config.h) are fullburn train's.
// - Fields with no option of their own say where they come from.
#pragma once

#include <cstdint>
#include <string>

namespace fullburn {

struct ModelSpec {
  std::string name = "resnet18";  // resnet18 | resnet50 | mlp | lstm | gpt
  // From the training data (the source's classes; its features for mlp).
  int64_t num_classes = 10;  // classes, or the vocabulary for gpt
  double width = 1.0;        // ResNet width multiplier
  int64_t in_features = 0;   // mlp: flattened input size
  int64_t vocab = 256;       // lstm/gpt token vocabulary (data.vocab)
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
  // gpt: "cuda" computes the cross-entropy with fullburn's own kernels
  // (builds with FULLBURN_CUDA_KERNELS, on CUDA tensors): the logits read in
  // their own dtype, no fp32 copy of them, the gradient written once. "aten":
  // libtorch's log-softmax over an fp32 copy. Where "cuda" cannot run the
  // model uses aten (the trainer says so at start).
  std::string loss_kernel = "aten";
  // gpt: "cuda" computes each block's layer norms, the second with the
  // residual add before it, with fullburn's own kernels (builds with
  // FULLBURN_CUDA_KERNELS, on CUDA tensors): the fp32 residual stream read
  // and written once each way, the normed output written in autocast's
  // dtype. "aten": libtorch's add, layer norm and cast. Where "cuda" cannot
  // run the model uses aten (the trainer says so at start).
  std::string norm_kernel = "aten";
  int64_t seq_len = 128;  // gpt context (positional table size; data.seq_len)
  int64_t hidden = 512, layers = 2, heads = 4;
  double dropout = 0;
  // Activation checkpointing: "none"; "blocks" (each GPT block, each ResNet
  // stage recomputed in backward); "every_K" (segments of K blocks or stages,
  // each keeping only its input: less memory, a larger recompute at a time).
  std::string checkpoint = "none";
};

struct OptimizerOptions {
  std::string name = "sgd";
  double momentum = 0.9, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, trust = 0.001;
  bool nesterov = false;
  // AdamW and SGD: one multi-tensor kernel per operation over every
  // parameter (torch's _foreach_*) instead of a loop over parameters, for
  // fewer kernel launches on a GPU. The same update up to rounding (an
  // operation's order within the formula differs). LARS always loops.
  // fullburn train: optim.foreach's verdict for the run's device (ForeachFor).
  bool foreach = false;
  // The multi-tensor update runs over groups of parameters of about this
  // many bytes (a group closes at the parameter that reaches it): AdamW's
  // denominator is one temporary the size of a group, so a 1.5B-parameter
  // model holds 256 MiB for it, not 6 GB (the whole-list temporary was the
  // step's peak, docs/memory.md).
  int64_t foreach_group_bytes = int64_t{256} << 20;
  // AdamW and SGD on a CUDA device: each group's update in one kernel
  // (torch's _fused_adamw_, libtorch 2.1 or later; _fused_sgd_, 2.3), reading
  // each parameter, gradient and state once and writing them once, with no
  // temporaries, where the multi-tensor path makes about nine passes
  // (AdamW) or three (SGD). The same formulas up to rounding. Set only
  // where it runs (FusedUpdateUnused); the groups are the multi-tensor
  // path's, and SGD's first step, which makes the momentum, loops.
  bool fused = false;
};

struct LossScalerOptions {
  bool enabled = false;  // train.precision = fp16
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct DistOptions {
  std::string backend = "auto";  // auto (nccl for CUDA when built in, else gloo) | gloo | nccl
  double timeout_s = 120;        // rendezvous and every collective
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  bool overlap = true;            // false: every bucket starts after backward (for comparison)
  std::string compress = "none";  // none | fp16 | bf16: gradients sent in 16 bits
  std::string config_hash;  // ranks must agree; empty: not checked (fullburn train: JobIdentity)
};

}  // namespace fullburn
