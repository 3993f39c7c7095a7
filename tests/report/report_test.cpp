#include "fullburn/report.h"

#include <gtest/gtest.h>

namespace fullburn {
namespace {

TEST(Report, PercentileNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(101 - i);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 50);
  EXPECT_DOUBLE_EQ(Percentile(v, 95), 95);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(Percentile({7}, 95), 7);
}

TEST(Report, SummaryCountsLowUtilizationAndThrottling) {
  RunInfo run;
  run.start_time = 100;
  run.end_time = 110;
  std::map<std::string, Series> samples;
  for (int i = 0; i < 10; ++i) {
    samples["gpu0.util"].push_back({double(i), i < 3 ? 20.0 : 90.0});
    samples["gpu0.throttle_reasons"].push_back({double(i), i < 5 ? 0x4 : (i < 8 ? 0x1 : 0.0)});
    samples["gpu0.mem_used_bytes"].push_back({double(i), 1e9 * i});
  }
  RunSummary s = Summarize(run, samples);
  EXPECT_DOUBLE_EQ(s.wall_s, 10);
  ASSERT_EQ(s.gpus.size(), 1u);
  EXPECT_DOUBLE_EQ(*s.gpus[0].low_util_share, 0.3);
  EXPECT_DOUBLE_EQ(*s.gpus[0].throttled_share, 0.5);  // idle (0x1) is not throttling
  EXPECT_EQ(s.gpus[0].throttle_reasons_seen, std::vector<std::string>{"sw_power_cap"});
  EXPECT_DOUBLE_EQ(*s.gpus[0].peak_mem_bytes, 9e9);
  EXPECT_DOUBLE_EQ(s.stats.at("gpu0.util").median, 90);
  std::string text = RenderSummary(run, s, "");
  EXPECT_NE(text.find("utilization under 50% for 30% of the time"), std::string::npos) << text;
  EXPECT_NE(text.find("throttled 50% of the time"), std::string::npos) << text;
}

TEST(Report, SummarySaysWhichGpusTheJobDidNotUse) {
  RunInfo run;
  run.start_time = 100;
  run.end_time = 110;
  std::map<std::string, Series> samples;
  for (int i = 0; i < 10; ++i) {
    samples["gpu0.util"].push_back({double(i), 90.0});
    samples["gpu0.proc_mem_used_bytes"].push_back({double(i), 2e9});
    samples["gpu1.util"].push_back({double(i), 0.0});
    samples["gpu1.proc_mem_used_bytes"].push_back({double(i), 0.0});
  }
  std::string text = RenderSummary(run, Summarize(run, samples), "");
  EXPECT_NE(text.find("GPU 0: utilization under 50% for 0%"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU 1: not used by this job"), std::string::npos) << text;
  nlohmann::json j = RunShowJson(run, Summarize(run, samples));
  EXPECT_EQ(j["gpu_summary"][0]["used_by_job"], true);
  EXPECT_EQ(j["gpu_summary"][1]["used_by_job"], false);
  // No GPU ran the job's processes (NVML could not match them): no claim.
  for (auto& p : samples["gpu0.proc_mem_used_bytes"]) p.v = 0;
  text = RenderSummary(run, Summarize(run, samples), "");
  EXPECT_EQ(text.find("not used by this job"), std::string::npos) << text;
}

// The live line of `fullburn run`: all GPUs until the job holds memory on
// one, then only those it holds, with a count of the rest.
TEST(Report, LiveLineShowsTheJobsGpusOnceKnown) {
  Snapshot s;
  for (int i = 0; i < 8; ++i) {
    GpuSample g;
    g.index = i;
    g.util = 10.0 * i;
    g.proc_mem_used_bytes = 0.0;
    s.gpus.push_back(g);
  }
  std::string line = RenderLiveLine(s, 5);
  for (int i = 0; i < 8; ++i)
    EXPECT_NE(line.find("gpu" + std::to_string(i) + " "), std::string::npos) << line;
  s.gpus[3].proc_mem_used_bytes = 1e9;
  line = RenderLiveLine(s, 5);
  EXPECT_NE(line.find("gpu3 30 %"), std::string::npos) << line;
  EXPECT_EQ(line.find("gpu0 "), std::string::npos) << line;
  EXPECT_NE(line.find("+7 not the job's"), std::string::npos) << line;
  s.gpus[5].proc_mem_used_bytes.reset();  // unknown: shown, never hidden on a guess
  line = RenderLiveLine(s, 5);
  EXPECT_NE(line.find("gpu5 "), std::string::npos) << line;
  EXPECT_NE(line.find("+6 not the job's"), std::string::npos) << line;
}

StepRecord LiveStep(int rank, int64_t step, double t, double step_s, double wait, double loss) {
  StepRecord r;
  r.rank = rank;
  r.step = step;
  r.t = t;
  r.step_s = step_s;
  r.samples = 32;
  r.loss = loss;
  if (wait >= 0) r.data_wait_s = wait;
  return r;
}

// fullburn run's live line gains the job's progress from its step markers.
TEST(Report, TheLiveLineShowsAWrappedJobsRecentSteps) {
  RecentSteps recent;
  EXPECT_EQ(recent.Render(), "");
  // Two ranks, a step every 0.1 s each, a quarter of it waiting for data.
  std::vector<StepRecord> steps;
  for (int i = 1; i <= 20; ++i)
    for (int rank : {1, 0})
      steps.push_back(LiveStep(rank, i, 0.1 * i, 0.1, 0.025, 2.0 - 0.01 * i * (rank + 1)));
  recent.Add(steps);
  std::string line = recent.Render();
  EXPECT_NE(line.find("step 20 "), std::string::npos) << line;
  EXPECT_NE(line.find("loss 1.8000"), std::string::npos) << line;  // rank 0's, not rank 1's 1.6
  // 19 steps x 2 ranks x 32 samples after the first end, over 1.9 s.
  EXPECT_NE(line.find("  640 samples/s"), std::string::npos) << line;
  EXPECT_NE(line.find("data-wait 25%"), std::string::npos) << line;
  EXPECT_EQ(line.find("epoch"), std::string::npos) << line;  // no epochs reported
  // Later steps push the old ones out of the window: the rate is today's.
  std::vector<StepRecord> later;
  for (int i = 21; i <= 40; ++i) later.push_back(LiveStep(0, i, 20 + 0.4 * (i - 20), 0.4, -1, NAN));
  later.back().epoch = 1;
  recent.Add(later);
  line = recent.Render();
  EXPECT_NE(line.find("step 40  epoch 1  80 samples/s"), std::string::npos) << line;
  EXPECT_EQ(line.find("data-wait"), std::string::npos) << line;  // not measured lately
  EXPECT_EQ(line.find("loss"), std::string::npos) << line;
  Snapshot s;
  EXPECT_EQ(RenderLiveLine(s, 5, line).find("fullburn    5.0s | step 40"), 0u)
      << RenderLiveLine(s, 5, line);
}

TEST(Report, ExitCodesOfSignalsAreNamed) {
  EXPECT_EQ(DescribeExitCode(3), "exit code 3");
  EXPECT_NE(DescribeExitCode(137).find("SIGKILL"), std::string::npos);
  EXPECT_NE(DescribeExitCode(137).find("OOM killer"), std::string::npos);
  EXPECT_NE(DescribeExitCode(143).find("SIGTERM"), std::string::npos);
  EXPECT_EQ(DescribeExitCode(200), "exit code 200");  // 128 + 72: no such signal named
  RunInfo run;
  run.id = 4;
  run.name = "sh";
  run.status = "finished";
  run.exit_code = 137;
  EXPECT_NE(RenderSummary(run, {}, "").find("exit code 137 (SIGKILL"), std::string::npos);
}

TEST(Report, PrometheusUsesDcgmNamesUnitsAndLabels) {
  Snapshot s;
  GpuSample g;
  g.index = 0;
  g.util = 87;
  g.mem_used_bytes = 2.0 * 1024 * 1024 * 1024;
  g.sm_active = 50;
  s.gpus.push_back(g);
  s.host.cpu.util = 12;
  s.host.cores.push_back(CpuShare{33.0, {}, {}, {}, {}});
  std::string text = RenderPrometheus(s, {{0, "NVIDIA H100", "GPU-x\"y"}}, "node1");
  EXPECT_NE(text.find("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"), std::string::npos);
  EXPECT_NE(
      text.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-x\\\"y\",modelName=\"NVIDIA H100\","
                "Hostname=\"node1\"} 87\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_USED{gpu=\"0\""), std::string::npos);
  EXPECT_NE(text.find("} 2048\n"), std::string::npos);  // MiB, as dcgm-exporter
  EXPECT_NE(text.find("} 0.5\n"), std::string::npos);   // SM active as a ratio
  EXPECT_NE(text.find("fullburn_host_cpu_util{Hostname=\"node1\"} 12\n"), std::string::npos);
  EXPECT_NE(text.find("fullburn_host_core_cpu_util{cpu=\"0\",Hostname=\"node1\"} 33\n"),
            std::string::npos);
  EXPECT_EQ(text.find("power"), std::string::npos);  // absent metrics are not exported
  // A data-parallel rank's process tree carries its rank as a label.
  Snapshot rank;
  rank.rank = 2;
  rank.proc = ProcTreeSample{};
  rank.proc->cpu_util = 150;
  rank.gpus.push_back(GpuSample{});
  rank.gpus[0].util = 60;
  std::string ranked = RenderPrometheus(rank, {}, "node1");
  EXPECT_NE(ranked.find("fullburn_proc_cpu_util{rank=\"2\",Hostname=\"node1\"} 150\n"),
            std::string::npos)
      << ranked;
  EXPECT_NE(ranked.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"\",modelName=\"\",rank=\"2\","
                        "Hostname=\"node1\"} 60\n"),
            std::string::npos)
      << ranked;
}

// fullburn serve's jobs: two ranks' last minute is one job's rate (every
// rank's samples over the wall time they span), the latest step's loss, the
// median step, data wait over the steps that timed it; what limits it now.
TEST(Report, JobsExportTheirLastMinute) {
  RunInfo run;
  run.id = 7;
  run.name = "bert \"base\"";
  std::vector<StepRecord> window;
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 1; i <= 4; ++i) {
      StepRecord r;
      r.rank = rank;
      r.step = 10 + i;
      r.t = 100 + i * 0.5;
      r.step_s = i == 4 ? 1.5 : 0.5;  // the last step is slow: the median is not the mean
      r.samples = 32;
      r.loss = 2.0 - 0.1 * i - 0.01 * rank;
      if (rank == 0) r.data_wait_s = 0.25;
      window.push_back(r);
    }
  Finding now{CauseId::kInputWorkers, "t", "e", 0.42, 0.9, "f"};
  JobNow job = SummarizeJob(run, window, now);
  EXPECT_EQ(job.step, 14);
  EXPECT_DOUBLE_EQ(*job.loss, 1.6);                 // rank 0's, the first with the latest time
  EXPECT_DOUBLE_EQ(*job.samples_per_s, 256 / 2.0);  // 8 x 32 samples from t = 100 to 102
  EXPECT_DOUBLE_EQ(*job.step_s, 0.5);
  EXPECT_DOUBLE_EQ(*job.data_wait_share, 1.0 / 3.0);  // 4 x 0.25 of rank 0's 3 s
  std::string text = RenderJobsPrometheus({job}, "node1");
  const std::string labels = "{run=\"7\",name=\"bert \\\"base\\\"\",Hostname=\"node1\"}";
  EXPECT_NE(text.find("# TYPE fullburn_job_samples_per_second gauge\n"
                      "fullburn_job_samples_per_second" +
                      labels + " 128\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fullburn_job_step" + labels + " 14\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fullburn_job_time_lost_ratio{run=\"7\",name=\"bert \\\"base\\\"\","
                      "Hostname=\"node1\",cause=\"input_workers\"} 0.42\n"),
            std::string::npos)
      << text;
  std::string lines = RenderJobLines({job});
  EXPECT_NE(lines.find("run 7"), std::string::npos) << lines;
  EXPECT_NE(
      lines.find("step 14  loss 1.6000  128 samples/s  data-wait 33% | now: input_workers ~42%"),
      std::string::npos)
      << lines;
  nlohmann::json j = JobsJson({job})[0];
  EXPECT_EQ(j["step"], 14);
  EXPECT_DOUBLE_EQ(j["now"]["time_lost_pct"].get<double>(), 42);
  // A job with no steps yet exports none of the step families, and no empty ones.
  JobNow idle = SummarizeJob(run, {}, std::nullopt);
  EXPECT_FALSE(idle.step || idle.samples_per_s || idle.step_s || idle.data_wait_share);
  EXPECT_EQ(RenderJobsPrometheus({idle}, "node1"), "");
  EXPECT_NE(RenderJobLines({idle}).find("no steps recorded"), std::string::npos);
  EXPECT_FALSE(JobsJson({idle})[0].contains("step"));
  EXPECT_EQ(RenderJobLines({}), "");
}

