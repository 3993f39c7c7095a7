// Each rule on synthetic series: a case that triggers it and a near miss that must not.
#include "fullburn/diagnose.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <tuple>

namespace fullburn {
namespace {

Series Flat(double v, int n = 60) {
  Series s;
  for (int i = 0; i < n; ++i) s.push_back({static_cast<double>(i), v});
  return s;
}
// `share` of the n samples take `on`, the rest `off`.
Series Mix(double share, double on, double off, int n = 100) {
  Series s;
  for (int i = 0; i < n; ++i) s.push_back({static_cast<double>(i), i < share * n ? on : off});
  return s;
}

struct Case {
  std::map<std::string, Series> m;
  std::vector<StepRecord> steps;
  RunInfo run;
  std::vector<RunEvent> events;
  std::vector<CheckpointRecord> checkpoints;
  Case() {
    run.config_json = R"({"train": {"precision": "bf16"}})";  // a fullburn train run
    run.end_time = 60;
    run.interval_s = 1;
  }
  Case& Gpu(double util, double mem_share) {
    m["gpu0.util"] = Flat(util);
    m["gpu0.mem_total_bytes"] = Flat(80e9);
    m["gpu0.mem_used_bytes"] = Flat(80e9 * mem_share);
    return *this;
  }
  Case& Host(double cpu, double iowait = 1) {
    m["host.cpu_util"] = Flat(cpu);
    m["host.cpu_iowait"] = Flat(iowait);
    return *this;
  }
  Case& Wait(double share) {
    for (int i = 1; i <= 50; ++i) {
      StepRecord r;
      r.step = i;
      r.step_s = 1.2;  // 50 steps fill the 60 s run
      r.t = 1.2 * i;
      r.samples = 64;
      r.data_wait_s = 1.2 * share;
      r.forward_s = 1.2 * (1 - share);
      steps.push_back(r);
    }
    return *this;
  }
  std::vector<Finding> Run() {
    RunData d;
    d.run = run;
    d.samples = m;
    d.steps = steps;
    d.events = events;
    d.checkpoints = checkpoints;
    return Diagnose(d);
  }
};

std::vector<std::string> Causes(const std::vector<Finding>& f) {
  std::vector<std::string> out;
  for (const Finding& x : f) out.push_back(x.name());
  return out;
}
bool Has(const std::vector<Finding>& f, const std::string& cause) {
  auto c = Causes(f);
  return std::find(c.begin(), c.end(), cause) != c.end();
}

TEST(Diagnose, BusyGpuIsHealthyWithNoFalseAlarms) {
  auto f = Case().Gpu(95, 0.7).Host(40).Wait(0.02).Run();
  EXPECT_EQ(Causes(f), std::vector<std::string>{"healthy"});
  Case fp32;
  fp32.run.config_json = R"({"train": {"precision": "fp32"}})";
  auto g = fp32.Gpu(95, 0.7).Host(40).Run();
  EXPECT_NE(g[0].fix.find("bf16"), std::string::npos);  // compute-bound: suggest mixed precision
  EXPECT_NE(g[0].fix.find("tensor cores"), std::string::npos);
  // fullburn train on the CPU: no tensor cores to point to.
  Case cpu;
  cpu.run.config_json =
      R"({"train": {"precision": "fp32"}, "resolved": {"device": "cpu", "threads": 2}})";
  for (int c = 0; c < 4; ++c) cpu.m["host.cpu" + std::to_string(c) + ".util"] = Flat(60);
  auto h = cpu.Host(60).Wait(0.02).Run();
  // Fewer threads than cores is a finding with its time, not a healthy run.
  ASSERT_EQ(Causes(h), std::vector<std::string>{"cpu_threads"});
  EXPECT_NEAR(h[0].share_lost, 0.5, 1e-9);  // 2 of 4 cores
  EXPECT_NE(h[0].evidence.find("train.threads = 2 of 4 cores"), std::string::npos) << h[0].evidence;
  EXPECT_NE(h[0].fix.find("train.threads = 0 (this rank's share of the CPUs) or 4"),
            std::string::npos)
      << h[0].fix;
  EXPECT_EQ(h[0].fix.find("tensor cores"), std::string::npos) << h[0].fix;
  cpu.run.config_json =
      R"({"train": {"precision": "fp32"}, "resolved": {"device": "cpu", "threads": 4}})";
  EXPECT_NE(cpu.Run()[0].fix.find("every core at work: train on a GPU"), std::string::npos);
}

// Ranks on one node split its cores: per-process advice counts a rank's share.
TEST(Diagnose, CpuAdviceCountsTheCoresOfOneRank) {
  Case cpu;
  cpu.run.config_json =
      R"({"train": {"precision": "fp32"}, "resolved": {"device": "cpu", "threads": 2,)"
      R"( "ranks_per_node": 2}})";
  for (int c = 0; c < 4; ++c) cpu.m["host.cpu" + std::to_string(c) + ".util"] = Flat(95);
  auto h = cpu.Host(95).Wait(0.02).Run();
  ASSERT_EQ(Causes(h), std::vector<std::string>{"healthy"});
  EXPECT_NE(h[0].fix.find("every core at work"), std::string::npos) << h[0].fix;
  cpu.run.config_json =
      R"({"train": {"precision": "fp32"}, "resolved": {"device": "cpu", "threads": 1,)"
      R"( "ranks_per_node": 2}})";
  auto one = cpu.Run();
  ASSERT_EQ(one[0].name(), "cpu_threads");
  EXPECT_NEAR(one[0].share_lost, 0.5, 1e-9);  // 1 of a rank's 2
  EXPECT_NE(one[0].evidence.find("1 of 2 cores per rank (2 ranks share 4)"), std::string::npos)
      << one[0].evidence;
  // Without the trainer's count: the ranks that recorded steps on the one
  // sampled node. Each of 4 ranks on 16 cores gets 3 loader threads, not 15.
  Case input;
  input.run.config_json = R"({"data": {"threads": 1}})";
  for (int c = 0; c < 16; ++c) input.m["host.cpu" + std::to_string(c) + ".util"] = Flat(40);
  input.Host(40).Wait(0.3);
  std::vector<StepRecord> one_rank = input.steps;
  for (int rank = 1; rank < 4; ++rank)
    for (StepRecord r : one_rank) {
      r.rank = rank;
      input.steps.push_back(r);
    }
  auto g = input.Run();
  ASSERT_EQ(g[0].name(), "input_workers");
  EXPECT_NE(g[0].fix.find("data.threads 1 -> 3"), std::string::npos) << g[0].fix;
}

// A wrapped job with steps and no GPU sampled ran on the CPU: tensor cores
// are not the advice, its threads are.
TEST(Diagnose, WrappedJobWithoutAGpuGetsCpuAdvice) {
  Case job;
  job.run.config_json = R"({"interval_s": 1})";  // fullburn run, not fullburn train
  for (int c = 0; c < 4; ++c) job.m["host.cpu" + std::to_string(c) + ".util"] = Flat(30);
  job.m["proc.cpu_util"] = Flat(100);
  auto f = job.Host(30).Wait(0.02).Run();
  ASSERT_EQ(Causes(f), std::vector<std::string>{"cpu_threads"});
  EXPECT_NEAR(f[0].share_lost, 0.75, 1e-9);  // 1 of 4 cores at work
  EXPECT_NE(f[0].evidence.find("used 1.0 of 4 cores"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("torch.set_num_threads(4)"), std::string::npos) << f[0].fix;
  EXPECT_EQ(f[0].fix.find("tensor cores"), std::string::npos) << f[0].fix;
  // Input-bound, or under a core in all (the loop waits, not computes): not this.
  Case input = job;
  input.steps.clear();
  EXPECT_FALSE(Has(input.Wait(0.4).Run(), "cpu_threads"));
  job.m["proc.cpu_util"] = Flat(35);
  EXPECT_FALSE(Has(job.Run(), "cpu_threads"));
  job.m["proc.cpu_util"] = Flat(390);
  auto busy = job.Run();
  EXPECT_NE(busy[0].fix.find("(no GPU sampled): train on a GPU"), std::string::npos) << busy[0].fix;
  EXPECT_NE(job.Gpu(95, 0.7).Run()[0].fix.find("tensor cores"), std::string::npos);  // a GPU job
}

// A loop without a DataLoader (word_language_model slices its batches out
// of a tensor, manual SGD): its steps carry no data wait, and the loop's own
// work holds the batch making. A small share of that is a CPU-bound job, as
// a small data wait is; a large one is the loop's finding, not this.
TEST(Diagnose, ALoopWithoutADataLoaderOnTheCpuGetsCpuAdvice) {
  Case job;
  job.run.config_json = R"({"interval_s": 1})";  // fullburn run
  job.run.status = "finished";
  job.run.exit_code = 143;  // stopped by SIGTERM, as a scheduler's time limit does
  for (int c = 0; c < 2; ++c) job.m["host.cpu" + std::to_string(c) + ".util"] = Flat(50);
  job.m["proc.cpu_util"] = Flat(100);
  for (int i = 1; i <= 50; ++i) {
    StepRecord r;
    r.step = i;
    r.step_s = 1.2;
    r.t = 1.2 * i;
    r.samples = 20;
    r.forward_s = 0.35;
    r.backward_s = 0.81;  // 0.04 s of the loop's own work: 3.3%
    job.steps.push_back(r);
  }
  auto f = job.Host(50).Run();
  ASSERT_EQ(Causes(f), std::vector<std::string>{"cpu_threads"});
  EXPECT_NEAR(f[0].share_lost, 0.5, 1e-9);  // 1 of 2 cores at work
  EXPECT_NE(f[0].evidence.find("used 1.0 of 2 cores"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("the loop's own work (making the batches included: no DataLoader fed the "
                               "steps) 3% of step time"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("torch.set_num_threads(2)"), std::string::npos) << f[0].fix;
  // Every core at work: healthy, and it says the steps were there.
  job.m["proc.cpu_util"] = Flat(195);
  auto busy = job.Run();
  ASSERT_EQ(Causes(busy), std::vector<std::string>{"healthy"});
  EXPECT_NE(busy[0].evidence.find("50 steps recorded, no GPU readings, no data wait timed"), std::string::npos)
      << busy[0].evidence;
  EXPECT_EQ(busy[0].fix.find("nothing measured"), std::string::npos) << busy[0].fix;
  // The loop's work is a third of the step: that is the finding, not the threads.
  job.m["proc.cpu_util"] = Flat(100);
  for (StepRecord& r : job.steps) r.backward_s = 0.45;
  EXPECT_FALSE(Has(job.Run(), "cpu_threads"));
  EXPECT_TRUE(Has(job.Run(), "loop_overhead"));
}

TEST(Diagnose, NothingMeasuredSaysHowToMeasureNotHowToSpeedUp) {
  auto f = Case().Host(40).Run();  // host samples only: no GPU, no steps
  ASSERT_EQ(Causes(f), std::vector<std::string>{"healthy"});
  EXPECT_LT(f[0].confidence, 0.5);
  EXPECT_NE(f[0].fix.find("step markers"), std::string::npos) << f[0].fix;
  EXPECT_EQ(f[0].fix.find("compute-bound"), std::string::npos) << f[0].fix;
}

TEST(Diagnose, InputCpuFromMeasuredDataWait) {
  auto f = Case().Host(92).Wait(0.3).Run();
  ASSERT_EQ(f[0].name(), "input_cpu");
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  EXPECT_NE(f[0].evidence.find("30%"), std::string::npos);
  EXPECT_EQ(Causes(Case().Host(92).Wait(0.08).Run()),
            std::vector<std::string>{"healthy"});  // near miss
  Case fixed;  // a fixed worker count on a 16-core host: the fix names the knob
  fixed.run.config_json = R"({"data": {"threads": 4}})";
  for (int c = 0; c < 16; ++c) fixed.m["host.cpu" + std::to_string(c) + ".util"] = Flat(90);
  EXPECT_NE(fixed.Host(92).Wait(0.3).Run()[0].fix.find("data.threads 4 -> 15"), std::string::npos);
}

// A pod limited to 4 CPUs on a 64-CPU host: the host reads 8% busy while the
// job uses its whole quota, so the loader is CPU-bound, not short of workers.
TEST(Diagnose, InputCpuAtAContainersQuota) {
  auto pod = [](double job_cpu, double throttled) {
    Case c;
    c.run.config_json = R"({"data": {"threads": 2}})";
    for (int i = 0; i < 64; ++i) c.m["host.cpu" + std::to_string(i) + ".util"] = Flat(8);
    c.m["host.cpu_quota"] = Flat(4);
    c.m["host.cpu_throttled"] = Flat(throttled);
    c.m["proc.cpu_util"] = Flat(job_cpu);
    return c.Host(8).Wait(0.3).Run();
  };
  auto full = pod(380, 5);
  ASSERT_EQ(full[0].name(), "input_cpu");
  EXPECT_NE(full[0].evidence.find("the job's CPU median 95% of its container's 4-CPU quota"),
            std::string::npos)
      << full[0].evidence;
  EXPECT_NE(full[0].fix.find("container's CPU limit (4 CPUs)"), std::string::npos) << full[0].fix;
  EXPECT_NE(full[0].fix.find("data.threads 2 -> 3"), std::string::npos) << full[0].fix;
  // Throttled in 40% of periods: saturated in bursts though the median use is 62%.
  auto bursts = pod(250, 40);
  ASSERT_EQ(bursts[0].name(), "input_cpu");
  EXPECT_NE(bursts[0].evidence.find("throttled in 40% of CFS periods"), std::string::npos);
  // Near miss: a third of the quota used, little throttling: too few workers,
  // and the advice counts the 4 CPUs, not the host's 64.
  // Another node's host busier than this pod's quota: its host reading, named as such.
  Case two;
  two.m["host.cpu_quota"] = Flat(4);
  two.m["proc.cpu_util"] = Flat(380);
  two.m["rank1.host.cpu_util"] = Flat(99);
  auto busier = two.Host(8).Wait(0.3).Run();
  ASSERT_EQ(busier[0].name(), "input_cpu");
  EXPECT_NE(busier[0].evidence.find("host CPU median 99% on rank 1's node"), std::string::npos)
      << busier[0].evidence;
  auto idle = pod(130, 2);
  ASSERT_EQ(idle[0].name(), "input_workers");
  EXPECT_NE(idle[0].fix.find("data.threads 2 -> 3"), std::string::npos) << idle[0].fix;
}

TEST(Diagnose, InputCpuInferredWithoutStepsFromAnIdleGpu) {
  auto f = Case().Gpu(30, 0.7).Host(95).Run();
  ASSERT_EQ(f[0].name(), "input_cpu");
  EXPECT_NEAR(f[0].share_lost, 0.7, 1e-9);
  EXPECT_LT(f[0].confidence, 0.9);  // inferred, not measured
  EXPECT_FALSE(Has(Case().Gpu(55, 0.7).Host(95).Run(), "input_cpu"));
}

TEST(Diagnose, InputIoWhenTheCpuWaitsOnStorage) {
  auto f = Case().Host(30, 25).Wait(0.4).Run();
  EXPECT_EQ(f[0].name(), "input_io");
  EXPECT_FALSE(Has(Case().Host(30, 8).Wait(0.4).Run(), "input_io"));
}

TEST(Diagnose, TooFewWorkersWhenCoresIdle) {
  auto f = Case().Host(40, 2).Wait(0.25).Run();
  EXPECT_EQ(f[0].name(), "input_workers");
  EXPECT_NE(f[0].fix.find("data.threads is tuned (0)"), std::string::npos) << f[0].fix;
  Case fixed;  // a fixed count: raise it
  fixed.run.config_json = R"({"data": {"threads": 1}})";
  for (int c = 0; c < 8; ++c) fixed.m["host.cpu" + std::to_string(c) + ".util"] = Flat(40);
  auto g = fixed.Host(40, 2).Wait(0.25).Run();
  ASSERT_EQ(g[0].name(), "input_workers");
  EXPECT_NE(g[0].fix.find("data.threads 1 -> 7"), std::string::npos) << g[0].fix;
}

TEST(Diagnose, DataWaitWithoutACpuReadingSaysSoInsteadOfNan) {
  auto f = Case().Wait(0.4).Run();  // steps, but no host sample yet
  ASSERT_EQ(f[0].name(), "input_workers");
  EXPECT_EQ(f[0].evidence.find("nan"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("not sampled"), std::string::npos) << f[0].evidence;
  EXPECT_LT(f[0].confidence, 0.9);
  EXPECT_NE(f[0].fix.find("fullburn pack"), std::string::npos) << f[0].fix;
}

TEST(Diagnose, SmallBatchAndHeadroom) {
  auto f = Case().Gpu(30, 0.2).Host(30).Run();
  EXPECT_EQ(f[0].name(), "small_batch");
  EXPECT_TRUE(Has(f, "memory_headroom"));
  auto near = Case().Gpu(30, 0.55).Host(30).Run();
  EXPECT_FALSE(Has(near, "small_batch"));
  EXPECT_FALSE(Has(near, "memory_headroom"));
}

// A job with no step records (fullburn attach, a loop without markers)
// whose GPU idles with cores to spare and its memory in use: not healthy,
// not a small batch; the usual cause at low confidence, and how to measure.
TEST(Diagnose, AnIdleGpuWithoutStepsIsNotHealthy) {
  Case attached;
  attached.run.config_json = R"({"interval_s": 1, "attached_pid": 4242})";
  auto f = attached.Gpu(30, 0.55).Host(30).Run();
  ASSERT_EQ(f[0].name(), "input_workers") << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(f[0].share_lost, 0.7, 1e-9);
  EXPECT_LT(f[0].confidence, 0.5);
  EXPECT_NE(f[0].evidence.find("not measured"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("start it under fullburn run next time"), std::string::npos) << f[0].fix;
  EXPECT_NE(f[0].fix.find("num_workers"), std::string::npos) << f[0].fix;
  EXPECT_FALSE(Has(f, "healthy"));
  Case wrapped;
  wrapped.run.config_json = R"({"interval_s": 1, "auto_steps": true})";
  wrapped.Gpu(30, 0.55).Host(30);
  wrapped.m.erase("gpu0.mem_used_bytes");  // no memory reading: still said, no nan
  auto w = wrapped.Run();
  ASSERT_EQ(w[0].name(), "input_workers");
  EXPECT_NE(w[0].fix.find("python/fullburn_markers.py"), std::string::npos) << w[0].fix;
  EXPECT_EQ(w[0].evidence.find("nan"), std::string::npos) << w[0].evidence;
  Case busy;  // a GPU at work is the near miss
  busy.run.config_json = attached.run.config_json;
  EXPECT_FALSE(Has(busy.Gpu(55, 0.55).Host(30).Run(), "input_workers"));
}

TEST(Diagnose, MemoryPressureOnGpuAndHost) {
  EXPECT_TRUE(Has(Case().Gpu(95, 0.97).Host(30).Run(), "memory_pressure"));
  EXPECT_FALSE(Has(Case().Gpu(95, 0.93).Host(30).Run(), "memory_pressure"));
  Case swap;
  swap.Gpu(95, 0.7).Host(30);
  swap.m["host.swap_in_per_s"] = Mix(0.2, 50, 0);
  EXPECT_TRUE(Has(swap.Run(), "memory_pressure"));
  swap.m["host.swap_in_per_s"] = Mix(0.05, 50, 0);
  EXPECT_FALSE(Has(swap.Run(), "memory_pressure"));
}

// fullburn train's memory events: a search whose trials ran out of memory
// held the micro-batch at 12 where dist.shard = full fits 54, and the finding
// names it. When the search took the memory model's size for the run's own
// setting (a sharded run), the evidence says so instead of "ran out of
// memory above it" (the trials ran out below the chosen size).
TEST(Diagnose, MemoryModelNamesTheSettingThatRaisesASearchedBatch) {
  auto run = [](bool chosen_by_model) {
    Case c;
    c.Host(40);
    c.events.push_back({0, "batch_size_trial", R"({"batch": 16, "fits": false, "error": "out of memory"})"});
    c.events.push_back({0, "batch_size_chosen",
                        chosen_by_model ? R"({"batch": 12, "memory_model": true, "rank": 0})"
                                        : R"({"batch": 12})"});
    c.events.push_back({5, "memory", R"({"rank": 0, "batch": 12, "shard": "none", "checkpoint": "none",
      "limit_bytes": 104857600, "predicted": {"weights": 1, "gradients": 1, "optimizer": 1,
      "activations": 1, "total": 4},
      "settings": [{"shard": "none", "checkpoint": "none", "bytes": 4, "largest_batch": 16},
                   {"shard": "full", "checkpoint": "none", "bytes": 3, "largest_batch": 54}]})"});
    for (const Finding& f : c.Run())
      if (f.name() == "memory_pressure") return f;
    return Finding{};
  };
  Finding plain = run(false);
  ASSERT_EQ(plain.name(), "memory_pressure");
  EXPECT_EQ(plain.title, "Micro-batch 12 held down by memory");
  EXPECT_NE(plain.fix.find("dist.shard = full: micro-batch up to 54"), std::string::npos) << plain.fix;
  EXPECT_NE(plain.evidence.find("ran out of memory above it"), std::string::npos) << plain.evidence;
  Finding by_model = run(true);
  ASSERT_EQ(by_model.name(), "memory_pressure");
  EXPECT_EQ(by_model.evidence.find("ran out of memory above it"), std::string::npos)
      << by_model.evidence;
  EXPECT_NE(by_model.evidence.find("the memory model's largest for this setting"),
            std::string::npos)
      << by_model.evidence;
}

TEST(Diagnose, MemoryPeaksAfterTheLastStepCount) {
  // The GPU fills after the last step that finished (the step that ran out
  // of memory never finished): outside the training window, still counted.
  Case c;
  c.Gpu(95, 0.7).Host(40).Wait(0.02);
  c.run.end_time = 63;
  for (double t : {61.0, 62.0}) {
    c.m["gpu0.util"].push_back({t, 95});
    c.m["gpu0.mem_total_bytes"].push_back({t, 80e9});
    c.m["gpu0.mem_used_bytes"].push_back({t, 79.5e9});
  }
  EXPECT_TRUE(Has(c.Run(), "memory_pressure"));
}

TEST(Diagnose, SigkillWithNoMemoryLeftPointsAtTheOomKiller) {
  Case c;
  c.run.config_json = R"({"interval_s": 1})";  // fullburn run -- python train.py
  c.run.exit_code = 137;
  c.Host(30);
  c.m["host.mem_total_bytes"] = Flat(64e9);
  c.m["host.mem_available_bytes"] = Mix(0.9, 20e9, 1e9);  // the last tenth: 1.6% left
  auto find = [](const std::vector<Finding>& f) {
    for (const Finding& x : f)
      if (x.name() == "memory_pressure") return x;
    return Finding{};
  };
  Finding killed = find(c.Run());
  EXPECT_NE(killed.title.find("OOM killer"), std::string::npos) << killed.title;
  EXPECT_NE(killed.fix.find("dmesg"), std::string::npos);
  c.run.exit_code = 1;  // the same memory, a plain failure: pressure, no OOM-killer claim
  EXPECT_EQ(find(c.Run()).title, "Host memory pressure");
  c.run.exit_code = 137;  // killed with memory to spare: not blamed on memory
  c.m["host.mem_available_bytes"] = Flat(20e9);
  EXPECT_EQ(find(c.Run()).title, "") << "no memory_pressure finding";
}

TEST(Diagnose, PowerAndThermalThrottlingAsTimeLost) {
  Case c;
  c.Gpu(95, 0.7).Host(30);
  c.m["gpu0.throttle_reasons"] = Mix(0.3, 0x4, 0);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "throttle_power");
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  c.m["gpu0.throttle_reasons"] = Mix(0.2, 0x20, 0);
  EXPECT_EQ(c.Run()[0].name(), "throttle_thermal");
  c.m["gpu0.throttle_reasons"] = Mix(0.03, 0x24, 0);
  EXPECT_EQ(Causes(c.Run()), std::vector<std::string>{"healthy"});
}

TEST(Diagnose, SortedByTimeLostAndRendered) {
  Case c;
  c.Host(95).Wait(0.2).Gpu(90, 0.7);
  c.m["gpu0.throttle_reasons"] = Mix(0.4, 0x80, 0);
  auto f = c.Run();
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[0].name(), "throttle_power");
  EXPECT_EQ(f[1].name(), "input_cpu");
  std::string text = RenderFindings(f);
  EXPECT_NE(text.find("[throttle_power]"), std::string::npos);
  EXPECT_NE(text.find("fix:"), std::string::npos);
  EXPECT_EQ(FindingsJson(f)[1]["cause"], "input_cpu");
}

TEST(Diagnose, WrappedJobsGetPyTorchKnobs) {
  Case c;
  c.run.config_json = R"({"interval_s": 1})";  // fullburn run -- python train.py
  auto f = c.Host(40, 2).Wait(0.25).Run();
  ASSERT_EQ(f[0].name(), "input_workers");
  EXPECT_NE(f[0].fix.find("num_workers"), std::string::npos) << f[0].fix;
  EXPECT_EQ(f[0].fix.find("data.threads"), std::string::npos);
}

// python/fullburn_markers.py describes the job's DataLoader: the evidence
// names its settings and the fix starts from them.
// A framework's job sets its DataLoader where the framework takes it: the
// fix says where (python/fullburn_autosteps/frameworks.py records the place), and a
// Trainer's user, who never wrote a DataLoader, gets TrainingArguments.
// A num_workers the script's command line carried (the hooks matched it to
// the option that parsed it): the fix names the flag, then, under a
// framework, where the framework takes the loader's settings.
TEST(Diagnose, AWorkersCountFromTheCommandLineIsFixedAsTheScriptsFlag) {
  auto job = [](const std::string& framework) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    for (int k = 0; k < 8; ++k) c.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
    c.Host(40, 2).Wait(0.25);
    nlohmann::json data{{"num_workers", 0}, {"pin_memory", false}, {"dataset", "Shapes"},
                        {"created_at", "train.py:805"}, {"created_in", "main"},
                        {"workers_flag", "--workers"}, {"script", "train.py"}};
    if (!framework.empty()) data["framework"] = framework;
    c.events.push_back({0.5, "dataloader", data.dump()});
    return c.Run();
  };
  auto plain = job("");
  ASSERT_EQ(plain[0].name(), "input_workers");
  EXPECT_EQ(plain[0].fix.find("train.py ... --workers 7: the script's own option, which sets its "
                              "DataLoader's num_workers (0 -> 7);"),
            0u)
      << plain[0].fix;
  EXPECT_NE(plain[0].fix.find("its DataLoader is made in main at train.py:805"), std::string::npos)
      << plain[0].fix;
  auto lightning = job("lightning");
  ASSERT_EQ(lightning[0].name(), "input_workers");
  EXPECT_EQ(lightning[0].fix.find("train.py ... --workers 7: the script's own option"), 0u) << lightning[0].fix;
  EXPECT_NE(lightning[0].fix.find("in Lightning"), std::string::npos) << lightning[0].fix;
  EXPECT_EQ(lightning[0].fix.find("(its DataLoader is made at"), std::string::npos) << lightning[0].fix;
}

TEST(Diagnose, AFrameworksLoaderIsFixedInItsOwnTerms) {
  auto job = [](const std::string& framework, const std::string& at, const std::string& in) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    for (int k = 0; k < 8; ++k) c.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
    c.Host(40, 2).Wait(0.25);
    nlohmann::json data{{"num_workers", 0}, {"pin_memory", false}, {"dataset", "Shapes"},
                        {"created_at", at}, {"created_in", in}};
    if (!framework.empty()) data["framework"] = framework;
    c.events.push_back({0.5, "dataloader", data.dump()});
    return c.Run();
  };
  auto lightning = job("lightning", "fit.py:48", "ShapesData.train_dataloader");
  ASSERT_EQ(lightning[0].name(), "input_workers");
  EXPECT_NE(lightning[0].fix.find("in Lightning: give the DataLoader that your LightningDataModule's "
                                  "(or LightningModule's) train_dataloader() returns num_workers=7, "
                                  "persistent_workers=True, pin_memory=True, made in "
                                  "ShapesData.train_dataloader at fit.py:48"),
            std::string::npos)
      << lightning[0].fix;
  EXPECT_EQ(lightning[0].fix.find("fullburn.ImageLoader"), std::string::npos)
      << "not an image folder: no swap to offer" << lightning[0].fix;
  auto hf = job("transformers", "train.py:67", "main");
  ASSERT_EQ(hf[0].name(), "input_workers");
  EXPECT_NE(hf[0].fix.find("in the Trainer's terms: TrainingArguments(dataloader_num_workers=7, "
                           "dataloader_persistent_workers=True, dataloader_pin_memory=True, "
                           "dataloader_prefetch_factor=4): the Trainer builds its DataLoader from "
                           "them (its train() at train.py:67)"),
            std::string::npos)
      << hf[0].fix;
  auto acc = job("accelerate", "loop.py:30", "main");
  EXPECT_NE(acc[0].fix.find("with accelerate: give the DataLoader you pass to accelerator.prepare() "
                            "num_workers=7"),
            std::string::npos)
      << acc[0].fix;
  auto plain = job("", "loop.py:12", "main");
  EXPECT_NE(plain[0].fix.find("; its DataLoader is made in main at loop.py:12"), std::string::npos)
      << plain[0].fix;
  EXPECT_NE(plain[0].fix.find("fullburn.ImageLoader"), std::string::npos) << plain[0].fix;
}

// Which input cause a starved loader gets hangs on the host's readings (a
// neighbour's writes raise iowait); the DataLoader's settings are named in
// the framework's terms under each.
TEST(Diagnose, AFrameworksLoaderIsFixedInItsOwnTermsWhateverTheInputCause) {
  auto job = [](double cpu, double iowait) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    for (int k = 0; k < 8; ++k) c.m["host.cpu" + std::to_string(k) + ".util"] = Flat(cpu);
    c.Host(cpu, iowait).Wait(0.4);
    nlohmann::json data{{"num_workers", 0}, {"pin_memory", false}, {"dataset", "Points"},
                        {"created_at", "loop.py:30"}, {"created_in", "main"},
                        {"framework", "accelerate"}};
    c.events.push_back({0.5, "dataloader", data.dump()});
    return c.Run();
  };
  for (auto [cpu, iowait, cause] : {std::tuple{30.0, 25.0, "input_io"},
                                    std::tuple{95.0, 2.0, "input_cpu"},
                                    std::tuple{40.0, 2.0, "input_workers"}}) {
    auto f = job(cpu, iowait);
    ASSERT_EQ(f[0].name(), cause) << RenderFindings(f);
    EXPECT_NE(f[0].fix.find("with accelerate: give the DataLoader you pass to "
                            "accelerator.prepare() num_workers="),
              std::string::npos)
        << cause << ": " << f[0].fix;
  }
}

// A framework schedules its evaluations: the fix names its settings.
TEST(Diagnose, AFrameworksEvaluationsAreFixedInItsSettings) {
  auto run = [](const std::string& framework) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";  // a wrapped job
    c.Host(40).Wait(0.02);
    nlohmann::json loader{{"num_workers", 2}, {"framework", framework}};
    c.events.push_back({0.5, "dataloader", loader.dump()});
    // A 15 s evaluation after step 25, as IdlePhasesFromGapsBetweenSteps.
    for (StepRecord& r : c.steps)
      if (r.step > 25) r.t += 15;
    c.run.end_time = 75;
    c.events.push_back({40, "evaluation", "{}"});
    return c.Run();
  };
  auto fix_of = [](const std::vector<Finding>& f) {
    for (const Finding& x : f)
      if (x.name() == "idle_phases") return x.fix;
    return std::string("no idle_phases finding");
  };
  EXPECT_NE(fix_of(run("lightning")).find("in Lightning: Trainer(val_check_interval=..."),
            std::string::npos)
      << fix_of(run("lightning"));
  EXPECT_NE(fix_of(run("transformers")).find("TrainingArguments(eval_steps=..."), std::string::npos)
      << fix_of(run("transformers"));
  EXPECT_EQ(fix_of(run("")).find("TrainingArguments"), std::string::npos) << fix_of(run(""));
}

TEST(Diagnose, AWrappedJobsDataLoaderSettingsShapeTheFix) {
  auto job = [](int workers, bool pin) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    for (int k = 0; k < 8; ++k) c.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
    c.Host(40, 2).Wait(0.25);
    nlohmann::json data{{"num_workers", workers}, {"pin_memory", pin}, {"batch_size", 64}};
    c.events.push_back({0.5, "dataloader", data.dump()});
    return c;
  };
  auto f = job(0, false).Run();
  ASSERT_EQ(f[0].name(), "input_workers");
  EXPECT_NE(f[0].evidence.find("its DataLoader: num_workers=0, pin_memory=False"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("DataLoader(num_workers=0 -> 7,"), std::string::npos) << f[0].fix;
  // Its DataLoader seen, the tuner can try the settings on the script as it is.
  EXPECT_NE(f[0].fix.find("fullburn tune -- CMD measures DataLoader settings"), std::string::npos)
      << f[0].fix;
  Case covered = job(7, true);  // workers for every core, yet cores idle
  covered.m["proc.cpu_util"] = Flat(310);
  auto g = covered.Run();
  ASSERT_EQ(g[0].name(), "input_workers");
  EXPECT_NE(g[0].fix.find("num_workers=7 already covers the cores"), std::string::npos) << g[0].fix;
  // The same, but the job's processes together use a third of one core: its
  // workers wait (storage, network, a sleep) rather than decode.
  Case waiting = job(7, true);
  waiting.Host(5, 2);
  waiting.m["proc.cpu_util"] = Flat(35);
  auto w = waiting.Run();
  ASSERT_EQ(w[0].name(), "input_workers");
  EXPECT_NE(w[0].fix.find("the workers wait rather than decode"), std::string::npos) << w[0].fix;
  EXPECT_NE(w[0].fix.find("num_workers 7 -> 14"), std::string::npos) << w[0].fix;
  Case busy = job(2, false);  // a saturated CPU with few workers on 8 cores
  busy.Host(92);
  auto h = busy.Run();
  ASSERT_EQ(h[0].name(), "input_cpu");
  EXPECT_EQ(h[0].fix.rfind("DataLoader(num_workers 2 -> 7); then ", 0), 0u) << h[0].fix;
  Case copies = job(2, false);  // copies measured: pinned memory first
  copies.Gpu(60, 0.7).Wait(0.02);
  for (StepRecord& r : copies.steps) r.h2d_s = r.step_s * 0.25;
  auto c = copies.Run();
  ASSERT_TRUE(Has(c, "h2d_copy"));
  for (const Finding& x : c) {
    if (x.name() == "h2d_copy") {
      EXPECT_NE(x.fix.find("DataLoader(pin_memory=False -> True)"), std::string::npos) << x.fix;
    }
  }
}

// An input-bound wrapped job is told the swap to fullburn.ImageLoader with
// its measured gain, and the tuner's trial of it when its dataset is an
// ImageFolder; a job fed by fullburn.ImageLoader already is told its threads
// and a pack instead.
TEST(Diagnose, AnInputBoundPyTorchJobIsToldTheSwapToFullburnsLoader) {
  Case c;
  c.run.config_json = R"({"interval_s": 1})";
  for (int k = 0; k < 4; ++k) c.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
  c.Host(40, 2).Wait(0.3);
  c.events.push_back({0.5, "dataloader", R"({"num_workers": 1, "dataset": "ImageFolder"})"});
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "input_workers");
  EXPECT_NE(f[0].fix.find("(its dataset is an ImageFolder) swap the DataLoader for "
                          "fullburn.ImageLoader, two lines: `import fullburn` and `loader = "
                          "fullburn.ImageLoader(root, batch_size)`"),
            std::string::npos)
      << f[0].fix;
  EXPECT_TRUE(std::regex_search(f[0].fix, std::regex("[0-9.]+x the DataLoader's images/s per core")))
      << f[0].fix;
  EXPECT_NE(f[0].fix.find("fullburn tune -- CMD tries the swap as a trial"), std::string::npos);
  Case busy = c;
  busy.Host(92);
  auto b = busy.Run();
  ASSERT_EQ(b[0].name(), "input_cpu");
  EXPECT_NE(b[0].fix.find("swap the DataLoader for fullburn.ImageLoader"), std::string::npos)
      << b[0].fix;
  Case other;  // not an ImageFolder: the swap for an image folder, no trial
  other.run.config_json = R"({"interval_s": 1})";
  for (int k = 0; k < 4; ++k) other.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
  other.Host(40, 2).Wait(0.3);
  other.events.push_back({0.5, "dataloader", R"({"num_workers": 1, "dataset": "Tokens"})"});
  auto o = other.Run();
  EXPECT_NE(o[0].fix.find("for an image folder, swap"), std::string::npos) << o[0].fix;
  EXPECT_EQ(o[0].fix.find("tries the swap"), std::string::npos) << o[0].fix;
  Case swapped = c;  // fed by fullburn.ImageLoader already
  swapped.events.clear();
  swapped.events.push_back({10, "loader", R"({"threads": 1, "python": "fullburn.ImageLoader"})"});
  auto s = swapped.Run();
  ASSERT_EQ(s[0].name(), "input_workers");
  EXPECT_EQ(s[0].fix.find("swap"), std::string::npos) << s[0].fix;
  EXPECT_NE(s[0].fix.find("fullburn.ImageLoader(threads=3)"), std::string::npos) << s[0].fix;
  // fullburn train's own runs are never told to swap.
  Case trainer;
  for (int k = 0; k < 4; ++k) trainer.m["host.cpu" + std::to_string(k) + ".util"] = Flat(40);
  auto t = trainer.Host(40, 2).Wait(0.3).Run();
  EXPECT_EQ(t[0].fix.find("fullburn.ImageLoader"), std::string::npos) << t[0].fix;
}

