// The cross-entropy over low-precision logits in two passes (loss_kernel.h).
//
// Why: ATen's path under autocast copies the bf16 logits to fp32, keeps the
// fp32 log-softmax for backward, makes an fp32 gradient and casts it back to
// bf16: about 30 GB of memory traffic a step for GPT-2 124M at 16 x 1024
// tokens (logits 16,384 x 50,304). Here forward reads the logits once
// (1.6 GB) and backward reads them once and writes the gradient once (3.3
// GB), computing in fp32 throughout. One block per row; the row's max and
// sum of exponentials are kept online (one exponential per element).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_convert.cuh"
#include "loss_kernel.h"

namespace fullburn {
namespace {

constexpr int kThreads = 512;

using cuda_convert::FromFloat;
using cuda_convert::ToFloat;

// A running max `m` and the sum `s` of exp(x - m) over the values seen.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ void Add(MaxSum& a, float x) {
  if (x == -INFINITY) return;  // exp(-inf) adds nothing (and -inf - -inf is NaN)
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);
  }
}

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  // A NaN logit (its sum NaN, its max maybe still -inf) makes the row's
  // loss NaN, as ATen's: never dropped with an empty side.
  if (isnan(a.s) || isnan(b.s)) return {fmaxf(a.m, b.m), NAN};
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum WarpCombine(MaxSum v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, offset),
                 __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = Combine(v, other);
  }
  return v;
}

// Every thread of the block gets the block's combination.
__device__ MaxSum BlockCombine(MaxSum v) {
  __shared__ float warp_m[kThreads / 32], warp_s[kThreads / 32];
  v = WarpCombine(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = v.m;
    warp_s[warp] = v.s;
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? MaxSum{warp_m[lane], warp_s[lane]} : MaxSum{-INFINITY, 0.f};
  return WarpCombine(v);
}

// 16-byte loads and stores where the rows allow them.
template <typename T>
struct Vec {
  static constexpr int kN = 16 / sizeof(T);
  union {
    uint4 raw;
    T e[kN];
  };
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyForwardKernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride,
                              bool vector_rows, const int64_t* __restrict__ targets,
                              float* __restrict__ lse, float* __restrict__ losses) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  constexpr int kN = Vec<T>::kN;
  MaxSum acc{-INFINITY, 0.f};
  const int64_t vector_end = vector_rows ? vocab / kN * kN : 0;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * kN; j < vector_end;
       j += static_cast<int64_t>(blockDim.x) * kN) {
    Vec<T> v;
    v.raw = *reinterpret_cast<const uint4*>(x + j);
#pragma unroll
    for (int k = 0; k < kN; ++k) Add(acc, ToFloat(v.e[k]));
  }
  for (int64_t j = vector_end + threadIdx.x; j < vocab; j += blockDim.x) Add(acc, ToFloat(x[j]));
  acc = BlockCombine(acc);
  if (threadIdx.x != 0) return;
  const float row_lse = acc.m + logf(acc.s);
  const int64_t t = targets[row];
  lse[row] = row_lse;
  if (t < 0)
    losses[row] = 0.f;
  else if (t >= vocab)
    losses[row] = NAN;
  else
    losses[row] = row_lse - ToFloat(x[t]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyBackwardKernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride,
                               int64_t out_cols, bool vector_rows,
                               const int64_t* __restrict__ targets, const float* __restrict__ lse,
                               const float* __restrict__ scale, T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  T* g = grad + row * out_cols;
  const int64_t t = targets[row];
  const float row_lse = lse[row], s = t < 0 ? 0.f : *scale;
  auto value = [&](int64_t j, float xj) {
    if (j >= vocab) return 0.f;
    return (expf(xj - row_lse) - (j == t ? 1.f : 0.f)) * s;
  };
  constexpr int kN = Vec<T>::kN;
  // Vector steps cover whole vectors of the output; within them a column at
  // or past `vocab` is padding (0), whose logit may still be read (it is in
  // the row: out_cols <= row_stride).
  const int64_t vector_end = vector_rows ? out_cols / kN * kN : 0;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * kN; j < vector_end;
       j += static_cast<int64_t>(blockDim.x) * kN) {
    Vec<T> in, out;
    in.raw = *reinterpret_cast<const uint4*>(x + j);
#pragma unroll
    for (int k = 0; k < kN; ++k) out.e[k] = FromFloat<T>(value(j + k, ToFloat(in.e[k])));
    *reinterpret_cast<uint4*>(g + j) = out.raw;
  }
  for (int64_t j = vector_end + threadIdx.x; j < out_cols; j += blockDim.x)
    g[j] = FromFloat<T>(j < vocab ? value(j, ToFloat(x[j])) : 0.f);
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
const char* Forward(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                    const int64_t* targets, float* lse, float* losses, cudaStream_t stream) {
  if (rows == 0) return nullptr;
  const bool vector_rows = Aligned(logits) && row_stride % Vec<T>::kN == 0;
  CrossEntropyForwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<const T*>(logits), vocab, row_stride, vector_rows, targets, lse, losses);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
const char* Backward(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                     int64_t out_cols, const int64_t* targets, const float* lse, const float* scale,
                     void* grad, cudaStream_t stream) {
  if (rows == 0) return nullptr;
  constexpr int kN = Vec<T>::kN;
  const bool vector_rows =
      Aligned(logits) && Aligned(grad) && row_stride % kN == 0 && out_cols % kN == 0;
  CrossEntropyBackwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<const T*>(logits), vocab, row_stride, out_cols, vector_rows, targets, lse, scale,
      static_cast<T*>(grad));
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* CrossEntropyForwardCuda(LossDtype dtype, const void* logits, int64_t rows,
                                    int64_t vocab, int64_t row_stride, const int64_t* targets,
                                    float* lse, float* losses, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case LossDtype::kFloat:
      return Forward<float>(logits, rows, vocab, row_stride, targets, lse, losses, s);
    case LossDtype::kBFloat16:
      return Forward<__nv_bfloat16>(logits, rows, vocab, row_stride, targets, lse, losses, s);
    case LossDtype::kHalf:
      return Forward<__half>(logits, rows, vocab, row_stride, targets, lse, losses, s);
  }
  return "unknown logits dtype";
}

const char* CrossEntropyBackwardCuda(LossDtype dtype, const void* logits, int64_t rows,
                                     int64_t vocab, int64_t row_stride, int64_t out_cols,
                                     const int64_t* targets, const float* lse, const float* scale,
                                     void* grad, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case LossDtype::kFloat:
      return Backward<float>(logits, rows, vocab, row_stride, out_cols, targets, lse, scale, grad,
                             s);
    case LossDtype::kBFloat16:
      return Backward<__nv_bfloat16>(logits, rows, vocab, row_stride, out_cols, targets, lse, scale,
                                     grad, s);
    case LossDtype::kHalf:
      return Backward<__half>(logits, rows, vocab, row_stride, out_cols, targets, lse, scale, grad,
                              s);
  }
  return "unknown logits dtype";
}

}  // namespace fullburn