TEST(Report, CsvHasOneRowPerTimeAndBlanksForAbsent) {
  std::map<std::string, Series> samples;
  samples["a"] = {{0, 1}, {1, 2}};
  samples["b"] = {{1, 5}};
  EXPECT_EQ(SamplesCsv(samples), "t,a,b\n0,1,\n1,2,5\n");
}

TEST(Report, SnapshotJsonMapsMetricsAndDecodesThrottle) {
  Snapshot s;
  GpuSample g;
  g.util = 5;
  g.throttle_reasons = 0x20;
  s.gpus.push_back(g);
  auto j = SnapshotJson(s, {{0, "G", "GPU-1"}}, "");
  EXPECT_EQ(j["metrics"]["gpu0.util"], 5);
  EXPECT_FALSE(j["metrics"].contains("gpu0.power_w"));
  EXPECT_EQ(j["gpus"][0]["throttle_reasons"][0], "sw_thermal_slowdown");
  EXPECT_EQ(j["gpus"][0]["uuid"], "GPU-1");
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

std::vector<StepRecord> MakeSteps(int n) {
  std::vector<StepRecord> steps;
  for (int i = 1; i <= n; ++i) {
    StepRecord r;
    r.step = i;
    r.t = i * 0.1;
    r.loss = 3.0 - 0.01 * i;
    r.lr = 0.1;
    r.samples = 32;
    r.step_s = 0.1;
    r.data_wait_s = 0.04;
    r.forward_s = 0.02;
    r.backward_s = 0.03;
    r.optimizer_s = 0.01;
    steps.push_back(r);
  }
  return steps;
}

TEST(StepsReport, SummaryAddsUpPhasesAndRate) {
  StepsSummary s = SummarizeSteps(MakeSteps(100));
  EXPECT_EQ(s.steps, 100);
  EXPECT_EQ(s.samples, 3200);
  EXPECT_NEAR(s.median_samples_per_s, 320, 1e-6);
  EXPECT_NEAR(s.first_loss, 3.0 - 0.01 * 5.5, 1e-9);
  ASSERT_EQ(s.phase_share.size(), 4u);
  EXPECT_EQ(s.phase_share[0].first, "data_wait");
  EXPECT_NEAR(s.phase_share[0].second, 0.4, 1e-9);
  EXPECT_NE(RenderStepsSummary(MakeSteps(3)).find("data_wait 40.0%"), std::string::npos);
  // A short run: windows of half the losses, never overlapping.
  StepsSummary three = SummarizeSteps(MakeSteps(3));
  EXPECT_NEAR(three.first_loss, 2.99, 1e-9);
  EXPECT_NEAR(three.final_loss, 2.97, 1e-9);
  StepsSummary six = SummarizeSteps(MakeSteps(6));
  EXPECT_NEAR(six.first_loss, 2.98, 1e-9);  // steps 1-3
  EXPECT_NEAR(six.final_loss, 2.95, 1e-9);  // steps 4-6
  EXPECT_NEAR(SummarizeSteps(MakeSteps(1)).first_loss, 2.99, 1e-9);
  std::vector<StepRecord> no_loss = MakeSteps(4);  // steps that record none
  for (StepRecord& r : no_loss) r.loss = NAN;
  EXPECT_TRUE(std::isnan(SummarizeSteps(no_loss).first_loss));
  EXPECT_TRUE(std::isnan(SummarizeSteps(no_loss).final_loss));
}

// 100 steps of 0.1 s with a 5 s evaluation after step 50: the median step
// rate does not see it, the rate over the steps' span does.
TEST(StepsReport, SummaryGivesTheRateOverTheStepsSpanToo) {
  std::vector<StepRecord> steps = MakeSteps(100);
  for (StepRecord& r : steps)
    if (r.step > 50) r.t += 5;
  StepsSummary s = SummarizeSteps(steps);
  EXPECT_NEAR(s.median_samples_per_s, 320, 1e-6);
  EXPECT_NEAR(s.span_s, 15, 1e-9);
  EXPECT_NEAR(s.overall_samples_per_s, 3200 / 15.0, 1e-6);
  EXPECT_NE(RenderStepsSummary(steps).find("320.0 samples/s (median), 213.3 over the 15.0 s"),
            std::string::npos)
      << RenderStepsSummary(steps);
  EXPECT_TRUE(std::isnan(SummarizeSteps(MakeSteps(1)).overall_samples_per_s));
}

TEST(StepsReport, SummaryOfSeveralRanksIsTheJobs) {
  // Two ranks, 32 samples each per step; rank 1 takes 0.2 s, so each step of
  // the job takes 0.2 s for 64 samples. Rank 1's loss is 1 higher.
  std::vector<StepRecord> steps = MakeSteps(100), other = MakeSteps(100);
  for (StepRecord& r : other) r.rank = 1, r.step_s = 0.2, r.loss += 1;
  steps.insert(steps.end(), other.begin(), other.end());
  StepsSummary s = SummarizeSteps(steps);
  EXPECT_EQ(s.steps, 100);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.samples, 6400);
  EXPECT_NEAR(s.median_samples_per_s, 320, 1e-6);
  EXPECT_NEAR(s.first_loss, 3.5 - 0.01 * 5.5, 1e-9);
  EXPECT_NE(RenderStepsSummary(steps).find("steps:   100 on 2 ranks (6400 samples)"),
            std::string::npos)
      << RenderStepsSummary(steps);
}

