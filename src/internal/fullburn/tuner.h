// Tuner: the loop of `fullburn tune`. A Tuning records the trials of one
// tuning run; a tuner decides which trial comes next and what it proved:
// the start run twice (the second measures the run-to-run noise), a start
// that recorded too few steps lengthened, the knobs in the order the start's
// diagnosis suggests, one value at a time on top of the best so far, a value
// whose start is slower retried once on a longer trial, a value kept only
// when it beats the best beyond the noise, and the budget and Ctrl-C
// obeyed (docs/tune.md). How a trial runs is a TrialRunner's: the command's
// starts a child process (src/cli/tune_trial.cpp), tests script one.
//
// Contract
// - Ownership: a Tuning borrows its RunStore and its Env (both outlive it)
//   and owns its trials; a tuner borrows the Tuning and the TrialRunner for
//   the length of its Run. Nothing here starts a process.
// - Threads: none of its own. A Tuning, its tuner and its runner are used from
//   one thread, one trial at a time.
// - Time: the budget and every trial's timing are read from the Env's
//   MonotonicSeconds, event times from its UnixSeconds; Env::Default() in the
//   command, a scripted clock in tests.
// - Errors: a trial that fails is recorded with TrialStatus::kFailed and its
//   reason, and the tuning goes on; nothing here throws. A tuner's Run returns
//   the command's exit code: 0; 1 when the start failed, nothing could be
//   measured or the winning config could not be written; 130 when a trial
//   was interrupted (Ctrl-C).
// - Output: each trial is a `tune_trial` event of the tuning run and a line
//   on stderr; the end is one `tune_result` event, the run finished with the
//   exit code, and the trial table and the summary on stdout (docs/tune.md).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/env.h"
#include "fullburn/status.h"
#include "fullburn/store.h"
#include "fullburn/store_layout.h"
#include "fullburn/tune.h"

namespace fullburn {

// Everything `fullburn tune` checked before the first trial.
struct TunePlan {
  bool grid = false;
  bool script = false;  // fullburn tune -- CMD: an unchanged PyTorch script
  double budget_s = 0, trial_s = 0;
  Objective objective = Objective::kSamplesPerSecond;
  std::vector<std::string> knobs;  // empty: all
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<GridAxis> axes;
};

// How much longer a value's trial runs again when its start left too few
// steps: cuDNN's benchmark mode took 4.1 s of an 8 s trial on an H200.
constexpr double kSlowStartStretch = 3;

class Tuning;

// Runs trials. The command's runner starts each as a child process recorded
// as a run of the tuning; a test's returns what its script says.
class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  // Runs the trial `trial` names (knob, value, overrides, log) as trial number
  // tuning.trials().size() + 1, for tuning.plan().trial_s, and fills its
  // status, reason, run_id, wall_s, measure, too_short and no_steps. A failure
  // is the trial's status (kInterrupted for Ctrl-C), never an exception.
  virtual void Run(const Tuning& tuning, Trial* trial) = 0;
  // Whether the user asked to stop (Ctrl-C): a short trial is not retried.
  virtual bool Interrupted() const = 0;
  // Writes the packed copy of the images the pack knob asks for (fullburn
  // pack SRC DST --format raw --max-side N); an error names what failed.
  virtual Status WritePack(const PackJob& job) = 0;
};

// The tuning as it goes: the run that holds it, its trials, the clock.
class Tuning {
 public:
  // Makes the folder of the trials' output files (StoreLayout::TuneLogs).
  Tuning(RunStore* store, RunInfo run, const TunePlan& plan, const Env* env = Env::Default());

  int64_t id() const { return run_.id; }
  const TunePlan& plan() const { return plan_; }
  RunStore* store() const { return store_; }
  const Env* env() const { return env_; }
  const std::vector<Trial>& trials() const { return trials_; }
  // A recorded trial was interrupted: no further trial starts.
  bool interrupted() const { return interrupted_; }

  std::string NextLog() const;  // the output file of the next trial
  std::string LogDir() const;
  std::string PackDir() const;  // where the pack knob writes its pack

  // Trials `factor` times as long from now on, if the budget holds the start
  // and its repeat at that length; false (unchanged) if not.
  bool LengthenTrials(double factor);
  // This trial's length (a slower start's longer trial), then the plan's again.
  void SetTrialLength(double seconds) { plan_.trial_s = seconds; }
  // Whether one more trial of `trial_s`, with `overhead_s` of start-up and
  // stop on top, fits in what is left of the budget.
  bool BudgetHolds(double trial_s, double overhead_s) const;
  // Whether the budget still holds the longest trial so far (at least the
  // plan's length; a slower start's longer trial aside).
  bool BudgetAllows() const;

  // Numbers the trial, stores it as a `tune_trial` event and says it on stderr.
  void Record(Trial t);
  // Stores the `tune_result` event (`result` with the summary), finishes the
  // run with `code`, and prints the trial table and the summary.
  void Finish(const std::string& summary, const nlohmann::json& result, int code);

