// Who holds a GPU: Slurm and Kubernetes identities from recorded /proc files
// (tests/fleet/fixtures/holders, modelled on a 6.1 kernel's), runs matched
// through a PID namespace, and the NSpid mapping of a real process in a PID
// namespace of its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fullburn/store.h"
#include "fullburn/telemetry.h"
#include "process.h"

namespace fullburn {
namespace {

constexpr double kBootTime = 1795600000;  // fixtures/holders/proc/stat's btime

std::string Fixtures() { return std::string(FLEET_FIXTURES_DIR) + "/holders"; }

std::map<std::string, std::string> AsMap(const std::vector<PromLabel>& labels) {
  return std::map<std::string, std::string>(labels.begin(), labels.end());
}

GpuSample HeldBy(std::vector<std::pair<int, double>> pids) {
  GpuSample g;
  for (const auto& [pid, mem] : pids) g.processes.push_back({pid, mem, ""});
  return g;
}

TEST(NsPids, FromStatus) {
  EXPECT_EQ(ParseNsPids("Name:\tx\nNStgid:\t9\t3\nNSpid:\t4242\t17\t1\nNSpgid:\t1\n"),
            (std::vector<int>{4242, 17, 1}));
  EXPECT_EQ(ParseNsPids("Name:\tx\nNSpid:\t88\n"), (std::vector<int>{88}));
  EXPECT_TRUE(ParseNsPids("Name:\tx\nPid:\t88\n").empty());  // kernels before 4.1
}

TEST(SchedulerIds, FromCgroupPaths) {
  EXPECT_EQ(SlurmJobFromCgroup("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"),
            "4242");
  EXPECT_EQ(SlurmJobFromCgroup("4:memory:/slurm/uid_1000/job_77/step_batch\n0::/\n"), "77");
  EXPECT_EQ(SlurmJobFromCgroup("0::/user.slice/job_12/x\n"), "");  // not Slurm's
  EXPECT_EQ(SlurmJobFromCgroup("0::/slurm/job_12abc/\n"), "");
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods/burstable/pod5f0e2c1a-8d2b-4c9e-9f3a-0b1c2d3e4f50/abc\n"),
            "5f0e2c1a-8d2b-4c9e-9f3a-0b1c2d3e4f50");
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/kubepods-besteffort.slice/"
                             "kubepods-besteffort-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/x\n"),
            "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d");
  EXPECT_EQ(PodUidFromCgroup("0::/system.slice/pod-manager.service\n"), "");
}

TEST(ProcessOwner, SlurmFromTheEnvironment) {
  testing::ReplayEnv env(Fixtures());
  Result<ProcessOwner> o = ReadProcessOwner(env, 1000);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->hpc_job, "4242");
  EXPECT_EQ(o->user, "alice");
  EXPECT_EQ(o->partition, "gpu");
  EXPECT_EQ(o->ppid, 990);
  EXPECT_DOUBLE_EQ(o->start_unix, kBootTime + 500000 / 100.0);
  EXPECT_EQ(o->pod_uid, "");
}

TEST(ProcessOwner, SlurmFromTheCgroupAndUserFromTheUid) {
  testing::ReplayEnv env(Fixtures());
  Result<ProcessOwner> o = ReadProcessOwner(env, 1100);  // no environ: not readable
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->hpc_job, "977");
  EXPECT_EQ(o->user, "bob");  // uid 1002 in etc/passwd
  EXPECT_EQ(o->partition, "");
}

TEST(ProcessOwner, KubernetesPods) {
  testing::ReplayEnv env(Fixtures());
  Result<ProcessOwner> a = ReadProcessOwner(env, 2000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->pod_uid, "5f0e2c1a-8d2b-4c9e-9f3a-0b1c2d3e4f50");
  EXPECT_EQ(a->pod, "trainer-0");           // HOSTNAME
  EXPECT_EQ(a->kube_namespace, "research");  // the service account's file
  EXPECT_EQ(a->ns_pids, (std::vector<int>{2000, 7}));
  EXPECT_EQ(a->hpc_job, "");
  Result<ProcessOwner> b = ReadProcessOwner(env, 2100);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->pod, "llm-7b-ft-2");  // POD_NAME over HOSTNAME
  EXPECT_EQ(b->kube_namespace, "ml-prod");
  EXPECT_EQ(b->user, "uid 1000");  // not in etc/passwd
  EXPECT_FALSE(ReadProcessOwner(env, 4040).ok());  // no such process
}

TEST(GpuHolders, LabelsEachGpuWithTheJobOfItsLargestProcess) {
  testing::ReplayEnv env(Fixtures());
  GpuHolders holders(&env);
  std::vector<GpuSample> gpus = {HeldBy({{1100, 1e9}, {1000, 8e9}}), HeldBy({{2000, 1e9}}),
                                 HeldBy({}), HeldBy({{4040, 1e9}})};
  auto labels = holders.Labels(gpus, {});
  ASSERT_EQ(labels.size(), 4u);
  EXPECT_EQ(AsMap(labels[0]), (std::map<std::string, std::string>{
                                  {"hpc_job", "4242"}, {"user", "alice"}, {"partition", "gpu"}}));
  EXPECT_EQ(AsMap(labels[1]), (std::map<std::string, std::string>{
                                  {"namespace", "research"}, {"pod", "trainer-0"}, {"user", "root"}}));
  EXPECT_TRUE(labels[2].empty());  // free
  EXPECT_TRUE(labels[3].empty());  // its process is gone
}