TEST(StepsReport, CsvHasOneRowPerStepAndBlanksForAbsent) {
  auto steps = MakeSteps(2);
  steps[1].forward_s.reset();
  std::string csv = StepsCsv(steps);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(csv.find("samples_per_s"), std::string::npos);
  EXPECT_NE(csv.find(",0.04,,0.02,"), std::string::npos);   // data_wait, h2d absent, forward
  EXPECT_NE(csv.find(",0.04,,,0.03,"), std::string::npos);  // second step: forward absent too
}

TEST(StepsReport, ChromeTraceNestsPhasesInsideTheirStep) {
  RunInfo run;
  run.id = 7;
  auto steps = MakeSteps(2);
  for (StepRecord& s : steps) s.data_wait_s = 0.03;  // 10 ms of the step outside every phase
  std::map<std::string, Series> samples{{"gpu0.util", {{0.05, 40}}},
                                        {"host.mem_used", {{0.05, 1}}}};
  std::vector<RunEvent> run_events{
      {0.25, "checkpoint", R"({"duration_s": 0.05, "path": "/ckpt/model.pt", "rank": 0})"},
      {0.3, "checkpoint", R"({"duration_s": 0.02, "background": true, "rank": 1})"},
      {0.01, "dataloader", R"({"num_workers": 2})"}};
  nlohmann::json trace =
      ChromeTrace(run, steps, {{2, 0.3, "/x", 10, 0.001, 0.05}}, run_events, samples);
  int step_events = 0, phase_events = 0, gpu_counters = 0, checkpoint_events = 0;
  std::vector<nlohmann::json> marks;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "step") {
      ++step_events;
      EXPECT_NEAR(e["ts"].get<double>() + e["dur"].get<double>(), 1e6 * 0.1 * (step_events), 1e-3);
    }
    if (e.value("cat", "") == "phase") {
      ++phase_events;
      if (e["name"] == "data_wait") {
        EXPECT_NEAR(e["dur"].get<double>(), 30000, 1e-3);
      }
      // Phases are laid end to end, the last ending with the step; the rest
      // (the loop's own work) comes first, then the wait, then forward.
      if (e["name"] == "forward" && e["pid"] == 0 && phase_events <= 4) {
        EXPECT_NEAR(e["ts"].get<double>(), (steps[0].t - steps[0].step_s + 0.04) * 1e6, 1e-3);
      }
    }
    if (e.value("name", "") == "gpu0.util") ++gpu_counters;
    if (e.value("cat", "") == "checkpoint") ++checkpoint_events;
    if (e.value("cat", "") == "event") marks.push_back(e);
  }
  // Run events: spans where they have a duration (a save: from its start),
  // instants where not, on each rank's third track.
  ASSERT_EQ(marks.size(), 3u);
  EXPECT_EQ(marks[0]["name"], "checkpoint");
  EXPECT_EQ(marks[0]["ph"], "X");
  EXPECT_NEAR(marks[0]["ts"].get<double>(), 0.2e6, 1e-3);
  EXPECT_NEAR(marks[0]["dur"].get<double>(), 0.05e6, 1e-3);
  EXPECT_EQ(marks[0]["args"]["path"], "/ckpt/model.pt");
  EXPECT_EQ(marks[1]["name"], "checkpoint (background)");
  EXPECT_EQ(marks[1]["pid"], 1);
  EXPECT_EQ(marks[2]["ph"], "i");
  EXPECT_EQ(marks[2]["tid"], 2);
  EXPECT_EQ(step_events, 2);
  EXPECT_EQ(phase_events, 8);
  EXPECT_EQ(gpu_counters, 1);  // host.mem_used is not a utilization track
  EXPECT_EQ(checkpoint_events, 1);
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

