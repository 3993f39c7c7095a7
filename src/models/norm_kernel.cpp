// model.norm_kernel = cuda: a GPT block's layer norms, with the residual add
// before the second, through fullburn's own CUDA kernels (norm_kernel.cu),
// as autograd functions. Without FULLBURN_CUDA_KERNELS only the refusals are
// here.
#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "models_internal.h"

#ifdef FULLBURN_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "norm_kernel.h"
#endif

namespace fullburn {

#ifdef FULLBURN_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void Refuse(const std::string& what) {
  throw std::invalid_argument("model.norm_kernel = cuda: " + what +
                              ": set model.norm_kernel = aten");
}

LossDtype KernelDtype(torch::ScalarType t, const char* what) {
  return CudaKernelDtype(t, "norm_kernel", what);
}

void Check(const char* error) {
  if (error) throw std::runtime_error(std::string("model.norm_kernel = cuda: ") + error);
}

struct Normed {
  torch::Tensor sum, out, mean, rstd;
};

// `residual` undefined: the norm of x alone (no sum written).
Normed Forward(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& gamma,
               const torch::Tensor& beta, double eps, torch::ScalarType out_dtype) {
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t width = x.size(-1), rows = x.numel() / width;
  Normed n;
  n.out = torch::empty(x.sizes(), x.options().dtype(out_dtype));
  n.mean = torch::empty({rows}, x.options());
  n.rstd = torch::empty({rows}, x.options());
  if (residual.defined()) n.sum = torch::empty_like(x);
  const LossDtype residual_dtype =
      residual.defined() ? KernelDtype(residual.scalar_type(), "a residual") : LossDtype::kFloat;
  Check(AddLayerNormForwardCuda(
      x.data_ptr<float>(), residual_dtype, residual.defined() ? residual.data_ptr() : nullptr,
      gamma.data_ptr<float>(), beta.data_ptr<float>(), rows, width, static_cast<float>(eps),
      KernelDtype(out_dtype, "an output"), n.sum.defined() ? n.sum.data_ptr<float>() : nullptr,
      n.out.data_ptr(), n.mean.data_ptr<float>(), n.rstd.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream().stream()));
  return n;
}

// grad_x (and the residual's, in `residual_dtype`, when `residual_dtype` is
// given), gamma's and beta's gradients.
struct Grads {
  torch::Tensor x, residual, gamma, beta;
};

Grads Backward(const torch::Tensor& s, const torch::Tensor& gamma, const torch::Tensor& mean,
               const torch::Tensor& rstd, torch::Tensor grad_out, torch::ScalarType out_dtype,
               const torch::Tensor& grad_sum, std::optional<torch::ScalarType> residual_dtype) {
  c10::cuda::CUDAGuard guard(s.device());
  const int64_t width = s.size(-1), rows = s.numel() / width;
  grad_out = grad_out.defined() ? grad_out.to(out_dtype).contiguous()
                                : torch::zeros(s.sizes(), s.options().dtype(out_dtype));
  torch::Tensor sum_grad = grad_sum.defined() ? grad_sum.to(torch::kFloat).contiguous() : grad_sum;
  Grads g;
  g.x = torch::empty_like(s);
  if (residual_dtype) g.residual = torch::empty(s.sizes(), s.options().dtype(*residual_dtype));
  // Enough blocks to fill the GPU, each summing gamma's and beta's gradients
  // over its rows; their partial sums are added here, in a fixed order.
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min(rows, 8 * sms)));
  torch::Tensor gamma_partial = torch::empty({blocks, width}, s.options());
  torch::Tensor beta_partial = torch::empty({blocks, width}, s.options());
  Check(AddLayerNormBackwardCuda(
      KernelDtype(out_dtype, "an output"), grad_out.data_ptr(),
      sum_grad.defined() ? sum_grad.data_ptr<float>() : nullptr, s.data_ptr<float>(),
      mean.data_ptr<float>(), rstd.data_ptr<float>(), gamma.data_ptr<float>(), rows, width,
      g.x.data_ptr<float>(),
      residual_dtype ? KernelDtype(*residual_dtype, "a residual") : LossDtype::kFloat,
      residual_dtype ? g.residual.data_ptr() : nullptr, blocks, gamma_partial.data_ptr<float>(),
      beta_partial.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()));
  g.gamma = gamma_partial.sum(0);
  g.beta = beta_partial.sum(0);
  return g;
}

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor gamma,
                               torch::Tensor beta, double eps, int64_t out_dtype) {
    const auto out_type = static_cast<torch::ScalarType>(out_dtype);
    Normed n = Forward(x, torch::Tensor(), gamma, beta, eps, out_type);
    ctx->save_for_backward({x, gamma, n.mean, n.rstd});
    ctx->saved_data["out_dtype"] = out_dtype;
    return n.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    variable_list v = ctx->get_saved_variables();
    Grads g = Backward(v[0], v[1], v[2], v[3], grad_output[0],
                       static_cast<torch::ScalarType>(ctx->saved_data["out_dtype"].toInt()),
                       torch::Tensor(), std::nullopt);
    return {g.x, g.gamma, g.beta, torch::Tensor(), torch::Tensor()};
  }
};

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor residual,
                               torch::Tensor gamma, torch::Tensor beta, double eps,
                               int64_t out_dtype) {
    const auto out_type = static_cast<torch::ScalarType>(out_dtype);
    Normed n = Forward(x, residual, gamma, beta, eps, out_type);
    ctx->save_for_backward({n.sum, gamma, n.mean, n.rstd});
    ctx->saved_data["out_dtype"] = out_dtype;
    ctx->saved_data["residual_dtype"] = static_cast<int64_t>(residual.scalar_type());
    return {n.sum, n.out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    variable_list v = ctx->get_saved_variables();
    Grads g = Backward(v[0], v[1], v[2], v[3], grad_output[1],
                       static_cast<torch::ScalarType>(ctx->saved_data["out_dtype"].toInt()),
                       grad_output[0],
                       static_cast<torch::ScalarType>(ctx->saved_data["residual_dtype"].toInt()));
    return {g.x, g.residual, g.gamma, g.beta, torch::Tensor(), torch::Tensor()};
  }
};

