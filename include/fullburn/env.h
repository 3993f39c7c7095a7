// Env: the seam between fullburn and the operating system's files and clocks.
//
// Contract: telemetry reads /proc and /sys only through an Env, so tests can
// run the same parsers on recorded files (RootedEnv) or inject faults (a
// subclass that fails chosen paths). Env::Default() is a process-wide object
// that lives forever; all methods are safe to call from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

class Env {
 public:
  virtual ~Env() = default;

  // Reads a whole (small) file such as /proc/stat.
  virtual Result<std::string> ReadFile(const std::string& path) const;
  // Names of the entries of a directory, without "." and "..".
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) const;
  // Seconds on a clock that never goes backwards.
  virtual double MonotonicSeconds() const;
  // Seconds since the Unix epoch.
  virtual double UnixSeconds() const;
  // Clock ticks per second of /proc/<pid>/stat times, and the page size.
  virtual long ClockTicksPerSecond() const;
  virtual long PageSize() const;

  static const Env* Default();
};

// The tightest CPU quota over this process's cgroups and their ancestors
// (Kubernetes CPU limits, docker --cpus): cgroup v2 cpu.max, v1
// cpu.cfs_quota_us / cpu.cfs_period_us. Inside a container the cgroup path is
// the host's while the container sees its own cgroup at the mount's root: the
// walk up ends there either way. cpus is 0 where there is no quota.
struct CpuQuota {
  double cpus = 0;
  std::string dir;  // the cgroup directory that sets it; its cpu.stat counts throttling
};
CpuQuota FindCpuQuota(const Env& env);

// What this process may run on: its affinity mask (0: unreadable), the
// machine's CPUs, and a CPU quota of its cgroup (Kubernetes limits, docker
// --cpus), rounded down (0: none).
struct CpuView {
  int affinity = 0, machine = 0, quota = 0;
};
CpuView ReadCpuView(const Env* env);
// FindCpuQuota in whole CPUs, rounded down so the threads it allows
// are never throttled (at least 1; 0: no quota).
int CgroupCpuQuota(const Env* env);

// The CPUs one rank should use for its threads. An affinity mask narrower
// than the machine (Slurm's binding, taskset, a cpuset) is the share a
// launcher already gave this rank; otherwise the node's CPUs, or the
// container's quota where lower, are split evenly over its ranks
// (local_world_size 0, unknown, counts as 1).
int RankCpus(const CpuView& cpus, int local_world_size);

// Serves every path from below `root`: "/proc/stat" reads root + "/proc/stat".
// Used by tests to replay /proc recordings; ticks and page size are those of
// the machine the recording was made on.
class RootedEnv : public Env {
 public:
  explicit RootedEnv(std::string root, long ticks = 100, long page_size = 4096)
      : root_(std::move(root)), ticks_(ticks), page_size_(page_size) {}
  Result<std::string> ReadFile(const std::string& path) const override;
  Result<std::vector<std::string>> ListDir(const std::string& path) const override;
  long ClockTicksPerSecond() const override { return ticks_; }
  long PageSize() const override { return page_size_; }

 private:
  std::string root_;
  long ticks_;
  long page_size_;
};

}  // namespace fullburn