TEST(Diagnose, HostToDeviceCopiesMeasuredAndInferred) {
  Case c;
  c.Gpu(60, 0.7).Host(40).Wait(0.02);
  for (StepRecord& r : c.steps) r.h2d_s = r.step_s * 0.25;
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "h2d_copy");
  EXPECT_NEAR(f[0].share_lost, 0.25, 1e-9);
  for (StepRecord& r : c.steps) r.h2d_s = r.step_s * 0.08;
  EXPECT_FALSE(Has(c.Run(), "h2d_copy"));  // near miss

  Case pcie;  // no steps: an idle GPU with a busy PCIe link
  pcie.Gpu(30, 0.7).Host(40);
  pcie.m["gpu0.pcie_rx_bytes_per_s"] = Flat(20e9);
  auto g = pcie.Run();
  ASSERT_EQ(g[0].name(), "h2d_copy");
  EXPECT_FALSE(Has(g, "input_cpu"));
  pcie.m["gpu0.pcie_rx_bytes_per_s"] = Flat(5e9);
  EXPECT_FALSE(Has(pcie.Run(), "h2d_copy"));
}

TEST(Diagnose, LaunchBoundWhenStepsWaitLittleYetTheGpuIdles) {
  Case c;
  c.Gpu(35, 0.1).Host(40).Wait(0.02);
  c.m["proc.cpu_util"] = Flat(99);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "small_batch");
  EXPECT_NE(f[0].fix.find("batch 64 -> 512"), std::string::npos) << f[0].fix;  // 0.8 / 0.1 = x8
  EXPECT_NE(f[0].fix.find("train.cuda_graphs = true"), std::string::npos) << f[0].fix;
  EXPECT_FALSE(Has(Case().Gpu(85, 0.1).Host(40).Wait(0.02).Run(), "small_batch"));
}

