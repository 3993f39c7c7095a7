// Internal to models: fullburn's own CUDA kernels for the cross-entropy over
// a language model's logits (model.loss_kernel = cuda), built only where nvcc
// and a CUDA libtorch are present (FULLBURN_CUDA_KERNELS). Plain pointers and
// a stream, no torch types: loss_kernel.cu is compiled by nvcc alone.
//
// Contract
// - `logits`: `rows` rows of `row_stride` elements, the first `vocab` of each
//   the classes (the rest, a padded vocabulary's columns, are not classes).
//   Device memory, in `dtype`.
// - `targets`: `rows` int64 class indices; a negative one is ignored (no
//   loss, no gradient, as ATen's ignore_index -100); one >= vocab gives NaN.
// - Forward writes each row's log-sum-exp (`lse`) and loss (`losses`), fp32.
// - Backward writes `grad` (`rows` x `out_cols`, contiguous, in `dtype`):
//   (softmax - one_hot(target)) * *scale for the first `vocab` columns, 0
//   for the others. `scale` is a device pointer (the loss's gradient over
//   the rows counted), so nothing is read on the host.
// - Both run on `stream` (a cudaStream_t) and return nullptr, or the CUDA
//   error's text when the launch failed.
#pragma once

#include <cstdint>

namespace fullburn {

enum class LossDtype { kFloat, kBFloat16, kHalf };

const char* CrossEntropyForwardCuda(LossDtype dtype, const void* logits, int64_t rows,
                                    int64_t vocab, int64_t row_stride, const int64_t* targets,
                                    float* lse, float* losses, void* stream);

const char* CrossEntropyBackwardCuda(LossDtype dtype, const void* logits, int64_t rows,
                                     int64_t vocab, int64_t row_stride, int64_t out_cols,
                                     const int64_t* targets, const float* lse, const float* scale,
                                     void* grad, void* stream);

}  // namespace fullburn