 private:
  RunStore* store_;
  RunInfo run_;
  TunePlan plan_;
  const Env* env_;
  double start_;
  StoreLayout layout_;
  std::vector<Trial> trials_;
  bool interrupted_ = false;
};

// One knob at a time from the best so far: what fullburn train's tuning and
// an unchanged script's share. The start runs twice (the second for the
// run-to-run noise, the start counting as their mean), the start's diagnosis
// orders the knobs, and a value is kept when it beats the best beyond the
// noise. Subclasses know their knobs and what the result says.
class KnobTuner {
 public:
  // start_value: the start trial's value ("as given"); start_name: what
  // failed when it fails ("the starting config"); versus: how the summary
  // names the start ("at the start").
  KnobTuner(Tuning* t, TrialRunner* runner, double min_gain, std::string budget,
            std::string start_value, std::string start_name, std::string versus);
  virtual ~KnobTuner() = default;
  int Run();  // the exit code

 protected:
  // The knobs to try, in order, from the start's findings.
  virtual std::vector<std::string> Order(const std::vector<Finding>& findings) = 0;
  // The values of `knob` to try on top of the best; none with *skip_reason
  // set when the knob does not apply.
  virtual std::vector<Candidate> Candidates(const std::string& knob,
                                            const std::vector<Finding>& findings,
                                            std::string* skip_reason) = 0;
  // A measured trial of `knob`, before it is judged (the batch search's
  // choice measured again with the effective batch kept).
  virtual Trial Settle(const std::string& /*knob*/, Trial trial) { return trial; }
  // A trial the runner ran, before anything else looks at it (whether the
  // setting took).
  virtual void Check(Trial* /*trial*/) {}
  // The end of a tuning that measured its start: adds to `result` (which has
  // objective, start, best, ratio, best_trial and overrides), may change
  // *code, and returns the summary; `head` is its first words ("tuning 3:
  // 512.0 samples/s vs 400.0 at the start (1.28x)").
  virtual std::string Conclude(const std::string& head, nlohmann::json* result, int* code) = 0;

  // A trial of `knob` = `value`, its output file next in the tuning's directory.
  Trial NewTrial(const std::string& knob, const std::string& value,
                 const std::map<std::string, std::string>& overrides) const;
  // The best settings so far with the candidate's on top.
  std::map<std::string, std::string> OnBest(const Candidate& c) const;
  // The runner's trial of `knob` = `value`, checked.
  Trial RunOne(const std::string& knob, const std::string& value,
               const std::map<std::string, std::string>& overrides);
  // RunOne, and where a value's start is slower than the start trial's (cuDNN
  // trying algorithms, DataLoader workers starting, a CUDA graph captured)
  // and left too few steps to measure, once more at kSlowStartStretch times
  // the length.
  Trial RunKnobTrial(const std::string& knob, const std::string& value,
                     const std::map<std::string, std::string>& overrides);
  // Records the trial with its verdict against the best; a kept one is the new best.
  void Judge(Trial* trial);
  void Skip(const std::string& knob, const std::string& reason);

  Tuning* t_;
  TrialRunner* runner_;
  double min_gain_;
  std::string budget_;
  Trial best_, start_;
  double noise_ = 0;               // relative difference of two runs of the start
  std::optional<PackJob> packed_;  // the pack this tuning wrote

 private:
  // The start (`value`), lengthened up to `lengthen` times while it records
  // too few steps to measure and the budget holds it.
  Trial RunStart(const std::string& value, int lengthen);
  void MeasureNoise();
  // False when the budget ran out before the knob was done.
  bool TryKnob(const std::string& knob, const std::vector<Finding>& findings);
  // Writes the result; `failure` set: the tuning stopped before any knob.
  int Finish(int code, const std::string& failure);

  std::string start_value_, start_name_, versus_;
};

// fullburn train's knobs (docs/tune.md): trials on top of plan().config_path
// and plan().overrides; the winner written as a complete config.
struct TrainTuneOptions {
  double min_gain = 0.03;
  std::string budget;       // as the user wrote it, for "budget (10m) used up"
  bool free_batch = false;  // the batch search may change the effective batch
  std::string output;       // the winning config; "" fullburn-tuned-TUNING.toml
};
int TuneTrain(Tuning* t, TrialRunner* runner, const TrainTuneOptions& o);

// fullburn tune -- CMD: an unchanged PyTorch script's DataLoader and threads,
// applied through FULLBURN_TUNE_SET; the winner said as the lines to change.
int TuneScript(Tuning* t, TrialRunner* runner, const std::vector<std::string>& command,
               double min_gain, const std::string& budget);

// --grid: every combination of plan().axes in `command` (placeholders
// substituted, checked before), each judged against the fastest before it,
// until the budget runs out.
int TuneGrid(Tuning* t, TrialRunner* runner, const std::vector<std::string>& command,
             double min_gain, const std::string& budget);

}  // namespace fullburn
