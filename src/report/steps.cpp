// Renderings of a training run's per-step records: CSV, JSON and a Chrome
// trace / Perfetto timeline.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "fullburn/report.h"

namespace fullburn {
namespace {

std::string Cell(const std::optional<double>& v) {
  if (!v) return "";
  std::ostringstream o;
  o.precision(9);
  o << *v;
  return o.str();
}

// A diverged loss reads back in pandas and spreadsheets: inf as "inf", NaN
// (or none reported) as an empty cell.
std::string LossCell(double loss) {
  if (std::isnan(loss)) return "";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  return Cell(loss);
}

nlohmann::json OptionalJson(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json();
}

double Micros(double seconds) { return std::round(seconds * 1e6 * 1000) / 1000; }

}  // namespace

std::string StepsCsv(const std::vector<StepRecord>& steps) {
  std::ostringstream o;
  o.precision(9);
  o << "rank,step,epoch,t,loss,lr,loss_scale,samples,samples_per_s,step_s";
  for (const StepPhase& p : kStepPhases) o << ',' << p.name << "_s";
  o << ",skipped\n";
  for (const StepRecord& r : steps) {
    o << r.rank << ',' << r.step << ',' << r.epoch << ',' << r.t << ',' << LossCell(r.loss) << ','
      << r.lr << ',' << Cell(r.loss_scale) << ',' << r.samples << ','
      << Cell(r.step_s > 0 ? std::optional<double>(r.samples / r.step_s) : std::nullopt) << ','
      << r.step_s;
    for (const StepPhase& p : kStepPhases) o << ',' << Cell(r.*p.field);
    o << ',' << (r.skipped ? 1 : 0) << '\n';
  }
  return o.str();
}

nlohmann::json StepsJson(const std::vector<StepRecord>& steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const StepRecord& r : steps) {
    nlohmann::json j{{"rank", r.rank},
                     {"step", r.step},
                     {"epoch", r.epoch},
                     {"t", r.t},
                     {"loss", OptionalJson(r.loss)},
                     {"lr", r.lr},
                     {"loss_scale", OptionalJson(r.loss_scale)},
                     {"samples", r.samples},
                     {"step_s", r.step_s},
                     {"skipped", r.skipped}};
    j["samples_per_s"] = r.step_s > 0 ? nlohmann::json(r.samples / r.step_s) : nlohmann::json();
    for (const StepPhase& p : kStepPhases) j[std::string(p.name) + "_s"] = OptionalJson(r.*p.field);
    out.push_back(j);
  }
  return out;
}

