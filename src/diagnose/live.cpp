// A stretch of a run as a run of its own (fullburn diagnose --from/--to), and
// LiveDiagnosis: the diagnosis of a running job's last minute, for the live line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "facts.h"
#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

// The events that describe the job rather than a moment of it.
bool IsSetting(const RunEvent& e) { return e.kind == "dataloader" || e.kind == "torch"; }

// When an event began: its time less its duration, if it has one.
double EventStart(const RunEvent& e) {
  auto j = nlohmann::json::parse(e.data, nullptr, false);
  return e.t - (j.is_object() ? j.value("duration_s", 0.0) : 0.0);
}

}  // namespace

RunData RunWindow(const RunData& d, double from, double to) {
  RunData w;
  w.run = d.run;
  w.run.start_time = d.run.start_time + from;
  if (d.run.end_time && *d.run.end_time - d.run.start_time > to) {
    w.run.end_time = d.run.start_time + to;
    w.run.exit_code.reset();
    w.run.status = "finished";
  }
  for (const auto& [name, series] : d.samples) {
    Series s;
    for (const SeriesPoint& p : series)
      if (p.t >= from && p.t <= to) s.push_back({p.t - from, p.v});
    if (!s.empty()) w.samples[name] = std::move(s);
  }
  for (StepRecord r : d.steps) {
    if (r.t - r.step_s < from || r.t > to) continue;
    r.t -= from;
    w.steps.push_back(r);
  }
  for (RunEvent e : d.events) {
    if (!IsSetting(e) && (EventStart(e) < from || e.t > to)) continue;
    e.t = std::max(0.0, e.t - from);
    w.events.push_back(e);
  }
  for (CheckpointRecord c : d.checkpoints) {
    if (c.t - c.write_s < from || c.t > to) continue;
    c.t -= from;
    w.checkpoints.push_back(c);
  }
  return w;
}

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
                               [&](const RunEvent& e) { return EventStart(e) < from; }),
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
  // What is kept, as a run still going, cut to the window.
  RunData kept;
  kept.run = run_;
  kept.run.end_time.reset();
  kept.run.exit_code.reset();
  kept.samples = samples_;
  kept.steps = steps_;
  kept.events = settings_;
  kept.events.insert(kept.events.end(), events_.begin(), events_.end());
  // Steps read just now may end after the latest reading: nothing is cut at the end.
  RunData d = RunWindow(kept, from, std::numeric_limits<double>::infinity());
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
