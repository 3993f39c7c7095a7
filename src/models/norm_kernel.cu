// A GPT block's layer norm with the residual add before it, in one pass each
// way (norm_kernel.h).
//
// Why: under bf16 autocast torch runs layer_norm in fp32, so a block's
// `ln_2(x + attn)` is three passes over the fp32 residual stream forward (the
// add, the norm, the cast of its fp32 output to bf16 for the next matmul)
// and about five backward (the cast's gradient, the norm's, the two
// gradients of the add summed, and the cast of the attention's gradient to
// bf16). Here forward reads x and the residual once and writes the sum
// (fp32) and the normed output (bf16) once; backward reads the sum, the
// output's gradient and the sum's own gradient once and writes the input's
// and the residual's once. One block per row, the row held in registers
// (up to kPerThread elements per thread), two-pass mean and variance.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_convert.cuh"
#include "norm_kernel.h"

namespace fullburn {
namespace {

using cuda_convert::FromFloat;
using cuda_convert::ToFloat;

constexpr int kPerThread = 8;
constexpr int kMaxThreads = 1024;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The block's sums of `a` and `b`, in every thread. The block is whole warps.
__device__ __forceinline__ void BlockSum2(float& a, float& b, float* scratch) {
  a = WarpSum(a);
  b = WarpSum(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = WarpSum(lane < warps ? scratch[lane] : 0.f);
  b = WarpSum(lane < warps ? scratch[32 + lane] : 0.f);
  __syncthreads();  // the next call writes scratch again
}

template <typename TR, typename TO>
__global__ void __launch_bounds__(kMaxThreads)
    AddLayerNormForwardKernel(const float* __restrict__ x, const TR* __restrict__ residual,
                              const float* __restrict__ gamma, const float* __restrict__ beta,
                              int width, float eps, float* __restrict__ sum, TO* __restrict__ out,
                              float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  __shared__ float scratch[64];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  float v[kPerThread];
  float total = 0.f, unused = 0.f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    v[k] = 0.f;
    if (c < width) {
      v[k] = x[base + c] + (residual ? ToFloat(residual[base + c]) : 0.f);
      total += v[k];
    }
  }
  BlockSum2(total, unused, scratch);
  const float mean = total / width;
  float squares = 0.f;
  unused = 0.f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < width) squares += (v[k] - mean) * (v[k] - mean);
  }
  BlockSum2(squares, unused, scratch);
  const float rstd = rsqrtf(squares / width + eps);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= width) continue;
    if (sum) sum[base + c] = v[k];
    out[base + c] = FromFloat<TO>((v[k] - mean) * rstd * gamma[c] + beta[c]);
  }
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

// Rows blockIdx.x, + gridDim.x, ...: each block sums gamma's and beta's
// gradients over its rows in registers and writes them once, as its row of
// the partials.
template <typename TO, typename TR>
__global__ void __launch_bounds__(kMaxThreads)
    AddLayerNormBackwardKernel(const TO* __restrict__ grad_out, const float* __restrict__ grad_sum,
                               const float* __restrict__ s, const float* __restrict__ mean,
                               const float* __restrict__ rstd, const float* __restrict__ gamma,
                               int64_t rows, int width, float* __restrict__ grad_x,
                               TR* __restrict__ grad_residual, float* __restrict__ gamma_partial,
                               float* __restrict__ beta_partial) {
  __shared__ float scratch[64];
  float dgamma[kPerThread], dbeta[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) dgamma[k] = dbeta[k] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * width;
    const float m = mean[row], r = rstd[row];
    float xhat[kPerThread], g[kPerThread];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      xhat[k] = g[k] = 0.f;
      if (c < width) {
        const float go = ToFloat(grad_out[base + c]);
        xhat[k] = (s[base + c] - m) * r;
        g[k] = go * gamma[c];  // read each row (cached): kept in registers it spilled
        sum_g += g[k];
        sum_gx += g[k] * xhat[k];
        dgamma[k] += go * xhat[k];
        dbeta[k] += go;
      }
    }
    BlockSum2(sum_g, sum_gx, scratch);
    const float mean_g = sum_g / width, mean_gx = sum_gx / width;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c >= width) continue;
      float dx = r * (g[k] - mean_g - xhat[k] * mean_gx);
      if (grad_sum) dx += grad_sum[base + c];
      grad_x[base + c] = dx;
      if (grad_residual) grad_residual[base + c] = FromFloat<TR>(dx);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= width) continue;
    gamma_partial[static_cast<int64_t>(blockIdx.x) * width + c] = dgamma[k];
    beta_partial[static_cast<int64_t>(blockIdx.x) * width + c] = dbeta[k];
  }
}

// Whole warps, enough for kPerThread elements each.
int ThreadsFor(int64_t width) {
  const int64_t warps = (width + kPerThread * 32 - 1) / (kPerThread * 32);
  return static_cast<int>(warps * 32);
}

// Calls f with a value of the C++ type of `dtype`.
template <typename F>
const char* WithType(LossDtype dtype, F&& f) {
  switch (dtype) {
    case LossDtype::kFloat:
      return f(float{});
    case LossDtype::kBFloat16:
      return f(__nv_bfloat16{});
    case LossDtype::kHalf:
      return f(__half{});
  }
  return "unknown dtype";
}

const char* LastError() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

int64_t NormKernelMaxWidth() { return int64_t{kPerThread} * kMaxThreads; }

const char* AddLayerNormForwardCuda(const float* x, LossDtype residual_dtype, const void* residual,
                                    const float* gamma, const float* beta, int64_t rows,
                                    int64_t width, float eps, LossDtype out_dtype, float* sum,
                                    void* out, float* mean, float* rstd, void* stream) {
  if (width < 1 || width > NormKernelMaxWidth()) return "width out of the kernel's range";
  if (rows == 0) return nullptr;
  auto st = static_cast<cudaStream_t>(stream);
  const int threads = ThreadsFor(width);
  return WithType(residual_dtype, [&](auto r) {
    return WithType(out_dtype, [&](auto o) {
      using TR = decltype(r);
      using TO = decltype(o);
      AddLayerNormForwardKernel<TR, TO><<<static_cast<unsigned>(rows), threads, 0, st>>>(
          x, static_cast<const TR*>(residual), gamma, beta, static_cast<int>(width), eps, sum,
          static_cast<TO*>(out), mean, rstd);
      return LastError();
    });
  });
}

const char* AddLayerNormBackwardCuda(LossDtype out_dtype, const void* grad_out,
                                     const float* grad_sum, const float* s, const float* mean,
                                     const float* rstd, const float* gamma, int64_t rows,
                                     int64_t width, float* grad_x, LossDtype residual_dtype,
                                     void* grad_residual, int blocks, float* grad_gamma_partial,
                                     float* grad_beta_partial, void* stream) {
  if (width < 1 || width > NormKernelMaxWidth()) return "width out of the kernel's range";
  if (blocks < 1) return "no blocks for the backward";
  auto st = static_cast<cudaStream_t>(stream);
  const int threads = ThreadsFor(width);
  return WithType(out_dtype, [&](auto o) {
    return WithType(residual_dtype, [&](auto r) {
      using TO = decltype(o);
      using TR = decltype(r);
      AddLayerNormBackwardKernel<TO, TR><<<static_cast<unsigned>(blocks), threads, 0, st>>>(
          static_cast<const TO*>(grad_out), grad_sum, s, mean, rstd, gamma, rows,
          static_cast<int>(width), grad_x, static_cast<TR*>(grad_residual), grad_gamma_partial,
          grad_beta_partial);
      return LastError();
    });
  });
}

}  // namespace fullburn
