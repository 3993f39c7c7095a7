// Used well, not just busy: what GPM and the step hooks' FLOP count say
// about how a busy GPU computes. Gathers the GPU model's peaks, the FLOP
// count and MFU (Mfu in diagnose.h), and holds the two rules that read them:
// precision (matmuls in fp32 on tensor-core GPUs) and low_mfu (busy, yet
// little of the peak used). Thresholds in facts.h, sources in docs/diagnosis.md.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>

#include "facts.h"

namespace fullburn {
namespace diagnose {
namespace {

// The latest "flops" event of the lowest rank that wrote one: a count, or
// the reason there is none.
const RunEvent* FlopEvent(const RunData& d) {
  const RunEvent* best = nullptr;
  int best_rank = 0;
  for (const RunEvent& e : d.events) {
    if (e.kind != "flops") continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    int rank = j.is_object() ? j.value("rank", 0) : 0;
    if (!best || rank <= best_rank) best = &e, best_rank = rank;
  }
  return best;
}

double NumberOr(const nlohmann::json& j, const char* key, double otherwise) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : otherwise;
}

// fp32 FLOPs that ran outside tensor cores: fp32 matmuls where TF32 is off
// for them, fp32 convolutions where cuDNN's is; all of them on a GPU without TF32.
double Fp32SimtFlops(const nlohmann::json& data, bool has_tf32) {
  auto part = [&](const char* key) {
    const nlohmann::json& d = data.contains(key) ? data[key] : nlohmann::json::object();
    return d.is_object() ? NumberOr(d, "float32", 0) : 0.0;
  };
  double all = part("by_dtype"), conv = part("conv_by_dtype");
  bool tf32_mm = has_tf32 && data.value("tf32_matmul", false) == true;
  bool tf32_conv = has_tf32 && data.value("tf32_cudnn", false) == true;
  return (tf32_mm ? 0 : all - conv) + (tf32_conv ? 0 : conv);
}

// The job's GPU model: the name NVML gave rank 0's first GPU the diagnosis counts.
std::string GpuModel(const RunData& d, const Facts& f) {
  auto gpus = nlohmann::json::parse(d.run.gpus_json, nullptr, false);
  if (!gpus.is_array()) return "";
  int first = -1;
  for (const GpuFacts& g : f.gpus)
    if (g.rank == 0 && (first < 0 || g.index < first)) first = g.index;
  for (const auto& g : gpus)
    if (g.is_object() && g.value("index", -1) == first && g.contains("name") && g["name"].is_string())
      return g["name"].get<std::string>();
  return "";
}

// The median step time of `rank`'s steps but the counted one (slowed by the count).
double MedianStep(const RunData& d, int rank, int64_t counted) {
  std::vector<double> v;
  for (const StepRecord& r : d.steps)
    if (r.rank == rank && r.step != counted && r.step_s > 0) v.push_back(r.step_s);
  return Median(v);
}

void GatherMfu(const RunData& d, Facts* f) {
  Mfu& m = f->mfu;
  const RunEvent* e = FlopEvent(d);
  m.counted = e != nullptr;
  if (!e) {
    m.why = d.steps.empty() ? "no steps recorded, no FLOPs counted"
                            : "no FLOP count (a PyTorch job's step hooks count one step's under "
                              "PyTorch 2.4 and newer)";
    return;
  }
  auto data = nlohmann::json::parse(e->data, nullptr, false);
  if (!data.is_object()) {
    m.why = "the FLOP count's event is malformed";
    return;
  }
  if (data.contains("error") && data["error"].is_string()) {
    m.why = data["error"].get<std::string>();
    return;
  }
  Facts::FlopFacts c;
  c.flops = NumberOr(data, "flops", NAN);
  c.device = data.value("device", std::string());
  c.tf32_matmul = data.value("tf32_matmul", false) == true;
  c.tf32_cudnn = data.value("tf32_cudnn", false) == true;
  c.fp32_simt_flops = Fp32SimtFlops(data, !f->peak || !std::isnan(f->peak->tf32));
  f->flop_count = c;
  if (data.contains("uncounted") && data["uncounted"].is_array())
    for (const auto& op : data["uncounted"])
      if (op.is_string()) m.uncounted.push_back(op.get<std::string>());
  m.flops_per_step = c.flops;
  m.step_s = MedianStep(d, data.value("rank", 0), data.value("step", int64_t{0}));
  if (!(c.flops > 0)) {
    m.why = "the counted step ran no matmul, convolution or attention FlopCounterMode counts";
    return;
  }
  if (c.device.find("cuda") == std::string::npos) {
    m.why = fmt::format("the counted step's matmuls ran on the {}, not a GPU", c.device.empty() ? "host" : c.device);
    return;
  }
  auto cfg = nlohmann::json::parse(d.run.config_json, nullptr, false);
  double override_tflops = cfg.is_object() ? NumberOr(cfg, "peak_tflops", NAN) : NAN;
  if (override_tflops > 0) {
    m.peak_tflops = override_tflops;
    m.peak_from = kPeakTflopsEnvVar;
  } else if (f->peak) {
    m.peak_tflops = f->peak->Mfu();
    m.peak_from = fmt::format("{} {}, {}", f->peak->model,
                              std::isnan(f->peak->bf16) ? "fp16" : "bf16", f->peak->source);
  } else {
    m.why = f->gpu_model.empty()
                ? "no GPU sampled to take a peak from"
                : fmt::format("{} is not in fullburn's peak table: {}=<its dense bf16 TFLOPS> "
                              "gives MFU",
                              f->gpu_model, kPeakTflopsEnvVar);
    return;
  }
  int rank0_gpus = 0;
  for (const GpuFacts& g : f->gpus) rank0_gpus += g.rank == 0;
  m.gpus = std::max(1, rank0_gpus / std::max(1, f->ranks_per_node));
  if (!(m.step_s > 0)) {
    m.why = "no step time to divide by";
    return;
  }
  m.value = m.flops_per_step / m.step_s / (m.peak_tflops * 1e12 * m.gpus);
}

std::string Tflop(double flops) {
  return flops >= 1e12 ? fmt::format("{:.3g} TFLOP", flops / 1e12)
                       : fmt::format("{:.3g} GFLOP", flops / 1e9);
}

// What Hopper's pipes say, for the evidence: "tensor activity 2%, SM activity 95%".
std::string GpmReading(const Facts& f) {
  std::string s = fmt::format("tensor activity {:.0f}%, SM activity {:.0f}%", f.tensor_active,
                              f.sm_active);
  if (!std::isnan(f.fp32_active)) s += fmt::format(", FP32 pipes {:.0f}%", f.fp32_active);
  return s + " (GPM medians)";
}

}  // namespace

void GatherEfficiency(const RunData& d, Facts* f) {
  auto mean = [&](double GpuFacts::*field) {
    double sum = 0;
    int n = 0;
    for (const GpuFacts& g : f->gpus)
      if (!std::isnan(g.*field)) sum += g.*field, ++n;
    return n ? sum / n : NAN;
  };
  f->sm_active = mean(&GpuFacts::sm_active);
  f->tensor_active = mean(&GpuFacts::tensor_active);
  f->sm_occupancy = mean(&GpuFacts::sm_occupancy);
  f->fp32_active = mean(&GpuFacts::fp32_active);
  f->gpu_model = GpuModel(d, *f);
  f->peak = f->gpu_model.empty() ? nullptr : FindGpuPeak(f->gpu_model);
  try {
    GatherMfu(d, f);
  } catch (const nlohmann::json::exception&) {  // a malformed count: no MFU
    f->flop_count.reset();
    f->mfu = Mfu();
    f->mfu.why = "the FLOP count's event is malformed";
  }
}

void PrecisionRule(const Facts& f, std::vector<Finding>* out) {
  if (f.trainer || !f.peak || !f.peak->TensorCores() || f.GpuUnused() || !(f.gpu_util >= kGpuLowUtil))
    return;
  const GpuPeak& p = *f.peak;
  double step_s = f.mfu.step_s;
  bool gpm_known = !std::isnan(f.tensor_active) && !std::isnan(f.sm_active);
  bool gpm_fp32 = gpm_known && f.tensor_active < kTensorIdle && f.sm_active >= kSmActiveLow;
  bool hooks_fp32 = f.flop_count && f.flop_count->device.find("cuda") != std::string::npos &&
                    f.flop_count->flops > 0 &&
                    f.flop_count->fp32_simt_flops >= kFp32FlopShare * f.flop_count->flops &&
                    !(gpm_known && f.tensor_active >= kTensorIdle);
  if (!gpm_fp32 && !hooks_fp32) return;
  double ratio = p.fp32 / p.Mfu();  // what fp32 takes of the 16-bit time
  std::string evidence;
  double in_fp32 = NAN;  // share of the time those matmuls take in fp32, at least
  if (hooks_fp32) {
    const Facts::FlopFacts& c = *f.flop_count;
    evidence = fmt::format(
        "the counted step ran {} of its {} of matmuls and convolutions in fp32 outside tensor "
        "cores (>= {}: no autocast{})",
        Percent(c.fp32_simt_flops / c.flops), Tflop(c.flops), Percent(kFp32FlopShare),
        std::isnan(p.tf32) ? ", and this GPU has no TF32" : ", TF32 off");
    if (step_s > 0) in_fp32 = std::min(1.0, c.fp32_simt_flops / (p.fp32 * 1e12) / step_s);
  }
  if (gpm_known) {
    evidence += (evidence.empty() ? "" : "; ") + GpmReading(f) +
                (gpm_fp32 ? fmt::format(": tensor cores idle (< {:.0f}%) while the SMs work (>= {:.0f}%)",
                                        kTensorIdle, kSmActiveLow)
                          : "");
    // The FP32 pipes' busy share bounds the fp32 math's time from the GPU's side.
    if (std::isnan(in_fp32) && !std::isnan(f.fp32_active)) in_fp32 = f.fp32_active / 100;
  }
  double share = std::isnan(in_fp32) ? 0 : in_fp32 * (1 - ratio);
  evidence += fmt::format(
      "; on {} ({:.4g} TFLOPS fp32, {:.4g} TFLOPS {} on tensor cores: {}) the same math in {} "
      "takes {:.0f}x less time{}",
      p.model, p.fp32, p.Mfu(), std::isnan(p.bf16) ? "fp16" : "bf16", p.source,
      std::isnan(p.bf16) ? "fp16" : "bf16", 1 / ratio,
      std::isnan(in_fp32)
          ? ""
          : fmt::format(": those matmuls take at least {} of the time in fp32, so up to {} of "
                        "the step comes back",
                        Percent(in_fp32), Percent(share)));
  bool fp16 = std::isnan(p.bf16);
  std::string fix = fmt::format(
      fmt::runtime(FixFor(CauseId::kPrecision, FrameworkFrom(f.loader_framework, f.trainer))),
      fmt::arg("dtype", fp16 ? "torch.float16" : "torch.bfloat16"),
      fmt::arg("scaler", fp16 ? " with a torch.amp.GradScaler (this GPU has no bf16)" : ""),
      fmt::arg("lightning", fp16 ? "16-mixed" : "bf16-mixed"), fmt::arg("hf", fp16 ? "fp16" : "bf16"),
      fmt::arg("short", fp16 ? "fp16" : "bf16"));
  if (!std::isnan(p.tf32) && FrameworkFrom(f.loader_framework, f.trainer) == Framework::kPytorch)
    fix += ", or at least torch.backends.cuda.matmul.allow_tf32 = True (TF32 tensor cores for fp32 matmuls)";
  out->push_back({CauseId::kPrecision, CauseOf(CauseId::kPrecision).title, evidence, share,
                  hooks_fp32 && gpm_fp32 ? 0.9 : hooks_fp32 ? 0.8 : 0.6, fix});
}

void LowMfuRule(const Facts& f, std::vector<Finding>* out) {
  if (f.trainer || Named(*out, CauseId::kPrecision) || !(f.gpu_util >= kGpuBusy)) return;
  bool low_mfu = f.mfu.known() && f.mfu.value < kMfuLow;
  bool low_sm = !std::isnan(f.sm_active) && f.sm_active < kSmActiveLow;
  if (!low_mfu && !low_sm) return;
  std::string evidence = fmt::format("GPU utilization median {:.0f}% (>= {:.0f}%: busy)", f.gpu_util, kGpuBusy);
  if (f.mfu.known())
    evidence += "; " + f.mfu.Text() + (low_mfu ? fmt::format(" (< {})", Percent(kMfuLow)) : "");
  if (!std::isnan(f.sm_active))
    evidence += fmt::format("; SM activity {:.0f}%{}", f.sm_active,
                            low_sm ? fmt::format(" (< {:.0f}%: DCGM's line for ineffective use)", kSmActiveLow) : "");
  if (!std::isnan(f.sm_occupancy)) evidence += fmt::format(", SM occupancy {:.0f}%", f.sm_occupancy);
  // SMs idle inside busy time are what filling them wins back, up to DCGM's
  // "necessary" line; MFU alone says what is possible, not what a change gains.
  double share = low_sm ? 1 - f.sm_active / kSmActiveGood : 0;
  std::string batch;
  if (f.batch > 0 && f.mem_peak_share > 0 && f.mem_peak_share < kMemHeadroom)
    batch = fmt::format("a larger batch: {} -> {} (GPU memory {} used); ", f.batch,
                        static_cast<int64_t>(f.batch * std::max(2.0, std::floor(0.8 / f.mem_peak_share))),
                        Percent(f.mem_peak_share));
  std::string fix = fmt::format(
      fmt::runtime(FixFor(CauseId::kLowMfu, FrameworkFrom(f.loader_framework, f.trainer))),
      fmt::arg("batch", batch));
  out->push_back({CauseId::kLowMfu, CauseOf(CauseId::kLowMfu).title, evidence, share,
                  low_mfu && low_sm ? 0.8 : 0.6, fix});
}

}  // namespace diagnose