// What the kernels take: fp32 x [..., width] on CUDA, contiguous; fp32
// affine parameters of that width.
void CheckInputs(const torch::Tensor& x, const torch::nn::LayerNormImpl& ln) {
  if (!x.is_cuda()) Refuse("input on " + x.device().str() + " (CUDA only)");
  if (x.scalar_type() != torch::kFloat)
    Refuse(std::string("a residual stream of dtype ") + c10::toString(x.scalar_type()) +
           " (float32 only)");
  const auto& shape = ln.options.normalized_shape();
  if (shape.size() != 1 || shape[0] != x.size(-1) || !ln.options.elementwise_affine())
    Refuse("a layer norm over the last dimension with weight and bias only");
  if (ln.weight.device() != x.device() || ln.bias.device() != x.device())
    Refuse("layer norm parameters on " + ln.weight.device().str() + ", the input on " +
           x.device().str());
  if (x.size(-1) < 1 || x.size(-1) > NormKernelMaxWidth())
    Refuse("width " + std::to_string(x.size(-1)) + " (at most " +
           std::to_string(NormKernelMaxWidth()) + ")");
  if (ln.weight.scalar_type() != torch::kFloat || ln.bias.scalar_type() != torch::kFloat)
    Refuse("layer norm parameters in float32 only");
}

}  // namespace
#endif

torch::Tensor CudaLayerNorm(const torch::Tensor& x, const torch::nn::LayerNorm& ln,
                            torch::ScalarType out_dtype) {
#ifdef FULLBURN_CUDA_KERNELS
  CheckInputs(x, *ln);
  return LayerNormFunction::apply(x.contiguous(), ln->weight.contiguous(), ln->bias.contiguous(),
                                  ln->options.eps(), static_cast<int64_t>(out_dtype));
#else
  (void)x;
  (void)ln;
  (void)out_dtype;
  throw std::logic_error("model.norm_kernel = cuda: this build has no CUDA kernels");
#endif
}

std::pair<torch::Tensor, torch::Tensor> CudaAddLayerNorm(const torch::Tensor& x,
                                                         const torch::Tensor& residual,
                                                         const torch::nn::LayerNorm& ln,
                                                         torch::ScalarType out_dtype) {
#ifdef FULLBURN_CUDA_KERNELS
  CheckInputs(x, *ln);
  if (residual.sizes() != x.sizes() || residual.device() != x.device())
    Refuse("a residual of another shape or device than the input");
  variable_list r = AddLayerNormFunction::apply(x.contiguous(), residual.contiguous(),
                                                ln->weight.contiguous(), ln->bias.contiguous(),
                                                ln->options.eps(), static_cast<int64_t>(out_dtype));
  return {r[0], r[1]};
#else
  (void)x;
  (void)residual;
  (void)ln;
  (void)out_dtype;
  throw std::logic_error("model.norm_kernel = cuda: this build has no CUDA kernels");
#endif
}

}  // namespace fullburn
