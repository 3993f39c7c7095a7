#include <torch/torch.h>
#include <torch/version.h>

#include "fullburn/trainer.h"

namespace fullburn {

std::string TorchDescription() {
  std::string out = std::string("libtorch ") + TORCH_VERSION;
  if (torch::cuda::is_available())
    out += ", CUDA with " + std::to_string(torch::cuda::device_count()) + " device(s)";
  else
    out += ", CPU only";
  return out;
}

}  // namespace fullburn
