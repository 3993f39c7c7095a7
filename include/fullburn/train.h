// Train: the libtorch training half of fullburn (built when libtorch is found).
//
// Contract: everything declared here links libtorch; the monitoring half never
// includes this header. Functions are safe to call from any thread.
#pragma once

#include <string>

namespace fullburn {

// "libtorch 1.13.1, CPU only" or "libtorch 2.x, CUDA with N device(s)".
std::string TorchDescription();

}  // namespace fullburn