// `fullburn run -- sleep 5` on the lent H100 read util 0% throughout and was
// called "small batches" with "raise the batch size (about x135)".
TEST(Diagnose, AJobThatNeverUsedTheGpuIsToldSoNotToRaiseItsBatch) {
  Case wrapped;
  wrapped.run.config_json = "";  // fullburn run -- CMD
  wrapped.Gpu(0, 0.006).Host(1);
  wrapped.m["gpu0.util"] = Mix(0.02, 3, 0);  // a blip, never 5%
  wrapped.m["proc.cpu_util"] = Flat(0);
  auto f = wrapped.Run();
  ASSERT_EQ(f[0].name(), "gpu_unused") << ::testing::PrintToString(Causes(f));
  EXPECT_NE(f[0].evidence.find("never above 3%"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("torch.cuda.is_available()"), std::string::npos) << f[0].fix;
  EXPECT_FALSE(Has(f, "small_batch"));
  EXPECT_FALSE(Has(f, "memory_headroom"));
  EXPECT_FALSE(Has(f, "healthy"));

  // fullburn train on the CPU of a GPU machine, with steps and little data wait.
  Case trainer;
  trainer.run.config_json = R"({"train": {"precision": "fp32"}, "resolved": {"device": "cpu"}})";
  trainer.Gpu(0, 0.006).Host(95).Wait(0.02);
  auto g = trainer.Run();
  ASSERT_EQ(g[0].name(), "gpu_unused") << ::testing::PrintToString(Causes(g));
  EXPECT_NE(g[0].fix.find("train.device = cuda"), std::string::npos) << g[0].fix;
  EXPECT_FALSE(Has(g, "small_batch"));

  // One busy sample is use: a job that used the GPU late is judged as before.
  Case late;
  late.Gpu(0, 0.006).Host(1);
  late.m["gpu0.util"] = Mix(0.9, 0, 60);
  EXPECT_FALSE(Has(late.Run(), "gpu_unused"));
  // No GPU reading at all is no evidence either way.
  EXPECT_FALSE(Has(Case().Host(40).Run(), "gpu_unused"));
}

// nanoGPT's loop evaluates every 20 iterations, each evaluation (0.9 s)
// shorter than an idle gap must be (kIdleGapMin_s): each one the hooks timed
// counts, the one before the first step is the evaluation's (not the
// start-up's), and the fix names the script's own options.
TEST(Diagnose, ShortRegularEvaluationsAreNamedWithTheScriptsOptions) {
  Case c;
  c.run.config_json = "{}";  // a wrapped job
  c.Host(40);
  const double step_s = 0.05, eval_s = 0.9;
  double t = 1.0;  // start-up: 1 s, then the evaluation at iteration 0 (before step 1)
  std::string options = R"("options": {"--eval-interval": 20, "--eval-iters": 40}, "script": "train.py")";
  for (int i = 1; i <= 100; ++i) {
    if (i % 20 == 1) {
      t += eval_s;
      c.events.push_back({t, "evaluation",
                          fmt::format(R"({{"duration_s": {}, "model_calls": 80, "after_step": {}, {}}})", eval_s, i - 1,
                                      options)});
    }
    StepRecord r;
    r.step = i;
    r.step_s = step_s;
    t += step_s;
    r.t = t;
    r.samples = 12;
    r.forward_s = 0.02, r.backward_s = 0.02, r.optimizer_s = 0.008;
    c.steps.push_back(r);
  }
  c.run.end_time = t;
  auto f = c.Run();
  ASSERT_FALSE(f.empty());
  const Finding& idle = f[0];
  ASSERT_EQ(idle.name(), "idle_phases") << RenderFindings(f, 9);
  EXPECT_NE(idle.evidence.find("evaluation x5 4.5 s (every 20 steps, 80 model calls each)"), std::string::npos)
      << idle.evidence;
  EXPECT_EQ(idle.title.rfind("Evaluation every 20 steps: ", 0), 0u) << idle.title;
  EXPECT_NE(idle.title.find(", 80 model calls each"), std::string::npos) << idle.title;
  EXPECT_NE(idle.fix.find("train.py ... --eval-interval 100 --eval-iters 10 (the script's own options, now "
                          "--eval-interval 20, --eval-iters 40)"),
            std::string::npos)
      << idle.fix;
}

// The loop-overhead share is of the mean step: its evidence quotes the
// means, and the medians beside them when a few long steps hold it.
TEST(Diagnose, LoopOverheadQuotesWhatItsShareIsOf) {
  Case c;
  c.run.config_json = "{}";
  c.Host(40);
  for (int i = 1; i <= 40; ++i) {
    StepRecord r;
    r.step = i;
    bool long_one = i % 10 == 0;  // every 10th step logs for 0.5 s
    r.step_s = long_one ? 0.55 : 0.05;
    r.t = 0.5 + 0.06 * i + (i / 10) * 0.5;
    r.samples = 8;
    r.data_wait_s = 0.001, r.forward_s = 0.03, r.backward_s = 0.015, r.optimizer_s = 0.002;
    c.steps.push_back(r);
  }
  c.run.end_time = 6;
  auto f = c.Run();
  auto loop = std::find_if(f.begin(), f.end(), [](const Finding& x) { return x.name() == "loop_overhead"; });
  ASSERT_NE(loop, f.end()) << RenderFindings(f, 9);
  // 4 of 40 steps hold 0.5 s each: a mean rest of 52 ms of a 100 ms step.
  EXPECT_NE(loop->evidence.find("52% of step time"), std::string::npos) << loop->evidence;
  EXPECT_NE(loop->evidence.find("52.0 ms of a 100.0 ms step on average (medians 2.0 of 50.0 ms: a few long steps "
                                "hold much of it)"),
            std::string::npos)
      << loop->evidence;
}

TEST(Diagnose, IdlePhasesFromGapsBetweenSteps) {
  Case c;
  c.Host(40).Wait(0.02);
  // A 15 s evaluation after step 25: later steps move 15 s on, the run grows.
  for (StepRecord& r : c.steps)
    if (r.step > 25) r.t += 15;
  c.run.end_time = 75;
  c.events.push_back({40, "evaluation", "{}"});
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "idle_phases");
  EXPECT_NEAR(f[0].share_lost, 15.0 / 75, 1e-9);
  EXPECT_NE(f[0].evidence.find("evaluation 15.0 s"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("evaluate less often (raise eval.every_steps"), std::string::npos)
      << f[0].fix;
  EXPECT_NE(f[0].fix.find("eval.max_samples"), std::string::npos) << f[0].fix;
  for (StepRecord& r : c.steps)
    if (r.step > 25) r.t -= 11;  // a 4 s gap: 5% of the run, a near miss
  c.run.end_time = 64;
  EXPECT_FALSE(Has(c.Run(), "idle_phases"));
}

TEST(Diagnose, AWrappedJobsStartUpWithoutAGpuIsTimeOutsideSteps) {
  Case c;
  c.Host(40).Wait(0.02);
  c.run.config_json = "{}";                 // wrapped: no trainer config
  for (StepRecord& r : c.steps) r.t += 12;  // 12 s before the first step
  c.run.end_time = 72;
  c.events.push_back({0, "dataloader", R"({"num_workers": 3, "pin_memory": false})"});
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "idle_phases");
  EXPECT_EQ(f[0].title, "Time outside training steps");  // no GPU sampled
  EXPECT_NE(f[0].evidence.find("start-up 12.0 s"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("a fixed cost"), std::string::npos) << f[0].fix;
  EXPECT_NE(f[0].fix.find("python -X importtime"), std::string::npos) << f[0].fix;
  EXPECT_NE(f[0].fix.find("num_workers=3 processes"), std::string::npos) << f[0].fix;
  c.Gpu(95, 0.7);
  EXPECT_EQ(c.Run()[0].title, "The device idles between phases");
}

// The summaries fullburn itself adds once the job has ended (its stacks,
// its layers) name no stretch of the job's time.
TEST(Diagnose, FullburnsOwnSummaryEventsNameNoIdleStretch) {
  Case c;
  c.Host(40).Wait(0.02);
  c.run.config_json = "{}";
  double last = 0;
  for (const StepRecord& r : c.steps) last = std::max(last, r.t);
  c.run.end_time = last + 12;  // 12 s after the last step: the interpreter's exit
  c.events.push_back({last + 11.5, "stacks", R"({"samples": 10})"});
  c.events.push_back({last + 11.6, "layers", R"({"layers": []})"});
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "idle_phases");
  EXPECT_NE(f[0].evidence.find("end 12.0 s"), std::string::npos) << f[0].evidence;
  EXPECT_EQ(f[0].evidence.find("stacks"), std::string::npos) << f[0].evidence;
  EXPECT_EQ(f[0].evidence.find("layers"), std::string::npos) << f[0].evidence;
}

