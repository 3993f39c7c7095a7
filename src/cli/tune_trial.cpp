// One trial of fullburn tune: a child process (fullburn-train, or fullburn
// run around the user's command) recorded as a run linked to the tuning,
// then measured from the store.
#include "tune_trial.h"

#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>

#include "child.h"
#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/env.h"
#include "fullburn/report.h"

namespace fullburn::cli {
namespace {

// The line that says why a child failed: its last "fullburn:" line, else its
// last line, shortened.
std::string FailureLine(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line, last, last_ours;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    last = line;
    size_t at = line.find("fullburn: ");
    if (at != std::string::npos) last_ours = line.substr(at + 10);
  }
  std::string why = last_ours.empty() ? last : last_ours;
  return why.size() > 200 ? why.substr(0, 197) + "..." : why;
}

// The run the child recorded: the newest run of this tuning not seen before.
int64_t FindTrialRun(RunStore* store, int64_t tuning_id, int64_t after) {
  auto runs = store->ListRuns();
  if (!runs.ok()) return 0;
  int64_t found = 0;
  for (const RunInfo& r : *runs)
    if (r.parent_id && *r.parent_id == tuning_id && r.id > after) found = std::max(found, r.id);
  return found;
}

Result<Measure> MeasureFromOutput(const std::string& log_path, const std::string& pattern) {
  std::regex re(pattern);
  std::ifstream in(log_path);
  std::string line;
  std::vector<double> values;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, re)) continue;
    try {
      values.push_back(std::stod(m.size() > 1 ? m[1].str() : m[0].str()));
    } catch (...) {
      // A match that is not a number: the pattern's group is wrong, said below if nothing matches.
    }
  }
  return MeasureValues(values, "metric");
}

}  // namespace

void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial) {
  const Env* env = Env::Default();
  double start = env->MonotonicSeconds();
  int64_t before = FindTrialRun(store, spec.tuning_id, 0);
  auto child = SpawnChild(spec.argv, spec.extra_env, trial->log);
  if (!child.ok()) {
    trial->status = "failed";
    trial->reason = child.status().message();
    return;
  }
  bool timed_out = false;
  int code = WaitChildFor(*child, spec.timeout_s, &timed_out);
  trial->wall_s = env->MonotonicSeconds() - start;
  trial->run_id = FindTrialRun(store, spec.tuning_id, before);
  if (ReceivedSignal()) {
    trial->status = "interrupted";
    trial->reason = "stopped by signal " + std::to_string(ReceivedSignal());
    return;
  }
  bool stopped_by_us = timed_out && spec.stop_is_normal;
  if (timed_out && !spec.stop_is_normal) {
    trial->status = "failed";
    trial->reason = "timeout: still running after " + std::to_string(static_cast<int>(spec.timeout_s)) + " s";
    return;
  }
  if (code != 0 && !stopped_by_us) {
    trial->status = "failed";
    std::string why = FailureLine(trial->log);
    trial->reason = DescribeExitCode(code) + (why.empty() ? "" : ": " + why);
    return;
  }
  Result<Measure> m = Status::NotFound("no run");
  if (!spec.metric_regex.empty()) {
    m = MeasureFromOutput(trial->log, spec.metric_regex);
  } else if (trial->run_id == 0) {
    m = Status::NotFound("the trial recorded no run (see " + trial->log + ")");
  } else {
    auto data = store->LoadRun(std::to_string(trial->run_id));
    if (!data.ok())
      m = data.status();
    else if (data->steps.empty())
      m = Status::NotFound(
          "no step records: no torch optimizer.step() seen; mark the steps with "
          "python/fullburn_markers.py, or measure the output with --grid and --metric-regex");
    else
      m = MeasureRun(*data, spec.objective);
    // Stopped at the trial's end before its first step (fullburn-train
    // never ends on its time limit before one: there no step is a failure).
    trial->no_steps = data.ok() && data->steps.empty() && stopped_by_us;
  }
  if (!m.ok()) {
    trial->status = "failed";
    trial->reason = m.status().message();
    // Only a child that ran the whole trial would have had more steps in a
    // longer one; one that ended by itself would not.
    trial->too_short = m.status().code() == Status::Code::kUnavailable &&
                       (stopped_by_us || trial->wall_s >= spec.length_s);
    return;
  }
  trial->status = "ok";
  trial->measure = *m;
}

std::string Verdict(const Trial& t, const Trial& best, double min_gain, bool* kept) {
  double gain = 0;
  *kept = BeatsBest(t.measure, best.measure, min_gain, &gain);
  if (*kept) return fmt::format("kept {:+.0f}%", gain * 100);
  return fmt::format("{} {:+.0f}%", gain < 0 ? "slower" : "within noise", gain * 100);
}

TrialSpec CommandTrialSpec(const Tuning& t, const std::string& label,
                           const std::vector<std::string>& command) {
  TrialSpec spec;
  spec.argv = {SelfExecutable(),
               "run",
               "-q",
               "--parent",
               std::to_string(t.id()),
               "--name",
               fmt::format("tune {} #{}: {}", t.id(), t.trials().size() + 1, label),
               "--store",
               t.store()->path(),
               "--"};
  spec.argv.insert(spec.argv.end(), command.begin(), command.end());
  spec.tuning_id = t.id();
  spec.timeout_s = t.plan().trial_s;
  spec.length_s = t.plan().trial_s;
  spec.stop_is_normal = true;  // a command still running at the trial's end is measured
  spec.objective = t.plan().objective;
  return spec;
}

