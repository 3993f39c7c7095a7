// Statistics over stored series and the end-of-run summary numbers.
#include <algorithm>
#include <cmath>

#include "fullburn/report.h"

namespace fullburn {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p% of values <= it.
  double rank = std::ceil(p / 100.0 * values.size());
  size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(i, values.size() - 1)];
}

std::map<std::string, MetricStats> ComputeStats(const std::map<std::string, Series>& samples) {
  std::map<std::string, MetricStats> out;
  for (const auto& [name, series] : samples) {
    if (series.empty()) continue;
    std::vector<double> v;
    v.reserve(series.size());
    double sum = 0;
    for (const SeriesPoint& p : series) {
      v.push_back(p.v);
      sum += p.v;
    }
    MetricStats s;
    s.name = name;
    const MetricDef* def = FindMetric(name);
    s.unit = def ? def->unit : "";
    s.count = v.size();
    s.min = *std::min_element(v.begin(), v.end());
    s.max = *std::max_element(v.begin(), v.end());
    s.mean = sum / v.size();
    s.median = Percentile(v, 50);
    s.p95 = Percentile(v, 95);
    out[name] = s;
  }
  return out;
}

namespace {

const Series* Find(const std::map<std::string, Series>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() || it->second.empty() ? nullptr : &it->second;
}

std::optional<double> Max(const Series* s) {
  if (!s) return std::nullopt;
  double m = s->front().v;
  for (const SeriesPoint& p : *s) m = std::max(m, p.v);
  return m;
}

}  // namespace

RunSummary Summarize(const RunInfo& run, const std::map<std::string, Series>& samples) {
  RunSummary out;
  double end = run.end_time.value_or(run.start_time);
  if (!run.end_time)
    for (const auto& kv : samples)
      if (!kv.second.empty()) end = std::max(end, run.start_time + kv.second.back().t);
  out.wall_s = std::max(0.0, end - run.start_time);
  out.stats = ComputeStats(samples);
  for (int i = 0;; ++i) {
    std::string g = "gpu" + std::to_string(i) + ".";
    bool any = false;
    for (const auto& kv : samples) any |= kv.first.rfind(g, 0) == 0;
    if (!any) break;
    GpuRunSummary gs;
    gs.index = i;
    if (const Series* util = Find(samples, g + "util")) {
      size_t low = 0;
      for (const SeriesPoint& p : *util) low += p.v < 50.0;
      gs.low_util_share = static_cast<double>(low) / util->size();
    }
    gs.peak_mem_bytes = Max(Find(samples, g + "mem_used_bytes"));
    gs.mem_total_bytes = Max(Find(samples, g + "mem_total_bytes"));
    gs.peak_proc_mem_bytes = Max(Find(samples, g + "proc_mem_used_bytes"));
    if (const Series* reasons = Find(samples, g + "throttle_reasons")) {
      size_t throttled = 0;
      uint64_t seen = 0;
      for (const SeriesPoint& p : *reasons) {
        uint64_t mask = static_cast<uint64_t>(p.v);
        throttled += IsThrottled(mask);
        if (IsThrottled(mask)) seen |= mask;
      }
      gs.throttled_share = static_cast<double>(throttled) / reasons->size();
      for (const std::string& n : DecodeThrottleReasons(seen))
        if (n != "gpu_idle") gs.throttle_reasons_seen.push_back(n);
    }
    out.gpus.push_back(gs);
  }
  bool job_seen = std::any_of(out.gpus.begin(), out.gpus.end(),
                              [](const GpuRunSummary& g) { return g.peak_proc_mem_bytes > 0.0; });
  for (GpuRunSummary& g : out.gpus)
    if (job_seen && g.peak_proc_mem_bytes) g.used_by_job = *g.peak_proc_mem_bytes > 0;
  return out;
}

JobNow SummarizeJob(const RunInfo& run, const std::vector<StepRecord>& window,
                    std::optional<Finding> now) {
  JobNow job{run, {}, {}, {}, {}, {}, std::move(now)};
  if (window.empty()) return job;
  const StepRecord* latest = &window.front();
  double begin = INFINITY, end = -INFINITY, wait = 0, waited_steps = 0;
  int64_t samples = 0;
  std::vector<double> times;
  for (const StepRecord& r : window) {
    if (r.t > latest->t || (r.t == latest->t && r.step > latest->step)) latest = &r;
    begin = std::min(begin, r.t - r.step_s);
    end = std::max(end, r.t);
    samples += r.samples;
    times.push_back(r.step_s);
    if (r.data_wait_s) {
      wait += *r.data_wait_s;
      waited_steps += r.step_s;
    }
  }
  job.step = latest->step;
  if (std::isfinite(latest->loss)) job.loss = latest->loss;
  if (end > begin && samples > 0) job.samples_per_s = samples / (end - begin);
  job.step_s = Percentile(times, 50);
  if (waited_steps > 0) job.data_wait_share = wait / waited_steps;
  return job;
}

}  // namespace fullburn
