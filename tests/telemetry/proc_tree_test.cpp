// The monitored process tree, from the same recordings: the root `sh`
// (root_pid) had two `yes` children, a nested `sh` with a `sleep`, and a
// `sleep`; an unrelated `yes` (pid 5741, parent 1) ran beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fullburn/telemetry.h"
#include "replay_env.h"

namespace fullburn {
namespace {

using testing::ReadText;
using testing::ReplayEnv;
const std::string kT0 = testing::Recording(0);
const std::string kT1 = testing::Recording(1);
int RootPid() { return std::atoi(ReadText(kT0 + "/root_pid").c_str()); }

// utime + stime of a recorded process, parsed here independently.
double Ticks(const std::string& root, int pid) {
  std::string text = ReadText(root + "/proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(text.substr(text.rfind(')') + 2));
  std::vector<std::string> f;
  std::string tok;
  while (in >> tok) f.push_back(tok);
  return std::stod(f[11]) + std::stod(f[12]);  // fields 14 and 15 of proc(5)
}

TEST(ProcTree, FindsEveryDescendantAndNothingElse) {
  ReplayEnv env(kT0);
  ProcTreeCollector c(&env, RootPid());
  ProcTreeSample s;
  c.Collect(&s);
  std::vector<int> pids = s.pids;
  std::sort(pids.begin(), pids.end());
  EXPECT_EQ(pids, (std::vector<int>{5836, 5838, 5839, 5840, 5841, 5845}));
  EXPECT_DOUBLE_EQ(*s.processes, 6);
  EXPECT_DOUBLE_EQ(*s.threads, 6);
  // rss (field 24) in pages: 400 + 377 + 363 + 388 + 356 + 394.
  EXPECT_DOUBLE_EQ(*s.rss_bytes, 2278.0 * 4096);
  EXPECT_FALSE(s.cpu_util.has_value());  // needs two readings
}

// fullburn run adopts the job's orphans (a subreaper): its other children,
// and theirs, belong to the job's tree; the adopter itself does not. In the
// recording, the root's parent 5832 has one other child, 5843.
TEST(ProcTree, AnAdoptersOtherChildrenJoinTheTree) {
  ReplayEnv env(kT0);
  ProcTreeCollector c(&env, RootPid(), 5832);
  ProcTreeSample s;
  c.Collect(&s);
  std::vector<int> pids = s.pids;
  std::sort(pids.begin(), pids.end());
  EXPECT_EQ(pids, (std::vector<int>{5836, 5838, 5839, 5840, 5841, 5843, 5845}));
}

// Found by fuzz/proc_fuzz (fuzz/regressions/proc/): /proc is read a file at
// a time, so a reused pid can make two processes each other's parent, and
// the walk down the tree went round that cycle forever.
TEST(ProcTree, ParentLinksThatFormACycleCountEachProcessOnce) {
  std::string root = testing::FreshTestDir("fb_proc_cycle");
  for (auto [pid, ppid] : {std::pair{10, 11}, std::pair{11, 10}}) {
    std::string dir = root + "/proc/" + std::to_string(pid);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/stat") << pid << " (a) S " << ppid
                                 << " 10 10 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 100 1000 50 0\n";
  }
  RootedEnv env(root);
  ProcTreeCollector c(&env, 10);
  ProcTreeSample s;
  c.Collect(&s);
  std::vector<int> pids = s.pids;
  std::sort(pids.begin(), pids.end());
  EXPECT_EQ(pids, (std::vector<int>{10, 11}));
  EXPECT_DOUBLE_EQ(*s.threads, 2);
  EXPECT_DOUBLE_EQ(*s.rss_bytes, 100.0 * 4096);
}

TEST(ProcTree, CpuIsTheSumOfDescendantTicks) {
  ReplayEnv env(kT0);
  ProcTreeCollector c(&env, RootPid());
  ProcTreeSample first, s;
  c.Collect(&first);
  env.SetRoot(kT1);
  env.SetTime(2.0);
  c.Collect(&s);
  double ticks = 0;
  for (int pid : {5836, 5838, 5839, 5840, 5841, 5845}) ticks += Ticks(kT1, pid) - Ticks(kT0, pid);
  ASSERT_TRUE(s.cpu_util.has_value());
  EXPECT_NEAR(*s.cpu_util, ticks / 100.0 / 2.0 * 100.0, 1e-9);
  EXPECT_GT(*s.cpu_util, 100.0);  // two busy `yes`: more than one core
}

TEST(ProcTree, ExitedRootGivesAnEmptyTree) {
  ReplayEnv env(kT0);
  ProcTreeCollector c(&env, 999999);
  ProcTreeSample s;
  c.Collect(&s);
  EXPECT_TRUE(s.pids.empty());
  EXPECT_DOUBLE_EQ(*s.processes, 0);
  EXPECT_FALSE(s.cpu_util.has_value());
}

TEST(ProcTree, LiveTreeOfThisProcess) {
  ProcTreeCollector c(Env::Default(), static_cast<int>(::getpid()));
  ProcTreeSample s;
  c.Collect(&s);
  ASSERT_FALSE(s.pids.empty());
  EXPECT_EQ(s.pids.front(), static_cast<int>(::getpid()));
  EXPECT_GE(*s.threads, 1);
  EXPECT_GT(*s.rss_bytes, 1024 * 1024);
}

// A data-parallel rank after 0: its sampler reads only its own tree, and the
// names it stores carry its rank.
TEST(ProcTree, ARankSamplerReadsOnlyItsTree) {
  ReplayEnv env(kT0);
  SamplerOptions o;
  o.root_pid = RootPid();
  o.host = false;
  o.rank = 1;
  Sampler sampler(&env, nullptr, o);
  sampler.SampleOnce();
  env.SetRoot(kT1);
  env.SetTime(2.0);
  Snapshot s = sampler.SampleOnce();
  ASSERT_TRUE(s.proc.has_value());
  EXPECT_EQ(s.rank, 1);
  EXPECT_FALSE(s.host.cpu.util.has_value());
  EXPECT_FALSE(s.host.mem_used_bytes.has_value());
  std::vector<std::string> names;
  for (const auto& [name, value] : Flatten(s)) names.push_back(name);
  EXPECT_FALSE(names.empty());
  for (const std::string& n : names) EXPECT_EQ(n.rfind("rank1.proc.", 0), 0u) << n;
  // The same recordings with host readings on give host.* too.
  ReplayEnv env2(kT0);
  o.host = true;
  Sampler full(&env2, nullptr, o);
  full.SampleOnce();
  env2.SetRoot(kT1);
  env2.SetTime(2.0);
  EXPECT_TRUE(full.SampleOnce().host.cpu.util.has_value());
}

// Messages true to the input (issue 53): a stat file cut short or missing
// is refused for the process asked about, and a whole one is read.
TEST(ProcessIdentity, ADamagedStatIsRefusedForThePidAsked) {
  namespace fs = std::filesystem;
  std::string root = ::testing::TempDir() + "/fb_identity";
  fs::remove_all(root);
  for (const char* pid : {"4242", "4343"}) fs::create_directories(root + "/proc/" + pid);
  const std::string whole =
      "4242 (python (x)) R 1 0 0 0 -1 4194560 27827 1873685 0 207 60 350 3031 2275 20 0 14 0 987654 40284160 2228 "
      "18446744073709551615 1 1 0 0 0 0 0 4096 1256 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
  std::ofstream(root + "/proc/4242/stat") << whole;
  std::ofstream(root + "/proc/4343/stat") << whole.substr(0, 30);
  testing::ReplayEnv env(root);
  Result<ProcessIdentity> ok = ReadProcessIdentity(env, 4242);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->state, 'R');
  EXPECT_EQ(ok->start_ticks, 987654u);
  Result<ProcessIdentity> cut = ReadProcessIdentity(env, 4343);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().message(), "no process 4343");
  Result<ProcessIdentity> gone = ReadProcessIdentity(env, 4444);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().message(), "no process 4444");
}

}  // namespace
}  // namespace fullburn
