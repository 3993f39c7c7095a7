// fullburn tune's loop (src/internal/fullburn/tuner.h) driven by a scripted
// TrialRunner and a scripted clock: the noise measured by the repeated start,
// a slower start retried once, a failed trial, a budget that runs out and
// Ctrl-C, each decided in milliseconds with no process started.
#include "fullburn/tuner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>

#include "fullburn/report.h"
#include "replay_env.h"

namespace fullburn {
namespace {

using nlohmann::json;

// A clock that moves only when a trial runs.
class ScriptedClock : public Env {
 public:
  double MonotonicSeconds() const override { return now_; }
  double UnixSeconds() const override { return 1.7e9 + now_; }
  void Advance(double s) { now_ += s; }

 private:
  double now_ = 0;
};

// What the runner answers to the next trial it is asked for.
struct Outcome {
  TrialStatus status = TrialStatus::kOk;
  double value = NAN;  // samples/s
  double wall_s = 10;  // the clock moves this much
  std::string reason;
  bool too_short = false, no_steps = false;
};
Outcome Ok(double value, double wall_s = 10) {
  Outcome o;
  o.value = value;
  o.wall_s = wall_s;
  return o;
}
Outcome Failed(std::string reason, double wall_s = 10) {
  Outcome o;
  o.status = TrialStatus::kFailed;
  o.reason = std::move(reason);
  o.wall_s = wall_s;
  return o;
}
// Ran the whole trial, and its start left too few steps (or none) to measure.
Outcome SlowStart(bool no_steps, double wall_s = 12) {
  Outcome o = Failed(no_steps ? "no step records" : "3 steps: lengthen the trial", wall_s);
  o.too_short = !no_steps;
  o.no_steps = no_steps;
  return o;
}
Outcome Interrupted() {
  Outcome o = Failed("stopped by signal 2", 4);
  o.status = TrialStatus::kInterrupted;
  return o;
}

// A trial the tuner asked for, as the runner saw it.
struct Asked {
  std::string knob, value;
  double length_s;
  int number;
};

class ScriptedRunner : public TrialRunner {
 public:
  ScriptedRunner(ScriptedClock* clock, std::vector<Outcome> script)
      : clock_(clock), script_(script.begin(), script.end()) {}

  void Run(const Tuning& t, Trial* trial) override {
    asked.push_back(
        {trial->knob, trial->value, t.plan().trial_s, static_cast<int>(t.trials().size()) + 1});
    if (script_.empty()) {
      ADD_FAILURE() << "an unscripted trial: " << trial->knob << "=" << trial->value;
      trial->status = TrialStatus::kFailed;
      trial->reason = "unscripted";
      return;
    }
    Outcome o = script_.front();
    script_.pop_front();
    clock_->Advance(o.wall_s);
    trial->status = o.status;
    trial->reason = o.reason;
    trial->wall_s = o.wall_s;
    trial->too_short = o.too_short;
    trial->no_steps = o.no_steps;
    trial->measure.value = o.value;
    trial->measure.spread = std::isnan(o.value) ? NAN : 0;
    trial->measure.unit = "samples/s";
    interrupted_ |= o.status == TrialStatus::kInterrupted;
    // The run a child would have recorded, with the effective config it ran.
    auto config = run_configs.find(trial->value);
    if (config != run_configs.end()) {
      RunInfo run;
      run.name = "trial";
      run.parent_id = t.id();
      run.start_time = clock_->UnixSeconds();
      run.config_json = config->second.dump();
      auto id = t.store()->BeginRun(run);
      EXPECT_TRUE(id.ok()) << id.status().message();
      trial->run_id = id.ok() ? *id : 0;
    }
  }
  bool Interrupted() const override { return interrupted_; }
  Status WritePack(const PackJob& job) override {
    packs.push_back(job);
    return Status::IoError("no room for the pack in this test");
  }

  size_t left() const { return script_.size(); }
  std::vector<Asked> asked;
  std::map<std::string, json> run_configs;  // by the trial's value: record a run with it
  std::vector<PackJob> packs;

