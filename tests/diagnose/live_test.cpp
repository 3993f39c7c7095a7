// LiveDiagnosis: the last minute of a run that is still going.
#include <gtest/gtest.h>

#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

// A wrapped job on a 2-core host: one reading a second, one 0.5 s step every
// 0.5 s, waiting for data `wait` of each.
struct Job {
  LiveDiagnosis live{[] {
    RunInfo r;
    r.config_json = R"({"interval_s": 1, "auto_steps": true})";
    r.interval_s = 1;
    return r;
  }()};
  int64_t step = 0;
  void Second(double t, double wait, double cpu = 30) {
    live.AddReadings(t, {{"host.cpu_util", cpu},
                         {"host.cpu_iowait", 1},
                         {"host.cpu0.util", cpu},
                         {"host.cpu1.util", cpu},
                         {"proc.cpu_util", 50}});
    std::vector<StepRecord> steps;
    for (double end : {t - 0.5, t}) {
      StepRecord r;
      r.step = ++step;
      r.t = end;
      r.step_s = 0.5;
      r.samples = 32;
      r.data_wait_s = 0.5 * wait;
      steps.push_back(r);
    }
    live.AddSteps(steps);
  }
};

TEST(LiveDiagnosis, NamesWhatLimitsTheLastMinuteAndFollowsAChange) {
  Job job;
  // Start-up: 15 s of readings without steps; then steps waiting 30% for data.
  for (int t = 1; t <= 15; ++t)
    job.live.AddReadings(t, {{"host.cpu_util", 90}, {"host.cpu0.util", 90}});
  EXPECT_FALSE(job.live.Update(15).has_value());  // too soon to tell
  for (int t = 16; t <= 30; ++t) job.Second(t, 0.3);
  EXPECT_FALSE(job.live.Update(30).has_value()) << "15 s of steps: too few";
  for (int t = 31; t <= 40; ++t) job.Second(t, 0.3);
  const std::optional<Finding>& top = job.live.Update(40);
  ASSERT_TRUE(top.has_value());
  // The start-up before the first step is not "now" (counted, its 15 s of
  // 40 would be idle_phases' 37%, above the wait's 30%).
  EXPECT_EQ(top->name(), "input_workers") << top->evidence;
  EXPECT_NEAR(top->share_lost, 0.3, 0.01);
  EXPECT_EQ(RenderLiveFinding(top), " | now: input_workers ~30%");
  // The loader is fixed at 41 s: once its waits leave the last minute, so
  // does the finding; between two diagnoses the last one stands.
  for (int t = 41; t <= 60; ++t) job.Second(t, 0.01);
  EXPECT_EQ(job.live.Update(60)->name(), "input_workers") << "25 s of waiting in the window";
  for (int t = 61; t <= 105; ++t) job.Second(t, 0.01);
  EXPECT_EQ(job.live.Update(65)->name(), "input_workers") << "diagnosed at most every 10 s";
  const std::optional<Finding>& later = job.live.Update(105);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->name(), "healthy") << later->evidence;
  EXPECT_EQ(RenderLiveFinding(later), " | now: no bottleneck");
  EXPECT_EQ(RenderLiveFinding(std::nullopt), "");
  Finding unmeasured = *later;
  unmeasured.confidence = 0.3;  // no GPU and no steps: nothing to call healthy
  EXPECT_EQ(RenderLiveFinding(unmeasured), "");
  // Then no step for a minute (a long evaluation, a hang): the whole window is idle.
  for (int t = 106; t <= 170; ++t) job.live.AddReadings(t, {{"host.cpu_util", 30}});
  const std::optional<Finding>& stopped = job.live.Update(170);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(RenderLiveFinding(stopped), " | now: idle_phases ~100%");
}

