// Linear layers through oneDNN where libtorch's own GEMM is slow.
//
// Debian's libtorch 1.13 is built with BLAS_INFO=generic (the reference
// BLAS): a 64x512x512 matmul runs at ~3 GFLOP/s on this project's machine,
// while the same product as a 1x1 convolution goes through oneDNN's JIT
// kernels at ~27 GFLOP/s (forward and backward). So builds with the generic
// BLAS and oneDNN take the convolution path; others (MKL, OpenBLAS, CUDA)
// keep libtorch's linear.
#include <ATen/Version.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "models_internal.h"

namespace fullburn {
namespace {

}  // namespace

torch::Tensor LinearAsConvolution(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = w.size(0);
  torch::Tensor x4 = x.reshape({-1, x.size(-1), 1, 1});
  torch::Tensor y = torch::conv2d(x4, w.view({w.size(0), w.size(1), 1, 1}), b);
  return y.view(out_shape);
}

namespace {

LinearBackend Decide() {
  const char* env = std::getenv("FULLBURN_LINEAR");
  if (env && std::strcmp(env, "blas") == 0) return LinearBackend::kBlas;
  if (env && std::strcmp(env, "onednn") == 0) return LinearBackend::kOneDnn;
  // Decided from the build, not by timing: a run and its resumption must
  // take the same path, or their losses drift apart in the last bits.
  std::string config = at::show_config();
  bool generic_blas = config.find("BLAS_INFO=generic") != std::string::npos;
  bool mkldnn = config.find("USE_MKLDNN=ON") != std::string::npos;
  return generic_blas && mkldnn ? LinearBackend::kOneDnn : LinearBackend::kBlas;
}

}  // namespace

LinearBackend CpuLinearBackend() {
  static std::once_flag once;
  static LinearBackend backend = LinearBackend::kBlas;
  std::call_once(once, [] { backend = Decide(); });
  return backend;
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (x.is_cpu() && x.scalar_type() == torch::kFloat && CpuLinearBackend() == LinearBackend::kOneDnn)
    return LinearAsConvolution(x, w, b);
  return torch::nn::functional::linear(x, w, b);
}

FastLinearImpl::FastLinearImpl(int64_t in, int64_t out, bool bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  // torch.nn.Linear's initialization: kaiming_uniform(a = sqrt(5)), bias
  // uniform in +-1/sqrt(fan_in).
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias) {
    double bound = 1.0 / std::sqrt(static_cast<double>(in));
    this->bias = register_parameter("bias", torch::empty({out}).uniform_(-bound, bound));
  }
}

torch::Tensor FastLinearImpl::forward(torch::Tensor x) { return Linear(x, weight, bias); }

}  // namespace fullburn
