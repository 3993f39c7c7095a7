// Stored records as tracker points, and the feed that reads them from the store.
#include <algorithm>
#include <cmath>

#include "fullburn/trackers.h"

namespace fullburn {
namespace {

// MLflow's own system-metric names (mlflow/system_metrics/metrics/*.py),
// for rank 0's readings, so its System Metrics tab charts them.
struct MlflowName {
  MetricScope scope;
  const char* suffix;
  const char* name;  // "{}" is the GPU's index
  double scale;
};
const MlflowName kMlflowNames[] = {
    {MetricScope::kGpu, "util", "gpu_{}_utilization_percentage", 1},
    {MetricScope::kGpu, "mem_used_bytes", "gpu_{}_memory_usage_megabytes", 1e-6},
    {MetricScope::kGpu, "power_w", "gpu_{}_power_usage_watts", 1},
    {MetricScope::kHostCpu, "util", "cpu_utilization_percentage", 1},
    {MetricScope::kHost, "mem_used_bytes", "system_memory_usage_megabytes", 1e-6},
};

std::string Fill(const char* pattern, int index) {
  std::string s = pattern;
  size_t at = s.find("{}");
  if (at != std::string::npos) s.replace(at, 2, std::to_string(index));
  return s;
}

// Per-core readings (host.cpu3.user: five per core) would bury a tracker's
// chart list; the all-cores ones stay. A bitmask is no scalar to chart.
bool Charted(const MetricDef* def) {
  if (!def) return true;  // not the catalog's (another rank's forwarded reading): keep
  if (def->scope == MetricScope::kCore) return false;
  return std::string(def->suffix) != "throttle_reasons";
}

int64_t SampleStep(const RunInfo& run, double t) {
  double interval = run.interval_s > 0 ? run.interval_s : 1.0;
  return static_cast<int64_t>(std::llround(t / interval));
}

void Add(std::vector<TrackerPoint>* out, std::string key, double v, int64_t step, double unix_time) {
  if (std::isfinite(v)) out->push_back({std::move(key), v, step, unix_time});
}

// `numerator` / `denominator` * 100 where both have a reading at the same t.
void AddShare(std::vector<TrackerPoint>* out, const RunInfo& run, const std::map<std::string, Series>& samples,
              const std::string& numerator, const std::string& denominator, const std::string& key) {
  auto n = samples.find(numerator), d = samples.find(denominator);
  if (n == samples.end() || d == samples.end()) return;
  std::map<double, double> totals;
  for (const SeriesPoint& p : d->second) totals[p.t] = p.v;
  for (const SeriesPoint& p : n->second) {
    auto total = totals.find(p.t);
    if (total == totals.end() || total->second <= 0) continue;
    Add(out, key, 100.0 * p.v / total->second, SampleStep(run, p.t), run.start_time + p.t);
  }
}

}  // namespace

std::string TrackerKey(const std::string& stored_name, TrackerStyle style, double* scale) {
  *scale = 1;
  int index = 0, rank = 0;
  const MetricDef* def = FindMetric(stored_name, &index, &rank);
  if (style == TrackerStyle::kMlflow && def && rank == 0) {
    for (const MlflowName& m : kMlflowNames) {
      if (m.scope == def->scope && std::string(m.suffix) == def->suffix) {
        *scale = m.scale;
        return "system/" + Fill(m.name, index);
      }
    }
  }
  return "fullburn/" + stored_name;
}

std::vector<TrackerPoint> SamplePoints(const RunInfo& run, const std::map<std::string, Series>& samples,
                                       TrackerStyle style) {
  std::vector<TrackerPoint> out;
  for (const auto& [name, series] : samples) {
    if (!Charted(FindMetric(name))) continue;
    double scale = 1;
    std::string key = TrackerKey(name, style, &scale);
    for (const SeriesPoint& p : series) Add(&out, key, p.v * scale, SampleStep(run, p.t), run.start_time + p.t);
  }
  if (style != TrackerStyle::kMlflow) return out;
  // The shares MLflow's monitor logs beside the amounts.
  AddShare(&out, run, samples, "host.mem_used_bytes", "host.mem_total_bytes", "system/system_memory_usage_percentage");
  for (const auto& [name, series] : samples) {
    int index = 0, rank = 0;
    const MetricDef* def = FindMetric(name, &index, &rank);
    if (!def || rank != 0 || def->scope != MetricScope::kGpu) continue;
    std::string gpu = "gpu" + std::to_string(index) + ".";
    std::string key = "system/gpu_" + std::to_string(index);
    if (std::string(def->suffix) == "mem_used_bytes")
      AddShare(&out, run, samples, name, gpu + "mem_total_bytes", key + "_memory_usage_percentage");
    if (std::string(def->suffix) == "power_w")
      AddShare(&out, run, samples, name, gpu + "power_limit_w", key + "_power_usage_percentage");
  }
  return out;
}

std::vector<TrackerPoint> StepPoints(const RunInfo& run, const std::vector<StepRecord>& steps) {
  std::vector<TrackerPoint> out;
  for (const StepRecord& s : steps) {
    std::string key = "fullburn/" + (s.rank > 0 ? "rank" + std::to_string(s.rank) + "." : std::string());
    double at = run.start_time + s.t;
    if (s.step_s > 0) {
      Add(&out, key + "step_time_ms", s.step_s * 1000, s.step, at);
      Add(&out, key + "steps_per_s", 1 / s.step_s, s.step, at);
      if (s.samples > 0) Add(&out, key + "samples_per_s", s.samples / s.step_s, s.step, at);
      if (s.data_wait_s) Add(&out, key + "data_wait_pct", 100 * *s.data_wait_s / s.step_s, s.step, at);
    }
    Add(&out, key + "loss", s.loss, s.step, at);
    if (s.lr > 0) Add(&out, key + "lr", s.lr, s.step, at);
  }
  return out;
}

std::vector<TrackerPoint> DiagnosisPoints(const std::optional<Finding>& top, const Mfu& mfu, int64_t step,
                                          double unix_time) {
  std::vector<TrackerPoint> out;
  if (top) Add(&out, "fullburn/now/" + top->name() + "_pct", 100 * top->share_lost, step, unix_time);
  if (mfu.known()) Add(&out, "fullburn/mfu_pct", 100 * mfu.value, step, unix_time);
  return out;
}

std::vector<TrackerPoint> RunDiagnosisPoints(const RunData& run) {
  double end_t = 0;
  for (const auto& [name, series] : run.samples)
    if (!series.empty()) end_t = std::max(end_t, series.back().t);
  for (const StepRecord& s : run.steps) end_t = std::max(end_t, s.t);
  std::vector<Finding> findings = Diagnose(run);
  std::optional<Finding> top;
  if (!findings.empty()) top = findings.front();
  std::vector<TrackerPoint> d =
      DiagnosisPoints(top, ComputeMfu(run), SampleStep(run.run, end_t), run.run.start_time + end_t);
  // The whole run's diagnosis, not the window's: fullburn/run/<cause>_pct.
  for (TrackerPoint& p : d)
    if (p.key.rfind("fullburn/now/", 0) == 0) p.key = "fullburn/run/" + p.key.substr(13);
  return d;
}

std::vector<TrackerPoint> RunPoints(const RunData& run, TrackerStyle style) {
  std::vector<TrackerPoint> out = SamplePoints(run.run, run.samples, style);
  std::vector<TrackerPoint> steps = StepPoints(run.run, run.steps);
  out.insert(out.end(), steps.begin(), steps.end());
  std::vector<TrackerPoint> d = RunDiagnosisPoints(run);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

TrackerFeed::TrackerFeed(RunInfo run, TrackerStyle style) : run_(run), style_(style), live_(std::move(run)) {}

Result<TrackerBatch> TrackerFeed::Poll(RunStore* store) {
  TrackerBatch batch;
  auto run = store->GetRun(std::to_string(run_.id));
  if (!run.ok()) return run.status();
  run_ = *run;
  batch.run = *run;
  batch.finished = run->status != "running";

  auto samples = store->LoadSamples(run_.id, read_to_ - kLookBackS);
  if (!samples.ok()) return samples.status();
  std::map<std::string, Series> fresh;
  std::map<double, std::vector<std::pair<std::string, double>>> by_time;
  for (auto& [name, series] : *samples) {
    auto last = last_t_.find(name);
    for (const SeriesPoint& p : series) {
      if (last != last_t_.end() && p.t <= last->second) continue;
      fresh[name].push_back(p);
      by_time[p.t].emplace_back(name, p.v);
      read_to_ = std::max(read_to_, p.t);
    }
    if (!fresh[name].empty()) last_t_[name] = fresh[name].back().t;
  }
  batch.points = SamplePoints(run_, fresh, style_);
  for (const auto& [t, readings] : by_time) live_.AddReadings(t, readings);

  auto steps = store->LoadSteps(run_.id, steps_to_ - kLookBackS);
  if (!steps.ok()) return steps.status();
  std::vector<StepRecord> new_steps;
  for (const StepRecord& s : *steps) {
    auto last = last_step_.find(s.rank);
    if (last != last_step_.end() && s.step <= last->second) continue;
    last_step_[s.rank] = s.step;
    steps_to_ = std::max(steps_to_, s.t);
    new_steps.push_back(s);
  }
  std::vector<TrackerPoint> step_points = StepPoints(run_, new_steps);
  batch.points.insert(batch.points.end(), step_points.begin(), step_points.end());
  live_.AddSteps(new_steps);

  auto events = store->LoadEvents(run_.id, events_to_);
  if (!events.ok()) return events.status();
  for (const RunEvent& e : *events) events_to_ = std::max(events_to_, e.t);
  live_.AddEvents(*events);
  batch.events = std::move(*events);

  double now = std::max(read_to_, steps_to_);
  if (std::isfinite(now) && now - last_diagnosis_t_ >= LiveDiagnosis::kEveryS) {
    const std::optional<Finding>& top = live_.Update(now);
    if (top) {
      last_diagnosis_t_ = now;
      batch.now = top;
      std::vector<TrackerPoint> d = DiagnosisPoints(top, live_.mfu(), SampleStep(run_, now), run_.start_time + now);
      batch.points.insert(batch.points.end(), d.begin(), d.end());
    }
  }
  return batch;
}

}  // namespace fullburn