 private:
  ScriptedClock* clock_;
  std::deque<Outcome> script_;
  bool interrupted_ = false;
};

// Knobs "a" and "b" with the values the test gives, each setting k.<knob>.
class FixedKnobs : public KnobTuner {
 public:
  FixedKnobs(Tuning* t, TrialRunner* runner, std::vector<std::string> a, std::vector<std::string> b)
      : KnobTuner(t, runner, 0.03, "45s", "as given", "the starting config", "at the start") {
    values_["a"] = std::move(a);
    values_["b"] = std::move(b);
  }

 private:
  std::vector<std::string> Order(const std::vector<Finding>&) override { return {"a", "b"}; }
  std::vector<Candidate> Candidates(const std::string& knob, const std::vector<Finding>&,
                                    std::string*) override {
    std::vector<Candidate> out;
    for (const std::string& v : values_[knob]) out.push_back({v, {{"k." + knob, v}}, {}});
    return out;
  }
  std::string Conclude(const std::string& head, json*, int*) override { return head; }

  std::map<std::string, std::vector<std::string>> values_;
};

class TunerLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("tuner");
    auto store = RunStore::Open(dir_ + "/runs.db");
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::move(*store);
    RunInfo info;
    info.name = "tune: test";
    info.start_time = clock_.UnixSeconds();
    auto id = store_->BeginRun(info);
    ASSERT_TRUE(id.ok()) << id.status().message();
    info.id = *id;
    info_ = info;
    plan_.budget_s = 1000;
    plan_.trial_s = 10;
  }

  // Runs FixedKnobs over the script; the exit code.
  int RunKnobs(std::vector<Outcome> script, std::vector<std::string> a,
               std::vector<std::string> b = {}) {
    tuning_ = std::make_unique<Tuning>(store_.get(), info_, plan_, &clock_);
    runner_ = std::make_unique<ScriptedRunner>(&clock_, std::move(script));
    int code = FixedKnobs(tuning_.get(), runner_.get(), std::move(a), std::move(b)).Run();
    EXPECT_EQ(runner_->left(), 0u) << "scripted trials never asked for";
    return code;
  }

  std::vector<json> Events(const std::string& kind) {
    std::vector<json> out;
    std::vector<RunEvent> events = store_->LoadEvents(info_.id).value();
    for (const RunEvent& e : events)
      if (e.kind == kind) out.push_back(json::parse(e.data));
    return out;
  }
  json Result() {
    std::vector<json> r = Events("tune_result");
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? json() : r.front();
  }
  std::optional<int> ExitCode() { return store_->GetRun(std::to_string(info_.id))->exit_code; }

  std::string dir_;
  std::unique_ptr<RunStore> store_;
  RunInfo info_;
  TunePlan plan_;
  ScriptedClock clock_;
  std::unique_ptr<Tuning> tuning_;
  std::unique_ptr<ScriptedRunner> runner_;
};

TEST_F(TunerLoop, TheRepeatedStartMeasuresTheNoiseThatAChangeMustBeat) {
  // The start measured 100 and 110: 10/105 = 10% noise, the start counting as 105.
  int code = RunKnobs({Ok(100), Ok(110), Ok(112), Ok(120)}, {"1", "2"});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[0]["verdict"], "start");
  EXPECT_EQ(trials[1]["value"], "again");
  EXPECT_EQ(trials[1]["verdict"], "run-to-run noise 10%");
  // +7% beats --min-gain (3%) but not the noise; +14% beats both.
  EXPECT_EQ(trials[2]["verdict"], "within noise +7%");
  EXPECT_EQ(trials[3]["verdict"], "kept +14%");
  json result = Result();
  EXPECT_DOUBLE_EQ(result["start"].get<double>(), 105);
  EXPECT_DOUBLE_EQ(result["best"].get<double>(), 120);
  EXPECT_EQ(result["best_trial"], 4);
  EXPECT_EQ(result["overrides"], json({{"k.a", "2"}}));
  EXPECT_EQ(result["summary"], "tuning 1: 120.0 samples/s vs 105.0 at the start (1.14x)");
  EXPECT_EQ(ExitCode(), 0);
}

