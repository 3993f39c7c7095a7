// Host metrics parsed from /proc recordings made on the dev machine
// (tests/telemetry/fixtures/t0 and t1, one second apart, recorded with
// record_proc.sh while two `yes` processes and a 200 MB dd ran).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "fullburn/telemetry.h"
#include "replay_env.h"

namespace fullburn {
namespace {

using testing::ReadText;
using testing::ReplayEnv;
const std::string kT0 = testing::Recording(0);
const std::string kT1 = testing::Recording(1);

// Reads `first`, then `second` `dt` seconds later, and returns the second sample.
HostSample TwoReadings(ReplayEnv* env, const std::string& first, const std::string& second,
                       double dt) {
  HostCollector c(env);
  HostSample a, b;
  env->SetRoot(first);
  env->SetTime(0);
  c.Collect(&a);
  env->SetRoot(second);
  env->SetTime(dt);
  c.Collect(&b);
  return b;
}

// Sum of the /proc/stat "cpu" line's fields, parsed here independently.
std::vector<uint64_t> CpuFields(const std::string& root, const std::string& label) {
  std::istringstream in(ReadText(root + "/proc/stat"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string name;
    f >> name;
    if (name != label) continue;
    std::vector<uint64_t> v;
    uint64_t x;
    while (f >> x) v.push_back(x);
    return v;
  }
  return {};
}

TEST(HostCollector, FirstSampleHasNoRates) {
  ReplayEnv env(kT0);
  HostCollector c(&env);
  HostSample s;
  c.Collect(&s);
  EXPECT_FALSE(s.cpu.util.has_value());
  EXPECT_FALSE(s.disk_read_bytes_per_s.has_value());
  EXPECT_FALSE(s.net_rx_bytes_per_s.has_value());
  EXPECT_TRUE(s.cores.empty());
  // Levels need one reading only.
  ASSERT_TRUE(s.mem_total_bytes.has_value());
  EXPECT_DOUBLE_EQ(*s.mem_total_bytes, 24684092.0 * 1024);
  ASSERT_TRUE(s.load1.has_value());
}

TEST(HostCollector, CpuSharesFromTwoRecordings) {
  ReplayEnv env(kT0);
  HostSample s = TwoReadings(&env, kT0, kT1, 1.0);
  std::vector<uint64_t> a = CpuFields(kT0, "cpu"), b = CpuFields(kT1, "cpu");
  ASSERT_GE(a.size(), 8u);
  auto d = [&](size_t i) { return static_cast<double>(b[i] - a[i]); };
  double user = d(0) + d(1), system = d(2) + d(5) + d(6), idle = d(3), iowait = d(4), steal = d(7);
  double total = user + system + idle + iowait + steal;
  ASSERT_TRUE(s.cpu.util.has_value());
  EXPECT_NEAR(*s.cpu.util, 100.0 * (user + system + steal) / total, 1e-9);
  EXPECT_NEAR(*s.cpu.user, 100.0 * user / total, 1e-9);
  EXPECT_NEAR(*s.cpu.system, 100.0 * system / total, 1e-9);
  EXPECT_NEAR(*s.cpu.iowait, 100.0 * iowait / total, 1e-9);
  EXPECT_NEAR(*s.cpu.steal, 100.0 * steal / total, 1e-9);
  // The recording was made with both cores busy.
  EXPECT_GT(*s.cpu.util, 95.0);
  ASSERT_EQ(s.cores.size(), 2u);
  for (const CpuShare& core : s.cores) EXPECT_GT(*core.util, 95.0);
}

TEST(HostCollector, DiskCountsWholeDisksOnly) {
  ReplayEnv env(kT0);
  HostSample s = TwoReadings(&env, kT0, kT1, 2.0);
  // vda: sectors read 3813098 -> 3813378, written 2834072 -> 2834072; loop*
  // and zram0 are not counted; over 2 s.
  ASSERT_TRUE(s.disk_read_bytes_per_s.has_value());
  EXPECT_DOUBLE_EQ(*s.disk_read_bytes_per_s, (3813378.0 - 3813098.0) * 512 / 2.0);
  EXPECT_DOUBLE_EQ(*s.disk_write_bytes_per_s, 0.0);
  ASSERT_TRUE(s.net_rx_bytes_per_s.has_value());
  ASSERT_TRUE(s.swap_in_per_s.has_value());
  EXPECT_DOUBLE_EQ(*s.swap_in_per_s, 0.0);
}

// Copies a recording and edits counters, to test rates the recording did not move.
TEST(HostCollector, SwapAndNetworkRates) {
  namespace fs = std::filesystem;
  std::string dir = testing::FreshTestDir("fb_host");
  fs::copy(kT1, dir + "/t2", fs::copy_options::recursive);
  auto replace = [](const std::string& path, const std::string& from, const std::string& to) {
    std::string text = ReadText(path);
    size_t pos = text.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    text.replace(pos, from.size(), to);
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  replace(dir + "/t2/proc/vmstat", "pswpin 0", "pswpin 500");
  replace(dir + "/t2/proc/vmstat", "pswpout 0", "pswpout 250");
  replace(dir + "/t2/proc/net/dev", "eth0: 52800307", "eth0: 53800307");
  // lo traffic must not count.
  replace(dir + "/t2/proc/net/dev", "lo:    3267", "lo: 9993267");
  ReplayEnv env(kT1);
  HostSample s = TwoReadings(&env, kT1, dir + "/t2", 0.5);
  EXPECT_DOUBLE_EQ(*s.swap_in_per_s, 1000.0);
  EXPECT_DOUBLE_EQ(*s.swap_out_per_s, 500.0);
  EXPECT_DOUBLE_EQ(*s.net_rx_bytes_per_s, 2000000.0);
  EXPECT_DOUBLE_EQ(*s.net_tx_bytes_per_s, 0.0);
}

TEST(HostCollector, UnreadableFilesLeaveMetricsAbsent) {
  ReplayEnv env(kT0);
  env.FailPath("/proc/meminfo");
  env.FailPath("/proc/diskstats");
  HostSample s = TwoReadings(&env, kT0, kT1, 1.0);
  EXPECT_FALSE(s.mem_total_bytes.has_value());
  EXPECT_FALSE(s.mem_used_bytes.has_value());
  EXPECT_FALSE(s.disk_read_bytes_per_s.has_value());
  EXPECT_TRUE(s.cpu.util.has_value());  // the rest carries on
  EXPECT_TRUE(s.load1.has_value());
}

// A container limited to 2.5 CPUs (cgroup v2, the quota on its parent):
// the quota every sample, the throttled share of CFS periods from the second.
TEST(HostCollector, ContainerQuotaAndThrottling) {
  std::string dir =
      std::filesystem::temp_directory_path() / ("fullburn-quota-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto write = [&](const std::string& root, const std::string& path, const std::string& text) {
    std::filesystem::path p = root + path;
    std::filesystem::create_directories(p.parent_path());
    std::FILE* f = std::fopen(p.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  for (const char* t : {"/a", "/b"}) {
    write(dir + t, "/proc/self/cgroup", "0::/kubepods/pod7/ctr\n");
    write(dir + t, "/sys/fs/cgroup/kubepods/pod7/cpu.max", "250000 100000\n");
  }
  write(dir + "/a", "/sys/fs/cgroup/kubepods/pod7/cpu.stat",
        "usage_usec 1000\nnr_periods 100\nnr_throttled 10\nthrottled_usec 5\n");
  write(dir + "/b", "/sys/fs/cgroup/kubepods/pod7/cpu.stat",
        "usage_usec 9000\nnr_periods 140\nnr_throttled 40\nthrottled_usec 90\n");
  ReplayEnv env(dir + "/a");
  HostCollector c(&env);
  HostSample first;
  c.Collect(&first);
  ASSERT_TRUE(first.cpu_quota.has_value());
  EXPECT_DOUBLE_EQ(*first.cpu_quota, 2.5);
  EXPECT_FALSE(first.cpu_throttled.has_value());  // a share needs two readings
  HostSample b = TwoReadings(&env, dir + "/a", dir + "/b", 1.0);
  ASSERT_TRUE(b.cpu_throttled.has_value());
  EXPECT_DOUBLE_EQ(*b.cpu_throttled, 75.0);  // 30 of 40 periods
  // No quota (the host, or a pod without a limit): both absent, not 0.
  ReplayEnv host(kT0);
  HostSample none = TwoReadings(&host, kT0, kT1, 1.0);
  EXPECT_FALSE(none.cpu_quota.has_value());
  EXPECT_FALSE(none.cpu_throttled.has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fullburn
