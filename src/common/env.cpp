#include "fullburn/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <thread>

namespace fullburn {

Result<std::string> Env::ReadFile(const std::string& path) const {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::IoError("cannot read " + path + ": " + std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::vector<std::string>> Env::ListDir(const std::string& path) const {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return Status::IoError("cannot list " + path + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

double Env::MonotonicSeconds() const {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

double Env::UnixSeconds() const {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

long Env::ClockTicksPerSecond() const { return ::sysconf(_SC_CLK_TCK); }
long Env::PageSize() const { return ::sysconf(_SC_PAGESIZE); }

const Env* Env::Default() {
  static const Env* env = new Env();
  return env;
}

Result<std::string> RootedEnv::ReadFile(const std::string& path) const {
  return Env::ReadFile(root_ + path);
}

Result<std::vector<std::string>> RootedEnv::ListDir(const std::string& path) const {
  return Env::ListDir(root_ + path);
}

namespace {

// "/a/b" -> "/a/b", "/a", "" (a limit on any ancestor applies too).
std::vector<std::string> SelfAndAncestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    out.push_back(path);
    if (path.empty()) return out;
    // A path without a '/' (a malformed /proc/self/cgroup line) has no
    // parent: substr(0, npos) would return it again, forever.
    size_t slash = path.rfind('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
}

// The first number of a file, 0 for "max", a missing file or no number;
// `second` gets the next word.
double FirstNumber(const Env& env, const std::string& path, std::string* second = nullptr) {
  Result<std::string> text = env.ReadFile(path);
  if (!text.ok()) return 0;
  std::istringstream in(*text);
  std::string first;
  in >> first;
  if (second) in >> *second;
  if (first == "max" || first.empty()) return 0;
  return std::strtod(first.c_str(), nullptr);
}

}  // namespace

CpuQuota FindCpuQuota(const Env& env) {
  CpuQuota tightest;
  Result<std::string> cgroups = env.ReadFile("/proc/self/cgroup");
  if (!cgroups.ok()) return tightest;
  auto take = [&](double quota_us, double period_us, const std::string& dir) {
    if (quota_us <= 0 || period_us <= 0) return;  // -1 (v1) or "max" (v2): no limit
    double cpus = quota_us / period_us;
    if (tightest.cpus == 0 || cpus < tightest.cpus) tightest = {cpus, dir};
  };
  std::istringstream lines(*cgroups);
  for (std::string line; std::getline(lines, line);) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      for (const std::string& dir : SelfAndAncestors(path)) {
        std::string period;
        double quota = FirstNumber(env, "/sys/fs/cgroup" + dir + "/cpu.max", &period);
        take(quota, std::strtod(period.c_str(), nullptr), "/sys/fs/cgroup" + dir);
      }
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      for (const std::string& mount :
           {"/sys/fs/cgroup/" + controllers, std::string("/sys/fs/cgroup/cpu")})
        for (const std::string& dir : SelfAndAncestors(path))
          take(FirstNumber(env, mount + dir + "/cpu.cfs_quota_us"),
               FirstNumber(env, mount + dir + "/cpu.cfs_period_us"), mount + dir);
    }
  }
  return tightest;
}

int RankCpus(const CpuView& cpus, int local_world_size) {
  int quota = cpus.quota > 0 ? cpus.quota : INT_MAX;
  if (cpus.affinity > 0 && cpus.affinity < cpus.machine) return std::min(cpus.affinity, quota);
  int node = std::min(std::max({1, cpus.affinity, cpus.machine}), quota);
  return std::max(1, node / std::max(1, local_world_size));
}

CpuView ReadCpuView(const Env* env) {
  CpuView v;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) v.affinity = CPU_COUNT(&set);
  v.machine = static_cast<int>(std::thread::hardware_concurrency());
  v.quota = CgroupCpuQuota(env);
  return v;
}

int CgroupCpuQuota(const Env* env) {
  double cpus = FindCpuQuota(*env).cpus;
  return cpus > 0 ? std::max(1, static_cast<int>(cpus)) : 0;
}

}  // namespace fullburn
