// GPU peaks: each GPU model's dense throughput by math (vendor datasheets),
// matched by the name NVML reports, for MFU and for what mixed precision
// would gain (docs/diagnosis.md, "Used well").
//
// Contract
// - Static data, immutable, safe from any thread. Dense figures only: a
//   datasheet's "with sparsity" numbers are halved, each row says its source.
// - A name is matched by whole tokens in a fixed order, so "GH200" is not an
//   H200 and "A100" not an A10; a name that matches no row is nullptr, never
//   a guess (the caller names FULLBURN_PEAK_TFLOPS).
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace fullburn {

struct GpuPeak {
  const char* model;  // "H100 SXM"
  // Dense TFLOPS: bf16 and fp16 on tensor cores (fp32 accumulate), tf32 on
  // tensor cores, fp32 without them (SIMT). NaN: the GPU has no such path.
  double bf16, fp16, tf32, fp32;
  const char* source;
  // The peak MFU is counted against: bf16's, or fp16's on GPUs without bf16
  // (V100, T4), as llm.c and PaLM count it.
  double Mfu() const { return std::isnan(bf16) ? fp16 : bf16; }
  // Tensor cores for 16-bit math (Volta and newer): fp32 matmuls there
  // leave them idle.
  bool TensorCores() const { return !std::isnan(fp16); }
};

const std::vector<GpuPeak>& GpuPeaks();
// The row for NVML's device name ("NVIDIA H100 80GB HBM3"); nullptr: not in the table.
const GpuPeak* FindGpuPeak(std::string_view nvml_name);

// The environment variable that overrides the table's MFU peak (TFLOPS per GPU).
constexpr const char* kPeakTflopsEnvVar = "FULLBURN_PEAK_TFLOPS";

}  // namespace fullburn
