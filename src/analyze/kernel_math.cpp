// The math of a GEMM, convolution or attention kernel, from its name alone
// (ClassifyKernelMath, analyze.h). NVIDIA documents none of cuBLAS's, cuDNN's,
// xmma's or nvjet's names; CUTLASS's come from its generator
// (python/cutlass_library/gemm_operation.py), Inductor's from
// torch/_inductor/codegen/triton.py. The rules, their order and their sources
// are in docs/analyze.md ("Matmul math"); first match wins.
#include <map>
#include <optional>
#include <mutex>
#include <regex>

#include "fullburn/analyze.h"

namespace fullburn {
namespace {

using M = KernelMath;

bool Has(std::string_view s, const char* needle) { return s.find(needle) != std::string_view::npos; }

bool Any(std::string_view s, std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (Has(s, n)) return true;
  return false;
}

bool Search(const std::string& s, const std::regex& re) { return std::regex_search(s, re); }

// The dtype in a demangled name's template arguments (flash-attention,
// CUTLASS/CuTe device kernels); fp8 first: its GEMMs name a 16-bit output too.
std::optional<M> TemplateDtype(const std::string& n) {
  static const std::regex half(R"(half_t|__half|c10::Half|\bhalf\b)");
  if (Any(n, {"float_e4m3", "float_e5m2", "__nv_fp8", "Float8_e4m3", "Float8_e5m2", "fp8_e4m3",
              "fp8_e5m2"}))
    return M::kFp8;
  if (Any(n, {"bfloat16", "BFloat16"})) return M::kBf16;
  if (Search(n, half)) return M::kFp16;
  if (Has(n, "tfloat32")) return M::kTf32;
  if (Any(n, {"int8_t", "uint8_t"})) return M::kInt8;
  return std::nullopt;
}

// Legacy engines templated on their storage type compute on CUDA cores:
// fp64 for double, fp32 FMA for the rest (16-bit storage included).
M SimtByTemplate(const std::string& n) {
  static const std::regex first(R"(<\s*(double|float2|float|__half|half|__nv_bfloat16|c10::Half|int|long)\b)");
  std::smatch m;
  return std::regex_search(n, m, first) && m[1] == "double" ? M::kFp64 : M::kFp32Simt;
}

std::optional<M> Attention(const std::string& n) {
  static const std::regex mem_eff(R"(fmha_cutlass[FB]_(bf16|f16|f32)_\w*?_sm(\d+))");
  static const std::regex flash(R"(flash_fwd|flash_bwd|pytorch_flash::|flash::|FlashAttn|FlashAttention)");
  static const std::regex cudnn_sdpa(R"(cudnn_generated_\w*sdpa|_sdpa_sm\d+_flash)");
  static const std::regex fp8_any(R"(e4m3|e5m2|fp8)", std::regex::icase);
  static const std::regex trt(R"(^fmhaSm\d+|fmha_v2|_mha_v2|fmhaKernel)");
  std::smatch m;
  if (Any(n, {"fmha_cutlassF_", "fmha_cutlassB_"})) {
    if (!std::regex_search(n, m, mem_eff)) return M::kUnknown;
    int sm = std::stoi(m[2]);
    if (m[1] == "bf16") return M::kBf16;
    if (m[1] == "f16") return sm >= 70 ? M::kFp16 : M::kFp32Simt;
    return sm >= 80 ? M::kTf32 : M::kFp32Simt;  // fp32 on sm80+: 3xTF32 on tensor cores
  }
  if (Search(n, flash)) return TemplateDtype(n).value_or(M::kUnknown);
  // cuDNN's SDPA says f16 for fp16 and bf16 alike.
  if (Search(n, cudnn_sdpa)) return Search(n, fp8_any) ? M::kFp8 : M::kUnknown;
  if (Search(n, trt)) {
    if (Any(n, {"E4m3", "e4m3", "Fp8", "fp8"})) return M::kFp8;
    if (Any(n, {"Bf16", "bf16", "Bfloat16"})) return M::kBf16;
    if (Any(n, {"Fp16", "fp16"})) return M::kFp16;
    return M::kUnknown;
  }
  return std::nullopt;
}

// cuBLAS(Lt) 12/13 "nvjet_[smNN_]<types>_...": the first type letter is A's.
std::optional<M> Nvjet(const std::string& n) {
  static const std::regex nvjet(R"(nvjet_(?:sm\d+_)?([a-z]{3,5})_)");
  std::smatch m;
  if (!std::regex_search(n, m, nvjet)) return std::nullopt;
  if (Has(n, "tf32")) return M::kTf32;
  switch (m.str(1)[0]) {
    case 't': return M::kBf16;
    case 'h': return M::kFp16;
    case 'q': return M::kFp8;
    case 'o': return M::kFp4;
    case 'i': return M::kInt8;
    case 'd': return M::kFp64;
    default: return M::kUnknown;  // s: fp32 in, TF32 or an emulation
  }
}

// CUTLASS 3.x: {A}_{B}_{acc}_{C}_{D} in the name.
std::optional<M> Cutlass3(const std::string& n) {
  static const std::regex cutlass3(R"(cutlass3x_sm\d+_\w*tensorop)");
  static const std::regex fp4(R"(xf4_|_f4_|e2m1|ue4m3x|_f6_|e2m3|e3m2)");
  static const std::regex int8(R"(_[su]8_|_[su]4_|i\d+x\d+x\d+gemm)");
  if (!Search(n, cutlass3)) return std::nullopt;
  if (Search(n, fp4)) return M::kFp4;
  if (Any(n, {"e4m3", "e5m2"})) return M::kFp8;
  if (Has(n, "_bf16_")) return M::kBf16;
  if (Has(n, "_f16_")) return M::kFp16;
  if (Has(n, "_tf32_")) return M::kTf32;
  if (Search(n, int8)) return M::kInt8;
  if (Has(n, "_f64_")) return M::kFp64;
  return M::kUnknown;
}

// CUTLASS 2.x procedural names, as the library, cuBLAS (cutlass_80_...) and
// cuDNN (cutlass__5x_cudnn::Kernel<...>) name them.
std::optional<M> Cutlass2(const std::string& n) {
  static const std::regex cutlass2(R"(cutlass_(?:\d+_)?(simt|tensorop|wmma_tensorop|sptensorop|wmma)_(\w+))");
  static const std::regex simt_fp64(R"(^d|_dgemm|_zgemm|^z)");
  static const std::regex int8(R"(i\d+(?:and|xor)?gemm|_s8|_u8|_s4|_u4|_b1)");
  static const std::regex fp64(R"(^d\d|^z\d|^gz\d|_f64)");
  static const std::regex fp16(R"(f16|^h\d)");
  // fp32 operands on a tensor op: TF32 (cuBLAS's own carries no _tf32).
  static const std::regex tf32(R"(^[sc](1688|1684|16816|1648)(gemm|fprop|dgrad|wgrad))");
  std::smatch m;
  if (!std::regex_search(n, m, cutlass2)) return std::nullopt;
  const std::string cls = m[1], rest = m[2];
  if (cls == "simt") return Search(rest, simt_fp64) ? M::kFp64 : M::kFp32Simt;
  if (Any(rest, {"e4m3", "e5m2"})) return M::kFp8;
  if (Has(rest, "bf16")) return M::kBf16;
  if (Has(rest, "tf32")) return M::kTf32;
  if (Search(rest, int8)) return M::kInt8;
  if (Search(rest, fp64)) return M::kFp64;
  if (Search(rest, fp16)) return M::kFp16;
  if (Search(rest, tf32)) return M::kTf32;
  return M::kUnknown;
}

// xmma (cuBLAS, cuDNN, TensorRT): the second dtype group's first token is
// the MMA's input; f32 there with ffma is fp32 on CUDA cores, not a tensor op.
std::optional<M> Xmma(const std::string& n) {
  static const std::regex dtypes(
      R"(_((?:bf16|tf32|f16|f32|f64|e4m3|e5m2|i8|i32)+)_(bf16|tf32|f16|f32|f64|e4m3|e5m2|i8)(f32|f16|i32|f64)(?:_|$))");
  if (!Has(n, "xmma_")) return std::nullopt;
  std::smatch m;
  if (std::regex_search(n, m, dtypes)) {
    static const std::map<std::string, M> math = {
        {"bf16", M::kBf16}, {"f16", M::kFp16}, {"tf32", M::kTf32},    {"e4m3", M::kFp8},
        {"e5m2", M::kFp8},  {"i8", M::kInt8},  {"f32", M::kFp32Simt}, {"f64", M::kFp64}};
    return math.at(m[2]);
  }
  return Has(n, "ffma") ? M::kFp32Simt : M::kUnknown;
}

// Classic cuBLAS/cuDNN: <arch>_[<io>_]<acc><mma shape>...(gemm|cudnn); no
// MMA shape in the name is SIMT.
std::optional<M> Classic(const std::string& n) {
  static const std::regex classic(
      R"(^(?:trt_)?(maxwell|pascal|volta|turing|ampere|hopper)_((?:fp16|bf16|tf32|fp32|int8|int32)_)?(\w+))");
  static const std::regex gemm(R"(gemm|cudnn)");
  static const std::regex mma(R"([hsi](884|1688|16816|1684|8816|16832|16864|161616)(tf32)?(gemm|cudnn))");
  static const std::regex int8(R"(int8|i8816|i16832|i16864)");
  static const std::regex fp16(R"(fp16|h884|h1688|h16816)");
  static const std::regex fp64(R"((^|_)(d|z)(gemm|cudnn)|dgemm|zgemm)");
  std::smatch m;
  if (!std::regex_search(n, m, classic) || !Search(m.str(3), gemm)) return std::nullopt;
  const std::string rest = m.str(2) + m.str(3);
  if (Search(rest, mma)) {
    if (Has(rest, "bf16")) return M::kBf16;
    if (Has(rest, "tf32")) return M::kTf32;
    if (Search(rest, int8)) return M::kInt8;
    if (Search(rest, fp16)) return M::kFp16;
    return M::kTf32;  // s1688 with no 16-bit type: fp32 operands on a tensor op
  }
  if (Any(rest, {"d884", "dmma"}) || Search(rest, fp64)) return M::kFp64;
  return M::kFp32Simt;
}

M Classify(const std::string& n) {
  static const std::regex nccl(R"(^nccl|ncclDevKernel|ncclKernel)");
  static const std::regex triton_plain(R"(^triton_(poi|red|per|for|spl|sca)_)");
  static const std::regex winograd(
      R"(winograd_nonfused::winograd|generateWinogradTilesKernel|fft2d_r2c|fft2d_c2r|fft1d_r2c|fft1d_c2r|flip_filter)");
  static const std::regex legacy_conv(
      R"(implicit_convolve_\w*gemm|explicit_convolve_\w*gemm|wgrad_alg\d_engine|dgrad_engine|dgrad2d_alg|wgrad2d|conv2d_grouped_direct|convolve_common_engine|depthwise|winograd)");
  static const std::regex blas2(
      R"(gemv2[TN]_kernel|gemvNSP|gemvx::kernel|gemmSN_[TN]N_kernel|gemmk1_kernel|gemmStridedBatched|fermiC?[sdh]?gemm|dot_kernel)");
  static const std::regex cute(R"(cutlass::device_kernel|cutlass::Kernel2?<|GemmUniversal|CollectiveMma|deep_gemm::|cute::)");
  static const std::regex matmul_like(R"(gemm|Gemm|GEMM|matmul|Matmul|_mm_|[Cc]onv(?!ert))");
  // First what only looks like math: NCCL names carry dtypes, Inductor's
  // pointwise kernels "convolution", norms and bookkeeping "gemm" or "conv".
  if (Search(n, nccl) || Search(n, triton_plain)) return M::kNotGemm;
  if (Any(n, {"bn_fw_", "bn_bw_", "batch_norm", "layer_norm", "BatchNorm"})) return M::kNotGemm;
  if (Any(n, {"splitKreduce", "splitK_reduce", "reduce_1Block"})) return M::kNotGemm;
  if (Any(n, {"cask_cudnn::", "computeOffsetsKernel", "computeBOffsets", "nchwToNhwc", "nhwcToNchw",
              "scalePackedTensor", "im2col", "col2im", "convertTensor", "transpose_readWrite"}))
    return M::kNotGemm;
  if (Search(n, winograd)) return SimtByTemplate(n);  // a cuDNN conv's transform stages
  using Rule = std::optional<M> (*)(const std::string&);
  for (Rule rule : std::initializer_list<Rule>{Attention, Nvjet, Cutlass3, Cutlass2, Xmma, Classic})
    if (std::optional<M> m = rule(n)) return *m;
  if (Search(n, legacy_conv) || Search(n, blas2)) return SimtByTemplate(n);
  if (n.rfind("triton_tem_", 0) == 0) return M::kUnknown;  // Inductor's templates: no dtype in the name
  if (Search(n, cute)) return Any(n, {"fp8", "Fp8", "FP8"}) ? M::kFp8 : TemplateDtype(n).value_or(M::kUnknown);
  if (Search(n, matmul_like)) return M::kUnknown;
  return M::kNotGemm;
}

}  // namespace

KernelMath ClassifyKernelMath(std::string_view kernel_name) {
  // A trace names a few hundred distinct kernels thousands of times: each
  // name's regexes run once.
  static std::mutex mu;
  static std::map<std::string, KernelMath, std::less<>> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(kernel_name);
    if (it != seen.end()) return it->second;
  }
  std::string name(kernel_name);
  KernelMath m = Classify(name);
  std::lock_guard<std::mutex> lock(mu);
  seen.emplace(std::move(name), m);
  return m;
}

const char* KernelMathName(KernelMath m) {
  switch (m) {
    case M::kNotGemm: return "not a matmul";
    case M::kBf16: return "bf16 tensor cores";
    case M::kFp16: return "fp16 tensor cores";
    case M::kTf32: return "tf32 tensor cores";
    case M::kFp8: return "fp8 tensor cores";
    case M::kFp4: return "fp4 tensor cores";
    case M::kInt8: return "int8 tensor cores";
    case M::kFp32Simt: return "fp32 without tensor cores (SIMT)";
    case M::kFp64: return "fp64";
    case M::kUnknown: return "math not in the name";
  }
  return "?";
}

const char* KernelMathKey(KernelMath m) {
  switch (m) {
    case M::kNotGemm: return "not_gemm";
    case M::kBf16: return "bf16_tc";
    case M::kFp16: return "fp16_tc";
    case M::kTf32: return "tf32_tc";
    case M::kFp8: return "fp8_tc";
    case M::kFp4: return "fp4_tc";
    case M::kInt8: return "int8_tc";
    case M::kFp32Simt: return "fp32_simt";
    case M::kFp64: return "fp64";
    case M::kUnknown: return "unknown";
  }
  return "?";
}

}  // namespace fullburn
