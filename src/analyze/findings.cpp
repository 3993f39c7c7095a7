// The trace's findings, in diagnose's vocabulary (docs/diagnosis.md, "From
// a profiler trace"). Shares are of the kernel span, HTA's denominator; on a
// CPU-only trace, of the steps' host time.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "internal.h"
#include "fullburn/gpu_peaks.h"
#include "fullburn/percent.h"

namespace fullburn {
namespace {

constexpr double kCpuDataShare = 0.10;  // diagnose's data-wait rule, for host-only traces

// The share of the kernel span at which the catalog names a cause from a trace.
double TraceShare(CauseId id) { return CauseOf(id).trace_share; }

// Traces time every op to the microsecond: one decimal.
std::string Pct(double share) { return Percent(share, 1); }
std::string Ms(double us) { return fmt::format("{:.1f} ms", us / 1e3); }

// "the GPU idle 38.2% of the kernel span (337.9 of 884.1 ms, ProfilerStep#5-#9)"
std::string IdleEvidence(const RankReport& r, double us) {
  return fmt::format("GPU idle {} of the kernel span ({:.1f} of {:.1f} ms, {})",
                     Pct(us / r.temporal.span_us), us / 1e3, r.temporal.span_us / 1e3, r.window);
}

std::string LoaderFix(const HostSummary& h) {
  if (h.data_loader_name == "fullburn.next_batch")  // fullburn train profile.steps
    return "fullburn train's loader does not keep up: more data.threads while the host has idle "
           "cores (0 tunes them), a pack (fullburn pack) or data.cache_mb for the decode, "
           "data.prefetch for bursts";
  if (h.data_loader_name.find("_SingleProcessDataLoaderIter") != std::string::npos)
    return "the DataLoader loads in the training process (num_workers=0): "
           "DataLoader(num_workers=cores - 1, pin_memory=True, persistent_workers=True); "
           "fullburn tune -- CMD measures the settings on the script as it is";
  return "the loader's workers do not keep up: more num_workers while the host has idle cores "
         "(fullburn run -- CMD samples them), else lighter per-sample work (fullburn pack "
         "--max-side 256 read by python/fullburn_pack.py, GPU augmentation), prefetch_factor=4";
}

double LoaderConfidence(const HostSummary& h) {
  return h.data_loader_name.find("_SingleProcessDataLoaderIter") != std::string::npos ? 0.85 : 0.7;
}

void Input(const RankReport& r, std::vector<Finding>* out) {
  double share = r.idle_causes.data_loader_us / r.temporal.span_us;
  if (share < TraceShare(CauseId::kInputWorkers)) return;
  Finding f;
  f.cause = CauseId::kInputWorkers;
  f.title =
      fmt::format("input-bound: the GPU waited {} of the time for the DataLoader", Pct(share));
  f.evidence = fmt::format("{} while the host was in {} ({} spans, {} in all)",
                           IdleEvidence(r, r.idle_causes.data_loader_us), r.host.data_loader_name,
                           r.host.data_loader_spans, Ms(r.host.data_loader_us));
  f.share_lost = share;
  f.confidence = LoaderConfidence(r.host);
  f.fix = LoaderFix(r.host);
  out->push_back(f);
}

// "cudaStreamSynchronize in aten::item x12, ..." (the three most frequent).
std::string Counted(const std::map<std::string, int64_t>& m) {
  std::vector<std::pair<std::string, int64_t>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (size_t i = 0; i < v.size() && i < 3; ++i)
    out += fmt::format("{}{} x{}", i ? ", " : "", v[i].first, v[i].second);
  return out;
}

void HostSync(const RankReport& r, std::vector<Finding>* out) {
  double share = r.idle_causes.sync_us / r.temporal.span_us;
  if (share < TraceShare(CauseId::kHostSync)) return;
  Finding f;
  f.cause = CauseId::kHostSync;
  f.title = fmt::format("host syncs: the GPU idled {} after the host waited for it", Pct(share));
  f.evidence = fmt::format("{} in gaps that began while the host was in a synchronization ({})",
                           IdleEvidence(r, r.idle_causes.sync_us), Counted(r.host.syncs));
  if (!r.host.sync_sites.empty()) f.evidence += "; called at " + Counted(r.host.sync_sites);
  f.share_lost = share;
  f.confidence = 0.8;
  f.fix = FixFor(CauseId::kHostSync, Framework::kPytorch);
  out->push_back(f);
}

void Copies(const RankReport& r, std::vector<Finding>* out) {
  const CopyStats* h2d = nullptr;
  for (const CopyStats& c : r.copies)
    if (c.direction == "HtoD") h2d = &c;
  if (!h2d) return;
  double lost = r.idle_causes.blocking_copy_us + h2d->us;
  double share = lost / r.temporal.span_us;
  if (share < TraceShare(CauseId::kH2dCopy)) return;
  Finding f;
  f.cause = CauseId::kH2dCopy;
  f.title = fmt::format("host-to-device copies cost {} of the GPU's time", Pct(share));
  f.evidence = fmt::format(
      "{} copies, {:.1f} MB at {:.1f} GB/s, {:.1f} ms on the GPU; {} from pageable memory, {} "
      "synchronous; GPU idle after blocking copies {:.1f} ms ({})",
      h2d->count, h2d->bytes / 1e6, h2d->GBps(), h2d->us / 1e3, h2d->pageable, h2d->synchronous,
      r.idle_causes.blocking_copy_us / 1e3, r.window);
  f.share_lost = share;
  f.confidence = h2d->pageable > 0 ? 0.75 : 0.5;
  f.fix = h2d->pageable > 0
              ? "pageable: set pin_memory=True on the DataLoader and copy with "
                ".to(device, non_blocking=True), so the copy runs beside compute (Nsight's "
                "\"async memcpy from pageable memory\" rule)"
              : "copy the next batch during this step (a side stream, non_blocking=True), uint8 "
                "on the wire and normalize on the device";
  out->push_back(f);
}

void LaunchBound(const RankReport& r, std::vector<Finding>* out) {
  double us = r.idle_causes.other_us + r.idle_causes.optimizer_us;
  double share = us / r.temporal.span_us;
  if (share < TraceShare(CauseId::kSmallBatch)) return;
  Finding f;
  f.cause = CauseId::kSmallBatch;
  f.title = fmt::format("launch-bound: the GPU waited {} of the time for the host to launch work",
                        Pct(share));
  f.evidence = fmt::format(
      "{} outside data loading, syncs and copies ({:.1f} ms of it in Optimizer.step); {} of "
      "{} launches ran shorter on the GPU than their launch call (median kernel {:.0f} us, "
      "launch {:.0f} us, launch delay {:.0f} us)",
      IdleEvidence(r, us), r.idle_causes.optimizer_us / 1e3, Pct(r.launches.shorter_than_launch),
      r.launches.launches, r.launches.gpu_median_us, r.launches.cpu_median_us,
      r.launches.delay_median_us);
  f.share_lost = share;
  f.confidence = r.launches.shorter_than_launch >= 0.5 ? 0.7 : 0.5;
  f.fix =
      "fewer, longer kernels: CUDA graphs (torch.compile(mode=\"reduce-overhead\")), a "
      "larger batch, fused ops";
  if (r.idle_causes.optimizer_us > 0.25 * us)
    f.fix += "; for Optimizer.step: foreach=True or fused=True";
  out->push_back(f);
}

void BetweenSteps(const RankReport& r, std::vector<Finding>* out) {
  double share = r.idle_causes.between_steps_us / r.temporal.span_us;
  if (share < TraceShare(CauseId::kLoopOverhead)) return;
  Finding f;
  f.cause = CauseId::kLoopOverhead;
  f.title = fmt::format("the loop's own work between steps idles the GPU {}", Pct(share));
  f.evidence = IdleEvidence(r, r.idle_causes.between_steps_us) +
               " while the host was outside every ProfilerStep (Python between prof.step() and "
               "the next step's first op)";
  f.share_lost = share;
  f.confidence = 0.6;
  f.fix =
      "log, print and compute metrics every N steps rather than every step; move slow calls "
      "(a synchronous logger, file writes) to a thread";
  out->push_back(f);
}

// A Gloo job has no communication kernels: its collectives run on the host,
// and the GPU's idle time while the host was in one is what they expose.
void Comm(const RankReport& r, std::vector<Finding>* out) {
  if (r.temporal.span_us <= 0) return;
  bool gloo = r.comm.kernels == 0;
  double share = (gloo ? r.idle_causes.collective_us : r.comm.Exposed()) / r.temporal.span_us;
  if (share < TraceShare(CauseId::kCommunication)) return;
  Finding f;
  f.cause = CauseId::kCommunication;
  f.share_lost = share;
  f.confidence = 0.7;
  if (gloo) {
    f.title =
        fmt::format("exposed communication: the GPU idled {} in Gloo collectives", Pct(share));
    f.evidence = fmt::format(
        "GPU idle {} of the kernel span ({:.1f} of {:.1f} ms, {}) while the host ran Gloo "
        "collectives ({} of them, {:.1f} ms within the steps)",
        Pct(share), r.idle_causes.collective_us / 1e3, r.temporal.span_us / 1e3, r.window,
        r.comm.host_collectives, r.comm.host_collective_us / 1e3);
    f.fix =
        "on GPUs, backend=\"nccl\": collectives as kernels that overlap backward; with Gloo, "
        "fewer and larger reductions (DDP bucket_cap_mb, no_sync over accumulated micro-batches)";
  } else {
    f.title = fmt::format("exposed communication: {} of the kernel span", Pct(share));
    f.evidence = fmt::format(
        "{} communication kernels, {:.1f} ms merged, {} of it overlapped by computation ({}); "
        "{:.1f} ms exposed",
        r.comm.kernels, r.comm.comm_us / 1e3, Pct(r.comm.overlap_us / r.comm.comm_us), r.window,
        r.comm.Exposed() / 1e3);
    f.fix =
        "overlap communication with backward (DDP buckets: bucket_cap_mb), bf16 gradient "
        "compression hooks, more accumulation per reduction (no_sync)";
  }
  out->push_back(f);
}

void HostOnly(const RankReport& r, std::vector<Finding>* out) {
  if (r.host.window_us <= 0) return;
  double share = r.host.data_loader_us / r.host.window_us;
  if (share < kCpuDataShare) return;
  Finding f;
  f.cause = CauseId::kInputWorkers;
  f.title = fmt::format("input-bound: {} of step time in the DataLoader", Pct(share));
  f.evidence = fmt::format(
      "the host spent {} of {} in {} ({} spans; a CPU-only trace: GPU idle "
      "time not measured)",
      Ms(r.host.data_loader_us), Ms(r.host.window_us), r.host.data_loader_name,
      r.host.data_loader_spans);
  f.share_lost = share;
  f.confidence = LoaderConfidence(r.host) - 0.1;
  f.fix = LoaderFix(r.host);
  out->push_back(f);
}

// fp32 matmuls and convolutions without tensor cores, on a GPU that has
// them: what their time would be in bf16 (fp16 where the GPU has no bf16),
// from the peak table's figures for the trace's device.
void Precision(const RankReport& r, std::vector<Finding>* out) {
  auto it = r.gemm_math_us.find(KernelMath::kFp32Simt);
  const GpuPeak* peak = r.device_name.empty() ? nullptr : FindGpuPeak(r.device_name);
  if (it == r.gemm_math_us.end() || !peak || !peak->TensorCores() || r.temporal.span_us <= 0) return;
  double in_fp32 = it->second / r.temporal.span_us;
  if (in_fp32 < TraceShare(CauseId::kPrecision)) return;
  bool fp16 = std::isnan(peak->bf16);
  double share = in_fp32 * (1 - peak->fp32 / peak->Mfu());
  double matmuls = 0;
  for (const auto& [math, us] : r.gemm_math_us) matmuls += us;
  Finding f;
  f.cause = CauseId::kPrecision;
  f.title = fmt::format("fp32 matmuls without tensor cores: {} of the GPU's time", Pct(in_fp32));
  f.evidence = fmt::format(
      "{} of GEMM and convolution kernels ran fp32 on CUDA cores (SIMT kernel names), {} of "
      "the kernel span ({}), {} of all matmul time; on {} ({:.4g} TFLOPS fp32, {:.4g} TFLOPS "
      "{} on tensor cores) the same math in {} takes {:.0f}x less",
      Ms(it->second), Pct(in_fp32), r.window, Pct(it->second / matmuls), peak->model, peak->fp32,
      peak->Mfu(), fp16 ? "fp16" : "bf16", fp16 ? "fp16" : "bf16", peak->Mfu() / peak->fp32);
  f.share_lost = share;
  f.confidence = 0.8;
  f.fix = fmt::format(fmt::runtime(FixFor(CauseId::kPrecision, Framework::kPytorch)),
                      fmt::arg("dtype", fp16 ? "torch.float16" : "torch.bfloat16"),
                      fmt::arg("scaler", fp16 ? " with a torch.amp.GradScaler (this GPU has no bf16)" : ""),
                      fmt::arg("lightning", fp16 ? "16-mixed" : "bf16-mixed"),
                      fmt::arg("hf", fp16 ? "fp16" : "bf16"), fmt::arg("short", fp16 ? "fp16" : "bf16"));
  if (!std::isnan(peak->tf32))
    f.fix += ", or at least torch.backends.cuda.matmul.allow_tf32 = True (TF32 tensor cores)";
  out->push_back(f);
}

Finding Healthy(const RankReport& r) {
  Finding f;
  f.cause = CauseId::kHealthy;
  f.title = "no idle cause costs 5% of the GPU's time";
  if (r.gpu_ops > 0 && r.temporal.span_us > 0)
    f.evidence = fmt::format("GPU busy {} of the kernel span ({}): computation {}, idle {}",
                             Pct(1 - r.temporal.idle_us / r.temporal.span_us), r.window,
                             Pct(r.temporal.compute_us / r.temporal.span_us),
                             Pct(r.temporal.idle_us / r.temporal.span_us));
  else
    f.evidence =
        fmt::format("CPU-only trace: data loading {} of the host time analysed",
                    Pct(r.host.window_us > 0 ? r.host.data_loader_us / r.host.window_us : 0));
  f.confidence = r.gpu_ops > 0 ? 0.6 : 0.3;
  f.fix = r.gpu_ops > 0 ? "compute-bound: bf16 autocast, channels_last, torch.compile"
                        : "record the trace on a GPU (ProfilerActivity.CUDA) to see the GPU's time";
  return f;
}

}  // namespace

void analyze::SortFindings(std::vector<Finding>* v) {
  std::stable_sort(v->begin(), v->end(),
                   [](const Finding& a, const Finding& b) { return a.share_lost > b.share_lost; });
}

std::vector<Finding> RankFindings(const RankReport& r) {
  std::vector<Finding> out;
  if (r.gpu_ops > 0 && r.temporal.span_us > 0) {
    Input(r, &out);
    HostSync(r, &out);
    Copies(r, &out);
    LaunchBound(r, &out);
    BetweenSteps(r, &out);
    Comm(r, &out);
    Precision(r, &out);
  } else {
    HostOnly(r, &out);
  }
  analyze::SortFindings(&out);
  // healthy's line: below it, run-to-run noise.
  if (out.empty() || out.front().share_lost < TraceShare(CauseId::kHealthy)) out.push_back(Healthy(r));
  return out;
}

}  // namespace fullburn