TEST(Diagnose, HostLevelsAreReadWhileTheJobTrains) {
  // 70 s of single-threaded start-up at 50% CPU, then 60 s of steps waiting
  // 78% of the time on loader workers that fill the host (95%). Over the
  // whole run the CPU median reads 50%: "idle cores, add workers" would be
  // wrong advice for a host that is full while it trains.
  Case c;
  c.Wait(0.78);
  for (StepRecord& r : c.steps) r.t += 70;
  c.run.end_time = 130;
  for (int i = 0; i < 130; ++i) {
    c.m["host.cpu_util"].push_back({static_cast<double>(i + 1), i < 70 ? 50.0 : 95.0});
    c.m["host.cpu_iowait"].push_back({static_cast<double>(i + 1), 1.0});
  }
  auto f = c.Run();
  EXPECT_TRUE(Has(f, "input_cpu")) << ::testing::PrintToString(Causes(f));
  EXPECT_FALSE(Has(f, "input_workers"));
  EXPECT_TRUE(Has(f, "idle_phases"));  // the start-up is judged on its own
  for (const Finding& x : f) {
    if (x.name() == "input_cpu") {
      EXPECT_NE(x.evidence.find("median 95%"), std::string::npos);
    }
  }
}

// A wrapped job's steps are timed on the host, ahead of the GPU: its wait
// for data counts only as far as the GPU was idle.
TEST(Diagnose, AWrappedJobsDataWaitCountsOnlyAsFarAsTheGpuIdled) {
  auto wrapped = [](double gpu_util) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    c.Gpu(gpu_util, 0.6).Host(40, 2).Wait(0.3);
    return c.Run();
  };
  auto busy = wrapped(96);  // the wait overlapped queued kernels
  EXPECT_FALSE(Has(busy, "input_workers")) << ::testing::PrintToString(Causes(busy));
  EXPECT_EQ(busy[0].name(), "healthy");
  auto partly = wrapped(80);
  ASSERT_EQ(partly[0].name(), "input_workers");
  EXPECT_NEAR(partly[0].share_lost, 0.2, 1e-9);
  EXPECT_NE(partly[0].evidence.find("the GPU waited at most 20%"), std::string::npos)
      << partly[0].evidence;
  auto idle = wrapped(40);  // the GPU idled more than the loop waited: the wait is the cost
  ASSERT_EQ(idle[0].name(), "input_workers");
  EXPECT_NEAR(idle[0].share_lost, 0.3, 1e-9);
  EXPECT_EQ(idle[0].evidence.find("at most"), std::string::npos);
  // fullburn train reads the device once a step: its host does not run ahead.
  Case trainer;
  trainer.Gpu(96, 0.6).Host(40, 2).Wait(0.3);
  EXPECT_EQ(trainer.Run()[0].name(), "input_workers");
}

