// GpuSource against the fake NVML library (tests/helpers/fake_nvml.cpp), whose
// readings are scripted per call.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include "fullburn/telemetry.h"

namespace fullburn {
namespace {

class GpuSourceTest : public ::testing::Test {
 protected:
  void Script(const std::string& json) {
    path_ = ::testing::TempDir() + "/fake_nvml_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::ofstream(path_) << json;
    ::setenv("FAKE_NVML_SCRIPT", path_.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("FULLBURN_NVML_LIBRARY"); }
  std::unique_ptr<GpuSource> Open(const std::string& lib = FAKE_NVML) {
    auto r = GpuSource::Open(lib);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
  std::string path_;
};

const char* kOneGpu = R"({
  "driver": "550.54.15",
  "gpus": [{
    "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1111",
    "util": [30, 95], "mem_util": [10, 40],
    "mem_used": [21474836480], "mem_total": 85899345920,
    "power_mw": [250500], "power_limit_mw": [700000], "temp": [65],
    "sm_clock": [1755], "max_sm_clock": 1980, "throttle": [0, 68],
    "pcie_tx_kbps": [1000], "pcie_rx_kbps": [2000],
    "processes": [[{"pid": 4242, "mem": 1000000}, {"pid": 77, "mem": 5000}]]
  }]})";

TEST_F(GpuSourceTest, ConvertsUnits) {
  Script(kOneGpu);
  auto src = Open();
  ASSERT_TRUE(src && src->available());
  EXPECT_EQ(src->driver_version(), "550.54.15");
  ASSERT_EQ(src->gpus().size(), 1u);
  EXPECT_EQ(src->gpus()[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(src->gpus()[0].uuid, "GPU-1111");
  GpuSample g = src->Collect({4242}, 0.0).at(0);
  EXPECT_DOUBLE_EQ(*g.util, 30);
  EXPECT_DOUBLE_EQ(*g.mem_util, 10);
  EXPECT_DOUBLE_EQ(*g.mem_used_bytes, 21474836480.0);
  EXPECT_DOUBLE_EQ(*g.mem_total_bytes, 85899345920.0);
  EXPECT_DOUBLE_EQ(*g.power_w, 250.5);  // from mW
  EXPECT_DOUBLE_EQ(*g.power_limit_w, 700.0);
  EXPECT_DOUBLE_EQ(*g.temp_c, 65);
  EXPECT_DOUBLE_EQ(*g.sm_clock_mhz, 1755);
  EXPECT_DOUBLE_EQ(*g.max_sm_clock_mhz, 1980);
  EXPECT_DOUBLE_EQ(*g.throttle_reasons, 0);
  // Only the monitored tree's processes count.
  EXPECT_DOUBLE_EQ(*g.proc_mem_used_bytes, 1000000.0);
  ASSERT_EQ(g.processes.size(), 2u);
  EXPECT_FALSE(g.sm_active.has_value());  // no GPM on this fake GPU
  // Second call: the script's next values.
  g = src->Collect({}, 1.0).at(0);
  EXPECT_DOUBLE_EQ(*g.util, 95);
  EXPECT_DOUBLE_EQ(*g.throttle_reasons, 68);  // 0x44
  EXPECT_EQ(DecodeThrottleReasons(68),
            (std::vector<std::string>{"sw_power_cap", "hw_thermal_slowdown"}));
  EXPECT_FALSE(g.proc_mem_used_bytes.has_value());  // no tree given
}

TEST_F(GpuSourceTest, PcieFromKilobytesPerSecond) {
  Script(kOneGpu);
  auto src = Open();
  ASSERT_TRUE(src);
  // PCIe readings come from their own thread; wait for the first.
  GpuSample g;
  for (int i = 0; i < 200 && !g.pcie_tx_bytes_per_s; ++i) {
    g = src->Collect({}, 0.0).at(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(g.pcie_tx_bytes_per_s.has_value());
  EXPECT_DOUBLE_EQ(*g.pcie_tx_bytes_per_s, 1000.0 * 1024);
  EXPECT_DOUBLE_EQ(*g.pcie_rx_bytes_per_s, 2000.0 * 1024);
}

TEST_F(GpuSourceTest, ErrorReturnsLeaveOnlyThatMetricAbsent) {
  Script(R"({"gpus": [{"util": [50], "mem_util": [5], "mem_used": [1], "mem_total": 2,
    "power_mw": [100000], "temp": [40], "errors": {"power_mw": 3, "temp": 999}}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  GpuSample g = src->Collect({}, 0).at(0);
  EXPECT_FALSE(g.power_w.has_value());
  EXPECT_FALSE(g.temp_c.has_value());
  EXPECT_FALSE(g.sm_clock_mhz.has_value());  // not scripted: not supported
  EXPECT_FALSE(g.throttle_reasons.has_value());
  EXPECT_DOUBLE_EQ(*g.util, 50);
  EXPECT_DOUBLE_EQ(*g.mem_used_bytes, 1);
}

TEST_F(GpuSourceTest, SeveralGpus) {
  Script(R"({"gpus": [
    {"name": "A", "uuid": "GPU-a", "util": [95], "mem_util": [1], "power_mw": [300000]},
    {"name": "B", "uuid": "GPU-b", "util": [40], "mem_util": [2], "power_mw": [150000]}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  ASSERT_EQ(src->gpus().size(), 2u);
  auto gs = src->Collect({}, 0);
  ASSERT_EQ(gs.size(), 2u);
  EXPECT_EQ(gs[0].index, 0);
  EXPECT_EQ(gs[1].index, 1);
  EXPECT_DOUBLE_EQ(*gs[0].util, 95);
  EXPECT_DOUBLE_EQ(*gs[1].util, 40);
  EXPECT_DOUBLE_EQ(*gs[1].power_w, 150);
  Snapshot s;
  s.gpus = gs;
  auto flat = Flatten(s);
  std::map<std::string, double> m(flat.begin(), flat.end());
  EXPECT_DOUBLE_EQ(m.at("gpu1.util"), 40);
  EXPECT_DOUBLE_EQ(m.at("gpu0.power_w"), 300);
}

TEST_F(GpuSourceTest, GpmActivityNeedsTwoSamplesAtLeast100msApart) {
  Script(R"({"gpus": [{"util": [99], "mem_util": [1], "gpm": true,
    "sm_active": [81.5, 70], "tensor_active": [42.25, 30],
    "gpm_pcie_tx_mibps": [10], "gpm_pcie_rx_mibps": [20]}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  GpuSample g = src->Collect({}, 10.0).at(0);
  EXPECT_FALSE(g.sm_active.has_value());  // first GPM sample: no window yet
  g = src->Collect({}, 10.05).at(0);
  EXPECT_FALSE(g.sm_active.has_value());  // 50 ms later: too soon
  g = src->Collect({}, 10.2).at(0);
  ASSERT_TRUE(g.sm_active.has_value());
  EXPECT_DOUBLE_EQ(*g.sm_active, 81.5);
  EXPECT_DOUBLE_EQ(*g.tensor_active, 42.25);
  EXPECT_DOUBLE_EQ(*g.pcie_tx_bytes_per_s, 10.0 * 1024 * 1024);  // GPM: MiB/s
  EXPECT_DOUBLE_EQ(*g.pcie_rx_bytes_per_s, 20.0 * 1024 * 1024);
}

TEST_F(GpuSourceTest, EveryGpmReadingWithItsOwnValidFlag) {
  Script(R"({"gpus": [{"util": [99], "mem_util": [1], "gpm": true,
    "sm_active": [90], "tensor_active": [55], "sm_occupancy": [33.5],
    "tensor_hmma_active": [50], "tensor_imma_active": [4], "tensor_dfma_active": [1],
    "fp16_active": [2], "fp32_active": [12.5], "fp64_active": [0.5], "dram_active": [61],
    "errors": {"tensor_imma_active": 3}}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  EXPECT_EQ(src->gpus().at(0).no_gpm, "");
  src->Collect({}, 1.0);
  GpuSample g = src->Collect({}, 1.2).at(0);
  EXPECT_EQ(g.sm_occupancy, 33.5);
  EXPECT_EQ(g.tensor_hmma_active, 50);
  EXPECT_EQ(g.tensor_dfma_active, 1);
  EXPECT_EQ(g.fp16_active, 2);
  EXPECT_EQ(g.fp32_active, 12.5);
  EXPECT_EQ(g.fp64_active, 0.5);
  EXPECT_EQ(g.dram_active, 61);
  // Scripted as refused by the driver: that one reading is absent, not 0.
  EXPECT_FALSE(g.tensor_imma_active.has_value());
  Snapshot s;
  s.gpus = {g};
  auto flat = Flatten(s);
  std::map<std::string, double> m(flat.begin(), flat.end());
  EXPECT_DOUBLE_EQ(m.at("gpu0.dram_active"), 61);
  EXPECT_EQ(m.count("gpu0.tensor_imma_active"), 0u);
}

TEST_F(GpuSourceTest, GpmOnAMigGpuReadsItsGpuInstance) {
  Script(R"({"gpus": [{"util": [99], "mem_util": [1], "gpm": true, "mig_instance": 3,
    "sm_active": [70], "tensor_active": [20]}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  EXPECT_EQ(src->gpus().at(0).no_gpm, "");
  src->Collect({}, 1.0);
  GpuSample g = src->Collect({}, 1.2).at(0);
  EXPECT_EQ(g.sm_active, 70);  // through nvmlGpmMigSampleGet: the whole GPU's is refused
  EXPECT_EQ(g.tensor_active, 20);
}

TEST_F(GpuSourceTest, WhyThereIsNoGpmIsSaidPerGpu) {
  Script(R"({"gpus": [{"util": [50], "mem_util": [1]},
                      {"util": [50], "mem_util": [1], "gpm": true, "errors": {"gpm_sample": 15}}]})");
  auto src = Open();
  ASSERT_TRUE(src);
  EXPECT_NE(src->gpus().at(0).no_gpm.find("not supported on this GPU"), std::string::npos)
      << src->gpus().at(0).no_gpm;
  EXPECT_NE(src->gpus().at(1).no_gpm.find("refused a GPM sample"), std::string::npos)
      << src->gpus().at(1).no_gpm;
  src->Collect({}, 1.0);
  GpuSample g = src->Collect({}, 1.2).at(1);
  EXPECT_FALSE(g.sm_active.has_value());
  EXPECT_EQ(g.util, 50);  // the rest of the GPU's readings go on
  auto old = Open(FAKE_NVML_OLD);  // a library without GPM's symbols
  ASSERT_TRUE(old);
  EXPECT_NE(old->gpus().at(0).no_gpm.find("no GPM"), std::string::npos) << old->gpus().at(0).no_gpm;
}

TEST_F(GpuSourceTest, OldSymbolNamesStillWork) {
  Script(kOneGpu);
  auto src = Open(FAKE_NVML_OLD);
  ASSERT_TRUE(src && src->available());
  GpuSample g = src->Collect({4242}, 0).at(0);
  EXPECT_DOUBLE_EQ(*g.util, 30);
  EXPECT_DOUBLE_EQ(*g.throttle_reasons, 0);               // ...ClocksThrottleReasons
  EXPECT_DOUBLE_EQ(*g.proc_mem_used_bytes, 1000000.0);    // v1 process struct
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  g = src->Collect({}, 1).at(0);
  EXPECT_FALSE(g.pcie_tx_bytes_per_s.has_value());        // symbol missing
}

TEST_F(GpuSourceTest, ManyProcessesGrowTheBuffer) {
  std::string procs;
  for (int i = 0; i < 100; ++i) procs += (i ? "," : "") + std::string("{\"pid\": ") + std::to_string(1000 + i) + ", \"mem\": 10}";
  Script(R"({"gpus": [{"util": [1], "mem_util": [1], "processes": [[)" + procs + "]]}]}");
  auto src = Open();
  ASSERT_TRUE(src);
  GpuSample g = src->Collect({1000, 1099}, 0).at(0);
  EXPECT_EQ(g.processes.size(), 100u);
  EXPECT_DOUBLE_EQ(*g.proc_mem_used_bytes, 20);
}

TEST_F(GpuSourceTest, ExplicitLibraryMissingSymbolsIsAnError) {
  Script(kOneGpu);
  auto r = GpuSource::Open(FAKE_NVML_BROKEN);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lacks nvmlInit, nvmlDeviceGetCount"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("FULLBURN_NVML_LIBRARY"), std::string::npos);
}

TEST_F(GpuSourceTest, ExplicitLibraryNotFoundIsAnError) {
  auto r = GpuSource::Open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot load NVML library /nonexistent"), std::string::npos);
}

TEST_F(GpuSourceTest, EnvironmentVariableNamesTheLibrary) {
  Script(kOneGpu);
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  auto r = GpuSource::Open();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->available());
  EXPECT_EQ((*r)->library_path(), FAKE_NVML);
}

TEST_F(GpuSourceTest, FailingInitMakesGpusUnavailableNotAnError) {
  Script(R"({"init_return": 9, "gpus": []})");
  auto r = GpuSource::Open(FAKE_NVML);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->available());
  EXPECT_NE((*r)->unavailable_reason().find("nvmlInit failed"), std::string::npos);
  EXPECT_TRUE((*r)->Collect({}, 0).empty());
}

TEST_F(GpuSourceTest, NoGpus) {
  Script(R"({"gpus": []})");
  auto r = GpuSource::Open(FAKE_NVML);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->available());
  EXPECT_EQ((*r)->unavailable_reason(), "NVML found no NVIDIA GPU");
}

// The states a cluster's view counts by: held (a process listed), held and
// idle (under 5%), throttled (a slowdown reason), each call's own.
TEST_F(GpuSourceTest, HeldIdleAndThrottledFollowTheReadings) {
  Script(R"({"gpus": [{
    "util": [0, 4, 5, 0], "mem_util": [0], "mem_used": [1073741824], "mem_total": 4294967296,
    "throttle": [0, 4, 1, 64],
    "processes": [[{"pid": 4242, "mem": 1073741824}], [{"pid": 4242, "mem": 1}],
                  [{"pid": 4242, "mem": 1}], []]}]})");
  auto src = Open();
  ASSERT_TRUE(src && src->available());
  struct Want {
    double held, held_idle, throttled;
  } want[] = {{1, 1, 0}, {1, 1, 1}, {1, 0, 0}, {0, 0, 1}};  // 0x4 power cap, 0x1 idle, 0x40 thermal
  for (int call = 0; call < 4; ++call) {
    GpuSample g = src->Collect({}, call).at(0);
    ASSERT_TRUE(g.held && g.held_idle && g.throttled) << call;
    EXPECT_EQ(*g.held, want[call].held) << call;
    EXPECT_EQ(*g.held_idle, want[call].held_idle) << call;
    EXPECT_EQ(*g.throttled, want[call].throttled) << call;
  }
  // Unknown inputs leave them absent: no process list, no utilization.
  Script(R"({"gpus": [{"util": [0], "mem_util": [0], "errors": {"processes": 999, "util": 999}}]})");
  src = Open();
  GpuSample g = src->Collect({}, 0).at(0);
  EXPECT_FALSE(g.held.has_value());
  EXPECT_FALSE(g.held_idle.has_value());
  EXPECT_FALSE(g.throttled.has_value());
}

