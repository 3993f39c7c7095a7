// Every option of `fullburn train`, once: type, default, choices, help.
#include "fullburn/config.h"

namespace fullburn {

const std::vector<OptionDef>& TrainOptions() {
  using T = OptionType;
  static const std::vector<OptionDef> kOptions = {
      // data
      {"data.source", T::kString, "images",
       "What to train on: an image folder or pack (images), token shards (tokens), or random "
       "tensors in device memory with a learnable rule (synthetic: features for mlp, images of "
       "data.image_size for resnet, sequences for lstm); tensors and dataset: a program's own "
       "samples, held in memory or made on the loader's threads, handed over through the C++ API "
       "(TrainerOptions::train_data, TrainerOptions::dataset)",
       "images|tokens|synthetic|tensors|dataset"},
      {"data.path", T::kString, "",
       "Image folder, pack or token file; empty: the synthetic default, created under the store's "
       "directory on first use"},
      {"data.val_path", T::kString, "",
       "Held-out data (eval.*): an image folder or pack (Resize+CenterCrop) or a token file; "
       "empty with an empty data.path: the synthetic default's held-out split"},
      {"data.image_size", T::kInt, "64", "Side of the square crop fed to the model (pixels)", "",
       ">0"},
      {"data.threads", T::kInt, "0",
       "Loader worker threads; 0: tuned while running within this rank's CPUs - 1", "", ">=0"},
      {"data.prefetch", T::kInt, "0", "Batches prepared ahead; 0: tuned (3..8)", "", ">=0"},
      {"data.cache_mb", T::kInt, "0", "RAM cache of encoded samples (MiB); 0: off", "", ">=0"},
      {"data.bad_samples", T::kString, "fail",
       "A corrupt image: stop with its path (fail) or count and replace it (skip)", "fail|skip"},
      {"data.seq_len", T::kInt, "128", "Tokens per sequence (tokens and lstm/gpt synthetic data)",
       "", ">0"},
      {"data.synthetic_samples", T::kInt, "16384",
       "Samples per epoch of synthetic data, all held on the training device (a resnet image "
       "takes 12 x data.image_size^2 bytes: lower this for large images)",
       "", ">0"},
      {"data.features", T::kInt, "256", "Input features of synthetic data (mlp)", "", ">0"},
      {"data.classes", T::kInt, "10",
       "Classes of synthetic data, of the default image set, and of a program's Dataset trained "
       "with a built-in model",
       "", ">1"},
      {"data.vocab", T::kInt, "256", "Vocabulary of synthetic token data", "", ">1"},
      // model
      {"model.name", T::kString, "resnet18",
       "Architecture: resnet18, resnet50 (torchvision layout), mlp, lstm (classifier), gpt "
       "(decoder-only transformer); custom: a program's own network, handed over through the C++ "
       "API (TrainerOptions::model)",
       "resnet18|resnet50|mlp|lstm|gpt|custom"},
      {"model.width", T::kFloat, "0.25",
       "ResNet width multiplier (1.0 = torchvision's; 0.25 keeps the CPU demo to minutes)", "",
       ">0"},
      {"model.channels_last", T::kBool, "false",
       "ResNet (or a custom network): channels-last memory format for its 4-D weights and image "
       "inputs"},
      {"model.hidden", T::kInt, "512", "mlp/lstm hidden size; gpt model width", "", ">0"},
      {"model.layers", T::kInt, "2", "mlp hidden layers, lstm layers, gpt blocks", "", ">0"},
      {"model.heads", T::kInt, "4", "gpt attention heads (must divide model.hidden)", "", ">0"},
      {"model.dropout", T::kFloat, "0", "Dropout probability (mlp, lstm, gpt)", "", ">=0"},
      {"model.pad_vocab", T::kInt, "64",
       "gpt: round the embedding and output rows up to a multiple of N (GPT-2's 50257 -> 50304: "
       "+38% tokens/s on an H200). The extra rows start at zero, are never targets and are cut "
       "from the logits, so the loss and the outputs are those of the unpadded model; "
       "checkpoints hold the padded table. 1: no padding",
       "", ">0"},
      {"model.fused_loss", T::kBool, "false",
       "gpt: the output layer and the cross-entropy in one function over chunks of logits (about "
       "256 MiB on a GPU, 32 MiB on a CPU), keeping none for backward (which recomputes them): at "
       "GPT-2's vocabulary the fp32 log-softmax and its gradient, 3.3 GB each at 16 x 1024 "
       "tokens, are never held. The same loss and gradients up to rounding. A memory lever, off "
       "by default: on an H200 GPT-2 124M's step took half the memory (16.0 -> 8.0 GiB) at half "
       "the speed"},
      {"model.loss_kernel", T::kString, "aten",
       "gpt's cross-entropy. aten: libtorch's log-softmax over an fp32 copy of the logits (at "
       "GPT-2's vocabulary and 16 x 1024 tokens the fp32 copy, log-softmax and gradient are 3.3 "
       "GB each). cuda: fullburn's own kernels read the bf16 logits once in forward and once in "
       "backward and write the gradient in bf16, computing in fp32 (a build configured with "
       "-DFULLBURN_CUDA_KERNELS=ON, on a CUDA device; elsewhere aten runs and the run says so). "
       "Not yet measured on a GPU: off until it is",
       "aten|cuda"},
      {"model.norm_kernel", T::kString, "aten",
       "gpt's layer norms. aten: libtorch's residual add, layer norm (fp32 under autocast) and "
       "cast of its output to bf16, three passes over the fp32 residual stream forward and about "
       "five backward. cuda: fullburn's own kernels do the second norm with the residual add "
       "before it and write the normed output in autocast's dtype, one pass each way (a build "
       "configured with -DFULLBURN_CUDA_KERNELS=ON, on a CUDA device; elsewhere aten runs and the "
       "run says so). Not yet measured on a GPU: off until it is",
       "aten|cuda"},
      {"model.checkpoint", T::kString, "none",
       "Activation checkpointing: blocks keeps only each GPT block's or ResNet stage's input "
       "and recomputes the block in backward (same dropout), trading a second forward for "
       "activation memory (a larger batch, a longer sequence); every_K does so for segments "
       "of K blocks (fewer inputs kept); none: keep every activation"},
      // train
      {"train.device", T::kString, "auto",
       "auto (cuda when libtorch sees a GPU), cpu, cuda, cuda:N"},
      {"train.epochs", T::kInt, "15", "Passes over the data (when train.steps is 0)", "", ">0"},
      {"train.steps", T::kInt, "0", "Optimizer steps to take; 0: train.epochs decides", "", ">=0"},
      {"train.batch_size", T::kInt, "64",
       "Micro-batch size, or auto: the largest that fits (double, then bisect) with the best "
       "measured throughput; with several ranks each trial steps as the rank will, alone, "
       "holding its dist.shard share",
       "auto", ">0"},
      {"train.accumulate", T::kInt, "1",
       "Micro-batches per optimizer step (effective batch = batch_size x accumulate)", "", ">0"},
      {"train.precision", T::kString, "fp32",
       "Autocast precision: fp32, bf16, or fp16 (with dynamic loss scaling; CUDA only)",
       "fp32|bf16|fp16"},
      {"train.tf32", T::kBool, "true", "Allow TF32 matmuls and convolutions on CUDA"},
      {"train.cudnn_benchmark", T::kBool, "false",
       "CUDA: let cuDNN time its algorithms for each new input shape and keep the fastest"},
      {"train.cuda_graphs", T::kBool, "false",
       "CUDA, one rank: capture the whole step (forward, backward, optimizer, loss scaler) in a "
       "CUDA graph and replay it, removing per-kernel launch overhead; phases are then not timed "
       "apart"},
      {"train.clip_grad_norm", T::kFloat, "0", "Clip the global gradient norm to this; 0: off", "",
       ">=0"},
      {"train.seed", T::kInt, "0", "Seed of weights, data order and augmentation", "", ">=0"},
      {"train.threads", T::kInt, "0",
       "Intra-op threads of the training thread; 0: this rank's share of the CPUs (all of them, "
       "or the container's CPU quota, for one process; split over a node's ranks; or the CPUs a "
       "launcher bound it to)",
       "", ">=0"},
      {"train.keep_host_memory", T::kBool, "true",
       "Keep freed host memory for reuse (glibc: no trimming, mmap only past 32 MiB) instead of "
       "returning it to the OS every step, whose page faults slow CPU steps; false: glibc's "
       "defaults"},
      {"train.time_every", T::kInt, "1",
       "Time the phases of every Nth step (clocks on CPU; CUDA events on a GPU, waited for once at "
       "the step's end)",
       "", ">0"},
      {"train.log_every_s", T::kFloat, "1", "Refresh of the live progress line (seconds)", "",
       ">0"},
      {"train.time_limit_s", T::kFloat, "0",
       "Stop (with a checkpoint) after this many seconds; 0: none. With several ranks, at the next "
       "multiple of 5 steps",
       "", ">=0"},
      {"train.memory_budget_mb", T::kInt, "0",
       "CPU only: a memory budget (MiB) that stands in for device memory; allocations past it fail "
       "as an out-of-memory would. 0: none",
       "", ">=0"},
      {"train.memory_report", T::kBool, "false",
       "Probe the memory a step adds per sample (two extra forward and backward passes at "
       "half and all of the micro-batch, with and without model.checkpoint = blocks) and "
       "record each rank's predicted and measured peak by part (a memory event; docs/memory.md). "
       "Always on with train.batch_size = auto"},
      {"train.max_batch_size", T::kInt, "4096", "Upper bound of the batch-size search", "", ">0"},
      {"train.max_skipped_steps", T::kInt, "20",
       "Consecutive steps skipped for inf/NaN before the run stops as diverged", "", ">0"},
      // optim
      {"optim.name", T::kString, "sgd", "Optimizer: sgd, adamw, or lars (large batches)",
       "sgd|adamw|lars"},
      {"optim.lr", T::kFloat, "0.1", "Peak learning rate", "", ">0"},
      {"optim.scale_lr", T::kBool, "false",
       "Linear scaling: lr x effective batch / optim.base_batch"},
      {"optim.base_batch", T::kInt, "256", "The batch optim.lr was tuned for (with optim.scale_lr)",
       "", ">0"},
      {"optim.momentum", T::kFloat, "0.9", "SGD/LARS momentum", "", ">=0"},
      {"optim.nesterov", T::kBool, "false", "SGD: Nesterov momentum"},
      {"optim.weight_decay", T::kFloat, "0.0005", "Weight decay (decoupled for adamw)", "", ">=0"},
      {"optim.beta1", T::kFloat, "0.9", "AdamW beta1", "", ">=0"},
      {"optim.beta2", T::kFloat, "0.999", "AdamW beta2", "", ">=0"},
      {"optim.eps", T::kFloat, "1e-08", "AdamW epsilon", "", ">0"},
      {"optim.trust", T::kFloat, "0.001", "LARS trust coefficient", "", ">0"},
      {"optim.foreach", T::kString, "auto",
       "AdamW and SGD, and the gradients' unscale and inf/NaN check before them: one "
       "multi-tensor kernel per operation over all parameters (torch's _foreach_*) instead of a "
       "loop over parameters: fewer kernel launches, the same update up to rounding. auto: on a "
       "CUDA device (+9.4% tokens/s for GPT-2 124M on an H200, before the check was), the loop "
       "on the CPU",
       "", "auto|true|false"},
      {"optim.fused", T::kBool, "false",
       "AdamW and SGD on CUDA: each group's update in one kernel (torch's _fused_adamw_, libtorch "
       "2.1 or later; _fused_sgd_, 2.3) that reads each parameter, gradient and state once, in "
       "place of optim.foreach's nine passes (AdamW) or three (SGD); the same formulas up to "
       "rounding. Where it cannot run (an older libtorch, the CPU, LARS, dist.offload, "
       "train.cuda_graphs) the run says so on one line and the update above runs. Not yet "
       "measured on a GPU: off until it is"},
      {"optim.warmup_steps", T::kInt, "20", "Linear warm-up from 0 to the peak LR (steps)", "",
       ">=0"},
      {"optim.schedule", T::kString, "cosine",
       "After warm-up: cosine decay to optim.min_lr, or constant", "cosine|constant"},
      {"optim.min_lr", T::kFloat, "0", "Learning rate at the end of the cosine schedule", "",
       ">=0"},
      // amp (GradScaler's defaults)
      {"amp.init_scale", T::kFloat, "65536", "fp16: initial loss scale", "", ">0"},
      {"amp.growth_factor", T::kFloat, "2", "fp16: scale x this after growth_interval finite steps",
       "", ">0"},
      {"amp.backoff_factor", T::kFloat, "0.5",
       "fp16: scale x this on inf/NaN gradients (step skipped)", "", ">0"},
      {"amp.growth_interval", T::kInt, "2000", "fp16: finite steps between growths", "", ">0"},
      // checkpoint
      {"checkpoint.dir", T::kString, "",
       "Where checkpoints go; empty: checkpoints/run-<id> beside the run store"},
      {"checkpoint.every_steps", T::kInt, "0", "Checkpoint every N optimizer steps; 0: off", "",
       ">=0"},
      {"checkpoint.every_minutes", T::kFloat, "0", "Checkpoint every T minutes; 0: off", "", ">=0"},
      {"checkpoint.at_end", T::kBool, "true", "Checkpoint when training ends"},
      {"checkpoint.keep", T::kInt, "3", "Checkpoints kept (oldest deleted)", "", ">0"},
      {"checkpoint.keep_best", T::kBool, "false",
       "Also keep the checkpoint of the lowest held-out loss (written at the evaluation that "
       "found it; needs eval.*)"},
      {"checkpoint.async", T::kBool, "true",
       "Write on a background thread; the loop is blocked only for the snapshot"},
      // profile
      {"profile.steps", T::kString, "",
       "Trace optimizer steps A-B (or N alone) with torch's profiler (e.g. 20-25): one Chrome trace per rank "
       "beside the run store (traces/run-ID), analysed as fullburn analyze does in the summary, "
       "fullburn diagnose and fullburn report; empty: off"},
      // eval: the held-out loss and accuracy, recorded as the run's evaluation events
      {"eval.every_steps", T::kInt, "0", "Evaluate every N optimizer steps; 0: off", "", ">=0"},
      {"eval.every_epochs", T::kInt, "0",
       "Evaluate every N epochs (every N x steps-per-epoch optimizer steps); 0: off", "", ">=0"},
      {"eval.at_end", T::kBool, "true", "Evaluate when training ends"},
      {"eval.max_samples", T::kInt, "0",
       "Held-out samples per evaluation, the first of the set (over all ranks, each its "
       "share); 0: all of them",
       "", ">=0"},
      {"dist.backend", T::kString, "auto",
       "Data parallelism (ranks from torchrun, Slurm, MPI or fullburn launch): auto = nccl for "
       "CUDA when built in and every rank has a GPU of its own, else gloo",
       "auto|gloo|nccl"},
      {"dist.timeout_s", T::kFloat, "120",
       "Rendezvous and collective timeout; a lost rank stops the others within it", "", ">0"},
      {"dist.bucket_mb", T::kFloat, "25",
       "Gradient bucket size (MB); each bucket is all-reduced during backward", "", ">0"},
      {"dist.first_bucket_mb", T::kFloat, "1",
       "The first (last layers') bucket, small so communication starts early", "", ">0"},
      {"dist.overlap", T::kBool, "true",
       "All-reduce buckets during backward (false: after it, for comparison)"},
      {"dist.compress", T::kString, "none", "Gradients sent in 16 bits: none, fp16 or bf16",
       "none|fp16|bf16"},
      {"dist.shard", T::kString, "none",
       "ZeRO stages (docs/memory.md). optimizer (stage 1): each rank keeps the optimizer state "
       "of the parameters it owns, about 1/N, updates them and broadcasts them; gradients "
       "(stage 2): also each gradient is reduced to its owner only, the others free theirs; full "
       "(stage 3): also each parameter lives only on its owner, gathered block by block for "
       "forward and again for backward (which recomputes the block, as model.checkpoint = "
       "blocks). Each rank writes its part of a checkpoint beside the step's file; any world "
       "size resumes it. none: every rank keeps everything",
       "none|optimizer|gradients|full"},
      {"dist.prefetch", T::kBool, "false",
       "dist.shard = full: start the next block's gather (the next segment's with "
       "model.checkpoint = every_K) while one computes (forward up the blocks, backward's "
       "recomputes down), as FSDP's prefetch does; a rank then holds two at a time. Off until "
       "measured where it pays (ranks on GPUs of their own, NCCL): "
       "on 2 busy CPU ranks it gained nothing (docs/benchmarks.md)"},
      {"dist.offload", T::kString, "none",
       "optimizer: the optimizer state (of the parameters this rank updates) and its update in "
       "host memory, for a GPU whose memory is the limit: each step copies the gradients to the "
       "host, updates an fp32 copy of the weights there and copies it back (docs/memory.md). On a "
       "CPU run it saves nothing. none: the state lives with the parameters",
       "none|optimizer"},
  };
  return kOptions;
}

}  // namespace fullburn
