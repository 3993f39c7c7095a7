// RunModel (run_model.h): the model, the optimizer, the loss scaler and the
// learning-rate schedule of one run.
#include "run_model.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace fullburn {
namespace {

// Why fullburn's own CUDA kernels cannot run on `device`; nullptr when they can.
const char* CudaKernelsUnavailable(const torch::Device& device) {
  if (!CudaKernelsBuilt())
    return "this build has no CUDA kernels (configure with -DFULLBURN_CUDA_KERNELS=ON where nvcc "
           "and a CUDA libtorch are)";
  if (!device.is_cuda()) return "the kernels run on CUDA devices only";
  return nullptr;
}

// Why a gpt asked for model.loss_kernel = cuda computes its loss with ATen
// instead; nullptr when the kernels run (or were not asked for).
const char* CudaLossKernelUnused(const ModelSpec& ms, const torch::Device& device) {
  if (ms.loss_kernel != "cuda" || ms.name != "gpt") return nullptr;
  if (const char* why = CudaKernelsUnavailable(device)) return why;
  if (ms.fused_loss) return "model.fused_loss = true computes the loss chunk by chunk";
  return nullptr;
}

// Why a gpt asked for model.norm_kernel = cuda runs ATen's layer norms
// instead; nullptr when the kernels run (or were not asked for).
const char* CudaNormKernelUnused(const ModelSpec& ms, const torch::Device& device) {
  if (ms.norm_kernel != "cuda" || ms.name != "gpt") return nullptr;
  return CudaKernelsUnavailable(device);
}

// Why optim.fused = true does not run in this run; nullptr when it does (or
// was not asked for).
const char* FusedUpdateUnusedHere(const TrainSettings& settings, const OptimizerOptions& oo,
                                  const torch::Device& device) {
  if (!oo.fused) return nullptr;
  if (const char* why = FusedUpdateUnused(oo, device)) return why;
  if (settings.dist.offload == "optimizer") return "dist.offload = optimizer updates on the host";
  if (settings.train.cuda_graphs)
    return "train.cuda_graphs = true updates inside the graph, with its own AdamW";
  return nullptr;
}

}  // namespace

OptimizerOptions RunModel::UpdateOptions(const TrainSettings& settings, const torch::Device& device,
                                         bool say) {
  OptimizerOptions oo = settings.optim;
  oo.foreach = ForeachFor(settings.optim.foreach_setting, device.is_cuda());
  if (const char* why = FusedUpdateUnusedHere(settings, oo, device)) {
    oo.fused = false;
    if (say)
      std::fprintf(stderr, "fullburn: optim.fused = true: %s: the %s update runs instead\n", why,
                   oo.foreach ? "multi-tensor (optim.foreach)" : "per-parameter");
  }
  return oo;
}

Status RunModel::Build(const TrainSettings& settings, const BatchSource& source,
                       std::shared_ptr<Model> program_model, bool say) {
  if (program_model) {
    ctx_.model = std::move(program_model);
    return Status::Ok();
  }
  ModelSpec ms = settings.model;
  ms.num_classes = source.num_classes();
  ms.in_features = source.in_features();
  // Never a silent fallback: where the kernels cannot run, say what does.
  if (const char* why = CudaLossKernelUnused(ms, ctx_.device); why && say)
    std::fprintf(stderr,
                 "fullburn: model.loss_kernel = cuda: %s: the ATen cross-entropy runs instead\n",
                 why);
  if (const char* why = CudaNormKernelUnused(ms, ctx_.device); why && say)
    std::fprintf(stderr, "fullburn: model.norm_kernel = cuda: %s: ATen's layer norms run instead\n",
                 why);
  auto m = MakeModel(ms);
  if (!m.ok()) return m.status();
  ctx_.model = *m;
  if (ms.name == "gpt" && ctx_.device.is_cuda() && say) SayAttentionKernel(ms);
  return Status::Ok();
}

// The math fallback (fp32 on a GPU without a fused fp32 kernel, an unusual
// head size) with what would take a fused one.
void RunModel::SayAttentionKernel(const ModelSpec& ms) const {
  const torch::ScalarType dtype = ctx_.autocast.value_or(torch::kFloat);
  std::string kernel;
  try {
    kernel =
        AttentionKernel(ms.heads, ms.hidden / ms.heads, ms.seq_len, dtype, ctx_.device, ms.dropout);
  } catch (const std::exception& e) {  // advice only
    std::string what = e.what();
    kernel = "unknown (" + what.substr(0, what.find('\n')) + ")";
  }
  if (kernel.empty()) return;
  std::fprintf(stderr, "fullburn: gpt attention: SDPA's %s kernel (%s, head size %lld)%s\n",
               kernel.c_str(), c10::toString(dtype), static_cast<long long>(ms.hidden / ms.heads),
               kernel == "math" ? ": the unfused fallback, which holds every head's positions x "
                                  "positions scores; train.precision = bf16 takes a fused one"
                                : "");
}

void RunModel::SetupUpdate(const TrainSettings& settings, const OptimizerOptions& update,
                           int64_t total_steps, int64_t effective_batch) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : ctx_.model->named_parameters()) params.emplace_back(p.key(), p.value());
  optimizer_ = std::make_unique<Optimizer>(params, update);
  scaler_ = std::make_unique<LossScaler>(settings.amp);
  schedule_.peak = settings.optim.lr;
  if (settings.optim.scale_lr)
    schedule_.peak *=
        static_cast<double>(effective_batch) / static_cast<double>(settings.optim.base_batch);
  schedule_.min_lr = settings.optim.min_lr;
  schedule_.warmup = std::min(settings.optim.warmup_steps, total_steps);
  schedule_.total = total_steps;
  schedule_.cosine = settings.optim.schedule == "cosine";
}

}  // namespace fullburn