// A wrapped job's steps with every phase timed (python/fullburn_autosteps/steps.py):
// `rest` of each 1 s step is the loop's own work, outside every phase.
Case LoopSteps(double rest, bool forward_timed = true) {
  Case c;
  c.run.config_json = R"({"interval_s": 1})";
  c.Host(40, 2);
  for (int i = 1; i <= 60; ++i) {  // they fill the 60 s run
    StepRecord r;
    r.step = i;
    r.step_s = 1;
    r.t = 1.0 * i;
    r.samples = 64;
    r.data_wait_s = 0.05;
    if (forward_timed) r.forward_s = (0.9 - rest) / 2;
    r.backward_s = (0.9 - rest) / 2;
    r.optimizer_s = 0.05;
    c.steps.push_back(r);
  }
  return c;
}

TEST(Diagnose, TheLoopsOwnWorkBetweenStepsIsNamedWithItsShare) {
  auto f = LoopSteps(0.3).Run();
  ASSERT_EQ(f[0].name(), "loop_overhead") << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  EXPECT_NE(f[0].evidence.find("300.0 ms of a 1000.0 ms step"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("every 50 steps"), std::string::npos) << f[0].fix;
  EXPECT_FALSE(Has(LoopSteps(0.08).Run(), "loop_overhead"));
  // Without the forward timed, the rest holds the forward too: not judged.
  EXPECT_FALSE(Has(LoopSteps(0.3, false).Run(), "loop_overhead"));
  // fullburn train times its steps phase by phase: its rest is no loop of the user's.
  Case trainer = LoopSteps(0.3);
  trainer.run.config_json = R"({"train": {"precision": "fp32"}})";
  EXPECT_FALSE(Has(trainer.Run(), "loop_overhead"));
}

// A get_batch() loop (no DataLoader): the model's calls time the forward,
// and its batches are made in the loop's own work, which the finding says.
TEST(Diagnose, ALoopWithoutADataLoaderHasItsBatchesInItsOwnWork) {
  Case c = LoopSteps(0.3);
  for (StepRecord& r : c.steps) r.data_wait_s.reset(), r.backward_s = *r.backward_s + 0.05;
  auto f = c.Run();
  ASSERT_FALSE(f.empty());
  ASSERT_EQ(f[0].name(), "loop_overhead") << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  EXPECT_NE(f[0].title.find("making the batches"), std::string::npos) << f[0].title;
  EXPECT_NE(f[0].evidence.find("no DataLoader fed the steps"), std::string::npos) << f[0].evidence;
  EXPECT_EQ(f[0].fix.rfind("if get_batch() is the cost", 0), 0u) << f[0].fix;
  // With a DataLoader the same share is bookkeeping only.
  auto g = LoopSteps(0.3).Run();
  EXPECT_EQ(g[0].title.find("making the batches"), std::string::npos) << g[0].title;
  EXPECT_EQ(g[0].fix.find("get_batch"), std::string::npos) << g[0].fix;
}

TEST(Diagnose, TheLoopsWorkCountsOnlyAsFarAsTheGpuIdled) {
  Case partly = LoopSteps(0.3);
  auto f = partly.Gpu(85, 0.6).Run();
  ASSERT_EQ(f[0].name(), "loop_overhead");
  // 15% idle, 5% of it the data wait's (LoopSteps waits 50 ms a step).
  EXPECT_NEAR(f[0].share_lost, 0.10, 1e-9);
  EXPECT_NE(f[0].evidence.find("the GPU idled 15%, 5% of it explained by the data wait: the "
                               "loop's work cost it at most 10%"),
            std::string::npos)
      << f[0].evidence;
  Case busy = LoopSteps(0.3);
  EXPECT_FALSE(Has(busy.Gpu(95, 0.6).Run(), "loop_overhead"));
  // An idle GPU behind a busy loop: the loop is the reason, not the batch size.
  Case idle = LoopSteps(0.3);
  auto g = idle.Gpu(35, 0.1).Run();
  EXPECT_EQ(g[0].name(), "loop_overhead");
  EXPECT_NEAR(g[0].share_lost, 0.3, 1e-9);
  EXPECT_FALSE(Has(g, "small_batch")) << ::testing::PrintToString(Causes(g));
  // The GPU's idle time the data wait explains is not the loop's too: 30%
  // idle, 25% of it waiting for data, leaves the loop 5%.
  Case waiting = LoopSteps(0.3);
  for (StepRecord& r : waiting.steps)
    r.data_wait_s = 0.25, *r.forward_s -= 0.1, *r.backward_s -= 0.1;
  auto w = waiting.Gpu(70, 0.6).Run();
  EXPECT_FALSE(Has(w, "loop_overhead")) << ::testing::PrintToString(Causes(w));
  EXPECT_TRUE(Has(w, "input_workers")) << ::testing::PrintToString(Causes(w));
}

// A wrapped job's uncaught exception (python/fullburn_autosteps/exceptions.py) is the
// first finding, whatever the others cost, titled and fixed by its kind.
TEST(Diagnose, AFailedJobIsNamedFirstWithTheFixForItsKind) {
  auto failed = [](std::vector<std::tuple<double, int, std::string, std::string>> raised) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    c.run.exit_code = 1;
    c.Host(40, 2).Wait(0.3);  // input-bound too: ~30% lost
    for (auto& [t, rank, type, message] : raised) {
      nlohmann::json data{
          {"type", type}, {"message", message}, {"where", "train.py:42"}, {"rank", rank}};
      c.events.push_back({t, "exception", data.dump()});
    }
    return c.Run();
  };
  auto f = failed(
      {{30.1, 0, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 MiB\nmore"}});
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[0].name(), "job_failed");
  EXPECT_EQ(f[0].title, "The job ran out of GPU memory");
  EXPECT_EQ(f[0].evidence,
            "exit code 1; raised OutOfMemoryError at train.py:42 after step 25, 30.1 s into the "
            "run: CUDA out of memory. Tried to allocate 20.00 MiB");
  EXPECT_EQ(f[1].name(), "input_workers");  // the run until it failed
  auto worker =
      failed({{5, 0, "RuntimeError", "Caught ValueError in DataLoader worker process 0."}});
  EXPECT_EQ(worker[0].title, "The Dataset raised in a DataLoader worker");
  auto died = failed(
      {{5, 0, "RuntimeError", "DataLoader worker (pid 4242) is killed by signal: Bus error."}});
  EXPECT_EQ(died[0].title, "A DataLoader worker died");
  EXPECT_NE(died[0].fix.find("--shm-size"), std::string::npos);
  auto host = failed({{0.5, 0, "MemoryError", ""}});
  EXPECT_EQ(host[0].title, "The job ran out of host memory");
  EXPECT_NE(host[0].evidence.find("before its first step"), std::string::npos) << host[0].evidence;
  // Ranks: the first to raise is the one named, the others waited for it.
  auto ranks = failed({{20.5, 0, "DistBackendError", "NCCL communicator was aborted"},
                       {12.0, 3, "KeyError", "'label'"},
                       {20.6, 1, "DistBackendError", "NCCL communicator was aborted"}});
  EXPECT_EQ(ranks[0].title, "The job failed: KeyError");
  EXPECT_NE(ranks[0].evidence.find("rank 3 raised KeyError"), std::string::npos)
      << ranks[0].evidence;
  EXPECT_NE(ranks[0].evidence.find("the first of 3 ranks"), std::string::npos);
  auto collective = failed({{20.5, 1, "DistBackendError", "NCCL communicator was aborted"}});
  EXPECT_EQ(collective[0].title, "A collective failed");
  // No exception event, no such finding.
  Case ok;
  ok.Host(40, 2).Wait(0.3);
  EXPECT_FALSE(Has(ok.Run(), "job_failed"));
}

// An out-of-memory's record (python/fullburn_layers.py): the layer and pass
// that ran and the allocator's bytes. Reserved far above allocated is
// fragmentation, fixed first by expandable segments; otherwise the batch and
// checkpointing fix, in the framework's words.
TEST(Diagnose, AnOutOfMemoryNamesItsLayerAndTellsFragmentationFromSize) {
  auto oom = [](nlohmann::json record, const std::string& framework) {
    Case c;
    c.run.config_json = R"({"interval_s": 1})";
    c.run.exit_code = 1;
    c.Host(40, 2).Wait(0.02);
    if (!framework.empty())
      c.events.push_back({0.5, "dataloader",
                          nlohmann::json{{"num_workers", 4}, {"framework", framework}}.dump()});
    nlohmann::json data{{"type", "OutOfMemoryError"},
                        {"message", "CUDA out of memory. Tried to allocate 2.00 GiB"},
                        {"where", "train.py:42"},
                        {"oom", record}};
    c.events.push_back({30.1, "exception", data.dump()});
    return c.Run();
  };
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  auto fragmented = oom({{"layer", "h"}, {"pass", "backward"}, {"allocated_bytes", 50 * kGiB},
                         {"reserved_bytes", 76 * kGiB}, {"total_bytes", 79.6 * kGiB}},
                        "lightning");
  ASSERT_EQ(fragmented[0].name(), "job_failed");
  EXPECT_EQ(fragmented[0].title, "The job ran out of GPU memory: fragmentation");
  EXPECT_NE(fragmented[0].evidence.find("it ran out in layer h (backward); the allocator: 50.0 GiB "
                                        "allocated, 76.0 GiB reserved of 79.6 GiB (26.0 GiB reserved "
                                        "beyond what is allocated: fragmentation)"),
            std::string::npos)
      << fragmented[0].evidence;
  EXPECT_EQ(fragmented[0].fix.find("the step does not fit in GPU memory: PYTORCH_CUDA_ALLOC_CONF="
                                   "expandable_segments:True first"),
            0u)
      << fragmented[0].fix;
  EXPECT_NE(fragmented[0].fix.find("Trainer(accumulate_grad_batches=2)"), std::string::npos);
  EXPECT_NE(fragmented[0].fix.find("checkpointing of layer h"), std::string::npos);
  // Nearly all reserved is allocated: the step is too large, not fragmented.
  auto full = oom({{"layer", "3"}, {"pass", "forward"}, {"allocated_bytes", 75 * kGiB},
                   {"reserved_bytes", 76 * kGiB}, {"total_bytes", 79.6 * kGiB}},
                  "transformers");
  EXPECT_EQ(full[0].title, "The job ran out of GPU memory");
  EXPECT_EQ(full[0].evidence.find("fragmentation"), std::string::npos) << full[0].evidence;
  EXPECT_NE(full[0].fix.find("gradient_accumulation_steps=2"), std::string::npos) << full[0].fix;
  EXPECT_NE(full[0].fix.find("gradient_checkpointing=True"), std::string::npos) << full[0].fix;
  // Without --layers: the module's type from the traceback; without CUDA
  // read, it says the numbers are missing rather than inventing them.
  auto plain = oom({{"module_type", "TransformerBlock"}, {"pass", "forward"}}, "");
  EXPECT_NE(plain[0].evidence.find("it ran out in a TransformerBlock (forward; fullburn run --layers "
                                   "names the layer); the CUDA allocator's numbers were not read"),
            std::string::npos)
      << plain[0].evidence;
  EXPECT_NE(plain[0].fix.find("torch.utils.checkpoint.checkpoint around the TransformerBlock layers"),
            std::string::npos)
      << plain[0].fix;
}

TEST(Diagnose, StepsThatStallEveryFewStepsAreNamed) {
  Case c;
  c.Host(40).Wait(0.02);
  c.run.config_json = "{}";  // wrapped: a torch.save inside the loop every 10 steps
  auto stall_every_10 = [&](double times) {
    for (StepRecord& r : c.steps) {
      r.step_s = 1.2;
      r.forward_s.reset();
      if (r.step % 10 == 0) r.step_s = 1.2 + (times - 1) * (1.2 - *r.data_wait_s);
    }
  };
  stall_every_10(4);  // 5 stalls of 3 x 1.176 s beyond the median: 17.6 s of 60 s
  auto f = c.Run();
  const Finding* stall = nullptr;
  for (const Finding& x : f)
    if (x.name() == "step_stalls") stall = &x;
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(stall->share_lost, 5 * 3 * 1.176 / 60, 1e-6);
  EXPECT_NE(stall->evidence.find("5 of 47 steps"), std::string::npos) << stall->evidence;
  EXPECT_NE(stall->evidence.find("every 10 steps, steps 10, 20, 30, 40, ..."), std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->fix.find("every 10 steps: a synchronous torch.save"), std::string::npos);
  // A run of fullburn train is pointed at its trace, with the phase that grew.
  c.run.config_json = R"({"train": {"precision": "bf16"}})";
  for (StepRecord& r : c.steps) {
    r.forward_s = 0.4;
    r.backward_s = r.step_s - *r.data_wait_s - 0.4;
  }
  f = c.Run();
  ASSERT_TRUE(Has(f, "step_stalls"));
  for (const Finding& x : f)
    if (x.name() == "step_stalls") {
      EXPECT_NE(x.evidence.find("the time went to backward"), std::string::npos) << x.evidence;
      EXPECT_NE(x.fix.find("fullburn runs trace RUN"), std::string::npos) << x.fix;
    }
  // Near misses: 2.5x the median is no stall; slow warm-up steps are not
  // judged; a long wait for data is the input rules', not a stall.
  stall_every_10(2.5);
  EXPECT_FALSE(Has(c.Run(), "step_stalls"));
  stall_every_10(1);
  for (int i = 0; i < 3; ++i) c.steps[i].step_s = 20;
  EXPECT_FALSE(Has(c.Run(), "step_stalls"));
  c.steps[0].step_s = c.steps[1].step_s = c.steps[2].step_s = 1.2;
  c.steps[20].data_wait_s = 20;
  c.steps[20].step_s = 21.2;
  EXPECT_FALSE(Has(c.Run(), "step_stalls"));
}

// A wrapped job with every phase timed: stalls that no phase holds are the
// loop's own code (logging, an evaluation inside it), and the evidence says so.
TEST(Diagnose, StallsOutsideEveryPhaseAreTheLoopsOwnCode) {
  Case c = LoopSteps(0.02);
  for (StepRecord& r : c.steps)
    if (r.step % 10 == 0) r.step_s += 3;  // 3 s of the loop's own work every 10 steps
  auto f = c.Run();
  const Finding* stall = nullptr;
  for (const Finding& x : f)
    if (x.name() == "step_stalls") stall = &x;
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NE(stall->evidence.find("the time went to the loop's own code"), std::string::npos)
      << stall->evidence;
  // The same stalls inside backward name backward.
  for (StepRecord& r : c.steps)
    if (r.step % 10 == 0) *r.backward_s += 3;
  f = c.Run();
  stall = nullptr;
  for (const Finding& x : f)
    if (x.name() == "step_stalls") stall = &x;
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NE(stall->evidence.find("the time went to backward"), std::string::npos)
      << stall->evidence;
}

const Finding* Named(const std::vector<Finding>& f, const std::string& cause) {
  for (const Finding& x : f)
    if (x.name() == cause) return &x;
  return nullptr;
}

// A wrapped job's 50 steps of 1.2 s with a 400 MB torch.save of `took` s
// after every 10th (10 to 40): the automatic markers keep each save out of
// the step it interrupts, so it pushes the later steps on.
Case SavingEvery10Steps(double took) {
  Case c;
  c.Host(40).Wait(0.02);
  c.run.config_json = "{}";
  double shift = 0;
  for (StepRecord& r : c.steps) {
    r.t += shift;
    if (r.step % 10 != 0 || r.step == 50) continue;
    shift += took;
    nlohmann::json data{{"duration_s", took},      {"path", "/ckpt/model.pt"}, {"bytes", 400000000},
                        {"detected", "automatic"}, {"after_step", r.step},     {"rank", 0}};
    c.events.push_back({r.t + took, "checkpoint", data.dump()});
  }
  c.run.end_time = 60 + shift;
  return c;
}

TEST(Diagnose, TorchSavesThatHoldUpTheLoopAreNamedOnceWithTheirCost) {
  Case c = SavingEvery10Steps(8);  // 32 s of a 92 s run
  auto f = c.Run();
  const Finding* stall = Named(f, "checkpoint_stall");
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(stall->share_lost, 32.0 / 92, 1e-9);
  EXPECT_NE(stall->evidence.find("4 checkpoints (torch.save, timed by the automatic markers) held "
                                 "up the training loop 32.0 s, 35% of the run"),
            std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->evidence.find("8 s each (median; longest 8 s), every 10 steps; 400 MB each "
                                 "at 50 MB/s; the last: /ckpt/model.pt"),
            std::string::npos)
      << stall->evidence;
  // 10 steps x 35% / 2% = 174 steps between saves for about 2% of the run.
  EXPECT_NE(stall->fix.find("save every 174 steps instead of every 10"), std::string::npos)
      << stall->fix;
  EXPECT_NE(stall->fix.find("async_save"), std::string::npos) << stall->fix;
  EXPECT_NE(stall->fix.find("ran at 50 MB/s: write to a local SSD"), std::string::npos)
      << stall->fix;
  // The 8 s gaps are longer than 5 median steps, yet they are the saves':
  // counted once, not again as idle phases.
  EXPECT_FALSE(Has(f, "idle_phases")) << ::testing::PrintToString(Causes(f));
  EXPECT_FALSE(Has(f, "step_stalls"));

  // An evaluation in the same gap as a save keeps its own time.
  Case e = SavingEvery10Steps(8);
  for (StepRecord& r : e.steps)
    if (r.step > 20) r.t += 12;
  for (RunEvent& x : e.events)
    if (x.t > e.steps[19].t + 8) x.t += 12;
  e.events.push_back({e.steps[19].t + 8 + 12, "evaluation", R"({"duration_s": 12})"});
  e.run.end_time = *e.run.end_time + 12;
  f = e.Run();
  const Finding* idle = Named(f, "idle_phases");
  ASSERT_NE(idle, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(idle->share_lost, 12.0 / 104, 1e-9);
  EXPECT_NE(idle->evidence.find("evaluation 12.0 s"), std::string::npos) << idle->evidence;
  ASSERT_NE(Named(f, "checkpoint_stall"), nullptr);
  EXPECT_NEAR(Named(f, "checkpoint_stall")->share_lost, 32.0 / 104, 1e-9);
}

TEST(Diagnose, CheapOrBackgroundSavesAreNoCheckpointStall) {
  Case c = SavingEvery10Steps(0.5);  // 2 s of 62 s: 3%
  EXPECT_FALSE(Has(c.Run(), "checkpoint_stall"));
  c = SavingEvery10Steps(8);
  for (RunEvent& e : c.events) {
    auto data = nlohmann::json::parse(e.data);
    data["background"] = true;  // an async checkpointer's thread wrote them
    e.data = data.dump();
  }
  EXPECT_FALSE(Has(c.Run(), "checkpoint_stall"));
}

// A save on a thread blocks no step, but pickling holds the GIL and writing
// takes a core: the steps it overlaps stall, and the stall says why.
TEST(Diagnose, StallsBesideBackgroundSavesAreLinkedToThem) {
  Case c;
  c.Host(40).Wait(0.02);
  c.run.config_json = "{}";
  for (StepRecord& r : c.steps) {
    if (r.step % 10 != 1 || r.step == 1) continue;
    r.step_s = 4.8;
    nlohmann::json data{{"duration_s", 4},
                        {"path", "/ckpt/model.pt"},
                        {"background", true},
                        {"detected", "automatic"},
                        {"rank", 0}};
    c.events.push_back({r.t - 0.5, "checkpoint", data.dump()});
  }
  auto f = c.Run();
  const Finding* stall = Named(f, "step_stalls");
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_FALSE(Has(f, "checkpoint_stall"));
  EXPECT_NE(stall->evidence.find("every 10 steps, steps 11, 21, 31, 41; "), std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->evidence.find("4 of them overlapped a torch.save on a background thread"),
            std::string::npos)
      << stall->evidence;
  EXPECT_EQ(stall->fix.rfind("the background save competes with the loop", 0), 0u) << stall->fix;
  for (RunEvent& e : c.events) e.t += 30;  // saves that overlap other steps explain nothing
  f = c.Run();
  stall = Named(f, "step_stalls");
  ASSERT_NE(stall, nullptr);
  EXPECT_EQ(stall->evidence.find("background"), std::string::npos) << stall->evidence;
  EXPECT_NE(stall->fix.find("a synchronous torch.save"), std::string::npos) << stall->fix;
}

TEST(Diagnose, AModelFileAndAnOptimizerFileAfterOneStepAreOneCheckpoint) {
  Case c = SavingEvery10Steps(4);
  std::vector<RunEvent> split;
  for (const RunEvent& e : c.events) {  // each 4 s save as a 3 s and a 1 s file
    auto data = nlohmann::json::parse(e.data);
    data["duration_s"] = 3;
    split.push_back({e.t - 1, "checkpoint", data.dump()});
    data["duration_s"] = 1;
    data["path"] = "/ckpt/optimizer.pt";
    split.push_back({e.t, "checkpoint", data.dump()});
  }
  c.events = split;
  auto f = c.Run();
  const Finding* stall = Named(f, "checkpoint_stall");
  ASSERT_NE(stall, nullptr);
  EXPECT_NEAR(stall->share_lost, 16.0 / 76, 1e-9);
  EXPECT_NE(stall->evidence.find("4 checkpoints (torch.save"), std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->evidence.find("4 s each (median"), std::string::npos) << stall->evidence;
  EXPECT_NE(stall->evidence.find("800 MB each at 200 MB/s; the last: /ckpt/optimizer.pt"),
            std::string::npos)
      << stall->evidence;
}

TEST(Diagnose, TheTrainersCheckpointStallsPointAtItsCheckpointKeys) {
  Case c;
  c.Host(40).Wait(0.02);
  double shift = 0;
  for (StepRecord& r : c.steps) {
    r.t += shift;
    if (r.step % 5 != 0) continue;
    shift += 0.9;  // the loop waits for a synchronous write
    c.checkpoints.push_back({r.step, r.t + 0.9, "/ckpt/step.safetensors", 50000000, 0.9, 0});
  }
  c.run.end_time = 60 + shift;  // 9 s of 69 s
  c.run.config_json = R"({"train": {"precision": "bf16"}, "checkpoint": {"async": false}})";
  auto f = c.Run();
  const Finding* stall = Named(f, "checkpoint_stall");
  ASSERT_NE(stall, nullptr) << ::testing::PrintToString(Causes(f));
  EXPECT_NEAR(stall->share_lost, 9.0 / 69, 1e-9);
  EXPECT_NE(stall->evidence.find("10 checkpoints (the snapshot before each background write)"),
            std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->evidence.find("every 5 steps"), std::string::npos) << stall->evidence;
  EXPECT_EQ(stall->fix.rfind("checkpoint.async = true", 0), 0u) << stall->fix;
  c.run.config_json = R"({"train": {"precision": "bf16"}, "checkpoint": {"async": true}})";
  f = c.Run();
  stall = Named(f, "checkpoint_stall");
  ASSERT_NE(stall, nullptr);
  // 5 x 13% / 2% = 32.6: every 33 steps.
  EXPECT_EQ(stall->fix.rfind("checkpoint.every_steps = 33 ", 0), 0u) << stall->fix;
}

TEST(Diagnose, IdlePhasesFromGpuSamplesWithoutSteps) {
  Case c;
  c.Gpu(95, 0.7).Host(40);
  for (int i = 0; i < 12; ++i) c.m["gpu0.util"][i].v = 0;  // 12 s of start-up
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "idle_phases");
  EXPECT_NE(f[0].evidence.find("start-up"), std::string::npos);
  for (int i = 4; i < 12; ++i) c.m["gpu0.util"][i].v = 95;  // 4 s: near miss
  EXPECT_FALSE(Has(c.Run(), "idle_phases"));
}

TEST(Diagnose, UnevenGpus) {
  Case c;
  c.Gpu(95, 0.7).Host(40);
  c.m["gpu1.util"] = Flat(40);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].title.find("GPU 1"), std::string::npos);
  EXPECT_NEAR(f[0].share_lost, 0.275, 1e-9);  // (95 - 40) / 2 GPUs
  c.m["gpu1.util"] = Flat(85);
  EXPECT_FALSE(Has(c.Run(), "uneven_ranks"));
}