TEST(Downsample, KeepsPeaksAndBreaksAtGaps) {
  Series s;
  for (int i = 0; i < 36000; ++i)
    s.push_back({static_cast<double>(i), i == 12345 ? 100.0 : (i == 20000 ? -5.0 : 50.0)});
  Series d = Downsample(s, 2000, 3);
  EXPECT_LE(d.size(), 2000u);
  double hi = 0, lo = 100;
  for (const SeriesPoint& p : d) hi = std::max(hi, p.v), lo = std::min(lo, p.v);
  EXPECT_EQ(hi, 100);  // a one-sample spike survives a x18 reduction
  EXPECT_EQ(lo, -5);
  for (size_t i = 1; i < d.size(); ++i) EXPECT_LT(d[i - 1].t, d[i].t);  // still in time order

  Series gap = {{0, 1}, {1, 1}, {2, 1}, {30, 1}, {31, 1}};  // the recorder stopped for 28 s
  Series g = Downsample(gap, 2000, 3);
  ASSERT_EQ(g.size(), 6u);
  EXPECT_TRUE(std::isnan(g[3].v));  // drawn as a break, not a line across
  EXPECT_DOUBLE_EQ(g[3].t, 16);
}

RunData TwoStepRun(int64_t id, int batch, double step_s) {
  RunData d;
  d.run.id = id;
  d.run.name = "job";
  d.run.start_time = 1000;
  d.run.end_time = 1010;
  d.run.command = {"python3", "train.py"};
  d.run.config_json =
      nlohmann::json{{"train", {{"batch_size", batch}, {"precision", "bf16"}}}}.dump();
  for (int i = 1; i <= 20; ++i) {
    StepRecord r;
    r.step = i;
    r.t = i * step_s;
    r.step_s = step_s;
    r.samples = batch;
    r.data_wait_s = step_s * 0.5;
    d.steps.push_back(r);
  }
  return d;
}

