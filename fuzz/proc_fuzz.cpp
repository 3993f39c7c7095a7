// The /proc and cgroup parsers (host counters, the process tree, a GPU
// holder's owner, the CPU quota) on a made-up host: the input's parts,
// split at "----" lines, are the files below in this order, served by an
// in-memory Env as tests serve recorded trees.
#include <map>

#include "fullburn/env.h"
#include "fullburn/telemetry.h"
#include "fuzz_files.h"

namespace {

const char* const kFiles[] = {
    "/proc/stat",     "/proc/meminfo",   "/proc/vmstat",    "/proc/diskstats",
    "/proc/net/dev",  "/proc/loadavg",   "/proc/self/cgroup", "cpu.max",
    "cpu.stat",       "/proc/42/stat",   "/proc/42/status", "/proc/42/environ",
    "/proc/42/cgroup", "/etc/passwd",    "/proc/43/stat",
};
constexpr size_t kCount = sizeof kFiles / sizeof kFiles[0];

class FuzzEnv : public fullburn::Env {
 public:
  std::map<std::string, std::string> files;
  fullburn::Result<std::string> ReadFile(const std::string& path) const override {
    auto it = files.find(path);
    if (it != files.end()) return it->second;
    // Every cgroup directory the quota walk visits reads the same two files.
    for (const char* leaf : {"cpu.max", "cpu.stat", "cpu.cfs_quota_us", "cpu.cfs_period_us"}) {
      std::string suffix = std::string("/") + leaf;
      if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
        auto f = files.find(leaf[4] == 'c' ? "cpu.max" : leaf);
        if (f != files.end()) return f->second;
      }
    }
    return fullburn::Status::NotFound(path);
  }
  fullburn::Result<std::vector<std::string>> ListDir(const std::string& path) const override {
    if (path == "/proc") return std::vector<std::string>{"42", "43", "self", "x1"};
    if (path == "/sys/block") return std::vector<std::string>{"sda", "nvme0n1", "loop0"};
    return fullburn::Status::NotFound(path);
  }
  double MonotonicSeconds() const override { return now_ += 1.5; }
  double UnixSeconds() const override { return 1.7e9 + now_; }

 private:
  mutable double now_ = 100;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts = fuzz::SplitParts(data, size, kCount);
  FuzzEnv env;
  for (size_t i = 0; i < parts.size(); ++i) env.files[kFiles[i]] = parts[i];

  fullburn::HostCollector host(&env);
  fullburn::HostSample a, b;
  host.Collect(&a);
  host.Collect(&b);  // the second reading turns counters into rates

  fullburn::ProcTreeCollector tree(&env, 42, 43);
  fullburn::ProcTreeSample t1, t2;
  tree.Collect(&t1);
  tree.Collect(&t2);

  (void)fullburn::ReadProcessIdentity(env, 42);
  (void)fullburn::ReadProcessOwner(env, 42);
  (void)fullburn::FindCpuQuota(env);
  if (parts.size() > 10) (void)fullburn::ParseNsPids(parts[10]);
  return 0;
}