// A one-GPU job on a shared eight-GPU node: the other GPUs, idle or another
// job's, say nothing about this job and are left out, with a note.
TEST(Diagnose, GpusWithoutTheJobsProcessesAreLeftOut) {
  Case c;
  c.Gpu(95, 0.7).Host(40).Wait(0.02);
  c.m["gpu0.proc_mem_used_bytes"] = Flat(20e9);
  c.m["gpu1.util"] = Flat(0);  // idle
  c.m["gpu1.proc_mem_used_bytes"] = Flat(0);
  c.m["gpu2.util"] = Flat(30);  // another job's, nearly out of memory
  c.m["gpu2.mem_total_bytes"] = Flat(80e9);
  c.m["gpu2.mem_used_bytes"] = Flat(79.5e9);
  c.m["gpu2.proc_mem_used_bytes"] = Flat(0);
  auto f = c.Run();
  ASSERT_EQ(Causes(f), std::vector<std::string>{"healthy"});
  EXPECT_NE(f[0].evidence.find("GPU utilization median 95%"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("left out: GPU 1, GPU 2"), std::string::npos) << f[0].evidence;
  // Where NVML matched none of the job's processes (a PID namespace), no GPU
  // can be told apart: all are read, and the idle ones show.
  for (const char* g : {"gpu0", "gpu1", "gpu2"})
    c.m[std::string(g) + ".proc_mem_used_bytes"] = Flat(0);
  auto g = c.Run();
  EXPECT_TRUE(Has(g, "uneven_ranks"));
  EXPECT_TRUE(Has(g, "memory_pressure"));
  EXPECT_EQ(g[0].evidence.find("left out"), std::string::npos) << g[0].evidence;
}

// A second node's first rank (rank 4) samples its host and GPUs as rank4.*:
// the rules read every node, and the evidence names the node.
TEST(Diagnose, OtherNodesGpusAndHostsAreRead) {
  Case c;
  c.Gpu(95, 0.7).Host(40);
  c.m["rank4.gpu0.util"] = Flat(40);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].title.find("GPU 0 of rank 4's node is busy far less than GPU 0"),
            std::string::npos)
      << f[0].title;
  EXPECT_NEAR(f[0].share_lost, 0.275, 1e-9);
  // The input pipeline waits while rank 4's node has its CPU saturated:
  // the CPU finding comes from that node even though rank 0's is idle.
  Case cpu;
  cpu.Host(40).Wait(0.3);
  cpu.m["rank4.host.cpu_util"] = Flat(93);
  auto g = cpu.Run();
  ASSERT_EQ(g[0].name(), "input_cpu");
  EXPECT_NE(g[0].evidence.find("host CPU median 93% on rank 4's node"), std::string::npos)
      << g[0].evidence;
  cpu.m["rank4.host.cpu_util"] = Flat(30);
  EXPECT_NE(cpu.Run()[0].name(), "input_cpu");
}

