// End to end: the real fullburn binary records real programs into a real
// SQLite store. Only NVML is faked (tests/helpers/fake_nvml.cpp).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fullburn/env.h"
#include "fullburn/report.h"
#include "fullburn/store.h"
#include "process.h"
#include "scripted_host.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;
using testing::Background;
using testing::ReadText;
using testing::RunToEnd;

class RunE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_e2e");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
  }
  std::vector<std::string> Run(std::vector<std::string> cmd, const std::string& interval = "0.2") {
    std::vector<std::string> argv = {FULLBURN_BIN, "run", "--interval", interval, "--store", store_, "--"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
  }
  std::map<std::string, Series> Samples(const std::string& run = "last") {
    auto store = RunStore::Open(store_);
    EXPECT_TRUE(store.ok());
    auto info = (*store)->GetRun(run);
    EXPECT_TRUE(info.ok()) << info.status().message();
    return *(*store)->LoadSamples(info->id);
  }
  // Whether the workload's signal mode said "ready" (its handlers are in).
  static bool Ready(const Background& b) {
    return testing::WaitFor([&] { return b.Out().find("ready") != std::string::npos; }, 60);
  }
  // The last run's stored readings of `metric` so far, and its start time
  // (none yet: empty, 0): for waiting on a run that is still being recorded.
  std::pair<Series, double> StoredSoFar(const std::string& metric) {
    auto store = RunStore::Open(store_);
    if (!store.ok()) return {};
    auto info = (*store)->GetRun("last");
    if (!info.ok()) return {};
    auto samples = (*store)->LoadSamples(info->id);
    if (!samples.ok() || !samples->count(metric)) return {{}, info->start_time};
    return {samples->at(metric), info->start_time};
  }
  // The Unix time of the last run's newest stored reading of `metric` (0: none).
  double NewestSampleTime(const std::string& metric) {
    auto [series, start] = StoredSoFar(metric);
    return series.empty() ? 0 : start + series.back().t;
  }
  // Once `job` says "burned" `burners` times, waits for the recorder to store
  // a sample taken after that (BatchWriter writes about once a second), then
  // lets the job exit (its --hold-file): everything it burned was sampled.
  void ReleaseOnceSampledAfterTheBurn(const Background& job, size_t burners,
                                      const std::string& hold) {
    auto burned = [&] {
      std::string out = job.Out();
      size_t n = 0;
      for (size_t at = out.find("burned"); at != std::string::npos; at = out.find("burned", at + 1))
        ++n;
      return n >= burners;
    };
    ASSERT_TRUE(testing::WaitFor(burned, 120)) << job.Out() << job.Err();
    double after = Env::Default()->UnixSeconds();
    ASSERT_TRUE(testing::WaitFor([&] { return NewestSampleTime("proc.processes") > after; }, 60))
        << job.Err();
    std::ofstream(hold) << "go";
  }
  // The burn starts (--start-file) only once the recorder has sampled the
  // tree twice: none of its CPU time falls before the first reading, however
  // late a busy machine runs the recorder.
  void StartOnceSampled(const std::string& start) {
    ASSERT_TRUE(testing::WaitFor([&] { return StoredSamples("proc.processes") >= 2; }, 60));
    std::ofstream(start) << "go";
  }
  // How many readings of `metric` the last run has stored so far.
  size_t StoredSamples(const std::string& metric) { return StoredSoFar(metric).first.size(); }
  std::string dir_, store_;
};

double Median(const Series& s) {
  std::vector<double> v;
  for (const SeriesPoint& p : s) v.push_back(p.v);
  return Percentile(v, 50);
}
double Max(const Series& s) {
  double m = -1;
  for (const SeriesPoint& p : s) m = std::max(m, p.v);
  return m;
}

// The CPU seconds a program prints ("cpu_seconds X", the workload's burn and
// fork modes: its own and its waited-for children's getrusage).
double PrintedCpuSeconds(const std::string& out) {
  size_t at = out.find("cpu_seconds ");
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 12);
}

// What the samples say the tree used: each proc.cpu_util reading (100 = one
// core) times the time since the sample before it (proc.processes is in
// every sample, the CPU reading from the second on).
double CpuSecondsRead(const std::map<std::string, Series>& samples) {
  const Series& cpu = samples.at("proc.cpu_util");
  const Series& all = samples.at("proc.processes");
  double sum = 0;
  for (const SeriesPoint& p : cpu) {
    auto at = std::lower_bound(all.begin(), all.end(), p.t,
                               [](const SeriesPoint& a, double t) { return a.t < t; });
    if (at == all.begin()) continue;
    sum += p.v / 100.0 * (p.t - std::prev(at)->t);
  }
  return sum;
}