// The run was recorded inside a PID namespace: its recorder saw itself as
// pid 1. Its job is pid 2 there, host pid 3001, the GPU's holder.
TEST(GpuHolders, MatchesARunRecordedInsideAPidNamespace) {
  testing::ReplayEnv env(Fixtures());
  GpuHolders holders(&env);
  const double recorder_start = kBootTime + 700000 / 100.0;
  std::vector<GpuSample> gpus = {HeldBy({{3001, 4e9}})};
  auto labels = holders.Labels(gpus, {{5, 1, recorder_start + 1.5, false}});
  EXPECT_EQ(AsMap(labels[0]).at("run"), "5");
  // The recorded pid 1 is not the host's init (which started at boot), nor a
  // process that started long after the run began (a reused pid).
  labels = holders.Labels({HeldBy({{1000, 1e9}})}, {{6, 1, recorder_start, false}});
  EXPECT_EQ(AsMap(labels[0]).count("run"), 0u);
  labels = holders.Labels(gpus, {{7, 1, recorder_start - 3600, false}});
  EXPECT_EQ(AsMap(labels[0]).count("run"), 0u);
  // Nor does a recorder that started more than the slack before its run.
  labels = holders.Labels(gpus, {{8, 1, recorder_start + 2 * GpuHolders::kRecorderStartSlackS, false}});
  EXPECT_EQ(AsMap(labels[0]).count("run"), 0u);
  // `fullburn attach` follows a job that started any time before.
  labels = holders.Labels(gpus, {{9, 2, recorder_start + 86400, true}});
  EXPECT_EQ(AsMap(labels[0]).at("run"), "9");
}

// A real process in a PID namespace of its own: its host pid (NVML's) and
// its pid inside, from the NSpid line, and a run recorded with the inner pid.
TEST(GpuHolders, RealProcessInItsOwnPidNamespace) {
  testing::Background ns;
  testing::Start(&ns, {"unshare", "--pid", "--fork", "--mount-proc", "sleep", "60"}, "unshare_pid");
  // unshare forks the namespace's pid 1, which execs sleep.
  int inner = -1;
  bool found = testing::WaitFor(
      [&] {
        for (const auto& e : std::filesystem::directory_iterator("/proc")) {
          std::string name = e.path().filename();
          if (name.find_first_not_of("0123456789") != std::string::npos) continue;
          std::ifstream stat(e.path() / "stat");
          std::string text((std::istreambuf_iterator<char>(stat)), {});
          size_t close = text.rfind(')');
          if (close != std::string::npos && std::atoi(text.c_str() + close + 4) == ns.pid &&
              text.find("(sleep)") != std::string::npos) {
            inner = std::stoi(name);
            return true;
          }
        }
        return ns.Wait(0.001) >= 0;  // unshare gave up
      },
      10);
  if (!found || inner < 0)
    GTEST_SKIP() << "unshare --pid --fork --mount-proc was refused (needs root or user namespaces): "
                 << ns.Err();
  Result<ProcessOwner> o = ReadProcessOwner(*Env::Default(), inner);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->ns_pids, (std::vector<int>{inner, 1}));
  GpuHolders holders(Env::Default());
  auto labels = holders.Labels({HeldBy({{inner, 1e9}})},
                               {{11, 1, o->start_unix + 1, false, o->start_unix}});
  EXPECT_EQ(AsMap(labels[0]).at("run"), "11");
  // A recorder that was pid 1 but started at another time is another
  // process: not this one, nor any ancestor, the host's init included
  // (which, with only the run's start to go by, matched whenever the
  // machine had booted about as long before as the run was made to
  // precede this process: an hour into CI, a flaky test).
  labels = holders.Labels({HeldBy({{inner, 1e9}})},
                          {{12, 1, o->start_unix - 3600, false, o->start_unix - 3600}});
  EXPECT_EQ(AsMap(labels[0]).count("run"), 0u);
  Result<ProcessOwner> init = ReadProcessOwner(*Env::Default(), 1);
  ASSERT_TRUE(init.ok());
  labels = holders.Labels({HeldBy({{inner, 1e9}})},
                          {{13, 1, init->start_unix + 1, false, init->start_unix + 5}});
  EXPECT_EQ(AsMap(labels[0]).count("run"), 0u) << "init's start is 5 s off the recorder's";
}

// The recorder's start is stored with its run (schema v5) when the
// recorder is the process that begins it.
TEST(GpuHolders, ARunStoresItsRecordersStart) {
  std::string dir = ::testing::TempDir() + "/fb_recorder_start";
  std::filesystem::create_directories(dir);
  auto store = RunStore::Open(dir + "/runs.db");
  ASSERT_TRUE(store.ok()) << store.status().message();
  RunInfo info;
  info.name = "self";
  info.recorder_pid = static_cast<int>(::getpid());
  auto id = (*store)->BeginRun(info);
  ASSERT_TRUE(id.ok());
  auto run = (*store)->GetRun(std::to_string(*id));
  ASSERT_TRUE(run.ok() && run->recorder_start.has_value());
  EXPECT_NEAR(*run->recorder_start, *ProcessStartTime(*Env::Default(), ::getpid()), 1e-6);
  info.recorder_pid = 999999;  // not this process: nothing to read
  auto other = (*store)->GetRun(std::to_string(*(*store)->BeginRun(info)));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->recorder_start.has_value());
}

}  // namespace
}  // namespace fullburn