TEST_F(TunerLoop, AValueWithASlowerStartIsRetriedOnceAtThreeTimesTheLength) {
  int code = RunKnobs(
      {Ok(100), Ok(100), SlowStart(false), Ok(130, 32),  // a=1: measured on the longer trial
       SlowStart(true), SlowStart(true, 32)},            // a=2: too slow there too
      {"1", "2"});
  EXPECT_EQ(code, 0);
  ASSERT_EQ(runner_->asked.size(), 6u);
  std::vector<double> lengths;
  for (const Asked& a : runner_->asked) lengths.push_back(a.length_s);
  EXPECT_EQ(lengths, (std::vector<double>{10, 10, 10, 30, 10, 30}));
  EXPECT_EQ(tuning_->plan().trial_s, 10);  // the plan's length again after each retry
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 6u);
  EXPECT_EQ(trials[2]["status"], "failed");
  EXPECT_EQ(trials[2]["reason"], "too few steps in 10.0s: tried again at 30.0s");
  EXPECT_EQ(trials[3]["status"], "ok");
  EXPECT_EQ(trials[3]["verdict"], "kept +30%");
  EXPECT_EQ(trials[4]["reason"], "no step in 10.0s: tried again at 30.0s");
  EXPECT_EQ(trials[5]["status"], "failed");  // once: not a third time
  EXPECT_EQ(trials[5]["reason"], "no step records");
  EXPECT_EQ(Result()["best"], 130);
}

TEST_F(TunerLoop, ASlowerStartIsNotRetriedWhenTheBudgetHasNoRoom) {
  plan_.budget_s = 60;
  // At 32 s a 30 s trial and the 2 s of start-up the short one took past 10 s do not fit.
  int code = RunKnobs({Ok(100), Ok(100), SlowStart(false)}, {"1"});
  EXPECT_EQ(code, 0);
  EXPECT_EQ(runner_->asked.size(), 3u);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[2]["reason"],
            "too few steps in 10.0s (a slower start), and the budget has no room for a 30.0s "
            "trial");
}

TEST_F(TunerLoop, AStartWithTooFewStepsLengthensEveryTrial) {
  int code = RunKnobs({SlowStart(false), Ok(100, 20), Ok(100, 20), Ok(101, 20)}, {"1"});
  EXPECT_EQ(code, 0);
  std::vector<double> lengths;
  for (const Asked& a : runner_->asked) lengths.push_back(a.length_s);
  EXPECT_EQ(lengths, (std::vector<double>{10, 20, 20, 20}));
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[0]["status"], "failed");
  EXPECT_EQ(trials[1]["verdict"], "start");
  EXPECT_EQ(trials[3]["verdict"], "within noise +1%");
}

TEST_F(TunerLoop, AFailedTrialIsRecordedWithItsReasonAndTheTuningGoesOn) {
  int code =
      RunKnobs({Ok(100), Ok(100), Failed("exit code 1: out of memory"), Ok(110)}, {"1", "2"});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[2]["status"], "failed");
  EXPECT_EQ(trials[2]["reason"], "exit code 1: out of memory");
  EXPECT_EQ(trials[2]["verdict"], "");
  EXPECT_EQ(trials[3]["verdict"], "kept +10%");
  EXPECT_EQ(Result()["best_trial"], 4);
}

TEST_F(TunerLoop, AFailedStartStopsTheTuningWithNothingToCompare) {
  int code = RunKnobs({Failed("exit code 1: no such file")}, {"1"});
  EXPECT_EQ(code, 1);
  EXPECT_EQ(Events("tune_trial").size(), 1u);
  json result = Result();
  EXPECT_EQ(result["summary"],
            "tuning 1 stopped: the starting config failed (exit code 1: no such file): nothing to "
            "compare with");
  EXPECT_FALSE(result.contains("best"));
  EXPECT_EQ(ExitCode(), 1);
}

