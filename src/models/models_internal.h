// Constructors behind MakeModel, one file per family.
#pragma once

#include "fullburn/models.h"
#include "loss_kernel.h"  // LossDtype: plain C++, shared with the .cu files

namespace fullburn {

std::shared_ptr<Model> MakeResNet(const ModelSpec& spec);
std::shared_ptr<Model> MakeMlp(const ModelSpec& spec);
std::shared_ptr<Model> MakeLstm(const ModelSpec& spec);
std::shared_ptr<Model> MakeGpt(const ModelSpec& spec);
enum class LinearBackend { kBlas, kOneDnn };
// float32 linear layers on CPU go through a 1x1 convolution (oneDNN) when
// libtorch was built with the generic reference BLAS and oneDNN (Debian's
// 1.13: ~10x faster), else through libtorch's linear. FULLBURN_LINEAR=blas|onednn
// forces one.
LinearBackend CpuLinearBackend();
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);
// x w^T + b as a 1x1 convolution over x viewed as [N, in, 1, 1].
torch::Tensor LinearAsConvolution(const torch::Tensor& x, const torch::Tensor& w,
                                  const torch::Tensor& b);

// nn::Linear's parameters, names and init, computed through Linear().
struct FastLinearImpl : torch::nn::Module {
  FastLinearImpl(int64_t in, int64_t out, bool bias = true);
  torch::Tensor forward(torch::Tensor x);
  torch::Tensor weight, bias;
};
TORCH_MODULE(FastLinear);

// mean over rows of cross_entropy(x w[:vocab]^T, targets), x [N, C] and w
// [>= vocab, C], computed `rows` rows at a time with no [N, vocab] tensor
// kept for backward (model.fused_loss). Autocast as the plain path: the
// product in autocast's dtype, the loss in fp32.
torch::Tensor HeadCrossEntropy(const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& targets, int64_t vocab, int64_t rows);
// Rows per chunk: about 256 MiB of fp32 logits on a GPU, 32 MiB on a CPU.
int64_t HeadLossRows(int64_t vocab, const torch::Device& device);

// model.loss_kernel = cuda (loss_kernel.cpp): the mean cross-entropy over
// the rows of `logits` [rows, >= vocab] on
// a CUDA device (the columns past `vocab` are a padded vocabulary's, not
// classes), with ATen's ignore_index: targets < 0 count nothing. fp32
// arithmetic on float32, bfloat16 or float16 logits, whose gradient comes
// back in their dtype. Throws where it cannot run.
torch::Tensor CudaCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t vocab);

#ifdef FULLBURN_CUDA_KERNELS
// The kernels' element type for `t` (float32, bfloat16, float16), or an
// invalid_argument naming model.`setting` and `what` had the dtype.
LossDtype CudaKernelDtype(torch::ScalarType t, const char* setting, const char* what);
#endif

// model.norm_kernel = cuda (norm_kernel.cpp): `ln`'s layer norm of x, and
// of x + residual (returned first, as the residual stream goes on), each in
// one kernel forward and one backward, the normed output written directly in
// `out_dtype` (autocast's dtype: the next matmul's input). x fp32 and
// contiguous-able on a CUDA device, width at most 8192. Throws where it
// cannot run.
torch::Tensor CudaLayerNorm(const torch::Tensor& x, const torch::nn::LayerNorm& ln,
                            torch::ScalarType out_dtype);
std::pair<torch::Tensor, torch::Tensor> CudaAddLayerNorm(const torch::Tensor& x,
                                                         const torch::Tensor& residual,
                                                         const torch::nn::LayerNorm& ln,
                                                         torch::ScalarType out_dtype);

// softmax(q k^T / sqrt(d) + causal mask) v, through the fused kernel where
// this libtorch has one.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout);

}  // namespace fullburn