// The job's worker burns a fixed amount of CPU time, however busy the
// machine is, starting only once the recorder sampled it (--start-file), and
// then holds (--hold-file) until the recorder has sampled it after the burn,
// so the readings can be held to the CPU time it reports under any load:
// their sum over the run is that time, less the little used before the
// first sample (the exec).
TEST_F(RunE2E, CpuReadingsAddUpToTheCpuTimeTheJobUsed) {
  std::string start = dir_ + "/start", hold = dir_ + "/hold";
  Background b;
  testing::Start(&b, Run({WORKLOAD_BIN, "fork", "--workers", "1", "--cpu-seconds", "1",
                          "--start-file", start, "--hold-file", hold}, "0.05"),
                 "burn");
  StartOnceSampled(start);
  ReleaseOnceSampledAfterTheBurn(b, 1, hold);
  ASSERT_EQ(b.Wait(60), 0) << b.Err();
  double used = PrintedCpuSeconds(b.Out());
  ASSERT_GE(used, 1.0) << b.Out();
  auto samples = Samples();
  ASSERT_GE(samples.at("proc.cpu_util").size(), 6u);
  double read = CpuSecondsRead(samples);
  EXPECT_GT(read, 0.9 * used) << "read " << read << " s of " << used;
  EXPECT_LT(read, 1.05 * used + 0.02) << "read " << read << " s of " << used;
  EXPECT_NE(b.Err().find("proc.cpu_util"), std::string::npos) << b.Err();  // the summary
  EXPECT_NE(b.Err().find("stored as run 1"), std::string::npos);
}

// Every worker's CPU time counts in the job's: if only the parent (which
// sleeps in waitpid) were read, the sum would be near 0.
TEST_F(RunE2E, ForkedWorkersAreOneTree) {
  std::string start = dir_ + "/start", hold = dir_ + "/hold";
  Background b;
  testing::Start(&b, Run({WORKLOAD_BIN, "fork", "--workers", "3", "--cpu-seconds", "0.6",
                          "--start-file", start, "--hold-file", hold}, "0.05"), "fork");
  StartOnceSampled(start);
  ReleaseOnceSampledAfterTheBurn(b, 3, hold);
  ASSERT_EQ(b.Wait(60), 0) << b.Err();
  double used = PrintedCpuSeconds(b.Out());
  ASSERT_GE(used, 1.8) << b.Out();
  auto samples = Samples();
  EXPECT_EQ(Max(samples.at("proc.processes")), 4);  // the parent and its 3 workers
  EXPECT_GE(Max(samples.at("proc.threads")), 4);
  double read = CpuSecondsRead(samples);
  EXPECT_GT(read, 0.9 * used) << "read " << read << " s of " << used;
  EXPECT_LT(read, 1.05 * used + 0.02) << "read " << read << " s of " << used;
}

// The product's choice for what a job leaves behind: when its main process
// exits, fullburn run ends the rest of its tree as srun ends a job step --
// here workers that outlive their parent and ignore SIGTERM, so they need
// the SIGKILL after --kill-wait. Orphans are adopted (fullburn run is their
// subreaper), so they count in the job's tree while it runs.
TEST_F(RunE2E, WorkersLeftRunningAreEndedWithTheJob) {
  std::string pids_file = dir_ + "/pids";
  std::vector<std::string> argv = {FULLBURN_BIN, "run", "--kill-wait", "0.3", "--store", store_,
                                   "--", WORKLOAD_BIN, "orphans", "--workers", "2", "--pids",
                                   pids_file, "--ignore-term"};
  auto o = RunToEnd(argv);
  EXPECT_EQ(o.code, 3) << o.err;  // the main process's code
  EXPECT_NE(o.err.find("left 2 process(es) running: sent them SIGTERM, and SIGKILL to 2 still "
                       "running 0.3 s later"),
            std::string::npos)
      << o.err;
  std::istringstream pids(ReadText(pids_file));
  int n = 0;
  for (int pid; pids >> pid; ++n) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "worker " << pid << " still runs";
    EXPECT_EQ(errno, ESRCH);
  }
  EXPECT_EQ(n, 2);
}

