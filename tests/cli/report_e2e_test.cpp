// End to end: real programs that create a bottleneck run under the real
// fullburn; the diagnosis must name it. GPU scenarios script the fake NVML
// (the hardware boundary). The HTML report is opened in a real headless
// Chromium.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/vfs.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "fullburn/pipeline.h"
#include "fullburn/store.h"
#include "process.h"
#include "scripted_host.h"

namespace fullburn {
namespace {

using testing::RunToEnd;

const std::string kLoop = std::string(SOURCE_DIR) + "/examples/scenarios/loop.py";

// The loops are real; the host they run on is scripted (ScriptedHost): the
// findings that rest on its CPU must not change with what else runs on the
// machine. By default a host with 2 CPUs 30% busy: cores to spare.
class ReportE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_report");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
    Host(0.3);
  }
  void Host(double busy, double iowait = 0) {
    host_.reset();  // first: its destructor clears the variable the new one sets
    host_ = std::make_unique<testing::ScriptedHost>(dir_, 2, busy, iowait);
  }
  void FakeGpus(const std::string& gpus_json) {
    std::string script = dir_ + "/nvml.json";
    std::ofstream(script) << R"({"gpus": )" << gpus_json << "}";
    ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
    ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  }
  testing::Outcome Record(std::vector<std::string> cmd, const std::string& interval = "0.25") {
    std::vector<std::string> argv = {FULLBURN_BIN, "run", "-q", "--interval", interval, "--store", store_, "--"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return RunToEnd(argv);
  }
  testing::Outcome Fullburn(std::vector<std::string> args) {
    args.insert(args.begin(), FULLBURN_BIN);
    args.push_back("--store");
    args.push_back(store_);
    return RunToEnd(args);
  }
  // The findings of a stored run, as `fullburn diagnose --json` gives them.
  nlohmann::json Findings(const std::string& run = "last") {
    auto o = Fullburn({"diagnose", run, "--json"});
    EXPECT_EQ(o.code, 0) << o.err;
    return nlohmann::json::parse(o.out);
  }
  std::string TopCause(const std::string& run = "last") { return Findings(run)[0]["cause"].get<std::string>(); }
  std::string dir_, store_;
  std::unique_ptr<testing::ScriptedHost> host_;
};

// --- Real bottlenecks on this machine, marked with python/fullburn_markers.py.

TEST_F(ReportE2E, SlowProducerIsInputBound) {
  auto o = Record({"python3", kLoop, "starved", "--seconds", "4"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto f = Findings();
  std::string top = f[0]["cause"];
  EXPECT_TRUE(top == "input_workers" || top == "input_cpu") << f.dump(2);
  EXPECT_GT(f[0]["time_lost_pct"].get<double>(), 50);  // 40 ms of loading per 10 ms of work
  // The markers became step records, exportable like fullburn train's.
  auto steps = Fullburn({"runs", "export", "last", "--table", "steps", "--format", "json"});
  ASSERT_EQ(steps.code, 0) << steps.err;
  auto j = nlohmann::json::parse(steps.out);
  EXPECT_GT(j.size(), 40u);
  EXPECT_EQ(j[0]["samples"], 32);
  // Most of each step is the wait (40 ms loading against 10 ms of work),
  // summed over the steps so that no single late wake-up decides it.
  double wait = 0, step = 0;
  for (const auto& s : j) {
    if (!s.contains("data_wait_s") || !s["data_wait_s"].is_number()) continue;
    wait += s["data_wait_s"].get<double>();
    step += s["step_s"].get<double>();
  }
  EXPECT_GT(wait, 0.5 * step);
}

TEST_F(ReportE2E, SlowConsumerIsHealthy) {
  auto o = Record({"python3", kLoop, "compute", "--seconds", "4"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto f = Findings();
  EXPECT_EQ(f[0]["cause"], "healthy") << f.dump(2);
  EXPECT_EQ(f.size(), 1u) << f.dump(2);  // no false alarms
}

TEST_F(ReportE2E, ABlockingSaveEveryTenStepsIsAStall) {
  // loop.py's compute loop (healthy above) with a 400 ms save inside every
  // 10th step: about 400 ms lost per 850 ms.
  auto o = Record({"python3", kLoop, "stalls", "--seconds", "5"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto f = Findings();
  EXPECT_EQ(f[0]["cause"], "step_stalls") << f.dump(2);
  EXPECT_GT(f[0]["time_lost_pct"].get<double>(), 25) << f.dump(2);
  EXPECT_NE(f[0]["evidence"].get<std::string>().find("every 10 steps"), std::string::npos)
      << f.dump(2);
}

TEST_F(ReportE2E, DiskReadsAreInputIo) {
  std::string data = dir_ + "/shard.bin";
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir_.c_str(), &fs), 0);
  if (fs.f_type == 0x01021994)  // TMPFS_MAGIC: reads never wait on a disk there
    GTEST_SKIP() << dir_ << " is on tmpfs: no storage to wait on";
  {
    std::ofstream out(data, std::ios::binary);
    std::string block(1 << 20, '\0');
    for (int i = 0; i < 256; ++i) {
      for (size_t k = 0; k < block.size(); k += 4096) block[k] = static_cast<char>(i * 31 + k);
      out << block;
    }
  }
  Host(0.1, 0.4);  // the CPUs wait on storage 40% of the time
  auto o = Record({"python3", kLoop, "disk", "--seconds", "5", "--file", data});
  ASSERT_EQ(o.code, 0) << o.err;
  auto f = Findings();
  EXPECT_EQ(f[0]["cause"], "input_io") << f.dump(2);
}

TEST_F(ReportE2E, MalformedMarkerLinesAreSkippedNotFatal) {
  std::string script = dir_ + "/bad_markers.py";
  std::ofstream(script) << "import os, time\n"
                           "f = open(os.environ['FULLBURN_EVENTS'], 'a')\n"
                           "f.write('not json\\n')\n"
                           "f.write('{\"kind\": \"step\", \"step\": 1}\\n')\n"
                           "f.write('{\"kind\": \"step\", \"step\": 1, \"time\": %f, \"step_s\": 0.5}\\n' % time.time())\n";
  std::vector<std::string> argv = {FULLBURN_BIN, "run", "--interval", "0.25", "--store", store_, "--", "python3", script};
  auto o = RunToEnd(argv);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("2 malformed step event line(s) skipped"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("line 1 of"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("not a JSON object"), std::string::npos) << o.err;
  auto steps = Fullburn({"runs", "export", "last", "--table", "steps", "--format", "json"});
  EXPECT_EQ(nlohmann::json::parse(steps.out).size(), 1u);
}

// The documented pattern, steps(loader) inside an epoch loop: every step of
// every epoch is stored, numbered on. A new Markers per epoch restarts its
// count: fullburn numbers on too, and says so.
TEST_F(ReportE2E, StepMarkersOfEveryEpochAreKept) {
  std::string script = dir_ + "/epochs.py";
  std::ofstream(script) << "import sys\n"
                           "sys.path.insert(0, '" SOURCE_DIR
                           "/python')\n"
                           "from fullburn_markers import Markers, steps\n"
                           "for epoch in range(3):\n"
                           "    m = Markers() if sys.argv[1] == 'own' else None\n"
                           "    for batch in steps([[0] * 8] * 5, markers=m, epoch=epoch):\n"
                           "        pass\n";
  for (std::string how : {"shared", "own"}) {
    std::vector<std::string> argv = {FULLBURN_BIN, "run",     "--store", store_,
                                     "--",         "python3", script,    how};
    auto o = RunToEnd(argv);
    ASSERT_EQ(o.code, 0) << o.err;
    auto steps = nlohmann::json::parse(
        Fullburn({"runs", "export", "last", "--table", "steps", "--format", "json"}).out);
    ASSERT_EQ(steps.size(), 15u) << how;
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ(steps[i]["step"], i + 1) << how;
      EXPECT_EQ(steps[i]["epoch"], i / 5) << how;
      EXPECT_EQ(steps[i]["samples"], 8) << how;
    }
    bool warned = o.err.find("step numbers started again 2 time(s)") != std::string::npos;
    EXPECT_EQ(warned, how == "own") << o.err;
  }
}

// steps(loader) records a DataLoader's settings (duck-typed: torch is not a
// test package) and the diagnosis of a starved loop names them.
TEST_F(ReportE2E, TheMarkersDescribeTheDataLoader) {
  std::string script = dir_ + "/loader.py";
  std::ofstream(script) << "import sys, time\n"
                           "sys.path.insert(0, '" SOURCE_DIR
                           "/python')\n"
                           "from fullburn_markers import steps\n"
                           "class DataLoader:  # the attributes torch's DataLoader has\n"
                           "    num_workers, pin_memory, batch_size = 0, False, 16\n"
                           "    def __iter__(self):\n"
                           "        for _ in range(40):\n"
                           "            time.sleep(0.03)  # the batch is read in this process\n"
                           "            yield [0] * 16\n"
                           "loader = DataLoader()\n"
                           "for epoch in range(2):\n"
                           "    for batch in steps(loader, epoch=epoch):\n"
                           "        time.sleep(0.003)\n";
  ASSERT_EQ(Record({"python3", script}).code, 0);
  auto f = Findings();
  ASSERT_EQ(f[0]["cause"], "input_workers") << f.dump(2);
  EXPECT_NE(
      f[0]["evidence"].get<std::string>().find("its DataLoader: num_workers=0, pin_memory=False"),
      std::string::npos)
      << f.dump(2);
  EXPECT_NE(f[0]["fix"].get<std::string>().find("DataLoader(num_workers=0 -> "), std::string::npos)
      << f.dump(2);
}

// --- GPU scenarios through the fake NVML, scripted series.

TEST_F(ReportE2E, IdleGpuWithSaturatedCpuIsInputCpu) {
  Host(0.95);
  FakeGpus(R"([{"util": [30], "mem_util": [5], "mem_used": [40000000000], "mem_total": 80000000000}])");
  ASSERT_EQ(Record({WORKLOAD_BIN, "fork", "--workers", "4", "--seconds", "3"}).code, 0);
  EXPECT_EQ(TopCause(), "input_cpu") << Findings().dump(2);
}

TEST_F(ReportE2E, BusyGpuIsHealthy) {
  FakeGpus(R"([{"util": [95], "mem_util": [5], "mem_used": [60000000000], "mem_total": 80000000000}])");
  ASSERT_EQ(Record({WORKLOAD_BIN, "burn", "--seconds", "2"}).code, 0);
  auto f = Findings();
  EXPECT_EQ(f[0]["cause"], "healthy") << f.dump(2);
  EXPECT_EQ(f.size(), 1u) << f.dump(2);
}

TEST_F(ReportE2E, MostlyFreeGpuMemoryIsHeadroom) {
  FakeGpus(R"([{"util": [95], "mem_util": [5], "mem_used": [16000000000], "mem_total": 80000000000}])");
  ASSERT_EQ(Record({WORKLOAD_BIN, "burn", "--seconds", "2"}).code, 0);
  auto f = Findings();
  EXPECT_EQ(f[0]["cause"], "memory_headroom") << f.dump(2);
  EXPECT_NE(f[0]["evidence"].get<std::string>().find("20%"), std::string::npos);
}

TEST_F(ReportE2E, PowerThrottledHalfTheRun) {
  // Sampled every 0.25 s for 3 s: about 12 samples, the first 6 power-capped.
  FakeGpus(R"([{"util": [95], "mem_util": [5], "mem_used": [60000000000], "mem_total": 80000000000,
               "throttle": [4, 4, 4, 4, 4, 4, 0]}])");
  ASSERT_EQ(Record({WORKLOAD_BIN, "burn", "--seconds", "3"}).code, 0);
  auto f = Findings();
  ASSERT_EQ(f[0]["cause"], "throttle_power") << f.dump(2);
  // The share of the stored samples that were power-capped: the sampler
  // drops ticks on a busy machine, so their count is read, not assumed.
  auto store = RunStore::Open(store_);
  ASSERT_TRUE(store.ok());
  auto run = (*store)->LoadRun("last");
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(run->samples.count("gpu0.throttle_reasons"));
  const Series& reasons = run->samples.at("gpu0.throttle_reasons");
  int capped = 0;
  for (const SeriesPoint& p : reasons) capped += (static_cast<int>(p.v) & 4) != 0;
  EXPECT_EQ(capped, 6);  // the fake's first six readings
  EXPECT_LT(static_cast<size_t>(capped), reasons.size());
  EXPECT_NEAR(f[0]["time_lost_pct"].get<double>(), 100.0 * capped / reasons.size(), 1.0);
}

TEST_F(ReportE2E, TwoUnevenGpus) {
  FakeGpus(R"([{"util": [95], "mem_util": [5], "mem_used": [60000000000], "mem_total": 80000000000},
               {"util": [40], "mem_util": [5], "mem_used": [60000000000], "mem_total": 80000000000}])");
  ASSERT_EQ(Record({WORKLOAD_BIN, "burn", "--seconds", "2"}).code, 0);
  auto f = Findings();
  ASSERT_EQ(f[0]["cause"], "uneven_ranks") << f.dump(2);
  EXPECT_NE(f[0]["title"].get<std::string>().find("GPU 1"), std::string::npos);
}

// --- The HTML report in a real browser.

struct Browser {
  std::string dom, log;
  int code = -1;
};

Browser OpenInChromium(const std::string& html, const std::string& profile, const std::string& screenshot) {
  std::vector<std::string> common = {"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                     "--disable-dev-shm-usage", "--user-data-dir=" + profile,
                                     "--enable-logging=stderr", "--v=0", "--window-size=1280,2400"};
  Browser b;
  std::vector<std::string> dump = common;
  dump.push_back("--dump-dom");
  dump.push_back("file://" + html);
  auto o = RunToEnd(dump, 90);
  b.code = o.code;
  b.dom = o.out;
  b.log = o.err;
  std::vector<std::string> shot = common;
  shot.push_back("--screenshot=" + screenshot);
  shot.push_back("file://" + html);
  auto s = RunToEnd(shot, 90);
  b.log += s.err;
  if (s.code != 0) b.code = s.code;
  return b;
}

// Share of pixels that are neither white nor near-white.
double InkShare(const std::string& png_path) {
  std::ifstream in(png_path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DecodedRegion img;
  if (bytes.empty() || !DecodePng(bytes.data(), bytes.size(), &img).ok()) return -1;
  size_t ink = 0, n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &img.rgb[i * 3];
    ink += p[0] < 230 || p[1] < 230 || p[2] < 230;
  }
  return static_cast<double>(ink) / n;
}

TEST_F(ReportE2E, HtmlReportRendersInChromium) {
  // A GPU a starved loop leaves half idle: the wait the loop measures on the
  // host is the GPU's too (a busy GPU would hide it).
  FakeGpus(
      R"([{"name": "Fake H100", "util": [0, 0, 30, 45, 55, 40, 50], "mem_util": [5], "mem_used": [30000000000],
               "mem_total": 80000000000, "power_mw": [350000, 600000], "temp": [60, 75], "sm_clock": [1980]}])");
  ASSERT_EQ(Record({"python3", kLoop, "starved", "--seconds", "3"}).code, 0);
  ASSERT_EQ(Record({"python3", kLoop, "compute", "--seconds", "3"}).code, 0);
  std::string html = dir_ + "/report.html";
  auto o = Fullburn({"report", "1", "2", "-o", html});
  ASSERT_EQ(o.code, 0) << o.err;
  std::string text = testing::ReadText(html);
  // Nothing is fetched from a network: no external scripts, styles or images.
  EXPECT_FALSE(std::regex_search(text, std::regex(R"((src|href)\s*=\s*["']?(https?:)?//)")));
  EXPECT_FALSE(std::regex_search(text, std::regex(R"(url\(\s*["']?https?:|@import)")));
  EXPECT_NE(text.find("input_workers"), std::string::npos);
  EXPECT_NE(text.find("config: command"), std::string::npos);  // the comparison table

  Browser b = OpenInChromium(html, dir_ + "/chromium-profile", dir_ + "/report.png");
  ASSERT_EQ(b.code, 0) << b.log;
  EXPECT_EQ(b.log.find(":CONSOLE"), std::string::npos) << b.log;  // no console errors or messages
  std::smatch m;
  ASSERT_TRUE(std::regex_search(b.dom, m, std::regex("data-charts-drawn=\"(\\d+)\""))) << b.dom.substr(0, 2000);
  int drawn = std::stoi(m[1]);
  EXPECT_GE(drawn, 10);  // GPU util, memory, power, temperature, clock, CPU, ..., step charts, breakdowns
  size_t plots = 0;
  for (size_t pos = 0; (pos = b.dom.find("class=\"uplot", pos)) != std::string::npos; ++pos) ++plots;
  EXPECT_EQ(plots, static_cast<size_t>(drawn));
  EXPECT_NE(b.dom.find("<canvas"), std::string::npos);
  EXPECT_NE(b.dom.find("GPU utilization (%)"), std::string::npos);
  // The evaluation each loop.py run marks at its end, as points.
  EXPECT_NE(b.dom.find("Held-out accuracy (%)"), std::string::npos);
  double ink = InkShare(dir_ + "/report.png");
  EXPECT_GT(ink, 0.02) << "the screenshot is blank";
}

// --- Bad input: clear messages, partial reports, never a crash.

TEST_F(ReportE2E, BadInputs) {
  auto unknown = Fullburn({"report", "42"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("no run 42"), std::string::npos) << unknown.err;
  EXPECT_EQ(Fullburn({"diagnose", "7", "--json"}).code, 2);
  ASSERT_EQ(Record({WORKLOAD_BIN, "exit", "--code", "0"}, "5").code, 0);  // ends before a second sample
  auto one = Fullburn({"compare", "1"});
  EXPECT_EQ(one.code, 2);
  EXPECT_NE(one.err.find("two runs or more"), std::string::npos);
  auto f = Findings("1");  // no GPU, no steps, next to no samples
  EXPECT_EQ(f[0]["cause"], "healthy");
  EXPECT_LT(f[0]["confidence"].get<double>(), 0.5);
  auto report = Fullburn({"report", "1", "-o", dir_ + "/no-such-dir/r.html"});
  EXPECT_EQ(report.code, 2);
  EXPECT_NE(report.err.find("cannot write"), std::string::npos) << report.err;

  // A run still recording: diagnosed and reported from what is there, once
  // its first samples are stored (10 s of burning leaves the checks time on
  // a busy machine).
  testing::Background live;
  testing::Start(&live, {FULLBURN_BIN, "run", "-q", "--interval", "0.2", "--store", store_, "--", WORKLOAD_BIN,
                         "burn", "--seconds", "10"},
                 "live_run");
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto store = RunStore::Open(store_);
        if (!store.ok()) return false;
        auto run = (*store)->LoadRun("2");
        return run.ok() && run->samples.count("proc.cpu_util") && run->samples.at("proc.cpu_util").size() >= 2;
      },
      30));
  auto running = Fullburn({"diagnose", "2"});
  EXPECT_EQ(running.code, 0) << running.err;
  EXPECT_NE(running.err.find("is running"), std::string::npos) << running.err;
  auto partial = Fullburn({"report", "2", "-o", dir_ + "/partial.html"});
  EXPECT_EQ(partial.code, 0) << partial.err;
  EXPECT_NE(testing::ReadText(dir_ + "/partial.html").find("no end recorded"), std::string::npos);
  EXPECT_EQ(live.Wait(30), 0);
}

// A run that changes half way: starved for 3 s, then compute-bound. The
// whole run is input-bound; its second half alone is not.
TEST_F(ReportE2E, DiagnoseAStretchOfTheRun) {
  std::string both =
      "python3 " + kLoop + " starved --seconds 3 && python3 " + kLoop + " compute --seconds 3";
  ASSERT_EQ(Record({"sh", "-c", both}).code, 0);
  auto first = Fullburn({"diagnose", "last", "--to", "3s", "--json"});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)[0]["cause"].get<std::string>().rfind("input_", 0), 0u)
      << first.out;
  auto second = Fullburn({"diagnose", "last", "--from", "4s", "--json"});
  ASSERT_EQ(second.code, 0) << second.err;
  for (const auto& f : nlohmann::json::parse(second.out))
    EXPECT_NE(f["cause"].get<std::string>().rfind("input_", 0), 0u) << second.out;
  auto last = Fullburn({"diagnose", "last", "--last", "2s"});
  ASSERT_EQ(last.code, 0) << last.err;
  EXPECT_NE(last.out.find(" to "), std::string::npos) << last.out;  // names the stretch
  // Bad stretches: one line, exit 2, before any diagnosis.
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--from", "1h"}, "past the run's end"},
           {{"--from", "4s", "--to", "2s"}, "is empty"},
           {{"--last", "2s", "--from", "1s"}, "one or the other"},
           {{"--to", "soon"}, "not a duration"}}) {
    std::vector<std::string> argv = {"diagnose", "last"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto o = Fullburn(argv);
    EXPECT_EQ(o.code, 2) << says;
    EXPECT_NE(o.err.find(says), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
}

TEST_F(ReportE2E, CompareTwoRuns) {
  ASSERT_EQ(Record({"python3", kLoop, "starved", "--seconds", "2"}).code, 0);
  ASSERT_EQ(Record({"python3", kLoop, "compute", "--seconds", "2"}).code, 0);
  auto o = Fullburn({"compare", "1", "2"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("samples/s (median)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("time lost: input_"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("config: command"), std::string::npos) << o.out;
  auto j = Fullburn({"compare", "1", "2", "--json"});
  auto runs = nlohmann::json::parse(j.out);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_GT(runs[0]["data_wait_pct"].get<double>(), 50);
  EXPECT_LT(runs[1]["data_wait_pct"].get<double>(), 10);
}

}  // namespace
}  // namespace fullburn
