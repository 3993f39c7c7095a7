// Trials as records: their JSON (the tuning run's `tune_trial` events), the
// keep-or-drop rule, and the table people read.
#include <fmt/format.h>

#include <algorithm>

#include "fullburn/percent.h"
#include "fullburn/report.h"
#include "fullburn/tune.h"

namespace fullburn {
namespace {

nlohmann::json Number(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }
double Number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

}  // namespace

const char* TrialStatusName(TrialStatus status) {
  switch (status) {
    case TrialStatus::kOk:
      return "ok";
    case TrialStatus::kFailed:
      return "failed";
    case TrialStatus::kSkipped:
      return "skipped";
    case TrialStatus::kInterrupted:
      return "interrupted";
  }
  return "failed";
}

TrialStatus ParseTrialStatus(const std::string& name) {
  for (TrialStatus s : {TrialStatus::kOk, TrialStatus::kSkipped, TrialStatus::kInterrupted})
    if (name == TrialStatusName(s)) return s;
  return TrialStatus::kFailed;
}

nlohmann::json TrialJson(const Trial& t) {
  const Measure& m = t.measure;
  return {{"index", t.index},
          {"knob", t.knob},
          {"value", t.value},
          {"overrides", t.overrides},
          {"run_id", t.run_id},
          {"status", TrialStatusName(t.status)},
          {"reason", t.reason},
          {"verdict", t.verdict},
          {"wall_s", t.wall_s},
          {"log", t.log},
          {"objective", Number(m.value)},
          {"unit", m.unit},
          {"spread", Number(m.spread)},
          {"low", Number(m.low)},
          {"high", Number(m.high)},
          {"steps", m.steps},
          {"rough", m.rough},
          {"gpu_util", Number(m.gpu_util)},
          {"data_wait_share", Number(m.data_wait_share)},
          {"peak_memory_bytes", Number(m.peak_memory_bytes)}};
}

Trial TrialFromJson(const nlohmann::json& j) {
  Trial t;
  t.index = j.value("index", 0);
  t.knob = j.value("knob", "");
  t.value = j.value("value", "");
  if (j.contains("overrides") && j["overrides"].is_object())
    for (auto& [k, v] : j["overrides"].items())
      if (v.is_string()) t.overrides[k] = v.get<std::string>();
  t.run_id = j.value("run_id", int64_t{0});
  t.status = ParseTrialStatus(j.value("status", ""));
  t.reason = j.value("reason", "");
  t.verdict = j.value("verdict", "");
  t.wall_s = Number(j, "wall_s");
  t.log = j.value("log", "");
  Measure& m = t.measure;
  m.value = Number(j, "objective");
  m.unit = j.value("unit", "");
  m.spread = Number(j, "spread");
  m.low = Number(j, "low");
  m.high = Number(j, "high");
  m.steps = j.value("steps", int64_t{0});
  m.rough = j.value("rough", false);
  m.gpu_util = Number(j, "gpu_util");
  m.data_wait_share = Number(j, "data_wait_share");
  m.peak_memory_bytes = Number(j, "peak_memory_bytes");
  return t;
}

std::string FormatMeasure(const Measure& m) {
  if (std::isnan(m.value)) return "-";
  std::string v = m.value >= 100 ? fmt::format("{:.0f}", m.value) : fmt::format("{:.3g}", m.value);
  if (!std::isnan(m.spread)) v += fmt::format(" ±{:.0f}%", m.spread * 50);  // half the IQR, as a ±
  if (m.rough) v += fmt::format(" ({} steps)", m.steps);
  return v;
}

bool BeatsBest(const Measure& candidate, const Measure& best, double min_gain, double* gain) {
  *gain = NAN;
  if (std::isnan(candidate.value) || std::isnan(best.value) || best.value <= 0) return false;
  *gain = candidate.value / best.value - 1;
  double noise = 0;
  for (double s : {candidate.spread, best.spread}) noise += std::isnan(s) ? 0 : s / 2;
  return *gain > std::max(min_gain, noise);
}

std::string Verdict(const Trial& t, const Trial& best, double min_gain, bool* kept) {
  double gain = 0;
  *kept = BeatsBest(t.measure, best.measure, min_gain, &gain);
  if (*kept) return fmt::format("kept {:+.0f}%", gain * 100);
  return fmt::format("{} {:+.0f}%", gain < 0 ? "slower" : "within noise", gain * 100);
}

std::string GridVerdict(const Trial& trial, const std::vector<Trial>& before, double min_gain) {
  if (trial.status != TrialStatus::kOk) return "";
  int best = BestTrial(before);
  if (best < 0) return "first";
  const Trial& b = before[best];
  double gain = 0;
  if (BeatsBest(trial.measure, b.measure, min_gain, &gain))
    return fmt::format("fastest so far ({:+.0f}%)", gain * 100);
  double back = 0;
  if (!BeatsBest(b.measure, trial.measure, min_gain, &back))
    return fmt::format("ties #{} ({:+.0f}%, within the noise)", b.index, gain * 100);
  return fmt::format("{:+.0f}% vs #{}", gain * 100, b.index);
}

int BestTrial(const std::vector<Trial>& trials) {
  int best = -1;
  for (size_t i = 0; i < trials.size(); ++i)
    if (trials[i].status == TrialStatus::kOk && !std::isnan(trials[i].measure.value) &&
        (best < 0 || trials[i].measure.value > trials[best].measure.value))
      best = static_cast<int>(i);
  return best;
}

std::vector<int> TiedWithBest(const std::vector<Trial>& trials, int best, double min_gain) {
  std::vector<int> ties;
  if (best < 0) return ties;
  for (size_t i = 0; i < trials.size(); ++i) {
    double gain = 0;
    if (static_cast<int>(i) != best && trials[i].status == TrialStatus::kOk &&
        !std::isnan(trials[i].measure.value) &&
        !BeatsBest(trials[best].measure, trials[i].measure, min_gain, &gain))
      ties.push_back(static_cast<int>(i));
  }
  return ties;
}

std::string RenderTrialTable(const std::vector<Trial>& trials) {
  std::string unit = "samples/s";
  for (const Trial& t : trials)
    if (!t.measure.unit.empty()) {
      unit = t.measure.unit;
      break;
    }
  // The verdict goes last so a long failure reason does not push the run id away.
  std::vector<std::vector<std::string>> rows = {
      {"#", "knob", "value", unit, "GPU util", "data wait", "peak mem", "run", "verdict"}};
  for (const Trial& t : trials) {
    const Measure& m = t.measure;
    std::string verdict = t.status == TrialStatus::kOk
                              ? t.verdict
                              : TrialStatusName(t.status) + (t.reason.empty() ? "" : ": " + t.reason);
    rows.push_back({std::to_string(t.index), t.knob, t.value, FormatMeasure(m),
                    std::isnan(m.gpu_util) ? "-" : fmt::format("{:.0f}%", m.gpu_util), Percent(m.data_wait_share),
                    std::isnan(m.peak_memory_bytes) ? "-" : FormatBytes(m.peak_memory_bytes),
                    t.run_id > 0 ? std::to_string(t.run_id) : "-", verdict});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    for (size_t c = 0; c + 1 < r.size(); ++c) out += fmt::format("{:<{}}  ", r[c], width[c]);
    out += r.back() + "\n";
  }
  return out;
}

}  // namespace fullburn