TEST(Compare, ShowsThroughputChangeAndOnlyTheConfigThatDiffers) {
  std::vector<RunDigest> runs = {
      Digest(TwoStepRun(1, 64, 0.1), {}),
      Digest(TwoStepRun(2, 256, 0.2), {{CauseId::kInputCpu, "", "", 0.5, 0.9, ""}})};
  EXPECT_DOUBLE_EQ(runs[0].samples_per_s, 640);
  EXPECT_DOUBLE_EQ(runs[1].samples_per_s, 1280);
  std::string text = RenderComparison(runs);
  EXPECT_NE(text.find("1280.0 (+100%)"), std::string::npos) << text;
  EXPECT_NE(text.find("config: train.batch_size"), std::string::npos) << text;
  EXPECT_EQ(text.find("config: train.precision"), std::string::npos) << text;  // equal in both
  EXPECT_EQ(text.find("config: command"), std::string::npos) << text;
  EXPECT_NE(text.find("time lost: input_cpu"), std::string::npos) << text;
  auto j = ComparisonJson(runs);
  EXPECT_EQ(j[1]["time_lost_pct"]["input_cpu"], 50.0);
  EXPECT_TRUE(j[0]["gpu_util_pct"].is_null());  // no GPU: null, never 0
}

// Steps timed phase by phase: each phase's share side by side, the rest as
// "other"; a run without a phase shows "-".
TEST(Compare, ShowsWhereEachRunsStepTimeWent) {
  RunData a = TwoStepRun(1, 64, 0.1), b = TwoStepRun(2, 64, 0.1);
  for (StepRecord& r : a.steps) r.forward_s = 0.02, r.backward_s = 0.03;  // 0 s other
  for (StepRecord& r : b.steps) r.forward_s = 0.02;                       // 30 ms other
  std::vector<RunDigest> runs = {Digest(a, {}), Digest(b, {})};
  std::vector<ComparisonRow> rows = ComparisonTable(runs);
  auto row = [&](const std::string& label) {
    for (const ComparisonRow& r : rows)
      if (r.first == label) return r.second;
    return std::vector<std::string>{};
  };
  EXPECT_EQ(row("forward (% of step)"), (std::vector<std::string>{"20%", "20%"}));
  EXPECT_EQ(row("backward (% of step)"), (std::vector<std::string>{"30%", "-"}));
  EXPECT_EQ(row("other (% of step)"), (std::vector<std::string>{"-", "30%"}));
  EXPECT_TRUE(row("optimizer (% of step)").empty());  // neither measured it
  auto j = ComparisonJson(runs);
  EXPECT_DOUBLE_EQ(j[1]["step_phases_pct"]["other"].get<double>(), 30.0);
  EXPECT_FALSE(j[1]["step_phases_pct"].contains("data_wait"));  // its own field
}

