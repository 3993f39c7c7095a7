// Internal to fullburn tune: running one trial as a child process.
#pragma once

#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/report.h"
#include "fullburn/store.h"
#include "fullburn/store_layout.h"
#include "fullburn/tune.h"

namespace fullburn::cli {

struct TrialSpec {
  std::vector<std::string> argv;  // records a run with --parent tuning_id
  int64_t tuning_id = 0;
  double timeout_s = 0;
  // The stretch measured (--trial): the child ran it all when it lasted this long.
  double length_s = 0;
  // --grid: a command still running at the trial's end is stopped and
  // measured; fullburn-train stops itself, so running past it is a failure.
  bool stop_is_normal = false;
  std::string metric_regex;  // measure the output instead of the step records
  std::vector<std::string> extra_env;  // NAME=value for the child
  Objective objective = Objective::kSamplesPerSecond;
};

// Everything checked before the first trial.
struct Plan {
  bool grid = false;
  bool script = false;  // fullburn tune -- CMD: an unchanged PyTorch script
  double budget_s = 0, trial_s = 0;
  Objective objective = Objective::kSamplesPerSecond;
  std::vector<std::string> knobs;  // empty: all
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<GridAxis> axes;
};

inline double TuneClock() { return Env::Default()->MonotonicSeconds(); }

// How much longer a value's trial runs again when its start left too few
// steps: cuDNN's benchmark mode took 4.1 s of an 8 s trial on an H200.
constexpr double kSlowStartStretch = 3;

// Runs the child (output to trial->log), then fills status, reason, run_id,
// wall_s and the measure. Never throws; a failure is the trial's status.
void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial);

// The tuning as it goes: the run that holds it, its trials, the clock.
class Tuning {
 public:
  Tuning(RunStore* store, RunInfo run, const Plan& plan)
      : store_(store),
        run_(std::move(run)),
        plan_(plan),
        start_(TuneClock()),
        layout_(store->path()) {
    ::mkdir(layout_.TuneLogs(run_.id).c_str(), 0755);  // the trials' output files
  }

  int64_t id() const { return run_.id; }
  const Plan& plan() const { return plan_; }
  RunStore* store() const { return store_; }
  const std::vector<Trial>& trials() const { return trials_; }
  bool interrupted() const { return interrupted_; }

  std::string NextLog() const { return layout_.TrialLog(run_.id, static_cast<int>(trials_.size()) + 1); }
  std::string LogDir() const { return layout_.TuneLogs(run_.id); }
  std::string PackDir() const { return layout_.TunePack(run_.id); }

  // Trials `factor` times as long from now on, if the budget holds the start
  // and its repeat at that length; false (unchanged) if not.
  bool LengthenTrials(double factor) {
    double longer = plan_.trial_s * factor;
    if (TuneClock() - start_ + 2 * longer > plan_.budget_s) return false;
    plan_.trial_s = longer;
    return true;
  }

  // Whether the budget holds one more trial of `seconds` and `overhead_s`
  // (the child's start-up and stop).
  bool BudgetHolds(double seconds, double overhead_s) const {
    return TuneClock() - start_ + seconds + overhead_s <= plan_.budget_s;
  }
  // The trials' length from now on (a slow start's longer trial, then back).
  void SetTrialLength(double seconds) { plan_.trial_s = seconds; }

  // Room for one more trial, judged by the longest so far at the plan's length.
  bool BudgetAllows() const {
    double longest = plan_.trial_s;
    for (const Trial& t : trials_)
      if (!t.stretched) longest = std::max(longest, t.wall_s);
    return TuneClock() - start_ + longest <= plan_.budget_s;
  }

  void Record(Trial t) {
    t.index = static_cast<int>(trials_.size()) + 1;
    if (t.status == "interrupted") interrupted_ = true;
    store_->AddEvent(run_.id, {Env::Default()->UnixSeconds() - run_.start_time, "tune_trial",
                               TrialJson(t).dump()});
    std::string line = fmt::format("tune: #{} {}={}: ", t.index, t.knob, t.value);
    if (t.status == "ok")
      line += FormatMeasure(t.measure) + " " + t.measure.unit + " " + t.verdict;
    else
      line += t.status + (t.reason.empty() ? "" : ": " + t.reason);
    if (t.run_id > 0) line += fmt::format(" (run {})", t.run_id);
    std::fprintf(stderr, "%s\n", line.c_str());
    trials_.push_back(std::move(t));
  }