TEST_F(TunerLoop, ABudgetThatRunsOutSkipsTheKnobsLeft) {
  plan_.budget_s = 45;  // each trial takes 10 s on the clock
  int code = RunKnobs({Ok(100), Ok(100), Ok(100), Ok(100)}, {"1", "2", "3"}, {"1"});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 6u);  // start, again, a=1, a=2, then at 40 s no room for 10 more
  for (int i : {4, 5}) {
    EXPECT_EQ(trials[i]["status"], "skipped");
    EXPECT_EQ(trials[i]["reason"], "budget (45s) used up");
    EXPECT_EQ(trials[i]["value"], "-");
  }
  EXPECT_EQ(trials[4]["knob"], "a");
  EXPECT_EQ(trials[5]["knob"], "b");
}

TEST_F(TunerLoop, TheLongestTrialSoFarIsWhatTheBudgetMustHold) {
  plan_.budget_s = 60;
  // The start took 25 s (start-up): at 35 s another 25 s still fits, at 45 s not.
  int code = RunKnobs({Ok(100, 25), Ok(100), Ok(100)}, {"1", "2"});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 5u);  // start, again, a=1, then a and b skipped
  EXPECT_EQ(trials[2]["status"], "ok");
  EXPECT_EQ(trials[3]["status"], "skipped");
  EXPECT_EQ(trials[4]["status"], "skipped");
}

TEST_F(TunerLoop, CtrlCEndsTheTuningWith130AndKeepsTheTrialsSoFar) {
  int code = RunKnobs({Ok(100), Ok(100), Ok(120), Interrupted()}, {"1", "2", "3"}, {"1"});
  EXPECT_EQ(code, 130);
  EXPECT_EQ(runner_->asked.size(), 4u);  // nothing after the interrupted trial
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[3]["status"], "interrupted");
  EXPECT_EQ(trials[3]["reason"], "stopped by signal 2");
  json result = Result();
  EXPECT_EQ(result["best"], 120);  // the best so far is the result
  EXPECT_EQ(result["summary"],
            "tuning 1: 120.0 samples/s vs 100.0 at the start (1.20x), interrupted");
  EXPECT_EQ(ExitCode(), 130);
}

TEST_F(TunerLoop, CtrlCInAGridSkipsTheCombinationsLeft) {
  auto axis = ParseGridAxis("batch=16,32,64");
  ASSERT_TRUE(axis.ok());
  plan_.grid = true;
  plan_.axes = {*axis};
  tuning_ = std::make_unique<Tuning>(store_.get(), info_, plan_, &clock_);
  ScriptedRunner runner(&clock_, {Ok(100), Interrupted()});
  int code = TuneGrid(tuning_.get(), &runner, {"train", "--batch", "{batch}"}, 0.03, "10m");
  EXPECT_EQ(code, 130);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[0]["verdict"], "first");
  EXPECT_EQ(trials[1]["status"], "interrupted");
  EXPECT_EQ(trials[2]["status"], "skipped");
  EXPECT_EQ(trials[2]["reason"], "interrupted");
  json result = Result();
  EXPECT_EQ(result["command"], "train --batch 16");
  EXPECT_EQ(ExitCode(), 130);
}

TEST_F(TunerLoop, AGridStopsWhenTheBudgetRunsOut) {
  auto axis = ParseGridAxis("workers=1,2,4,8");
  ASSERT_TRUE(axis.ok());
  plan_.grid = true;
  plan_.axes = {*axis};
  plan_.budget_s = 25;
  tuning_ = std::make_unique<Tuning>(store_.get(), info_, plan_, &clock_);
  ScriptedRunner runner(&clock_, {Ok(100), Ok(150)});
  int code = TuneGrid(tuning_.get(), &runner, {"cmd", "{workers}"}, 0.03, "25s");
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[1]["verdict"], "fastest so far (+50%)");
  EXPECT_EQ(trials[2]["reason"], "budget (25s) used up");
  EXPECT_EQ(Result()["best_trial"], 2);
}

