// Ranks from launcher environments, and the environment of `fullburn launch`.
#include <unistd.h>

#include <cstdlib>

#include "fullburn/dist.h"

extern char** environ;

namespace fullburn {
namespace {

struct Scheme {
  const char* launcher;
  const char *rank, *size, *local_rank, *local_size;
};
const Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"}};

const std::string* Get(const EnvMap& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

Result<int> NonNegativeInt(const EnvMap& env, const char* name, int lo) {
  const std::string* v = Get(env, name);
  if (!v) return Status::NotFound(name);
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || x < lo || x > 1 << 20)
    return Status::InvalidArgument(std::string(name) + "=" + *v + " is not a valid number (" + std::to_string(lo) +
                                   " to " + std::to_string(1 << 20) + ")");
  return static_cast<int>(x);
}

}  // namespace

EnvMap EnvironmentMap() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::optional<std::pair<int, int>> FirstSharedGpu(const std::vector<std::string>& gpu_of_rank) {
  for (size_t b = 1; b < gpu_of_rank.size(); ++b)
    for (size_t a = 0; a < b; ++a)
      if (!gpu_of_rank[a].empty() && gpu_of_rank[a] == gpu_of_rank[b])
        return std::make_pair(static_cast<int>(a), static_cast<int>(b));
  return std::nullopt;
}

Result<std::string> FirstSlurmHost(const std::string& nodelist) {
  if (nodelist.empty()) return Status::InvalidArgument("SLURM_JOB_NODELIST is empty");
  size_t bracket = nodelist.find('['), comma = nodelist.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  size_t close = nodelist.find(']', bracket);
  if (close == std::string::npos) return Status::InvalidArgument("SLURM_JOB_NODELIST=" + nodelist + " has an unclosed '['");
  std::string first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find_first_of(",-"));
  return nodelist.substr(0, bracket) + first;
}

Result<std::optional<RankInfo>> RankFromEnvironment(const EnvMap& env) {
  for (const Scheme& s : kSchemes) {
    bool any = Get(env, s.rank) || Get(env, s.size);
    if (!any) continue;
    RankInfo info;
    info.launcher = s.launcher;
    Result<int> rank = NonNegativeInt(env, s.rank, 0), size = NonNegativeInt(env, s.size, 1);
    for (const Result<int>* r : {&rank, &size})
      if (!r->ok())
        return r->status().code() == Status::Code::kNotFound
                   ? Status::InvalidArgument(std::string(s.launcher) + " variables are incomplete: " +
                                             r->status().message() + " is not set (set " + s.rank + " and " + s.size +
                                             " together, or neither for one process)")
                   : r->status();
    info.rank = *rank;
    info.world_size = *size;
    if (info.rank >= info.world_size)
      return Status::InvalidArgument(std::string(s.rank) + "=" + std::to_string(info.rank) + " is not below " + s.size +
                                     "=" + std::to_string(info.world_size));
    Result<int> local = NonNegativeInt(env, s.local_rank, 0);
    if (local.ok()) info.local_rank = *local;
    else if (local.status().code() != Status::Code::kNotFound) return local.status();
    else info.local_rank = info.rank;  // one node
    // Only a thread-count default depends on it: a malformed value reads as unknown.
    Result<int> local_size = NonNegativeInt(env, s.local_size, 1);
    info.local_world_size = local_size.ok() ? *local_size : local.ok() ? 0 : info.world_size;
    if (const std::string* nodes = Get(env, "SLURM_JOB_NODELIST"); nodes && info.launcher == "slurm") {
      Result<std::string> host = FirstSlurmHost(*nodes);
      if (!host.ok()) return host.status();
      info.master_addr = *host;
    }
    if (const std::string* addr = Get(env, "MASTER_ADDR")) info.master_addr = *addr;
    Result<int> port = NonNegativeInt(env, "MASTER_PORT", 1);
    if (port.ok()) {
      if (*port > 65535) return Status::InvalidArgument("MASTER_PORT=" + std::to_string(*port) + " is not a TCP port");
      info.master_port = *port;
    } else if (port.status().code() != Status::Code::kNotFound) {
      return port.status();
    } else if (info.launcher == "torchrun" && info.world_size > 1) {
      return Status::InvalidArgument("RANK and WORLD_SIZE are set but MASTER_PORT is not: set MASTER_ADDR and MASTER_PORT "
                                     "(torchrun and fullburn launch do)");
    }
    if (const std::string* by = Get(env, "FULLBURN_LAUNCHER"); by && info.launcher == "torchrun") info.launcher = *by;
    return std::optional<RankInfo>(info);
  }
  return std::optional<RankInfo>();
}

Status CheckLaunchPlan(const LaunchPlan& p) {
  if (p.nproc < 1 || p.nproc > 1024) return Status::InvalidArgument("--nproc must be between 1 and 1024");
  if (p.nnodes < 1) return Status::InvalidArgument("--nnodes must be at least 1");
  if (p.node_rank < 0 || p.node_rank >= p.nnodes)
    return Status::InvalidArgument("--node-rank must be between 0 and --nnodes - 1");
  if (p.nnodes > 1 && p.master_addr.empty())
    return Status::InvalidArgument("several nodes need --master ADDR:PORT (node 0's address)");
  if (p.master_port < 1 || p.master_port > 65535) return Status::InvalidArgument("the master port must be 1..65535");
  return Status::Ok();
}

std::vector<std::string> LaunchEnvironment(const LaunchPlan& p, int local_rank) {
  int rank = p.node_rank * p.nproc + local_rank;
  return {"RANK=" + std::to_string(rank),
          "WORLD_SIZE=" + std::to_string(p.nproc * p.nnodes),
          "LOCAL_RANK=" + std::to_string(local_rank),
          "LOCAL_WORLD_SIZE=" + std::to_string(p.nproc),
          "GROUP_RANK=" + std::to_string(p.node_rank),
          "MASTER_ADDR=" + p.master_addr,
          "MASTER_PORT=" + std::to_string(p.master_port),
          "FULLBURN_LAUNCHER=fullburn"};
}

}  // namespace fullburn
