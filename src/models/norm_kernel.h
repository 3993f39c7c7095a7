// Internal to models: fullburn's own CUDA kernels for a GPT block's layer
// norms with the residual add before them (model.norm_kernel = cuda), built
// only where nvcc and a CUDA libtorch are present (FULLBURN_CUDA_KERNELS).
// Plain pointers and a stream, no torch types: norm_kernel.cu is compiled by
// nvcc alone.
//
// Contract
// - Rows of `width` contiguous elements, `rows` of them; device memory.
//   `x`, `sum`, `grad_sum` and `grad_x` are fp32 (the residual stream);
//   `residual` and `grad_residual` are in `residual_dtype`; `out` and
//   `grad_out` in `out_dtype`; `gamma`, `beta`, `mean`, `rstd` and the
//   partial sums fp32. `width` <= NormKernelMaxWidth().
// - Forward: s = x + residual (residual may be null: s = x), then out =
//   (s - mean(s)) * rstd * gamma + beta with rstd = 1 / sqrt(var(s) + eps),
//   the biased variance as torch's layer_norm. Writes `sum` (s; null when
//   not wanted), `out`, and each row's `mean` and `rstd` for backward.
// - Backward: from `s` (the forward's sum, or x), `mean`, `rstd`, `gamma`,
//   `grad_out` and `grad_sum` (the sum's gradient from its other uses;
//   null: none), writes grad_x = grad_sum + d(layer norm)/ds · grad_out, the
//   same in `grad_residual`'s dtype (null when not wanted), and per-block
//   partial sums of gamma's and beta's gradients, `blocks` rows of `width`:
//   their column sums are the gradients (summed by the caller, so the
//   result does not depend on scheduling).
// - Both run on `stream` (a cudaStream_t) and return nullptr, or the CUDA
//   error's text when the launch failed.
#pragma once

#include <cstdint>

#include "loss_kernel.h"  // LossDtype: float32, bfloat16, float16

namespace fullburn {

int64_t NormKernelMaxWidth();

const char* AddLayerNormForwardCuda(const float* x, LossDtype residual_dtype, const void* residual,
                                    const float* gamma, const float* beta, int64_t rows,
                                    int64_t width, float eps, LossDtype out_dtype, float* sum,
                                    void* out, float* mean, float* rstd, void* stream);

const char* AddLayerNormBackwardCuda(LossDtype out_dtype, const void* grad_out,
                                     const float* grad_sum, const float* s, const float* mean,
                                     const float* rstd, const float* gamma, int64_t rows,
                                     int64_t width, float* grad_x, LossDtype residual_dtype,
                                     void* grad_residual, int blocks, float* grad_gamma_partial,
                                     float* grad_beta_partial, void* stream);

}  // namespace fullburn