// fullburn train's knobs on the same loop: what its result is made of.
class TunerTrain : public TunerLoop {
 protected:
  int RunTrain(std::vector<Outcome> script, std::map<std::string, json> run_configs = {}) {
    tuning_ = std::make_unique<Tuning>(store_.get(), info_, plan_, &clock_);
    runner_ = std::make_unique<ScriptedRunner>(&clock_, std::move(script));
    runner_->run_configs = std::move(run_configs);
    TrainTuneOptions o;
    o.budget = "10m";
    o.output = dir_ + "/tuned.toml";
    int code = TuneTrain(tuning_.get(), runner_.get(), o);
    EXPECT_EQ(runner_->left(), 0u) << "scripted trials never asked for";
    return code;
  }
};

TEST_F(TunerTrain, TheWinnerIsWrittenAsAConfigThatSaysWhatChanged) {
  plan_.knobs = {"precision"};
  int code = RunTrain({Ok(100), Ok(100), Ok(150)});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[2]["knob"], "precision");
  EXPECT_EQ(trials[2]["value"], "bf16");  // the default fp32 left out
  EXPECT_EQ(trials[2]["verdict"], "kept +50%");
  std::string path = dir_ + "/tuned.toml";
  json result = Result();
  EXPECT_EQ(result["config_path"], path);
  EXPECT_EQ(result["overrides"], json({{"train.precision", "bf16"}}));
  EXPECT_EQ(result["summary"],
            "tuning 1: 150.0 samples/s vs 100.0 at the start (1.50x); config "
            "written to " +
                path + " (fullburn train " + path + ")");
  std::string toml = testing::ReadText(path);
  EXPECT_EQ(toml.rfind("# fullburn tune (tuning run 1): 150.0 samples/s with these settings, "
                       "100.0 at the start (1.50x).\n# Changed: train.precision=bf16\n",
                       0),
            0u)
      << toml;
  EXPECT_NE(toml.find("\nprecision = \"bf16\"\n"), std::string::npos) << toml;
}

TEST_F(TunerTrain, TheBatchSearchsChoiceIsMeasuredAgainWithTheEffectiveBatchKept) {
  plan_.knobs = {"batch"};
  json start = {{"train", {{"batch_size", 32}, {"accumulate", 4}}}};  // 128 a step
  json searched = {{"train", {{"batch_size", 64}, {"accumulate", 1}}}};
  int code = RunTrain({Ok(100), Ok(100), Ok(180), Ok(160)},
                      {{"as given", start}, {"again", start}, {"auto (<= 128)", searched}});
  EXPECT_EQ(code, 0);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[2]["overrides"], json({{"train.batch_size", "auto"},
                                          {"train.max_batch_size", "128"},
                                          {"train.accumulate", "1"}}));
  EXPECT_EQ(trials[2]["verdict"], "search chose 64");
  EXPECT_EQ(trials[3]["value"], "64 x 2");
  EXPECT_EQ(trials[3]["verdict"], "kept +60%");
  EXPECT_EQ(Result()["overrides"], json({{"train.batch_size", "64"}, {"train.accumulate", "2"}}));
  std::string toml = testing::ReadText(dir_ + "/tuned.toml");
  EXPECT_NE(toml.find("\nbatch_size = 64\naccumulate = 2\n"), std::string::npos) << toml;
}

TEST_F(TunerTrain, APackThatCannotBeWrittenIsAFailedTrialAndNoTrialRuns) {
  plan_.knobs = {"pack"};
  json start = {{"data", {{"source", "images"}, {"image_size", 64}}},
                {"resolved", {{"data_path", dir_ + "/images"}}}};
  int code = RunTrain({Ok(100), Ok(100)}, {{"as given", start}, {"again", start}});
  EXPECT_EQ(code, 0);
  ASSERT_EQ(runner_->packs.size(), 1u);
  EXPECT_EQ(runner_->packs[0].src, dir_ + "/images");
  EXPECT_EQ(runner_->packs[0].dst, tuning_->PackDir());
  EXPECT_EQ(runner_->packs[0].max_side, 128);
  std::vector<json> trials = Events("tune_trial");
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[2]["knob"], "pack");
  EXPECT_EQ(trials[2]["status"], "failed");
  EXPECT_EQ(trials[2]["reason"], "no room for the pack in this test");
  EXPECT_EQ(Result()["overrides"], json::object());
}

}  // namespace
}  // namespace fullburn
