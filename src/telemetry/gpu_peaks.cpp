// The peak table (gpu_peaks.h). Rows are tried in order, the specific before
// the general ("H100 NVL" before "H100"); a row matches when the name holds
// all of its tokens and none of its excluded ones. Figures: dense TFLOPS from
// the vendor's datasheet or whitepaper, sparsity figures halved.
#include <cctype>

#include "fullburn/gpu_peaks.h"

namespace fullburn {
namespace {

constexpr double kNone = NAN;

struct Row {
  std::vector<const char*> all;   // upper-case tokens the name must hold
  std::vector<const char*> none;  // and must not
  GpuPeak peak;
};

const std::vector<Row>& Rows() {
  static const std::vector<Row> rows = {
      {{"GB200"}, {}, {"GB200", 2500, 2500, 1250, 80, "NVIDIA GB200 NVL72 spec table, per GPU, sparse/2"}},
      {{"B200"}, {}, {"B200", 2250, 2250, 1100, 75, "NVIDIA HGX B200 spec table (preliminary), sparse/2"}},
      {{"GH200"}, {}, {"GH200", 989.5, 989.5, 494.5, 67, "NVIDIA GH200 datasheet (as H100 SXM), sparse/2"}},
      {{"H200", "NVL"}, {}, {"H200 NVL", 835.5, 835.5, 417.5, 60, "nvidia.com/en-us/data-center/h200, sparse/2"}},
      {{"H200"}, {}, {"H200 SXM", 989.5, 989.5, 494.5, 67, "nvidia.com/en-us/data-center/h200, sparse/2"}},
      {{"H100", "NVL"}, {}, {"H100 NVL", 835.5, 835.5, 417.5, 60, "H100 NVL datasheet (one card), sparse/2"}},
      {{"H100", "PCIE"}, {}, {"H100 PCIe", 756.5, 756.5, 378, 51, "H100 datasheet, PCIe column, sparse/2"}},
      {{"H100"}, {}, {"H100 SXM", 989.4, 989.4, 494.7, 67, "Hopper whitepaper / H100 datasheet, SXM, sparse/2"}},
      {{"A100"}, {}, {"A100", 312, 312, 156, 19.5, "A100 datasheet (dense column)"}},
      // No datasheet: a measured 69.5 TFLOPS bf16 GEMM fits ~70, not the A10's 125.
      {{"A10G"}, {}, {"A10G", 70, 70, 35, 35, "no NVIDIA datasheet; ~70 from a measured bf16 GEMM (unverified)"}},
      {{"A10"}, {}, {"A10", 125, 125, 62.5, 31.2, "A10 datasheet, sparse/2"}},
      {{"A40"}, {}, {"A40", 149.7, 149.7, 74.8, 37.4, "A40 datasheet, sparse/2"}},
      {{"L40S"}, {}, {"L40S", 362.05, 362.05, 183, 91.6, "L40S datasheet (dense column)"}},
      {{"L4"}, {}, {"L4", 121, 121, 60, 30.3, "L4 datasheet, sparse/2"}},
      {{"V100S"}, {}, {"V100S PCIe", kNone, 130, kNone, 16.4, "V100 datasheet (fp16 tensor only)"}},
      {{"V100", "SXM2"}, {}, {"V100 SXM2", kNone, 125, kNone, 15.7, "V100 datasheet (fp16 tensor only)"}},
      {{"V100", "PCIE"}, {}, {"V100 PCIe", kNone, 112, kNone, 14, "V100 datasheet (fp16 tensor only)"}},
      // The DGX Station's V100s: 500 TFLOPS for four, as the SXM2 part.
      {{"V100", "DGXS"}, {}, {"V100 DGXS", kNone, 125, kNone, 15.7, "DGX Station datasheet (4 x 125 TFLOPS fp16)"}},
      {{"T4"}, {}, {"T4", kNone, 65, kNone, 8.1, "T4 datasheet (fp16 tensor, no bf16)"}},
      {{"RTX", "6000", "ADA"}, {}, {"RTX 6000 Ada", 364.2, 364.2, 182.1, 91.1, "RTX 6000 Ada datasheet, FP8 sparse/4 (unverified)"}},
      {{"RTX", "4090"}, {"D"}, {"GeForce RTX 4090", 165.2, 165.2, 82.6, 82.6, "Ada whitepaper v2.1 appendix A (fp32 accumulate)"}},
      {{"RTX", "3090"}, {"TI"}, {"GeForce RTX 3090", 71, 71, 35.6, 35.6, "GA102 whitepaper appendix A (fp32 accumulate)"}},
  };
  return rows;
}

std::vector<std::string> Tokens(std::string_view name) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      cur += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool Has(const std::vector<std::string>& tokens, const char* t) {
  for (const std::string& x : tokens)
    if (x == t) return true;
  return false;
}

}  // namespace

const std::vector<GpuPeak>& GpuPeaks() {
  static const std::vector<GpuPeak> peaks = [] {
    std::vector<GpuPeak> v;
    for (const Row& r : Rows()) v.push_back(r.peak);
    return v;
  }();
  return peaks;
}

const GpuPeak* FindGpuPeak(std::string_view nvml_name) {
  std::vector<std::string> tokens = Tokens(nvml_name);
  const std::vector<Row>& rows = Rows();
  for (size_t i = 0; i < rows.size(); ++i) {
    bool match = true;
    for (const char* t : rows[i].all) match = match && Has(tokens, t);
    for (const char* t : rows[i].none) match = match && !Has(tokens, t);
    if (match) return &GpuPeaks()[i];
  }
  return nullptr;
}

}  // namespace fullburn