// --keep-orphans leaves them as they were (this test ends them itself).
TEST_F(RunE2E, KeepOrphansLeavesTheWorkersRunning) {
  std::string pids_file = dir_ + "/pids";
  auto o = RunToEnd({FULLBURN_BIN, "run", "--keep-orphans", "--store", store_, "--", WORKLOAD_BIN,
                     "orphans", "--workers", "2", "--pids", pids_file});
  EXPECT_EQ(o.code, 3) << o.err;
  EXPECT_EQ(o.err.find("left 2 process(es) running"), std::string::npos) << o.err;
  std::istringstream pids(ReadText(pids_file));
  int n = 0;
  for (int pid; pids >> pid; ++n) {
    EXPECT_EQ(::kill(pid, 0), 0) << "worker " << pid << " was ended";
    ::kill(pid, SIGKILL);
  }
  EXPECT_EQ(n, 2);
}

TEST_F(RunE2E, ExitCodePassesThrough) {
  EXPECT_EQ(RunToEnd(Run({WORKLOAD_BIN, "exit", "--code", "7"})).code, 7);
  EXPECT_EQ(RunToEnd(Run({"/bin/sh", "-c", "kill -TERM $$"})).code, 128 + SIGTERM);
  auto store = RunStore::Open(store_);
  auto runs = (*store)->ListRuns();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ(*(*runs)[0].exit_code, 7);
  EXPECT_EQ((*runs)[0].status, "finished");
  EXPECT_EQ(*(*runs)[1].exit_code, 143);
}

// A job started under another fullburn run (a tuning trial, a nested run)
// inherits its variables: the inner run's own values must be the ones it reads.
TEST_F(RunE2E, TheChildSeesThisRunsVariablesNotInheritedOnes) {
  ::setenv("FULLBURN_RUN_ID", "999", 1);
  ::setenv("PYTHONPATH", "/inherited", 1);
  auto o = RunToEnd(Run({"/usr/bin/env"}));  // its environment as it came, duplicates too
  ::unsetenv("FULLBURN_RUN_ID");
  ::unsetenv("PYTHONPATH");
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<std::string> ids, paths;
  std::istringstream lines(o.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("FULLBURN_RUN_ID=", 0) == 0) ids.push_back(line);
    if (line.rfind("PYTHONPATH=", 0) == 0) paths.push_back(line);
  }
  EXPECT_EQ(ids, std::vector<std::string>{"FULLBURN_RUN_ID=1"});
  ASSERT_EQ(paths.size(), 1u);
  // fullburn's python/ first, the job's own path after it.
  EXPECT_NE(paths[0].find("/python:/inherited"), std::string::npos) << paths[0];
}

TEST_F(RunE2E, SigtermIsForwardedToTheCommand) {
  std::string marker = dir_ + "/marker";
  Background b;
  testing::Start(&b, Run({WORKLOAD_BIN, "signal", "--marker", marker, "--seconds", "20"}), "fwd");
  ASSERT_TRUE(Ready(b));
  ::kill(b.pid, SIGTERM);
  EXPECT_EQ(b.Wait(10), 42) << b.Err();  // the command's own exit code
  EXPECT_EQ(ReadText(marker), "SIGTERM");
}

TEST_F(RunE2E, SigintFromKillIsForwarded) {
  std::string marker = dir_ + "/marker";
  Background b;
  testing::Start(&b, Run({WORKLOAD_BIN, "signal", "--marker", marker, "--seconds", "20"}), "int");
  ASSERT_TRUE(Ready(b));
  ::kill(b.pid, SIGINT);
  EXPECT_EQ(b.Wait(10), 42) << b.Err();
  EXPECT_EQ(ReadText(marker), "SIGINT");
}

TEST_F(RunE2E, CommandThatCannotStart) {
  auto o = RunToEnd(Run({"no-such-command-fullburn"}));
  EXPECT_EQ(o.code, 127);
  EXPECT_NE(o.err.find("cannot start 'no-such-command-fullburn': No such file or directory"),
            std::string::npos)
      << o.err;
  auto store = RunStore::Open(store_);
  EXPECT_EQ((*store)->GetRun("last")->status, "failed_to_start");
  std::ofstream(dir_ + "/not-exec") << "#!/bin/sh\n";
  o = RunToEnd(Run({dir_ + "/not-exec"}));
  EXPECT_EQ(o.code, 127);
  EXPECT_NE(o.err.find("Permission denied; check that the file is executable"), std::string::npos)
      << o.err;
}