// Two ranks of a synchronous job with 1.2 s steps, each waiting `wait` of
// them for data. With communication timed, what a rank does not spend
// working it spends waiting for the other; without (a wrapped job's
// markers), only the ranks' data waits tell them apart.
Case TwoRankSteps(std::array<double, 2> work, std::array<double, 2> wait, bool comm) {
  Case c;
  c.Host(40);
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 1; i <= 50; ++i) {
      StepRecord r;
      r.rank = rank;
      r.step = i;
      r.step_s = 1.2;
      r.t = 1.2 * i;
      r.samples = 64;
      r.data_wait_s = 1.2 * wait[rank];
      if (comm) r.comm_s = 1.2 - work[rank];
      c.steps.push_back(r);
    }
  return c;
}
Case TwoRanks(double work0, double work1) {
  return TwoRankSteps({work0, work1}, {0.01 / 1.2, 0.01 / 1.2}, true);
}

TEST(Diagnose, StragglerRankFromStepRecords) {
  auto f = TwoRanks(0.9, 1.1).Run();  // rank 1 works 1.1 s, rank 0 0.9 s and waits
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].title.find("rank 1"), std::string::npos);
  EXPECT_NEAR(f[0].share_lost, 1 - 1.0 / 1.1, 1e-9);
  EXPECT_FALSE(Has(f, "communication"));                         // the wait is the straggler's
  EXPECT_FALSE(Has(TwoRanks(1.09, 1.1).Run(), "uneven_ranks"));  // 1 % apart
  EXPECT_EQ(f[0].evidence.find("of a core"),
            std::string::npos);  // no per-rank telemetry: not claimed
}

