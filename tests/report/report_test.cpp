#include <gtest/gtest.h>

#include "fullburn/report.h"

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
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-x\\\"y\",modelName=\"NVIDIA H100\","
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
