// LiveDiagnosis: the diagnosis of a running job's last minute, for the live line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "facts.h"
#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

// The events that describe the job rather than a moment of it.
bool IsSetting(const RunEvent& e) { return e.kind == "dataloader" || e.kind == "torch"; }

}  // namespace

void LiveDiagnosis::AddReadings(double t,
                                const std::vector<std::pair<std::string, double>>& readings) {
  if (std::isnan(first_t_)) first_t_ = t;
  for (const auto& [name, value] : readings) samples_[name].push_back({t, value});
}

void LiveDiagnosis::AddSteps(const std::vector<StepRecord>& steps) {
  for (const StepRecord& r : steps) {
    if (std::isnan(first_step_t_) || r.t - r.step_s < first_step_t_) first_step_t_ = r.t - r.step_s;
    longest_step_s_ = std::max(longest_step_s_, r.step_s);
    steps_.push_back(r);
  }
}

void LiveDiagnosis::AddEvents(const std::vector<RunEvent>& events) {
  for (const RunEvent& e : events) (IsSetting(e) ? settings_ : events_).push_back(e);
}

void LiveDiagnosis::Trim(double from) {
  for (auto& [name, series] : samples_)
    series.erase(series.begin(), std::find_if(series.begin(), series.end(),
                                              [&](const SeriesPoint& p) { return p.t >= from; }));
  // A step counts when it started inside the window.
  steps_.erase(std::remove_if(steps_.begin(), steps_.end(),
                              [&](const StepRecord& r) { return r.t - r.step_s < from; }),
               steps_.end());
  events_.erase(std::remove_if(events_.begin(), events_.end(),
                               [&](const RunEvent& e) {
                                 double d = 0;
                                 auto j = nlohmann::json::parse(e.data, nullptr, false);
                                 if (j.is_object()) d = j.value("duration_s", 0.0);
                                 return e.t - d < from;
                               }),
                events_.end());
}

const std::optional<Finding>& LiveDiagnosis::Update(double t) {
  // With steps, "now" starts at the first: the start-up is over, and what
  // it cost is the whole run's diagnosis's to tell.
  double start = std::isnan(first_step_t_) ? first_t_ : first_step_t_;
  if (std::isnan(start) || t - start < kMinS || t - last_update_ < kEveryS) return top_;
  last_update_ = t;
  double from = std::max(start, t - kWindowS);
  Trim(from);
  // The window as a run of its own that is still going: times from its start.
  RunData d;
  d.run = run_;
  d.run.end_time.reset();
  d.run.exit_code.reset();
  for (const auto& [name, series] : samples_) {
    Series& s = d.samples[name];
    for (const SeriesPoint& p : series) s.push_back({p.t - from, p.v});
  }
  for (StepRecord r : steps_) {
    r.t -= from;
    d.steps.push_back(r);
  }
  for (const std::vector<RunEvent>* list : {&settings_, &events_})
    for (RunEvent e : *list) {
      e.t = std::max(0.0, e.t - from);
      d.events.push_back(e);
    }
  top_.reset();
  if (!std::isnan(first_step_t_) && d.steps.empty() && longest_step_s_ < kWindowS / 3) {
    // Short steps came before, none in the window: a long evaluation, a hang.
    top_ = Finding{"idle_phases",
                   "No training step in the last minute",
                   fmt::format("no step started in the last {:.0f} s", t - from),
                   1.0,
                   0.9,
                   "an evaluation or checkpoint that long is a phase to shorten; else the job "
                   "may hang: py-spy dump --pid PID shows where each thread is"};
    return top_;
  }
  for (const Finding& f : Diagnose(d))
    if (f.cause == "healthy" || f.share_lost >= diagnose::kMinShare) {
      top_ = f;
      break;
    }
  return top_;
}

std::string RenderLiveFinding(const std::optional<Finding>& top) {
  if (!top) return "";
  if (top->cause == "healthy")  // with nothing measured (no GPU, no steps), nothing to say
    return top->confidence < 0.5 ? "" : " | now: no bottleneck";
  return fmt::format(" | now: {} ~{}", top->cause, diagnose::Pct(top->share_lost));
}

}  // namespace fullburn
