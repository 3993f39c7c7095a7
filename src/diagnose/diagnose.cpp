// The rules of the diagnosis (docs/diagnosis.md explains each threshold).
#include "fullburn/diagnose.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fullburn/telemetry.h"

namespace fullburn {
namespace {

// Thresholds, one place. Sources in docs/diagnosis.md.
constexpr double kDataWaitShare = 0.10;   // of step time: the input pipeline is a bottleneck
constexpr double kCpuSaturated = 80;      // host.cpu_util %, all cores
constexpr double kIoWait = 10;            // host.cpu_iowait %
constexpr double kGpuLowUtil = 50;        // gpuN.util %, median
constexpr double kGpuBusy = 80;           // gpuN.util %, median: healthy
constexpr double kMemHeadroom = 0.5;      // peak GPU memory / total below this: the batch can grow
constexpr double kMemNearFull = 0.95;     // peak GPU memory / total above this: near OOM
constexpr double kHostMemLow = 0.05;      // host available / total below this
constexpr double kSwapShare = 0.10;       // share of samples swapping
constexpr double kThrottleShare = 0.05;   // share of samples throttled
constexpr double kMinShare = 0.05;        // smaller losses are not reported as problems

double Median(const Series& s) {
  if (s.empty()) return NAN;
  std::vector<double> v;
  for (const SeriesPoint& p : s) v.push_back(p.v);
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double Max(const Series& s) {
  double m = NAN;
  for (const SeriesPoint& p : s) m = std::isnan(m) ? p.v : std::max(m, p.v);
  return m;
}

const Series* Find(const std::map<std::string, Series>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() || it->second.empty() ? nullptr : &it->second;
}

struct Facts {
  std::vector<int> gpus;
  double gpu_util = NAN;       // mean over GPUs of the median
  double mem_peak_share = NAN; // max over GPUs of peak used / total
  double cpu = NAN, iowait = NAN;
  double swap_share = 0, host_avail_min_share = NAN;
  double power_share = 0, thermal_share = 0;
  bool have_steps = false;
  double data_wait_share = NAN;  // of step time over timed steps
  double wall_s = 0;
  std::string precision;
  int cores = 0;          // host.cpuN series
  int data_threads = -1;  // data.threads of a fullburn train run (0: tuned)
};

Facts Gather(const RunInfo& run, const std::map<std::string, Series>& m, const std::vector<StepRecord>& steps) {
  Facts f;
  for (int g = 0; g < 64; ++g)
    if (Find(m, "gpu" + std::to_string(g) + ".util")) f.gpus.push_back(g);
  double util_sum = 0;
  for (int g : f.gpus) {
    std::string p = "gpu" + std::to_string(g) + ".";
    util_sum += Median(*Find(m, p + "util"));
    const Series *used = Find(m, p + "mem_used_bytes"), *total = Find(m, p + "mem_total_bytes");
    if (used && total && Max(*total) > 0) {
      double share = Max(*used) / Max(*total);
      f.mem_peak_share = std::isnan(f.mem_peak_share) ? share : std::max(f.mem_peak_share, share);
    }
    if (const Series* t = Find(m, p + "throttle_reasons")) {
      double power = 0, thermal = 0;
      for (const SeriesPoint& s : *t) {
        power += IsPowerThrottled(static_cast<uint64_t>(s.v));
        thermal += IsThermalThrottled(static_cast<uint64_t>(s.v));
      }
      f.power_share = std::max(f.power_share, power / t->size());
      f.thermal_share = std::max(f.thermal_share, thermal / t->size());
    }
  }
  if (!f.gpus.empty()) f.gpu_util = util_sum / f.gpus.size();
  if (const Series* s = Find(m, "host.cpu_util")) f.cpu = Median(*s);
  if (const Series* s = Find(m, "host.cpu_iowait")) f.iowait = Median(*s);
  const Series *in = Find(m, "host.swap_in_per_s"), *out = Find(m, "host.swap_out_per_s");
  if (in || out) {
    size_t n = 0, swapping = 0;
    for (const Series* s : {in, out}) {
      if (!s) continue;
      n = std::max(n, s->size());
      for (const SeriesPoint& p : *s) swapping += p.v > 0;
    }
    f.swap_share = n ? std::min(1.0, static_cast<double>(swapping) / n) : 0;
  }
  const Series *avail = Find(m, "host.mem_available_bytes"), *total = Find(m, "host.mem_total_bytes");
  if (avail && total && Max(*total) > 0) {
    double lo = INFINITY;
    for (const SeriesPoint& p : *avail) lo = std::min(lo, p.v);
    f.host_avail_min_share = lo / Max(*total);
  }
  double timed = 0, wait = 0;
  for (const StepRecord& r : steps) {
    if (!r.data_wait_s) continue;
    timed += r.step_s;
    wait += *r.data_wait_s;
  }
  f.have_steps = timed > 0;
  if (f.have_steps) f.data_wait_share = wait / timed;
  f.wall_s = run.end_time ? *run.end_time - run.start_time : 0;
  auto cfg = nlohmann::json::parse(run.config_json, nullptr, false);
  if (cfg.is_object() && cfg.contains("train") && cfg["train"].contains("precision"))
    f.precision = cfg["train"]["precision"].get<std::string>();
  if (cfg.is_object() && cfg.contains("data") && cfg["data"].contains("threads") && cfg["data"]["threads"].is_number())
    f.data_threads = cfg["data"]["threads"].get<int>();
  while (Find(m, "host.cpu" + std::to_string(f.cores) + ".util")) ++f.cores;
  return f;
}

std::string Pct(double share) { return fmt::format("{:.0f}%", share * 100); }

void InputRules(const Facts& f, std::vector<Finding>* out) {
  // With step records the data wait is measured; without, a GPU that idles
  // while the host is busy stands in for it.
  bool measured = f.have_steps && f.data_wait_share >= kDataWaitShare;
  bool inferred = !f.have_steps && !std::isnan(f.gpu_util) && f.gpu_util < kGpuLowUtil;
  if (!measured && !inferred) return;
  double share = measured ? f.data_wait_share : 1 - f.gpu_util / 100;
  std::string wait = measured ? fmt::format("the training loop waited for data {} of step time (>= {})",
                                            Pct(f.data_wait_share), Pct(kDataWaitShare))
                              : fmt::format("GPU utilization median {:.0f}% (< {:.0f}%)", f.gpu_util, kGpuLowUtil);
  double conf = measured ? 0.9 : 0.6;
  if (!std::isnan(f.iowait) && f.iowait >= kIoWait) {
    out->push_back({"input_io", "Input-bound: waiting on storage",
                    wait + fmt::format("; CPU iowait median {:.0f}% (>= {:.0f}%)", f.iowait, kIoWait), share, conf,
                    "read from local SSD or RAM: data.cache_mb = the dataset size, or pack it once "
                    "(fullburn pack SRC DST --format raw) for sequential reads"});
  } else if (!std::isnan(f.cpu) && f.cpu >= kCpuSaturated) {
    std::string fix =
        "decode less: fullburn pack SRC DST --format raw --max-side 256 (decoding disappears), smaller "
        "source images, or more cores for the loader";
    // A fixed worker count below the cores a loader may use comes first.
    if (f.data_threads > 0 && f.cores > 2 && f.data_threads < f.cores - 1)
      fix = fmt::format("data.threads {} -> {} (or 0: tuned); then ", f.data_threads, f.cores - 1) + fix;
    out->push_back({"input_cpu", "Input-bound: the CPU cannot prepare batches fast enough",
                    wait + fmt::format("; host CPU median {:.0f}% (>= {:.0f}%)", f.cpu, kCpuSaturated), share, conf,
                    fix});
  } else if (measured) {
    out->push_back({"input_workers", "Input-bound with idle cores: too few loader workers",
                    wait + fmt::format("; host CPU median {:.0f}% (< {:.0f}%)", f.cpu, kCpuSaturated), share, conf,
                    "data.threads = 0 (tuned) or raise it; data.prefetch = 0 (tuned) absorbs bursts"});
  } else if (!std::isnan(f.mem_peak_share) && f.mem_peak_share < kMemHeadroom) {
    out->push_back({"small_batch", "GPU underused: small batches or launch overhead",
                    wait + fmt::format("; host CPU median {:.0f}%; peak GPU memory {} of total", f.cpu,
                                       Pct(f.mem_peak_share)),
                    share, 0.6,
                    "raise the batch size (train.batch_size = auto finds the largest that fits); on CUDA, "
                    "capture the step in a CUDA graph"});
  }
}

void MemoryRules(const Facts& f, std::vector<Finding>* out) {
  if (!std::isnan(f.mem_peak_share) && f.mem_peak_share < kMemHeadroom && f.gpu_util < kGpuBusy)
    out->push_back({"memory_headroom", "GPU memory headroom: the batch can grow",
                    fmt::format("peak GPU memory {} of total (< {}), GPU utilization median {:.0f}%",
                                Pct(f.mem_peak_share), Pct(kMemHeadroom), f.gpu_util),
                    0, 0.8, "train.batch_size = auto (or about x" + fmt::format("{:.0f}", std::floor(0.8 / f.mem_peak_share)) + ")"});
  if (!std::isnan(f.mem_peak_share) && f.mem_peak_share > kMemNearFull)
    out->push_back({"memory_pressure", "GPU memory near full: out-of-memory risk",
                    fmt::format("peak GPU memory {} of total (> {})", Pct(f.mem_peak_share), Pct(kMemNearFull)), 0, 0.7,
                    "lower train.batch_size and raise train.accumulate, or use bf16"});
  bool swapping = f.swap_share >= kSwapShare;
  bool low = !std::isnan(f.host_avail_min_share) && f.host_avail_min_share < kHostMemLow;
  if (swapping || low)
    out->push_back({"memory_pressure", "Host memory pressure",
                    fmt::format("swapping in {} of samples (>= {}); lowest available memory {} of total", Pct(f.swap_share),
                                Pct(kSwapShare), std::isnan(f.host_avail_min_share) ? "-" : Pct(f.host_avail_min_share)),
                    swapping ? f.swap_share : 0, 0.7, "lower data.cache_mb or data.threads, or add RAM"});
}

void ThrottleRules(const Facts& f, std::vector<Finding>* out) {
  if (f.power_share >= kThrottleShare)
    out->push_back({"throttle_power", "Clocks held down by the power limit",
                    fmt::format("power-capped in {} of samples (>= {})", Pct(f.power_share), Pct(kThrottleShare)),
                    f.power_share, 0.8, "check the enforced power limit (nvidia-smi -q -d POWER) and the supply"});
  if (f.thermal_share >= kThrottleShare)
    out->push_back({"throttle_thermal", "Clocks held down by temperature",
                    fmt::format("thermally throttled in {} of samples (>= {})", Pct(f.thermal_share), Pct(kThrottleShare)),
                    f.thermal_share, 0.8, "improve cooling: airflow, fan curve, ambient temperature"});
}

}  // namespace

std::vector<Finding> Diagnose(const RunInfo& run, const std::map<std::string, Series>& samples,
                              const std::vector<StepRecord>& steps) {
  Facts f = Gather(run, samples, steps);
  std::vector<Finding> out;
  InputRules(f, &out);
  MemoryRules(f, &out);
  ThrottleRules(f, &out);
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) { return a.share_lost > b.share_lost; });
  bool problem = std::any_of(out.begin(), out.end(), [](const Finding& x) { return x.share_lost >= kMinShare; });
  if (!problem) {
    std::string evidence = !std::isnan(f.gpu_util) ? fmt::format("GPU utilization median {:.0f}%", f.gpu_util)
                         : f.have_steps ? fmt::format("data wait {} of step time (< {})", Pct(f.data_wait_share), Pct(kDataWaitShare))
                                        : "no GPU readings and no step records: nothing pointed to a bottleneck";
    std::string fix = f.precision == "fp32" ? "compute-bound: train.precision = bf16 (or fp16 on CUDA) for tensor cores"
                                            : "compute-bound: nothing to fix in the input or memory";
    out.insert(out.begin(), {"healthy", "No bottleneck found", evidence, 0, f.have_steps || !f.gpus.empty() ? 0.8 : 0.3, fix});
  }
  return out;
}

std::string RenderFindings(const std::vector<Finding>& findings, size_t max_shown) {
  std::string s = "  findings:\n";
  for (size_t i = 0; i < findings.size() && i < max_shown; ++i) {
    const Finding& x = findings[i];
    s += fmt::format("    [{}] {}{}\n      why: {}\n      fix: {}\n", x.cause, x.title,
                     x.share_lost > 0 ? fmt::format(" (~{} of the time)", Pct(x.share_lost)) : "", x.evidence, x.fix);
  }
  return s;
}

nlohmann::json FindingsJson(const std::vector<Finding>& findings) {
  nlohmann::json out = nlohmann::json::array();
  for (const Finding& x : findings)
    out.push_back({{"cause", x.cause}, {"title", x.title}, {"evidence", x.evidence}, {"share_lost", x.share_lost},
                   {"confidence", x.confidence}, {"fix", x.fix}});
  return out;
}

}  // namespace fullburn
