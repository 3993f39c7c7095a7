// Dist: who this process is in a data-parallel job, from the environment the
// launchers set, and how `fullburn launch` starts the processes of one node.
// The libtorch half (process groups, gradient buckets) is dist_torch.h.
//
// Contract
// - RankFromEnvironment is a pure function of the variables it is given:
//   torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) win,
//   then Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of
//   SLURM_JOB_NODELIST), then Open MPI's (OMPI_COMM_WORLD_RANK, _SIZE,
//   _LOCAL_RANK). None of them: no value (a single process). Partial or
//   inconsistent variables: InvalidArgument naming the variable and the fix,
//   never a guess (a guessed rank hangs a job at rendezvous).
// - Slurm and MPI give no port: MASTER_PORT must be set, or kDefaultPort is
//   used (torchrun's default); MASTER_ADDR defaults to the first Slurm host,
//   else 127.0.0.1.
// - Safe from any thread; no I/O besides EnvironmentMap (reads environ).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/status.h"

namespace fullburn {

constexpr int kDefaultPort = 29500;

struct RankInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  // Ranks on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
  // SLURM_NTASKS_PER_NODE); the world size when no local rank is given (one
  // node); 0 when unknown.
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultPort;
  std::string launcher;  // torchrun | slurm | mpi | fullburn
};

using EnvMap = std::map<std::string, std::string>;
EnvMap EnvironmentMap();

Result<std::optional<RankInfo>> RankFromEnvironment(const EnvMap& env);

// "gpu[01-04,09],cpu7" -> "gpu01" (Slurm's compressed host list).
Result<std::string> FirstSlurmHost(const std::string& nodelist);

// NCCL refuses two ranks on one GPU ("invalid usage"), as when more ranks
// than GPUs start on a node. Given each rank's GPU identity (its UUID; ""
// for a rank without one), the first two ranks that share a GPU, if any.
std::optional<std::pair<int, int>> FirstSharedGpu(const std::vector<std::string>& gpu_of_rank);

// The environment `fullburn launch` gives local process `local_rank` of a
// node: torchrun's variables, so anything torchrun can start it can start.
struct LaunchPlan {
  int nproc = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultPort;
};
Status CheckLaunchPlan(const LaunchPlan& plan);
std::vector<std::string> LaunchEnvironment(const LaunchPlan& plan, int local_rank);

}  // namespace fullburn