TEST_F(RunE2E, SigkillLeavesAConsistentStoreAndNoOrphan) {
  std::string marker = dir_ + "/marker";
  Background b;
  testing::Start(&b, Run({WORKLOAD_BIN, "signal", "--marker", marker, "--seconds", "30"}, "0.1"),
                 "kill9");
  ASSERT_TRUE(Ready(b));
  // What the store has committed before the kill must all be there after it.
  ASSERT_TRUE(testing::WaitFor([&] { return StoredSamples("host.load1") >= 12; }, 60)) << b.Err();
  size_t committed = StoredSamples("host.load1");
  ::kill(b.pid, SIGKILL);
  EXPECT_EQ(b.Wait(5), 128 + SIGKILL);
  // The command got SIGTERM when its recorder died: not orphaned.
  for (int i = 0; i < 100 && ReadText(marker).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ReadText(marker), "SIGTERM");
  auto store = RunStore::Open(store_);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(*(*store)->IntegrityCheck(), "ok");
  auto run = (*store)->GetRun("last");
  EXPECT_EQ(run->status, "interrupted");
  auto samples = (*store)->LoadSamples(run->id);
  EXPECT_GE(samples->at("host.load1").size(), committed);
}

// Another process holds the store's write lock past the 5 s busy timeout
// (a long `runs rm`, a backup, an sqlite3 shell left in a transaction): the
// recorder's writes fail for a while. The job goes on, and the samples and
// steps of that while are kept and written once the lock is gone. Time:
// 10 s, a lock held past the store's 5 s busy timeout (what is tested).
TEST_F(RunE2E, AStoreLockedForAWhileCostsNoStepsOrSamples) {
  const int kSteps = 100;  // 10 s of 0.1 s steps
  std::string script = dir_ + "/steps.py";
  std::ofstream(script) << "import time, fullburn_markers\n"
                           "m = fullburn_markers.Markers()\n"
                           "for i in range("
                        << kSteps << "):\n    time.sleep(0.1)\n    m.step_end(samples=8)\n";
  Background b;
  testing::Start(&b, Run({"python3", script}), "locked");
  auto recorded = [&] {
    if (!fs::exists(store_)) return false;
    auto runs = (*RunStore::Open(store_))->ListRuns();
    return runs.ok() && !runs->empty() && runs->front().sample_count >= 3;
  };
  for (int i = 0; i < 200 && !recorded(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(recorded()) << b.Err();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(store_.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto locked = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(7500));
  double lock_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - locked).count();
  ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  ASSERT_EQ(b.Wait(60), 0) << b.Err();

  std::string err = b.Err();
  EXPECT_NE(err.find("the job keeps running, and its samples and steps are kept"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the run store takes writes again (nothing lost)"), std::string::npos) << err;
  auto store = RunStore::Open(store_);
  auto run = (*store)->GetRun("last");
  EXPECT_EQ(run->status, "finished");
  EXPECT_EQ((*store)->LoadSteps(run->id)->size(), static_cast<size_t>(kSteps));
  // Snapshots before, during and after the lock: the sampler waits in each
  // failed write (the busy timeout), so "during" is the batch it was writing.
  std::map<std::string, Series> samples = Samples();
  const Series& load = samples.at("host.load1");
  double span = load.back().t - load.front().t;
  EXPECT_GE(span, 9.0);
  double biggest_gap = 0;
  for (size_t i = 1; i < load.size(); ++i)
    biggest_gap = std::max(biggest_gap, load[i].t - load[i - 1].t);
  EXPECT_LT(biggest_gap, lock_s) << "the batch written when the lock came was kept";
}

TEST_F(RunE2E, RecordsFakeGpus) {
  std::string script = dir_ + "/nvml.json";
  std::ofstream(script) << R"({"gpus": [{"name": "Fake H100", "uuid": "GPU-e2e",
    "util": [30, 30, 95], "mem_util": [5], "mem_used": [1073741824], "mem_total": 8589934592,
    "power_mw": [300000], "temp": [70], "throttle": [4, 0]}]})";
  ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  auto o = RunToEnd(Run({WORKLOAD_BIN, "burn", "--seconds", "1"}));
  ASSERT_EQ(o.code, 0) << o.err;
  auto samples = Samples();
  EXPECT_DOUBLE_EQ(samples.at("gpu0.util").front().v, 30);
  EXPECT_DOUBLE_EQ(samples.at("gpu0.util").back().v, 95);
  EXPECT_DOUBLE_EQ(samples.at("gpu0.power_w").front().v, 300);
  EXPECT_NE(o.err.find("GPU 0: utilization under 50%"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("peak memory 1.0 GiB of 8.0 GiB"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("sw_power_cap"), std::string::npos) << o.err;
  auto store = RunStore::Open(store_);
  EXPECT_NE((*store)->GetRun("last")->gpus_json.find("GPU-e2e"), std::string::npos);
}

// A one-GPU job on a two-GPU machine: the idle GPU ran none of the job's
// processes, so the summary and the diagnosis leave it out instead of
// calling the GPUs uneven.
TEST_F(RunE2E, GpusTheJobDidNotUseAreLeftOut) {
  std::string script = dir_ + "/nvml.json";
  std::ofstream(script) << R"({"gpus": [
    {"name": "Fake H100", "uuid": "GPU-used", "util": [95], "mem_util": [40],
     "mem_used": [4294967296], "mem_total": 8589934592,
     "processes": [[{"pid": "child", "mem": 2147483648}]]},
    {"name": "Fake H100", "uuid": "GPU-idle", "util": [0], "mem_util": [0],
     "mem_used": [0], "mem_total": 8589934592, "processes": [[]]}]})";
  ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  auto o = RunToEnd(Run({WORKLOAD_BIN, "burn", "--seconds", "1"}));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("(this job: 2.0 GiB)"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("GPU 1: not used by this job"), std::string::npos) << o.err;
  auto d = RunToEnd({FULLBURN_BIN, "diagnose", "last", "--json", "--store", store_});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out.find("uneven_ranks"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("left out: GPU 1"), std::string::npos) << d.out;
}

