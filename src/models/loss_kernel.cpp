// model.loss_kernel = cuda: the cross-entropy of GPT's logits through
// fullburn's own CUDA kernels (loss_kernel.cu), as one autograd function.
// Without FULLBURN_CUDA_KERNELS only CudaKernelsBuilt() is here.
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "models_internal.h"

#ifdef FULLBURN_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "loss_kernel.h"
#endif

namespace fullburn {

bool CudaKernelsBuilt() {
#ifdef FULLBURN_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

#ifdef FULLBURN_CUDA_KERNELS
LossDtype CudaKernelDtype(torch::ScalarType t, const char* setting, const char* what) {
  switch (t) {
    case torch::kFloat:
      return LossDtype::kFloat;
    case torch::kBFloat16:
      return LossDtype::kBFloat16;
    case torch::kHalf:
      return LossDtype::kHalf;
    default:
      throw std::invalid_argument(
          std::string("model.") + setting + " = cuda: " + what + " of dtype " + c10::toString(t) +
          " (float32, bfloat16 or float16 only): set model." + setting + " = aten");
  }
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

LossDtype KernelDtype(const torch::Tensor& t) {
  return CudaKernelDtype(t.scalar_type(), "loss_kernel", "logits");
}

void Check(const char* error) {
  if (error) throw std::runtime_error(std::string("model.loss_kernel = cuda: ") + error);
}

class CudaCrossEntropyFunction : public torch::autograd::Function<CudaCrossEntropyFunction> {
 public:
  // `logits` [rows, >= vocab] with unit stride along a row (a padded
  // vocabulary's columns included); `targets` [rows] int64.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor targets,
                               int64_t vocab) {
    c10::cuda::CUDAGuard guard(logits.device());
    const int64_t rows = logits.size(0);
    torch::Tensor lse = torch::empty({rows}, logits.options().dtype(torch::kFloat));
    torch::Tensor losses = torch::empty({rows}, lse.options());
    Check(CrossEntropyForwardCuda(KernelDtype(logits), logits.data_ptr(), rows, vocab,
                                  logits.stride(0), targets.data_ptr<int64_t>(),
                                  lse.data_ptr<float>(), losses.data_ptr<float>(),
                                  c10::cuda::getCurrentCUDAStream().stream()));
    // ATen's mean over the rows not ignored, counted on the device.
    torch::Tensor counted = targets.ge(0).sum().to(torch::kFloat);
    ctx->save_for_backward({logits, targets, lse, counted});
    ctx->saved_data["vocab"] = vocab;
    return losses.sum() / counted;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& logits = saved[0];
    c10::cuda::CUDAGuard guard(logits.device());
    torch::Tensor scale = (grad_output[0].to(torch::kFloat) / saved[3]).contiguous();
    torch::Tensor grad = torch::empty(logits.sizes(), logits.options());  // contiguous
    Check(CrossEntropyBackwardCuda(
        KernelDtype(logits), logits.data_ptr(), logits.size(0), ctx->saved_data["vocab"].toInt(),
        logits.stride(0), logits.size(1), saved[1].data_ptr<int64_t>(), saved[2].data_ptr<float>(),
        scale.data_ptr<float>(), grad.data_ptr(), c10::cuda::getCurrentCUDAStream().stream()));
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor CudaCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t vocab) {
#ifdef FULLBURN_CUDA_KERNELS
  if (!logits.is_cuda() || logits.dim() != 2 || logits.size(1) < vocab)
    throw std::invalid_argument(
        "model.loss_kernel = cuda needs CUDA logits [rows, >= vocab]: set model.loss_kernel = "
        "aten");
  if (targets.device() != logits.device() || targets.dim() != 1 ||
      targets.size(0) != logits.size(0))
    throw std::invalid_argument(
        "model.loss_kernel = cuda: targets must be [rows] on the logits' device (" +
        logits.device().str() + "), got " + std::to_string(targets.dim()) + "-d on " +
        targets.device().str() + ": set model.loss_kernel = aten");
  torch::Tensor rows = logits.stride(1) == 1 ? logits : logits.contiguous();
  return CudaCrossEntropyFunction::apply(rows, targets.to(torch::kLong).contiguous(), vocab);
#else
  (void)logits;
  (void)targets;
  (void)vocab;
  throw std::logic_error("model.loss_kernel = cuda: this build has no CUDA kernels");
#endif
}

}  // namespace fullburn
