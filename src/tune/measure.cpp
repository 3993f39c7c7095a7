// Measuring a trial: throughput (or samples per joule) over windows of steps
// after warm-up, with the spread that says how far to trust it.
#include <algorithm>
#include <set>

#include "fullburn/report.h"
#include "fullburn/tune.h"

namespace fullburn {
namespace {

constexpr double kWarmupShare = 0.2;
constexpr size_t kMinWarmupSteps = 3, kMaxWindows = 8, kMinMeasuredSteps = 8, kMinRoughSteps = 3;

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  size_t i = static_cast<size_t>(pos);
  double frac = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

void Summarize(const std::vector<double>& windows, Measure* m) {
  m->value = Quantile(windows, 0.5);
  m->low = *std::min_element(windows.begin(), windows.end());
  m->high = *std::max_element(windows.begin(), windows.end());
  m->spread = m->value > 0 ? (Quantile(windows, 0.75) - Quantile(windows, 0.25)) / m->value : NAN;
}

// Linear interpolation of a series at t (clamped to its ends).
double At(const Series& s, double t) {
  if (t <= s.front().t) return s.front().v;
  if (t >= s.back().t) return s.back().v;
  auto hi = std::lower_bound(s.begin(), s.end(), t, [](const SeriesPoint& p, double x) { return p.t < x; });
  auto lo = hi - 1;
  double f = (t - lo->t) / (hi->t - lo->t);
  return lo->v + f * (hi->v - lo->v);
}

// Joules between a and b: the trapezoid rule over the interpolated series.
double Energy(const Series& power, double a, double b) {
  std::vector<double> ts = {a};
  for (const SeriesPoint& p : power)
    if (p.t > a && p.t < b) ts.push_back(p.t);
  ts.push_back(b);
  double joules = 0;
  for (size_t i = 1; i < ts.size(); ++i) joules += (At(power, ts[i - 1]) + At(power, ts[i])) / 2 * (ts[i] - ts[i - 1]);
  return joules;
}

std::vector<const Series*> PowerSeries(const RunData& run) {
  std::vector<const Series*> out;
  for (const auto& [name, series] : run.samples)
    if (name.rfind("gpu", 0) == 0 && name.size() > 8 && name.compare(name.size() - 8, 8, ".power_w") == 0 &&
        !series.empty())
      out.push_back(&series);
  return out;
}

void Resources(const RunData& run, Measure* m) {
  RunDigest d = Digest(run, {});
  m->gpu_util = d.gpu_util;
  m->data_wait_share = d.data_wait_share;
  double gpu_peak = NAN, rss_peak = NAN;
  for (const auto& [name, series] : run.samples) {
    bool gpu_mem = name.rfind("gpu", 0) == 0 && name.find(".mem_used_bytes") != std::string::npos;
    if (!gpu_mem && name != "proc.rss_bytes") continue;
    double& peak = gpu_mem ? gpu_peak : rss_peak;
    for (const SeriesPoint& p : series) peak = std::isnan(peak) ? p.v : std::max(peak, p.v);
  }
  m->peak_memory_bytes = !std::isnan(gpu_peak) ? gpu_peak : rss_peak;
}

}  // namespace

Result<Objective> ParseObjective(const std::string& name) {
  if (name == "samples_per_s") return Objective::kSamplesPerSecond;
  if (name == "samples_per_joule") return Objective::kSamplesPerJoule;
  return Status::InvalidArgument("unknown objective '" + name + "': use samples_per_s or samples_per_joule");
}

const char* ObjectiveName(Objective o) {
  return o == Objective::kSamplesPerJoule ? "samples_per_joule" : "samples_per_s";
}

Result<Measure> MeasureRun(const RunData& run, Objective objective) {
  std::vector<StepRecord> steps;
  std::set<int> ranks;
  for (const StepRecord& s : run.steps) {
    ranks.insert(s.rank);
    if (s.rank == 0) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end(), [](const StepRecord& a, const StepRecord& b) { return a.step < b.step; });
  std::string run_name = "run " + std::to_string(run.run.id);
  if (steps.size() < kMinRoughSteps)
    return Status::Unavailable(run_name + " recorded " + std::to_string(steps.size()) + " steps, too few to measure (" +
                                   std::to_string(kMinWarmupSteps + kMinMeasuredSteps) +
                                   " needed): lengthen the trial (--trial)");
  double start = steps.front().t - steps.front().step_s, end = steps.back().t;
  size_t warm = kMinWarmupSteps;
  while (warm < steps.size() && steps[warm - 1].t - start < kWarmupShare * (end - start)) ++warm;
  size_t n = steps.size() >= warm ? steps.size() - warm : 0;
  // A setting so slow that a trial holds only a few steps is still measured,
  // roughly: one window after the first step, no spread.
  bool rough = n < kMinMeasuredSteps;
  if (rough) warm = 1, n = steps.size() - 1;
  bool have_samples = std::any_of(steps.begin(), steps.end(), [](const StepRecord& s) { return s.samples > 0; });
  std::vector<const Series*> power;
  if (objective == Objective::kSamplesPerJoule) {
    power = PowerSeries(run);
    if (power.empty())
      return Status::InvalidArgument(run_name + " has no GPU power readings: use --objective samples_per_s");
  }
  Measure m;
  m.steps = static_cast<int64_t>(n);
  m.unit = objective == Objective::kSamplesPerJoule ? (have_samples ? "samples/J" : "steps/J")
                                                    : (have_samples ? "samples/s" : "steps/s");
  m.rough = rough;
  size_t windows = rough ? 1 : std::min(kMaxWindows, n), per = n / windows;
  std::vector<double> values;
  for (size_t w = 0; w < windows; ++w) {
    size_t a = warm + w * per, b = w + 1 == windows ? steps.size() - 1 : a + per - 1;
    double t0 = steps[a - 1].t, t1 = steps[b].t, work = 0;
    for (size_t i = a; i <= b; ++i) work += have_samples ? static_cast<double>(steps[i].samples) : 1.0;
    work *= static_cast<double>(ranks.size());  // every rank does the same share
    if (t1 <= t0) continue;
    if (objective == Objective::kSamplesPerJoule) {
      double joules = 0;
      for (const Series* p : power) joules += Energy(*p, t0, t1);
      if (joules > 0) values.push_back(work / joules);
    } else {
      values.push_back(work / (t1 - t0));
    }
  }
  if (values.empty()) return Status::InvalidArgument(run_name + ": step times do not advance; nothing to measure");
  Summarize(values, &m);
  if (rough) m.spread = NAN;
  Resources(run, &m);
  return m;
}

Result<Measure> MeasureValues(const std::vector<double>& values, const std::string& unit) {
  size_t warm = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(values.size()) * kWarmupShare));
  if (values.size() < warm + 3)
    return Status::InvalidArgument("the command printed " + std::to_string(values.size()) +
                                   " values matching --metric-regex, too few to measure (4 needed, the first 20% "
                                   "are warm-up): lengthen the trial or check the pattern");
  Measure m;
  m.unit = unit;
  m.steps = static_cast<int64_t>(values.size() - warm);
  Summarize(std::vector<double>(values.begin() + static_cast<long>(warm), values.end()), &m);
  return m;
}

}  // namespace fullburn