// Gradients all-reduced during backward: the fast rank waits inside its
// backward, so both ranks' step time outside communication reads the same
// (the rank-0 measurement of a straggler on the 2-core VM: 80 and 73 ms). The
// forward, which holds no communication, tells them apart.
TEST(Diagnose, StragglerFromTheForwardWhenTheWaitIsInsideBackward) {
  Case c = TwoRanks(1.0, 1.0);
  for (StepRecord& r : c.steps) r.forward_s = r.rank == 1 ? 0.34 : 0.18;
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].title.find("rank 1"), std::string::npos);
  EXPECT_NE(f[0].evidence.find("median forward 340.0 ms on rank 1 vs 180.0 ms on rank 0"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NEAR(f[0].share_lost, 1 - 0.26 / 0.34, 1e-9);
  for (StepRecord& r : c.steps) r.forward_s = r.rank == 1 ? 0.185 : 0.18;  // 3% apart
  EXPECT_FALSE(Has(c.Run(), "uneven_ranks"));
}

// Each rank's process tree is sampled (proc.*, rank1.proc.*): the straggler's
// evidence says how busy its process was against the fastest rank's.
TEST(Diagnose, StragglerEvidenceNamesEachRanksProcessCpu) {
  Case c = TwoRanks(0.9, 1.1);
  c.m["proc.cpu_util"] = Flat(190);
  c.m["rank1.proc.cpu_util"] = Flat(95);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].evidence.find("its process used 95% of a core, rank 0's 190%"), std::string::npos)
      << f[0].evidence;
}

// Two ranks on one saturated host: the straggler is whichever gets less CPU,
// so the fix is CPUs for the ranks, not a look at one rank's machine.
TEST(Diagnose, StragglerOnASharedBusyHostPointsToTheCpus) {
  Case c = TwoRanks(0.9, 1.1);
  c.Host(95);
  auto f = c.Run();
  ASSERT_EQ(f[0].name(), "uneven_ranks");
  EXPECT_NE(f[0].evidence.find("its 2 ranks share one host, host CPU median 95%"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("the ranks compete for the host's CPUs"), std::string::npos) << f[0].fix;
  // A second node that sampled its host: the ranks may not share one.
  c.m["rank1.host.cpu_util"] = Flat(95);
  auto g = c.Run();
  ASSERT_EQ(g[0].name(), "uneven_ranks");
  EXPECT_NE(g[0].fix.find("look at rank 1"), std::string::npos) << g[0].fix;
  // One host with idle cores: the ranks do not compete.
  EXPECT_NE(TwoRanks(0.9, 1.1).Run()[0].fix.find("look at rank 1"), std::string::npos);
}

// A wrapped DDP job's markers time steps without communication: every rank's
// step is as long as the slowest's, and only the straggler's data wait shows.
TEST(Diagnose, StragglerFromDataWaitWhenStepsCarryNoCommunication) {
  auto ranks = [](double wait0, double wait1) {
    Case c = TwoRankSteps({1.2, 1.2}, {wait0, wait1}, false);
    c.run.config_json = R"({"interval_s": 1})";
    return c.Run();
  };
  auto f = ranks(0.02, 0.30);
  ASSERT_TRUE(Has(f, "uneven_ranks"));
  const Finding& u =
      *std::find_if(f.begin(), f.end(), [](const Finding& x) { return x.name() == "uneven_ranks"; });
  EXPECT_NE(u.title.find("rank 1 waits for its data"), std::string::npos) << u.title;
  EXPECT_NEAR(u.share_lost, 0.28, 1e-9);
  EXPECT_NE(u.evidence.find("30% of rank 1's step time vs 2% on rank 0"), std::string::npos)
      << u.evidence;
  EXPECT_NE(u.fix.find("DistributedSampler"), std::string::npos) << u.fix;
  EXPECT_FALSE(Has(ranks(0.02, 0.09), "uneven_ranks"));  // 7 points apart
}

TEST(Diagnose, CommunicationNotHidden) {
  auto f = TwoRanks(0.9, 0.9).Run();  // equal ranks, 25 % of each step in communication
  ASSERT_EQ(f[0].name(), "communication");
  EXPECT_NEAR(f[0].share_lost, 0.25, 1e-9);
  EXPECT_FALSE(Has(TwoRanks(1.14, 1.14).Run(), "communication"));  // 5 %: near miss
}

TEST(Diagnose, PartialDataNeverFails) {
  Case empty;
  empty.run.end_time.reset();  // still running, no samples, no steps
  auto f = empty.Run();
  ASSERT_EQ(Causes(f), std::vector<std::string>{"healthy"});
  EXPECT_LT(f[0].confidence, 0.5);
  EXPECT_NE(f[0].evidence.find("still going"), std::string::npos);
  empty.run.status = "interrupted";  // no end because its recorder was killed
  auto cut = empty.Run();
  EXPECT_EQ(cut[0].evidence.find("still going"), std::string::npos) << cut[0].evidence;
  EXPECT_NE(cut[0].evidence.find("recorder killed"), std::string::npos) << cut[0].evidence;
  Case gaps;  // samples with a hole in the middle
  gaps.Gpu(95, 0.7).Host(40);
  gaps.m["gpu0.util"].erase(gaps.m["gpu0.util"].begin() + 10, gaps.m["gpu0.util"].begin() + 30);
  EXPECT_EQ(gaps.Run().back().name(), "healthy");
}

TEST(Diagnose, JsonHasTheDocumentedFields) {
  auto j = FindingsJson(Case().Host(92).Wait(0.3).Run());
  ASSERT_GE(j.size(), 1u);
  for (const char* key : {"cause", "time_lost_pct", "confidence", "evidence", "fix"})
    EXPECT_TRUE(j[0].contains(key)) << key;
  EXPECT_DOUBLE_EQ(j[0]["time_lost_pct"].get<double>(), 30.0);
}

TEST(Diagnose, EveryCauseIsDocumented) {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/diagnosis.md");
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  for (const Cause& c : fullburn::Causes())
    EXPECT_NE(doc.find(std::string("| `") + c.name + "` |"), std::string::npos)
        << c.name << ": no row in the rules table";
}

// Any mix of present and missing readings (a run cut short, a host without
// NVML, a job without step markers) reads as words, never as nan or inf.
TEST(Diagnose, MissingReadingsNeverPrintNanOrInf) {
  int checked = 0;
  for (int mask = 0; mask < 256; ++mask) {
    for (int n : {1, 60}) {
      Case c;
      if (mask & 1) c.m["gpu0.util"] = Flat(20, n);
      if (mask & 2) {
        c.m["gpu0.mem_total_bytes"] = Flat(80e9, n);
        c.m["gpu0.mem_used_bytes"] = Flat(8e9, n);
      }
      if (mask & 4) c.m["host.cpu_util"] = Flat(50, n);
      if (mask & 8) c.m["host.cpu_iowait"] = Flat(2, n);
      if (mask & 16) c.Wait(0.3);
      if (mask & 32) c.run.config_json = R"({"interval_s": 1})";  // a wrapped job
      if (mask & 64) c.m["gpu0.pcie_rx_bytes_per_s"] = Flat(20e9, n);
      if (mask & 128) c.m["proc.cpu_util"] = Flat(99, n);
      for (const Finding& f : c.Run()) {
        std::string text = f.title + " | " + f.evidence + " | " + f.fix;
        for (const char* bad : {"nan", "inf%", "-inf"})
          EXPECT_EQ(text.find(bad), std::string::npos)
              << "mask " << mask << " n " << n << ": " << text;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 512);
}

}  // namespace
}  // namespace fullburn