  void Finish(const std::string& summary, const nlohmann::json& result, int code) {
    nlohmann::json j = result;
    j["summary"] = summary;
    store_->AddEvent(run_.id,
                     {Env::Default()->UnixSeconds() - run_.start_time, "tune_result", j.dump()});
    store_->FinishRun(run_.id, Env::Default()->UnixSeconds(), code, "finished");
    std::fputs(("\n" + RenderTrialTable(trials_) + "\n").c_str(), stdout);
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }

 private:
  RunStore* store_;
  RunInfo run_;
  Plan plan_;
  double start_;
  StoreLayout layout_;
  std::vector<Trial> trials_;
  bool interrupted_ = false;
};

// A trial of `command` under `fullburn run`, recorded as a run of the
// tuning named `label` ("tune 3 #2: workers=4"), stopped at --trial and
// measured from what it recorded (--grid, and an unchanged script).
TrialSpec CommandTrialSpec(const Tuning& t, const std::string& label,
                           const std::vector<std::string>& command);

// "kept +12%", "within noise +1%", "slower -8%"; *kept: t beats best beyond min_gain.
std::string Verdict(const Trial& t, const Trial& best, double min_gain, bool* kept);

// One knob at a time from the best so far: what fullburn train's tuning and
// an unchanged script's share. The start runs twice (the second for the
// run-to-run noise, the start counting as their mean), the start's diagnosis
// orders the knobs, and a value is kept when it beats the best beyond the
// noise. Subclasses run a trial and know their knobs.
class KnobTuner {
 public:
  // start_value: the start trial's value ("as given"); start_name: what
  // failed when it fails ("the starting config").
  KnobTuner(Tuning* t, double min_gain, std::string budget, std::string start_value,
            std::string start_name)
      : t_(t),
        min_gain_(min_gain),
        budget_(std::move(budget)),
        start_value_(std::move(start_value)),
        start_name_(std::move(start_name)) {}
  virtual ~KnobTuner() = default;
  int Run();  // the exit code

 protected:
  virtual Trial RunOne(const std::string& knob, const std::string& value,
                       const std::map<std::string, std::string>& overrides) = 0;
  virtual std::vector<std::string> Order(const std::vector<Finding>& findings) = 0;
  // False when the budget ran out before the knob was done.
  virtual bool TryKnob(const std::string& knob, const std::vector<Finding>& findings) = 0;
  // Writes the result; `failure` set: the tuning stopped before any knob.
  virtual int Finish(int code, const std::string& failure) = 0;

  // A trial of `knob` = `value`, its output file next in the tuning's directory.
  Trial NewTrial(const std::string& knob, const std::string& value,
                 const std::map<std::string, std::string>& overrides) const;
  // The best settings so far with the candidate's on top.
  std::map<std::string, std::string> OnBest(const Candidate& c) const;
  // RunOne, and where a value's start is slower than the start trial's (cuDNN
  // trying algorithms, DataLoader workers starting, a CUDA graph captured)
  // and left too few steps to measure, once more at three times the length.
  Trial RunKnobTrial(const std::string& knob, const std::string& value,
                     const std::map<std::string, std::string>& overrides);
  // Records the trial with its verdict against the best; a kept one is the new best.
  void Judge(Trial* trial);
  void Skip(const std::string& knob, const std::string& reason);

  Tuning* t_;
  double min_gain_;
  std::string budget_;
  Trial best_, start_;
  double noise_ = 0;  // relative difference of two runs of the start

 private:
  void MeasureNoise();
  std::string start_value_, start_name_;
};

// fullburn tune -- CMD: an unchanged PyTorch script's DataLoader and threads,
// one knob at a time (cmd_tune_script.cpp).
int TuneScript(Tuning* t, const std::vector<std::string>& command, double min_gain,
               const std::string& budget);

}  // namespace fullburn::cli
