// Each rule on synthetic series: a case that triggers it and a near miss that must not.
#include <gtest/gtest.h>

#include "fullburn/diagnose.h"

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
      r.step_s = 0.1;
      r.data_wait_s = 0.1 * share;
      r.forward_s = 0.1 * (1 - share);
      steps.push_back(r);
    }
    return *this;
  }
  std::vector<Finding> Run() { return Diagnose(run, m, steps); }
};

std::vector<std::string> Causes(const std::vector<Finding>& f) {
  std::vector<std::string> out;
  for (const Finding& x : f) out.push_back(x.cause);
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
}

TEST(Diagnose, InputCpuFromMeasuredDataWait) {
  auto f = Case().Host(92).Wait(0.3).Run();
  ASSERT_EQ(f[0].cause, "input_cpu");
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  EXPECT_NE(f[0].evidence.find("30%"), std::string::npos);
  EXPECT_EQ(Causes(Case().Host(92).Wait(0.08).Run()), std::vector<std::string>{"healthy"});  // near miss
  Case fixed;  // a fixed worker count on a 16-core host: the fix names the knob
  fixed.run.config_json = R"({"data": {"threads": 4}})";
  for (int c = 0; c < 16; ++c) fixed.m["host.cpu" + std::to_string(c) + ".util"] = Flat(90);
  EXPECT_NE(fixed.Host(92).Wait(0.3).Run()[0].fix.find("data.threads 4 -> 15"), std::string::npos);
}

TEST(Diagnose, InputCpuInferredWithoutStepsFromAnIdleGpu) {
  auto f = Case().Gpu(30, 0.7).Host(95).Run();
  ASSERT_EQ(f[0].cause, "input_cpu");
  EXPECT_NEAR(f[0].share_lost, 0.7, 1e-9);
  EXPECT_LT(f[0].confidence, 0.9);  // inferred, not measured
  EXPECT_FALSE(Has(Case().Gpu(55, 0.7).Host(95).Run(), "input_cpu"));
}

TEST(Diagnose, InputIoWhenTheCpuWaitsOnStorage) {
  auto f = Case().Host(30, 25).Wait(0.4).Run();
  EXPECT_EQ(f[0].cause, "input_io");
  EXPECT_FALSE(Has(Case().Host(30, 8).Wait(0.4).Run(), "input_io"));
}

TEST(Diagnose, TooFewWorkersWhenCoresIdle) {
  auto f = Case().Host(40, 2).Wait(0.25).Run();
  EXPECT_EQ(f[0].cause, "input_workers");
  EXPECT_NE(f[0].fix.find("data.threads"), std::string::npos);
}

TEST(Diagnose, SmallBatchAndHeadroom) {
  auto f = Case().Gpu(30, 0.2).Host(30).Run();
  EXPECT_EQ(f[0].cause, "small_batch");
  EXPECT_TRUE(Has(f, "memory_headroom"));
  auto near = Case().Gpu(30, 0.55).Host(30).Run();
  EXPECT_FALSE(Has(near, "small_batch"));
  EXPECT_FALSE(Has(near, "memory_headroom"));
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

TEST(Diagnose, PowerAndThermalThrottlingAsTimeLost) {
  Case c;
  c.Gpu(95, 0.7).Host(30);
  c.m["gpu0.throttle_reasons"] = Mix(0.3, 0x4, 0);
  auto f = c.Run();
  ASSERT_EQ(f[0].cause, "throttle_power");
  EXPECT_NEAR(f[0].share_lost, 0.3, 1e-9);
  c.m["gpu0.throttle_reasons"] = Mix(0.2, 0x20, 0);
  EXPECT_EQ(c.Run()[0].cause, "throttle_thermal");
  c.m["gpu0.throttle_reasons"] = Mix(0.03, 0x24, 0);
  EXPECT_EQ(Causes(c.Run()), std::vector<std::string>{"healthy"});
}

TEST(Diagnose, SortedByTimeLostAndRendered) {
  Case c;
  c.Host(95).Wait(0.2).Gpu(90, 0.7);
  c.m["gpu0.throttle_reasons"] = Mix(0.4, 0x80, 0);
  auto f = c.Run();
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[0].cause, "throttle_power");
  EXPECT_EQ(f[1].cause, "input_cpu");
  std::string text = RenderFindings(f);
  EXPECT_NE(text.find("[throttle_power]"), std::string::npos);
  EXPECT_NE(text.find("fix:"), std::string::npos);
  EXPECT_EQ(FindingsJson(f)[1]["cause"], "input_cpu");
}

}  // namespace
}  // namespace fullburn