int KnobTuner::Run() {
  Trial start = RunOne("start", start_value_, {});
  // Too few steps in the start (a slow start-up, a machine busy with other
  // work): every trial is made twice as long, up to twice, while the budget
  // allows, rather than ending the tuning with nothing measured.
  for (int i = 0; i < 2 && start.too_short && !t_->interrupted() && t_->LengthenTrials(2); ++i) {
    t_->Record(start);
    std::fprintf(stderr, "tune: too few steps to measure: trials lengthened to %s\n",
                 FormatDuration(t_->plan().trial_s).c_str());
    start = RunOne("start", start_value_, {});
  }
  if (start.status == "ok") start.verdict = "start";
  bool ok = start.status == "ok";
  t_->Record(start);
  if (!ok)
    return Finish(t_->interrupted() ? 130 : 1,
                  start_name_ + " failed (" + start.reason + "): nothing to compare with");
  best_ = t_->trials().back();
  MeasureNoise();
  start_ = best_;
  auto data = t_->store()->LoadRun(std::to_string(best_.run_id));
  std::vector<Finding> findings = data.ok() ? Diagnose(*data) : std::vector<Finding>{};
  std::vector<std::string> order = Order(findings);
  std::fprintf(
      stderr,
      "tune: run-to-run noise %.0f%%; the start's top finding is %s; knobs in this order: %s\n",
      noise_ * 100, findings.empty() ? "none" : findings.front().cause.c_str(),
      fmt::format("{}", fmt::join(order, ", ")).c_str());
  for (size_t k = 0; k < order.size() && !t_->interrupted(); ++k) {
    if (!TryKnob(order[k], findings)) {
      for (size_t r = k; r < order.size(); ++r) Skip(order[r], "budget (" + budget_ + ") used up");
      break;
    }
  }
  return Finish(t_->interrupted() ? 130 : 0, "");
}

// The start again: windows within one trial vary less than whole trials do
// (other load, clocks, caches), so a change must also beat the difference
// between two runs of the same settings.
void KnobTuner::MeasureNoise() {
  if (!t_->BudgetAllows()) return;
  Trial again = RunOne("start", "again", {});
  // The machine slowed since the start (other work): once more, longer, as
  // for the start, rather than tuning without knowing the noise.
  if (again.too_short && !t_->interrupted() && t_->LengthenTrials(2)) {
    t_->Record(again);
    std::fprintf(stderr, "tune: too few steps to measure: trials lengthened to %s\n",
                 FormatDuration(t_->plan().trial_s).c_str());
    again = RunOne("start", "again", {});
  }
  if (again.status == "ok") {
    double a = best_.measure.value, b = again.measure.value;
    noise_ = std::abs(a - b) / ((a + b) / 2);
    again.verdict = fmt::format("run-to-run noise {:.0f}%", noise_ * 100);
    best_.measure.value = (a + b) / 2;
    best_.measure.spread = std::max(best_.measure.spread, again.measure.spread);
  }
  t_->Record(again);
}

Trial KnobTuner::RunKnobTrial(const std::string& knob, const std::string& value,
                              const std::map<std::string, std::string>& overrides) {
  Trial trial = RunOne(knob, value, overrides);
  // The start was measured with this length, so a value that leaves too few
  // steps, or none, starts slower (or runs far slower, which a longer trial
  // measures too, roughly).
  if (!(trial.too_short || trial.no_steps) || t_->interrupted() || ReceivedSignal()) return trial;
  const double was = t_->plan().trial_s, longer = was * kSlowStartStretch;
  const char* what = trial.no_steps ? "no step" : "too few steps";
  // The trial's start-up and stop come on top of its length, in the budget too.
  if (!t_->BudgetHolds(longer, std::max(0.0, trial.wall_s - was))) {
    trial.reason =
        fmt::format("{} in {} (a slower start), and the budget has no room for a {} trial", what,
                    FormatDuration(was), FormatDuration(longer));
    return trial;
  }
  trial.reason =
      fmt::format("{} in {}: tried again at {}", what, FormatDuration(was), FormatDuration(longer));
  t_->Record(trial);
  std::fprintf(stderr, "tune: %s=%s: %s in %s (a slower start): once more at %s\n", knob.c_str(),
               value.c_str(), what, FormatDuration(was).c_str(), FormatDuration(longer).c_str());
  t_->SetTrialLength(longer);
  Trial again = RunOne(knob, value, overrides);
  t_->SetTrialLength(was);
  again.stretched = true;
  return again;
}

Trial KnobTuner::NewTrial(const std::string& knob, const std::string& value,
                          const std::map<std::string, std::string>& overrides) const {
  Trial trial;
  trial.knob = knob;
  trial.value = value;
  trial.overrides = overrides;
  trial.log = t_->NextLog();
  return trial;
}

std::map<std::string, std::string> KnobTuner::OnBest(const Candidate& c) const {
  std::map<std::string, std::string> merged = best_.overrides;
  for (const auto& [key, v] : c.overrides) merged[key] = v;
  return merged;
}

void KnobTuner::Judge(Trial* trial) {
  bool kept = false;
  if (trial->status == "ok")
    trial->verdict = Verdict(*trial, best_, std::max(min_gain_, noise_), &kept);
  t_->Record(*trial);
  if (kept) best_ = t_->trials().back();
}

void KnobTuner::Skip(const std::string& knob, const std::string& reason) {
  Trial t;
  t.knob = knob;
  t.value = "-";
  t.status = "skipped";
  t.reason = reason;
  t_->Record(t);
}

}  // namespace fullburn::cli
