// Rank discovery from the environments of torchrun, Slurm and Open MPI.
#include <gtest/gtest.h>

#include "fullburn/dist.h"

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
  EXPECT_EQ(RankCpus(16, 16, 1), 16);
  EXPECT_EQ(RankCpus(16, 16, 4), 4);   // 4 ranks on a 16-CPU node, none bound
  EXPECT_EQ(RankCpus(16, 16, 0), 16);  // unknown ranks per node
  EXPECT_EQ(RankCpus(4, 16, 4), 4);    // bound to 4 CPUs by the launcher: not split again
  EXPECT_EQ(RankCpus(2, 2, 3), 1);     // more ranks than CPUs: one thread each
  EXPECT_EQ(RankCpus(0, 8, 2), 4);     // affinity unreadable
  EXPECT_GE(AffinityCpus(), 1);
}

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

}  // namespace
}  // namespace fullburn