nlohmann::json ChromeTrace(const RunInfo& run, const std::vector<StepRecord>& steps,
                           const std::vector<CheckpointRecord>& checkpoints,
                           const std::vector<RunEvent>& run_events,
                           const std::map<std::string, Series>& samples) {
  nlohmann::json events = nlohmann::json::array();
  std::set<int> ranks;
  for (const StepRecord& r : steps) {
    ranks.insert(r.rank);
    double start = r.t - r.step_s;
    events.push_back({{"name", "step " + std::to_string(r.step)},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", Micros(start)},
                      {"dur", Micros(r.step_s)},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"args",
                       {{"epoch", r.epoch},
                        {"loss", OptionalJson(r.loss)},
                        {"lr", r.lr},
                        {"samples", r.samples},
                        {"skipped", r.skipped}}}});
    // Phases end with the step: what none accounts for (a wrapped loop's own
    // work after the previous optimizer step) comes before the batch.
    double phased = 0;
    for (const StepPhase& p : kStepPhases) phased += std::max(0.0, (r.*p.field).value_or(0));
    double at = r.t - std::min(phased, r.step_s);
    for (const StepPhase& p : kStepPhases) {
      const std::optional<double>& d = r.*p.field;
      if (!d || *d <= 0) continue;
      events.push_back({{"name", p.name},
                        {"cat", "phase"},
                        {"ph", "X"},
                        {"ts", Micros(at)},
                        {"dur", Micros(*d)},
                        {"pid", r.rank},
                        {"tid", 1}});
      at += *d;
    }
    if (std::isfinite(r.loss))
      events.push_back({{"name", "loss"},
                        {"ph", "C"},
                        {"ts", Micros(r.t)},
                        {"pid", r.rank},
                        {"args", {{"loss", r.loss}}}});
    if (r.step_s > 0)
      events.push_back({{"name", "samples/s"},
                        {"ph", "C"},
                        {"ts", Micros(r.t)},
                        {"pid", r.rank},
                        {"args", {{"samples/s", r.samples / r.step_s}}}});
  }
  for (const CheckpointRecord& c : checkpoints) {
    events.push_back({{"name", "checkpoint step " + std::to_string(c.step)},
                      {"cat", "checkpoint"},
                      {"ph", "X"},
                      {"ts", Micros(c.t - c.write_s)},
                      {"dur", Micros(c.write_s)},
                      {"pid", 0},
                      {"tid", 2},
                      {"args", {{"path", c.path}, {"bytes", c.bytes}, {"stall_s", c.stall_s}}}});
  }
  // What filled the gaps between steps: an evaluation, a save, a phase.
  for (const RunEvent& e : run_events) {
    auto data = nlohmann::json::parse(e.data, nullptr, false);
    if (!data.is_object()) data = nlohmann::json::object();
    int rank =
        data.contains("rank") && data["rank"].is_number_integer() ? data["rank"].get<int>() : 0;
    ranks.insert(rank);
    nlohmann::json ev{{"name", data.value("background", false) ? e.kind + " (background)" : e.kind},
                      {"cat", "event"},
                      {"pid", rank},
                      {"tid", 2},
                      {"args", data}};
    double duration = data.contains("duration_s") && data["duration_s"].is_number()
                          ? data["duration_s"].get<double>()
                          : 0;
    if (duration > 0) {
      ev["ph"] = "X";
      ev["ts"] = Micros(e.t - duration);
      ev["dur"] = Micros(duration);
    } else {
      ev["ph"] = "i";
      ev["s"] = "t";
      ev["ts"] = Micros(e.t);
    }
    events.push_back(ev);
  }
  // Utilization next to the steps, so idle gaps line up with their cause.
  const int telemetry_pid = 1000;
  for (const auto& [name, series] : samples) {
    bool wanted = name == "host.cpu.util" ||
                  (name.rfind("gpu", 0) == 0 && (name.find(".util") != std::string::npos ||
                                                 name.find(".mem_used") != std::string::npos));
    if (!wanted) continue;
    for (const SeriesPoint& p : series)
      events.push_back({{"name", name},
                        {"ph", "C"},
                        {"ts", Micros(p.t)},
                        {"pid", telemetry_pid},
                        {"args", {{"value", p.v}}}});
  }
  auto name_process = [&](int pid, const std::string& name) {
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
  };
  for (int r : ranks) {
    name_process(r, "rank " + std::to_string(r));
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 0},
                      {"args", {{"name", "steps"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 1},
                      {"args", {{"name", "phases"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 2},
                      {"args", {{"name", "events and checkpoints"}}}});
  }
  name_process(telemetry_pid, "telemetry");
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"run", run.id}, {"name", run.name}, {"start_time", run.start_time}}}};
}

}  // namespace fullburn