TEST(Compare, CommandsShowTheArgumentsThatDiffer) {
  RunData a = TwoStepRun(1, 64, 0.1), b = TwoStepRun(2, 64, 0.1);
  a.run.command = {"/usr/bin/python3", "/home/me/projects/vision/train.py",
                   "--batch-size",     "16",
                   "--workers",        "0",
                   "--seconds",        "15"};
  b.run.command = a.run.command;
  b.run.command[3] = "32";
  b.run.command[5] = "2";
  std::vector<RunDigest> runs = {Digest(a, {}), Digest(b, {})};
  std::string text = RenderComparison(runs);
  EXPECT_NE(text.find("config: command (what differs)"), std::string::npos) << text;
  EXPECT_NE(text.find("--batch-size 16 ... --workers 0"), std::string::npos) << text;
  EXPECT_NE(text.find("--batch-size 32 ... --workers 2"), std::string::npos) << text;
  // Commands of other lengths are shown whole (elided in the middle).
  b.run.command.push_back("--amp");
  text = RenderComparison({Digest(a, {}), Digest(b, {})});
  EXPECT_NE(text.find("config: command "), std::string::npos) << text;
  EXPECT_EQ(text.find("what differs"), std::string::npos) << text;
  EXPECT_EQ(ComparisonJson(runs)[1]["config"]["command"],
            "/usr/bin/python3 /home/me/projects/vision/train.py --batch-size 32 --workers 2 "
            "--seconds 15");
}