// fullburn attach: a job started without fullburn (here the test's own
// child) is recorded from its PID until it exits. Its parent has not reaped
// it yet when it ends, so the zombie it leaves must count as gone.
// The workers start burning only once attach has taken its first samples
// (the start file) and exit only once it has sampled them after their burn
// (the hold file), so all their CPU time falls in the recording and the
// readings can be held to the CPU time the job reports, under any load.
TEST_F(RunE2E, AttachRecordsARunningTreeUntilItExits) {
  std::string start = dir_ + "/start", hold = dir_ + "/hold";
  Background job;
  testing::Start(&job, {WORKLOAD_BIN, "fork", "--workers", "2", "--cpu-seconds", "0.6",
                        "--start-file", start, "--hold-file", hold}, "attached");
  Background attach;
  testing::Start(&attach, {FULLBURN_BIN, "attach", std::to_string(job.pid), "--interval", "0.05",
                           "--store", store_}, "attach");
  ASSERT_TRUE(testing::WaitFor([&] { return StoredSamples("proc.processes") >= 2; }, 60))
      << attach.Err();
  std::ofstream(start) << "go";
  ReleaseOnceSampledAfterTheBurn(job, 2, hold);
  ASSERT_EQ(attach.Wait(60), 0) << attach.Err();
  std::string err = attach.Err();
  EXPECT_NE(err.find("the process exited"), std::string::npos) << err;
  EXPECT_NE(err.find("findings:"), std::string::npos) << err;
  if (err.find("GPU metrics unavailable") != std::string::npos) {
    // No GPU and no steps: the fix says how to get them next time.
    EXPECT_NE(err.find("start it with fullburn run"), std::string::npos) << err;
  }
  auto store = RunStore::Open(store_);
  RunInfo run = (*store)->GetRun("last").value();
  EXPECT_EQ(run.status, "finished");
  EXPECT_FALSE(run.exit_code.has_value());  // its code went to its parent
  ASSERT_GE(run.command.size(), 2u);
  EXPECT_EQ(run.command[0], WORKLOAD_BIN);
  EXPECT_EQ(run.command[1], "fork");
  EXPECT_TRUE(run.end_time.has_value());
  EXPECT_EQ(job.Wait(5), 0);
  double used = PrintedCpuSeconds(job.Out());
  ASSERT_GE(used, 1.2) << job.Out();
  auto samples = Samples();
  EXPECT_EQ(Max(samples.at("proc.processes")), 3);  // the job and its 2 workers
  double read = CpuSecondsRead(samples);             // their tree's CPU, all of it
  EXPECT_GT(read, 0.9 * used) << "read " << read << " s of " << used;
  EXPECT_LT(read, 1.05 * used + 0.02) << "read " << read << " s of " << used;
}