std::string Mfu::Text() const {
  if (!known()) return "MFU -: " + why;
  std::string s = fmt::format("MFU {}{}: {}/step in {:.1f} ms of {:.4g} TFLOPS × {} GPU{} ({})",
                              uncounted.empty() ? "" : ">= ", Percent(value, 1),
                              diagnose::Tflop(flops_per_step), step_s * 1e3, peak_tflops, gpus,
                              gpus == 1 ? "" : "s", peak_from);
  if (!uncounted.empty())
    s += fmt::format("; a lower bound: {} ran without a FLOP formula", fmt::join(uncounted, ", "));
  return s;
}

Mfu ComputeMfu(const RunData& run) { return diagnose::Gather(run).mfu; }

std::string RenderMfu(const Mfu& m) { return m.counted ? "  " + m.Text() + "\n" : ""; }

nlohmann::json MfuJson(const Mfu& m) {
  auto number = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
  return {{"value", number(m.value)},           {"flops_per_step", number(m.flops_per_step)},
          {"step_s", number(m.step_s)},         {"peak_tflops", number(m.peak_tflops)},
          {"gpus", m.gpus},                     {"peak_from", m.peak_from},
          {"lower_bound", !m.uncounted.empty()}, {"uncounted", m.uncounted},
          {"why", m.why}};
}

std::string RenderLiveMfu(const Mfu& m) {
  return m.known() ? fmt::format(" | MFU {}{}", m.uncounted.empty() ? "" : ">=", Percent(m.value))
                   : "";
}

}  // namespace fullburn
