#include <gtest/gtest.h>

#include <map>
#include <set>

#include "fullburn/telemetry.h"

namespace fullburn {
namespace {

TEST(Metrics, NamesRoundTripThroughTheCatalog) {
  std::set<std::string> names;
  for (int rank : {0, 12}) {
    for (const MetricDef& d : MetricCatalog()) {
      std::string name = MetricName(d, 3, rank);
      EXPECT_TRUE(names.insert(name).second) << "duplicate " << name;
      int index = -1, found_rank = -1;
      const MetricDef* found = FindMetric(name, &index, &found_rank);
      ASSERT_EQ(found, &d) << name;
      EXPECT_EQ(found_rank, rank) << name;
      if (d.scope == MetricScope::kGpu || d.scope == MetricScope::kCore) {
        EXPECT_EQ(index, 3) << name;
      }
    }
  }
  EXPECT_EQ(MetricName(*FindMetric("gpu0.util"), 1, 4), "rank4.gpu1.util");
  EXPECT_EQ(FindMetric("rank4gpu1.util"), nullptr);
  EXPECT_EQ(FindMetric("rank4.gpu.util"), nullptr);
  EXPECT_EQ(FindMetric("rank4.rank2.proc.cpu_util"), nullptr);
  EXPECT_EQ(FindMetric("gpu.util"), nullptr);
  EXPECT_EQ(FindMetric("gpux.util"), nullptr);
  EXPECT_EQ(FindMetric("nonsense"), nullptr);
  EXPECT_EQ(FindMetric("rank0.proc.cpu_util"), nullptr);  // rank 0 is proc.*
  EXPECT_EQ(FindMetric("rank.proc.cpu_util"), nullptr);
  int index = -1;
  ASSERT_NE(FindMetric("proc.cpu_util", &index), nullptr);
  EXPECT_EQ(index, 0);
}

// A data-parallel rank after 0 samples only its own process tree: no host
// readings that would double rank 0's, and its names carry the rank.
TEST(Metrics, RanksAfterZeroStoreOnlyTheirProcessTree) {
  Snapshot s;
  s.rank = 2;
  ProcTreeSample p;
  p.cpu_util = 180.0;
  p.rss_bytes = 1e9;
  s.proc = p;
  auto flat = Flatten(s);
  std::map<std::string, double> m(flat.begin(), flat.end());
  EXPECT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m.at("rank2.proc.cpu_util"), 180.0);
  EXPECT_DOUBLE_EQ(m.at("rank2.proc.rss_bytes"), 1e9);
}

// The first rank on another node samples that node's host and GPUs: every
// name carries its rank, so nothing collides with rank 0's node.
TEST(Metrics, AnotherNodesHostAndGpusCarryTheRankThatSampledThem) {
  Snapshot s;
  s.rank = 4;
  s.host.cpu.util = 75.0;
  s.host.cores.resize(2);
  s.host.cores[1].iowait = 3.0;
  s.host.mem_used_bytes = 2e9;
  GpuSample g;
  g.index = 1;
  g.util = 40.0;
  s.gpus.push_back(g);
  auto flat = Flatten(s);
  std::map<std::string, double> m(flat.begin(), flat.end());
  EXPECT_EQ(m.size(), 4u);
  EXPECT_DOUBLE_EQ(m.at("rank4.host.cpu_util"), 75.0);
  EXPECT_DOUBLE_EQ(m.at("rank4.host.cpu1.iowait"), 3.0);
  EXPECT_DOUBLE_EQ(m.at("rank4.host.mem_used_bytes"), 2e9);
  EXPECT_DOUBLE_EQ(m.at("rank4.gpu1.util"), 40.0);
}

TEST(Metrics, IssueNamesExist) {
  for (const char* n : {"gpu0.util",
                        "gpu0.mem_util",
                        "gpu0.mem_used_bytes",
                        "gpu0.mem_total_bytes",
                        "gpu0.power_w",
                        "gpu0.power_limit_w",
                        "gpu0.temp_c",
                        "gpu0.sm_clock_mhz",
                        "gpu0.throttle_reasons",
                        "gpu0.pcie_tx_bytes_per_s",
                        "gpu0.pcie_rx_bytes_per_s",
                        "host.cpu_util",
                        "host.mem_used_bytes",
                        "host.swap_in_per_s",
                        "host.disk_read_bytes_per_s",
                        "host.net_rx_bytes_per_s",
                        "proc.cpu_util",
                        "proc.rss_bytes",
                        "proc.threads",
                        "proc.processes",
                        "host.cpu1.iowait"})
    EXPECT_NE(FindMetric(n), nullptr) << n;
}

TEST(Metrics, FlattenSkipsAbsentValues) {
  Snapshot s;
  s.host.cpu.util = 12.5;
  s.host.cores.push_back(CpuShare{50.0, {}, {}, {}, {}});
  GpuSample g;
  g.index = 1;
  g.util = 0.0;  // a real zero is kept
  s.gpus.push_back(g);
  auto flat = Flatten(s);
  std::map<std::string, double> m(flat.begin(), flat.end());
  EXPECT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m.at("host.cpu_util"), 12.5);
  EXPECT_DOUBLE_EQ(m.at("host.cpu0.util"), 50.0);
  EXPECT_DOUBLE_EQ(m.at("gpu1.util"), 0.0);
  EXPECT_FALSE(m.count("proc.cpu_util"));
}

TEST(Metrics, ThrottleReasonsDecode) {
  EXPECT_EQ(DecodeThrottleReasons(0x4 | 0x40),
            (std::vector<std::string>{"sw_power_cap", "hw_thermal_slowdown"}));
  EXPECT_TRUE(DecodeThrottleReasons(0).empty());
  EXPECT_EQ(DecodeThrottleReasons(0x10000), (std::vector<std::string>{"other"}));
  EXPECT_FALSE(IsThrottled(0x1));  // idle is not throttling
  EXPECT_FALSE(IsThrottled(0x2));
  EXPECT_TRUE(IsThrottled(0x8));
  EXPECT_TRUE(IsPowerThrottled(0x80));
  EXPECT_FALSE(IsPowerThrottled(0x20));
  EXPECT_TRUE(IsThermalThrottled(0x20));
}

}  // namespace
}  // namespace fullburn