namespace fullburn {

// Ranks each record every optimizer step: the job's step is the set of
// records with one step number. Its samples are the sum over ranks, it
// ends when the slowest rank ends, and its loss is the mean of the ranks'
// (each rank's is over its own shard). One rank reads as before.
StepsSummary SummarizeSteps(const std::vector<StepRecord>& steps) {
  struct JobStep {
    int64_t samples = 0;
    double slowest_s = 0, loss_sum = 0;
    int losses = 0;
    bool skipped = false;
  };
  std::map<int64_t, JobStep> job;
  std::set<int> ranks;
  StepsSummary s;
  double timed_total = 0, first_start = INFINITY, last_end = -INFINITY;
  std::vector<double> phase_total(std::size(kStepPhases), 0.0);
  for (const StepRecord& r : steps) {
    JobStep& j = job[r.step];
    j.samples += r.samples;
    j.slowest_s = std::max(j.slowest_s, r.step_s);
    if (std::isfinite(r.loss)) j.loss_sum += r.loss, ++j.losses;
    j.skipped = j.skipped || r.skipped;
    ranks.insert(r.rank);
    s.samples += r.samples;
    first_start = std::min(first_start, r.t - r.step_s);
    last_end = std::max(last_end, r.t);
    if (!r.forward_s && !r.data_wait_s) continue;  // not a timed step
    timed_total += r.step_s;
    for (size_t p = 0; p < std::size(kStepPhases); ++p)
      phase_total[p] += (r.*kStepPhases[p].field).value_or(0);
  }
  s.steps = static_cast<int64_t>(job.size());
  s.ranks = static_cast<int>(ranks.size());
  std::vector<double> finite, rates;
  size_t warmup = job.size() / 10, i = 0;
  for (const auto& [step, j] : job) {
    s.skipped += j.skipped ? 1 : 0;
    if (j.losses) finite.push_back(j.loss_sum / j.losses);
    if (i++ >= warmup && j.slowest_s > 0) rates.push_back(j.samples / j.slowest_s);
  }
  auto mean = [](auto begin, auto end) {
    double sum = 0;
    for (auto it = begin; it != end; ++it) sum += *it;
    return end == begin ? NAN : sum / static_cast<double>(end - begin);
  };
  // Windows of up to 10 that never overlap: a short run's first and last
  // losses, not one mean twice ("loss 5.40 -> 5.40" over 3 falling steps).
  size_t k = finite.empty() ? 0 : std::max<size_t>(1, std::min<size_t>(10, finite.size() / 2));
  s.first_loss = mean(finite.begin(), finite.begin() + k);
  s.final_loss = mean(finite.end() - k, finite.end());
  if (!rates.empty()) s.median_samples_per_s = Percentile(rates, 50);
  if (job.size() >= 2 && last_end > first_start) {
    s.span_s = last_end - first_start;
    s.overall_samples_per_s = static_cast<double>(s.samples) / s.span_s;
  }
  if (timed_total > 0) {
    double accounted = 0;
    for (size_t p = 0; p < std::size(kStepPhases); ++p) {
      if (phase_total[p] <= 0) continue;
      s.phase_share.emplace_back(kStepPhases[p].name, phase_total[p] / timed_total);
      accounted += phase_total[p];
    }
    if (timed_total - accounted > 1e-3 * timed_total)
      s.phase_share.emplace_back("other", (timed_total - accounted) / timed_total);
  }
  return s;
}

std::string RenderStepsSummary(const std::vector<StepRecord>& steps) {
  StepsSummary s = SummarizeSteps(steps);
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(4);
  o << "  steps:   " << s.steps;
  if (s.ranks > 1) o << " on " << s.ranks << " ranks";
  o << " (" << s.samples << " samples";
  if (s.skipped) o << ", " << s.skipped << " skipped by the loss scaler";
  o << ")";
  if (std::isfinite(s.first_loss)) o << ", loss " << s.first_loss << " -> " << s.final_loss;
  o << "\n";
  o.precision(1);
  o << "  rate:    " << s.median_samples_per_s << " samples/s (median)";
  // A live line's rate counts the time between steps too: say both.
  if (std::isfinite(s.overall_samples_per_s))
    o << ", " << s.overall_samples_per_s << " over the " << s.span_s
      << " s the steps span (what ran between them included)";
  o << "\n";
  if (!s.phase_share.empty()) {
    o << "  step time:";
    for (const auto& [name, share] : s.phase_share) o << " " << name << " " << share * 100 << "%";
    o << "\n";
  }
  return o.str();
}

void RecentSteps::Add(const std::vector<StepRecord>& steps) {
  if (steps.empty()) return;
  window_.insert(window_.end(), steps.begin(), steps.end());
  double newest = 0;
  for (const StepRecord& r : window_) newest = std::max(newest, r.t);
  window_.erase(std::remove_if(window_.begin(), window_.end(),
                               [&](const StepRecord& r) { return r.t < newest - kWindowS; }),
                window_.end());
}

std::string RecentSteps::Render() const {
  if (window_.empty()) return "";
  int lowest = window_.front().rank;
  for (const StepRecord& r : window_) lowest = std::min(lowest, r.rank);
  const StepRecord* last = nullptr;  // the lowest rank's newest step
  for (const StepRecord& r : window_)
    if (r.rank == lowest && (!last || r.step > last->step)) last = &r;
  std::string line = fmt::format(" | step {}", last->step);
  if (last->epoch > 0 ||
      std::any_of(window_.begin(), window_.end(), [](const StepRecord& r) { return r.epoch > 0; }))
    line += fmt::format("  epoch {}", last->epoch);
  if (!std::isnan(last->loss)) line += fmt::format("  loss {:.4f}", last->loss);
  // The rate over the wall time the window spans: the steps after the first
  // end time, every rank's, over the time from that end to the newest; a
  // single end time (one step) falls back to its own step time.
  double first = window_.front().t, newest = first;
  for (const StepRecord& r : window_) {
    first = std::min(first, r.t);
    newest = std::max(newest, r.t);
  }
  double samples = 0, span = newest - first;
  for (const StepRecord& r : window_)
    if (span > 0 ? r.t > first : true) samples += static_cast<double>(r.samples);
  if (span <= 0) span = last->step_s;
  if (samples > 0 && span > 0) line += fmt::format("  {:.0f} samples/s", samples / span);
  double wait = 0, timed = 0;
  for (const StepRecord& r : window_) {
    if (!r.data_wait_s) continue;
    wait += *r.data_wait_s;
    timed += r.step_s;
  }
  if (timed > 0) line += fmt::format("  data-wait {:.0f}%", 100 * wait / timed);
  return line;
}

}  // namespace fullburn