// Steps longer than a third of the window: a minute without a step start is
// not a stop.
TEST(LiveDiagnosis, LongStepsAreNoStop) {
  Job job;
  std::vector<StepRecord> steps;
  for (int i = 1; i <= 3; ++i) {
    StepRecord r;
    r.step = i;
    r.t = 30.0 * i;
    r.step_s = 30;
    r.samples = 32;
    r.data_wait_s = 0;
    steps.push_back(r);
  }
  job.live.AddSteps(steps);
  for (int t = 1; t <= 150; ++t) job.live.AddReadings(t, {{"host.cpu_util", 30}});
  const std::optional<Finding>& top = job.live.Update(150);
  EXPECT_TRUE(!top || top->name() != "idle_phases") << top->evidence;
}

// The DataLoader's settings came once, at the start: the advice still uses
// them after that event has left the window.
TEST(LiveDiagnosis, TheJobsSettingsOutliveTheWindow) {
  Job job;
  job.live.AddEvents({{16, "dataloader", R"({"num_workers": 0, "rank": 0})"}});
  for (int t = 16; t <= 120; ++t) job.Second(t, 0.5);
  const std::optional<Finding>& top = job.live.Update(120);
  ASSERT_TRUE(top.has_value());
  EXPECT_NE(top->evidence.find("num_workers=0"), std::string::npos) << top->evidence;
}

// A stretch of a stored run as a run of its own.
TEST(RunWindow, KeepsWhatIsInsideShiftedAndTheJobsSettings) {
  RunData d;
  d.run.start_time = 1000;
  d.run.end_time = 1100;
  d.run.exit_code = 0;
  for (int t = 0; t <= 100; t += 10) d.samples["host.cpu_util"].push_back({double(t), double(t)});
  for (int i = 1; i <= 10; ++i) {
    StepRecord r;
    r.step = i;
    r.t = 10.0 * i;
    r.step_s = 10;
    d.steps.push_back(r);
  }
  d.events = {{1, "dataloader", R"({"num_workers": 2})"},
              {45, "evaluation", R"({"duration_s": 10})"},  // 35..45: cut by the window
              {60, "evaluation", R"({"duration_s": 5})"}};  // 55..60: inside
  d.checkpoints = {{3, 30, "/a", 1, 0, 2}, {6, 60, "/b", 1, 0, 2}};
  RunData w = RunWindow(d, 40, 70);
  EXPECT_DOUBLE_EQ(w.run.start_time, 1040);
  ASSERT_TRUE(w.run.end_time.has_value());
  EXPECT_DOUBLE_EQ(*w.run.end_time, 1070);  // the run went on: it ends with the window
  EXPECT_FALSE(w.run.exit_code.has_value());
  ASSERT_EQ(w.samples["host.cpu_util"].size(), 4u);  // 40, 50, 60, 70
  EXPECT_DOUBLE_EQ(w.samples["host.cpu_util"].front().t, 0);
  EXPECT_DOUBLE_EQ(w.samples["host.cpu_util"].front().v, 40);
  ASSERT_EQ(w.steps.size(), 3u);  // 40-50, 50-60, 60-70
  EXPECT_EQ(w.steps.front().step, 5);
  EXPECT_DOUBLE_EQ(w.steps.front().t, 10);
  ASSERT_EQ(w.events.size(), 2u);
  EXPECT_EQ(w.events[0].kind, "dataloader");  // a setting: kept, at the window's start
  EXPECT_DOUBLE_EQ(w.events[0].t, 0);
  EXPECT_DOUBLE_EQ(w.events[1].t, 20);
  ASSERT_EQ(w.checkpoints.size(), 1u);
  EXPECT_EQ(w.checkpoints[0].path, "/b");
  // A window that holds the end keeps it, and the exit code.
  RunData tail = RunWindow(d, 80, 100);
  EXPECT_DOUBLE_EQ(*tail.run.end_time, 1100);
  EXPECT_EQ(tail.run.exit_code, 0);
}

}  // namespace
}  // namespace fullburn
