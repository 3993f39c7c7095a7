// A stretch of a run as a run of its own (fullburn diagnose --from/--to), and
// LiveDiagnosis: the diagnosis of a running job's last minute, for the live line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "facts.h"
#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

// The events that describe the job rather than a moment of it.
bool IsSetting(const RunEvent& e) {
  return e.kind == "dataloader" || e.kind == "torch" || e.kind == "flops";
}

// When an event began: its time less its duration, if it has one.
double EventStart(const RunEvent& e) {
  auto j = nlohmann::json::parse(e.data, nullptr, false);
  return e.t - (j.is_object() ? j.value("duration_s", 0.0) : 0.0);
}

// Keeps what lies inside [from, to], times unchanged: readings, steps and
// timed events wholly inside, checkpoints written inside, every setting.
void Cut(RunData* d, double from, double to) {
  for (auto it = d->samples.begin(); it != d->samples.end();) {
    Series& s = it->second;
    s.erase(std::remove_if(s.begin(), s.end(),
                           [&](const SeriesPoint& p) { return p.t < from || p.t > to; }),
            s.end());
    it = s.empty() ? d->samples.erase(it) : std::next(it);
  }
  auto& steps = d->steps;
  steps.erase(
      std::remove_if(steps.begin(), steps.end(),
                     [&](const StepRecord& r) { return r.t - r.step_s < from || r.t > to; }),
      steps.end());
  auto& events = d->events;
  events.erase(std::remove_if(events.begin(), events.end(),
                              [&](const RunEvent& e) {
                                return !IsSetting(e) && (EventStart(e) < from || e.t > to);
                              }),
               events.end());
  auto& saves = d->checkpoints;
  saves.erase(
      std::remove_if(saves.begin(), saves.end(),
                     [&](const CheckpointRecord& c) { return c.t - c.write_s < from || c.t > to; }),
      saves.end());
}

// Times from `from` (settings from before it at 0).
void Shift(RunData* d, double from) {
  for (auto& [name, series] : d->samples)
    for (SeriesPoint& p : series) p.t -= from;
  for (StepRecord& r : d->steps) r.t -= from;
  for (RunEvent& e : d->events) e.t = std::max(0.0, e.t - from);
  for (CheckpointRecord& c : d->checkpoints) c.t -= from;
}

}  // namespace

RunData RunWindow(const RunData& d, double from, double to) {
  RunData w = d;
  Cut(&w, from, to);
  Shift(&w, from);
  w.run.start_time = d.run.start_time + from;
  if (d.run.end_time && *d.run.end_time - d.run.start_time > to) {
    w.run.end_time = d.run.start_time + to;
    w.run.exit_code.reset();
    w.run.status = "finished";
  }
  return w;
}

void LiveDiagnosis::AddReadings(double t,
                                const std::vector<std::pair<std::string, double>>& readings) {
  if (std::isnan(first_t_)) first_t_ = t;
  for (const auto& [name, value] : readings) kept_.samples[name].push_back({t, value});
}

void LiveDiagnosis::AddSteps(const std::vector<StepRecord>& steps) {
  for (const StepRecord& r : steps) {
    if (std::isnan(first_step_t_) || r.t - r.step_s < first_step_t_) first_step_t_ = r.t - r.step_s;
    longest_step_s_ = std::max(longest_step_s_, r.step_s);
    kept_.steps.push_back(r);
  }
}

void LiveDiagnosis::AddEvents(const std::vector<RunEvent>& events) {
  kept_.events.insert(kept_.events.end(), events.begin(), events.end());
}

const std::optional<Finding>& LiveDiagnosis::Update(double t) {
  // With steps, "now" starts at the first: the start-up is over, and what
  // it cost is the whole run's diagnosis's to tell.
  double start = std::isnan(first_step_t_) ? first_t_ : first_step_t_;
  if (std::isnan(start) || t - start < kMinS || t - last_update_ < kEveryS) return top_;
  last_update_ = t;
  // Other ranks' steps reach rank 0 late, a straggler's latest (its own
  // writer is slowed with it): "now" ends where every rank has reported, so
  // the ranks are compared over the same stretch and a slow rank is not
  // mistaken for a missing one.
  double end = t;
  std::map<int, double> reported;
  for (const StepRecord& r : kept_.steps) reported[r.rank] = std::max(reported[r.rank], r.t);
  if (reported.size() > 1)
    for (const auto& [rank, latest] : reported)
      if (latest >= t - kWindowS) end = std::min(end, latest);  // a rank silent a minute: gone
  double from = std::max(start, end - kWindowS);
  Cut(&kept_, from, std::numeric_limits<double>::infinity());
  RunData d = kept_;
  // Steps read just now may end after the latest reading: nothing is cut at
  // the end unless another rank has not reported that far.
  if (end < t) Cut(&d, from, end);
  Shift(&d, from);
  top_.reset();
  if (!std::isnan(first_step_t_) && d.steps.empty() && longest_step_s_ < kWindowS / 3) {
    // Short steps came before, none in the window: a long evaluation, a hang.
    top_ = Finding{CauseId::kIdlePhases,
                   "No training step in the last minute",
                   fmt::format("no step started in the last {:.0f} s", t - from),
                   1.0,
                   0.9,
                   "an evaluation or checkpoint that long is a phase to shorten; else the job "
                   "may hang: py-spy dump --pid PID shows where each thread is"};
    return top_;
  }
  mfu_ = ComputeMfu(d);
  for (const Finding& f : Diagnose(d))
    if (f.cause == CauseId::kHealthy || f.share_lost >= diagnose::kMinShare) {
      top_ = f;
      break;
    }
  return top_;
}

std::string RenderLiveFinding(const std::optional<Finding>& top) {
  if (!top) return "";
  if (top->cause == CauseId::kHealthy)  // with nothing measured (no GPU, no steps), nothing to say
    return top->confidence < 0.5 ? "" : " | now: no bottleneck";
  return fmt::format(" | now: {} ~{}", top->name(), Percent(top->share_lost));
}

}  // namespace fullburn
