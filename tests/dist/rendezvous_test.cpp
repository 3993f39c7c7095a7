// Rank discovery from the environments of torchrun, Slurm and Open MPI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fullburn/dist.h"
#include "replay_env.h"

namespace fullburn {
namespace {

TEST(Rendezvous, NoLauncherIsOneProcess) {
  auto r = RankFromEnvironment({{"PATH", "/usr/bin"}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(Rendezvous, Torchrun) {
  auto r = RankFromEnvironment({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29400"}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->has_value());
  const RankInfo& i = **r;
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 0);  // no LOCAL_WORLD_SIZE: unknown
  EXPECT_EQ(i.master_addr, "node7");
  EXPECT_EQ(i.master_port, 29400);
  EXPECT_EQ(i.launcher, "torchrun");
}

TEST(Rendezvous, RanksSharingAGpuAreFoundSoNcclIsNotAskedToRunThem) {
  EXPECT_FALSE(FirstSharedGpu({}).has_value());
  EXPECT_FALSE(FirstSharedGpu({"gpu-a"}).has_value());
  EXPECT_FALSE(FirstSharedGpu({"gpu-a", "gpu-b", "gpu-c"}).has_value());
  EXPECT_FALSE(FirstSharedGpu({"", ""}).has_value()) << "ranks without a GPU share nothing";
  EXPECT_EQ(FirstSharedGpu({"gpu-a", "gpu-a"}), std::make_pair(0, 1));
  // 4 ranks on a 2-GPU node, each on local_rank % 2: rank 2 is the first on a taken GPU.
  EXPECT_EQ(FirstSharedGpu({"gpu-a", "gpu-b", "gpu-a", "gpu-b"}), std::make_pair(0, 2));
  EXPECT_EQ(FirstSharedGpu({"gpu-a", "gpu-b", "gpu-c", "gpu-b"}), std::make_pair(1, 3));
}

TEST(Rendezvous, SlurmTakesTheFirstHostOfTheNodeList) {
  auto r = RankFromEnvironment({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                {"SLURM_JOB_NODELIST", "gpu[012-015,020]"}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->rank, 5);
  EXPECT_EQ((*r)->local_rank, 1);
  EXPECT_EQ((*r)->local_world_size, 0);
  EXPECT_EQ((*r)->master_addr, "gpu012");
  EXPECT_EQ((*r)->master_port, kDefaultPort);
  EXPECT_EQ((*r)->launcher, "slurm");
  EXPECT_EQ(*FirstSlurmHost("a1,b2"), "a1");
  EXPECT_EQ(*FirstSlurmHost("solo"), "solo");
  EXPECT_EQ(*FirstSlurmHost("rack1-n[7,9]"), "rack1-n7");
  EXPECT_FALSE(FirstSlurmHost("n[1-4").ok());
}

TEST(Rendezvous, OpenMpiWithAnExplicitMaster) {
  auto r = RankFromEnvironment({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->world_size, 2);
  EXPECT_EQ((*r)->master_addr, "10.0.0.1");
  EXPECT_EQ((*r)->launcher, "mpi");
  auto sized = RankFromEnvironment({{"OMPI_COMM_WORLD_RANK", "0"},
                                    {"OMPI_COMM_WORLD_SIZE", "8"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ((*sized)->local_world_size, 4);
  auto slurm = RankFromEnvironment({{"SLURM_PROCID", "0"},
                                    {"SLURM_NTASKS", "8"},
                                    {"SLURM_LOCALID", "0"},
                                    {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ((*slurm)->local_world_size, 2);
  // No local rank at all: one node, every rank on it.
  auto one_node = RankFromEnvironment({{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "9"}});
  EXPECT_EQ((*one_node)->local_world_size, 3);
}

TEST(Rendezvous, TorchrunWinsOverSlurm) {
  // srun torchrun ...: the inner launcher's variables describe this process.
  auto r = RankFromEnvironment({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1234"},
                                {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->rank, 1);
  EXPECT_EQ((*r)->launcher, "torchrun");
}

TEST(Rendezvous, EachRankGetsItsShareOfTheCpus) {
  EXPECT_EQ(RankCpus({16, 16, 0}, 1), 16);
  EXPECT_EQ(RankCpus({16, 16, 0}, 4), 4);   // 4 ranks on a 16-CPU node, none bound
  EXPECT_EQ(RankCpus({16, 16, 0}, 0), 16);  // unknown ranks per node
  EXPECT_EQ(RankCpus({4, 16, 0}, 4), 4);    // bound to 4 CPUs by the launcher: not split again
  EXPECT_EQ(RankCpus({2, 2, 0}, 3), 1);     // more ranks than CPUs: one thread each
  EXPECT_EQ(RankCpus({0, 8, 0}, 2), 4);     // affinity unreadable
  EXPECT_EQ(RankCpus({64, 64, 4}, 1), 4);   // a container limited to 4 CPUs on a 64-CPU host
  EXPECT_EQ(RankCpus({64, 64, 4}, 2), 2);
  EXPECT_EQ(RankCpus({8, 64, 4}, 1), 4);  // bound to 8, limited to 4
  CpuView here = ReadCpuView(Env::Default());
  EXPECT_GE(here.affinity, 1);
  EXPECT_GE(here.machine, here.affinity);
}

// Recorded cgroup layouts: v2 (a quota on the pod's parent), v1 (cpu,cpuacct),
// none, and a container that sees its own cgroup at the mount's root.
class CgroupQuota : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("fullburn-cgroup-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    std::filesystem::path p = root_.string() + path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  int Quota() {
    testing::ReplayEnv env(root_.string());
    return CgroupCpuQuota(&env);
  }
  std::filesystem::path root_;
};

TEST_F(CgroupQuota, V2TakesTheTightestOfTheCgroupAndItsParents) {
  Write("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n");  // 2.5 CPUs
  Write("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  EXPECT_EQ(Quota(), 2);  // rounded down: 2 threads are never throttled
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n");
  EXPECT_EQ(Quota(), 0);
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "50000 100000\n");  // half a CPU
  EXPECT_EQ(Quota(), 1);
}

// Found by fuzz/proc_fuzz (fuzz/regressions/proc/cgroup-without-slash):
// a cgroup path without a '/' walked up to itself forever, growing a list.
TEST_F(CgroupQuota, APathWithoutASlashEndsTheWalk) {
  Write("/proc/self/cgroup", "0::pod1\n");
  Write("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  EXPECT_EQ(Quota(), 1);  // the root's limit still counts
}

TEST_F(CgroupQuota, V1ReadsCfsQuotaAndPeriod) {
  Write("/proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(Quota(), 4);
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(Quota(), 0);
}

TEST_F(CgroupQuota, AContainerSeesItsOwnCgroupAtTheRoot) {
  Write("/proc/self/cgroup", "0::/system.slice/docker-abc.scope\n");  // the host's path
  Write("/sys/fs/cgroup/cpu.max", "300000 100000\n");                 // the container's own
  EXPECT_EQ(Quota(), 3);
}

TEST_F(CgroupQuota, NoCgroupFileIsNoQuota) { EXPECT_EQ(Quota(), 0); }

TEST(Rendezvous, BadVariablesAreClearErrors) {
  struct Case {
    EnvMap env;
    const char* says;
  } cases[] = {
      {{{"RANK", "0"}}, "WORLD_SIZE is not set"},
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}, "is not below WORLD_SIZE=4"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "4"}}, "RANK=x is not a valid number"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_PORT is not"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "not a TCP port"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2"}}, "unclosed"},
  };
  for (const Case& c : cases) {
    auto r = RankFromEnvironment(c.env);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
  }
}

TEST(Rendezvous, LaunchEnvironmentIsTorchruns) {
  LaunchPlan p;
  p.nproc = 4;
  p.nnodes = 2;
  p.node_rank = 1;
  p.master_addr = "node0";
  p.master_port = 29511;
  ASSERT_TRUE(CheckLaunchPlan(p).ok());
  EnvMap env;
  for (const std::string& kv : LaunchEnvironment(p, 2)) env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  auto r = RankFromEnvironment(env);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->rank, 6);  // node 1, local 2, 4 per node
  EXPECT_EQ((*r)->world_size, 8);
  EXPECT_EQ((*r)->local_rank, 2);
  EXPECT_EQ((*r)->local_world_size, 4);
  EXPECT_EQ((*r)->master_addr, "node0");
  p.node_rank = 2;
  EXPECT_FALSE(CheckLaunchPlan(p).ok());
  p.node_rank = 0;
  p.nproc = 0;
  EXPECT_FALSE(CheckLaunchPlan(p).ok());
}

// Messages true to the input (issue 53): each quotes the variables as the
// launcher set them. A number past the bound once read "(>= 0)", as if only
// the lower bound had been broken.
TEST(Rendezvous, MessagesQuoteTheVariablesAsSet) {
  auto message = [](const EnvMap& env) {
    auto r = RankFromEnvironment(env);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(message({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}), "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_EQ(message({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}), "SLURM_PROCID=3 is not below SLURM_NTASKS=2");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
            "MASTER_PORT=70000 is not a TCP port");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 is not a valid number (1 to 1048576)");
  EXPECT_EQ(message({{"RANK", "2000000"}, {"WORLD_SIZE", "4"}}), "RANK=2000000 is not a valid number (0 to 1048576)");
  EXPECT_EQ(message({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "gpu[01-04,07"}}),
            "SLURM_JOB_NODELIST=gpu[01-04,07 has an unclosed '['");
}

}  // namespace
}  // namespace fullburn