TEST(HtmlReport, EscapesWhatTheRunRecorded) {
  RunData d = TwoStepRun(1, 64, 0.1);
  d.run.name = "</script><script>alert(1)</script>";
  d.run.config_json = nlohmann::json{{"note", "</script><b>x</b>"}}.dump();
  d.samples["gpu0.util"] = {{0, 50}, {1, 60}};
  std::string html = RenderHtmlReport({{d, {{CauseId::kHealthy, "<ok>", "a < b", 0, 0.8, "none & all"}}}});
  EXPECT_EQ(html.find("<script>alert(1)"), std::string::npos);
  EXPECT_EQ(html.find("<b>x</b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;ok&gt;"), std::string::npos);
  EXPECT_NE(html.find("none &amp; all"), std::string::npos);
  // One data block, one uPlot, one drawing script; nothing loaded from elsewhere.
  size_t scripts = 0;
  for (size_t pos = 0; (pos = html.find("<script", pos)) != std::string::npos; ++pos) ++scripts;
  EXPECT_EQ(scripts, 3u);
  EXPECT_NE(html.find("GPU utilization"), std::string::npos);
  EXPECT_NE(html.find("\"stacked\":true"), std::string::npos);
}

// The training loss per step and, from the evaluation events, the held-out
// loss and accuracy drawn as points on the same time axis.
TEST(HtmlReport, LossAndHeldOutCharts) {
  RunData d = TwoStepRun(1, 64, 0.1);
  for (size_t i = 0; i < d.steps.size(); ++i) d.steps[i].loss = 2.0 - 0.05 * i;
  std::string html = RenderHtmlReport({{d, {}}});
  EXPECT_NE(html.find("\"title\":\"Loss\""), std::string::npos);
  EXPECT_EQ(html.find("Held-out accuracy"), std::string::npos);  // no evaluation: no chart
  d.events.push_back({1.0, "evaluation", R"({"step": 10, "val_loss": 1.5, "val_accuracy": 0.25})"});
  d.events.push_back({2.0, "evaluation", R"({"step": 20, "val_loss": 1.25, "val_accuracy": 0.5})"});
  d.events.push_back({2.5, "checkpoint", "{}"});
  html = RenderHtmlReport({{d, {}}});
  std::string block = html.substr(html.find("fb-data"));
  nlohmann::json data = nlohmann::json::parse(
      block.substr(block.find('>') + 1, block.find("</script>") - block.find('>') - 1));
  nlohmann::json loss, accuracy;
  for (const auto& c : data["charts"]) {
    if (c["title"] == "Loss") loss = c;
    if (c["title"] == "Held-out accuracy") accuracy = c;
  }
  ASSERT_EQ(loss["series"].size(), 2u) << loss.dump();  // training, held-out
  EXPECT_EQ(loss["series"][1]["label"], "held-out");
  EXPECT_EQ(loss["series"][1]["v"], nlohmann::json({1.5, 1.25}));
  EXPECT_EQ(loss["series"][1]["points"], true);
  ASSERT_EQ(accuracy["series"].size(), 1u);
  EXPECT_EQ(accuracy["series"][0]["t"], nlohmann::json({1.0, 2.0}));
  EXPECT_EQ(accuracy["series"][0]["v"], nlohmann::json({25.0, 50.0}));
}