// NVML lists host PIDs. When none of them is a process in this PID
// namespace (a recorder in a container), the tree's share is unknown, not 0.
TEST_F(GpuSourceTest, TreeMemoryIsAbsentWhenNoListedPidIsAProcessHere) {
  // Above the kernel's largest pid (4194304): never a process.
  Script(R"({"gpus": [{"util": [50], "mem_util": [0],
    "processes": [[{"pid": 999999001, "mem": 1000}, {"pid": 999999002, "mem": 2000}]]}]})");
  auto src = Open();
  ASSERT_TRUE(src && src->available());
  SamplerOptions options;
  options.root_pid = static_cast<int>(::getpid());
  Sampler sampler(Env::Default(), src.get(), options);
  Snapshot s = sampler.SampleOnce();
  ASSERT_EQ(s.gpus.size(), 1u);
  EXPECT_FALSE(s.gpus[0].proc_mem_used_bytes.has_value());
  // A listed pid that is a process here (init) but not the tree's: a true 0.
  Script(R"({"gpus": [{"util": [50], "mem_util": [0], "processes": [[{"pid": 1, "mem": 1000}]]}]})");
  src = Open();
  Sampler again(Env::Default(), src.get(), options);
  s = again.SampleOnce();
  ASSERT_TRUE(s.gpus[0].proc_mem_used_bytes.has_value());
  EXPECT_EQ(*s.gpus[0].proc_mem_used_bytes, 0);
}

}  // namespace
}  // namespace fullburn