// The main use: a GPU job someone started by hand. Its GPU memory is
// attributed from NVML's process list (the fake's, scripted with the job's
// PID), and a GPU only other processes use is left out, as for `run`.
TEST_F(RunE2E, AttachedJobsGpusAreTheOnesItsTreeUses) {
  // The finding rests on the host's CPU: a scripted host, 30% busy on 2 CPUs.
  testing::ScriptedHost host(dir_, 2, 0.3);
  Background job;
  testing::Start(&job, {WORKLOAD_BIN, "burn", "--seconds", "3"}, "attached_gpu");
  std::string script = dir_ + "/nvml.json";
  std::ofstream(script) << R"({"gpus": [
    {"name": "Fake H100", "uuid": "GPU-used", "util": [25], "mem_util": [10],
     "mem_used": [4294967296], "mem_total": 8589934592,
     "processes": [[{"pid": )"
                        << job.pid << R"(, "mem": 2147483648}]]},
    {"name": "Fake H100", "uuid": "GPU-other", "util": [90], "mem_util": [50],
     "mem_used": [4294967296], "mem_total": 8589934592,
     "processes": [[{"pid": 1, "mem": 4294967296}]]}]})";
  ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  auto o = RunToEnd(
      {FULLBURN_BIN, "attach", std::to_string(job.pid), "--interval", "0.2", "--store", store_},
      30);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("(this job: 2.0 GiB)"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("GPU 1: not used by this job"), std::string::npos) << o.err;
  // GPUs were read: not the no-GPU fix. GPU 0 idles 75% with a core to
  // spare and half its memory in use, and no steps were timed.
  EXPECT_EQ(o.err.find("start it with fullburn run"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("GPU mostly idle with cores to spare (steps not timed)"), std::string::npos)
      << o.err;
  EXPECT_DOUBLE_EQ(Median(Samples().at("gpu0.util")), 25);
  EXPECT_EQ(job.Wait(5), 0);
}

// --for and Ctrl-C end the recording, never the job: it is sent nothing.
TEST_F(RunE2E, AttachStopsRecordingAndLeavesTheJobRunning) {
  std::string marker = dir_ + "/marker";
  Background job;
  testing::Start(&job, {WORKLOAD_BIN, "signal", "--marker", marker, "--seconds", "30"}, "kept");
  ASSERT_TRUE(Ready(job));
  auto o = RunToEnd({FULLBURN_BIN, "attach", std::to_string(job.pid), "--for", "1s", "--interval",
                     "0.2", "--store", store_},
                    30);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("recording stopped; the process goes on"), std::string::npos) << o.err;
  auto store = RunStore::Open(store_);
  RunInfo run = (*store)->GetRun("last").value();
  EXPECT_EQ(run.status, "detached");
  // --for ended it (the job runs 30 s): a second at least, a few at most
  // however slowly a loaded machine stops the sampler.
  EXPECT_GE(*run.end_time - run.start_time, 0.95);
  EXPECT_LT(*run.end_time - run.start_time, 10);

  Background attach;
  testing::Start(
      &attach,
      {FULLBURN_BIN, "attach", std::to_string(job.pid), "--interval", "0.2", "--store", store_},
      "attach_int");
  // Interrupted once it records (its handlers are in place by then).
  ASSERT_TRUE(testing::WaitFor(
      [&] { return (*store)->ListRuns()->size() == 2 && StoredSamples("host.load1") >= 1; }, 60));
  ::kill(attach.pid, SIGINT);
  EXPECT_EQ(attach.Wait(10), 0) << attach.Err();
  EXPECT_EQ((*store)->GetRun("last")->status, "detached");
  EXPECT_EQ(job.Wait(0.5), -1);     // still running
  EXPECT_EQ(ReadText(marker), "");  // and sent no signal
}

TEST_F(RunE2E, AttachToWhatIsNoRunningProcessIsAOneLineError) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"abc"}, "'abc' is not a process id"},
      {{"0"}, "'0' is not a process id"},
      {{"2147483647"}, "no running process 2147483647"},
      {{std::to_string(::getpid()), "--for", "soon"}, "--for 'soon' is not a duration"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {FULLBURN_BIN, "attach", "--store", store_};
    argv.insert(argv.end(), args.begin(), args.end());
    auto o = RunToEnd(argv);
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find(message), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
  EXPECT_FALSE(fs::exists(store_));  // refused before the store was opened
}

}  // namespace
}  // namespace fullburn