// An evaluation between steps (0.5 s with 50 ms steps) breaks the step
// charts' lines instead of being drawn across; a slow step does not.
TEST(HtmlReport, TimeOutsideTheStepsBreaksTheStepCharts) {
  RunData d;
  double t = 0;
  for (int i = 1; i <= 40; ++i) {
    if (i == 21) t += 0.5;  // the evaluation
    StepRecord r;
    r.step = i;
    r.step_s = i == 30 ? 0.2 : 0.05;  // a stalled step is still a step
    t += r.step_s;
    r.t = t;
    r.samples = 16;
    r.data_wait_s = 0.01;
    d.steps.push_back(r);
  }
  std::string html = RenderHtmlReport({{d, {}}});
  std::string block = html.substr(html.find("fb-data"));
  nlohmann::json data = nlohmann::json::parse(
      block.substr(block.find('>') + 1, block.find("</script>") - block.find('>') - 1));
  int checked = 0;
  for (const auto& c : data["charts"]) {
    std::string title = c["title"];
    if (title != "Step time" && title.rfind("Step time breakdown", 0) != 0) continue;
    for (const auto& series : c["series"]) {  // the breakdown: one per stacked band
      const auto& v = series["v"];
      const auto& times = series["t"];
      ASSERT_EQ(v.size(), 41u) << title << v.dump();  // 40 steps and one break
      std::vector<size_t> breaks;
      for (size_t i = 0; i < v.size(); ++i)
        if (v[i].is_null()) breaks.push_back(i);
      ASSERT_EQ(breaks, std::vector<size_t>{20}) << title;
      EXPECT_GT(times[20].get<double>(), d.steps[19].t);  // inside the evaluation
      EXPECT_LT(times[20].get<double>(), d.steps[20].t - d.steps[20].step_s);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);  // step time; the breakdown's "other" and "data wait"
}

}  // namespace
}  // namespace fullburn
