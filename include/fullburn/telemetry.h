// Telemetry: what the machine and the monitored job are doing, sample by sample.
//
// Contract
// - Collectors fill plain structs (HostSample, ProcTreeSample, GpuSample);
//   renderers (report.h) and the store only read them. Every reading is a
//   Value (std::optional<double>): an unsupported or failed metric is absent,
//   never a silent 0. Rates (bytes/s, CPU %) need two readings, so the first
//   sample of a collector has them absent.
// - HostCollector and ProcTreeCollector read /proc through an Env (env.h), so
//   tests replay recorded /proc files. They keep the previous counters and are
//   not thread-safe: one thread calls Collect.
// - GpuSource loads NVML with dlopen at run time (no link-time dependency) and
//   keeps device handles open between samples. No NVML or no GPU makes it
//   unavailable with a one-line reason; host metrics go on regardless. A
//   library named explicitly (FULLBURN_NVML_LIBRARY) that cannot be used is an
//   error, because the user asked for it.
// - Sampler runs the collectors on its own thread every `interval_s` and hands
//   each Snapshot to a callback on that thread. Stop() joins the thread.
// - Metric names ("gpu0.util", "host.cpu_util", ...) are defined once, in the
//   catalog below; docs/metrics.md lists them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/status.h"

namespace fullburn {

using Value = std::optional<double>;

// Shares of CPU time in percent of the time of the CPUs concerned (0-100).
struct CpuShare {
  Value util, user, system, iowait, steal;
};

struct HostSample {
  CpuShare cpu;                 // all cores together
  std::vector<CpuShare> cores;  // cpu0, cpu1, ...
  Value mem_total_bytes, mem_used_bytes, mem_available_bytes;
  Value swap_in_per_s, swap_out_per_s;  // pages per second
  Value disk_read_bytes_per_s, disk_write_bytes_per_s;
  Value net_rx_bytes_per_s, net_tx_bytes_per_s;
  Value load1, load5, load15;
  // The recorder's cgroup CPU quota (a container's limit), in CPUs, and the
  // share of its CFS periods that were throttled: absent without a quota.
  Value cpu_quota, cpu_throttled;
};

// The monitored process and all its descendants (e.g. data-loader workers).
struct ProcTreeSample {
  Value cpu_util;  // percent of one core: 100 = one core busy
  Value rss_bytes, threads, processes;
  std::vector<int> pids;
};

struct GpuProcess {
  int pid = 0;
  Value used_memory_bytes;
  std::string name;
};

// A Prometheus label: name and value.
using PromLabel = std::pair<std::string, std::string>;

struct GpuInfo {
  int index = 0;
  std::string name, uuid;
  // The job holding the GPU now, as Prometheus labels (GpuHolders, for
  // fullburn serve): exported on every series of this GPU. Usually empty.
  std::vector<PromLabel> labels;
  // Why GPM's readings (SM, tensor, pipe and DRAM activity) are not read on
  // this GPU ("" when they are): not supported (before Hopper, MIG without
  // it, an old driver) or refused.
  std::string no_gpm;
};

struct GpuSample {
  int index = 0;
  Value util, mem_util;                   // percent
  Value mem_used_bytes, mem_total_bytes;  // bytes
  Value power_w, power_limit_w, temp_c;
  Value sm_clock_mhz, max_sm_clock_mhz;
  Value throttle_reasons;  // NVML clock-event bitmask
  Value pcie_tx_bytes_per_s, pcie_rx_bytes_per_s;
  Value proc_mem_used_bytes;       // memory of the monitored process tree
  // Percent of the window since the last GPM sample (Hopper and newer; a
  // GPU instance's under MIG): SMs with a warp resident, warps resident of
  // the SMs' slots (occupancy), tensor pipes busy (any, and by kind: HMMA
  // 16-bit floats, IMMA integers, DFMA fp64), the fp16/fp32/fp64 pipes, and
  // DRAM bandwidth used of its peak.
  Value sm_active, tensor_active;
  Value sm_occupancy;
  Value tensor_hmma_active, tensor_imma_active, tensor_dfma_active;
  Value fp16_active, fp32_active, fp64_active;
  Value dram_active;
  // Derived from the readings above, for a cluster's view: 1 or 0, absent
  // when what they rest on is. held: a compute process has a context on the
  // GPU (NVML's process list); held_idle: held while utilization is under
  // kHeldIdleUtilPct; throttled: a slowdown clock-event reason is set.
  Value held, held_idle, throttled;
  std::vector<GpuProcess> processes;
};

// Utilization under which a held GPU counts as idle: the diagnosis's
// gpu_unused threshold (no kernel in 95% of NVML's sample period).
constexpr double kHeldIdleUtilPct = 5;

struct Snapshot {
  double unix_time = 0;
  double mono_time = 0;
  HostSample host;
  std::optional<ProcTreeSample> proc;
  std::vector<GpuSample> gpus;
  // The data-parallel rank that took it: 0 for the monitored job (or rank 0),
  // whose names are bare ("gpu0.util", "proc.cpu_util"); R > 0 prefixes every
  // name with "rankR." ("rank4.host.cpu_util", "rank4.gpu0.util").
  int rank = 0;
};

// ---- Metric catalog -------------------------------------------------------

enum class MetricScope { kHost, kHostCpu, kCore, kProc, kGpu };

struct MetricDef {
  MetricScope scope;
  const char* suffix;  // "util" -> gpuN.util / host.cpu_util etc.
  const char* unit;
  const char* help;
  const char* prom_name;  // DCGM field name for GPU metrics where one exists
  double prom_scale;      // value * prom_scale is exported
};

const std::vector<MetricDef>& MetricCatalog();
// The stored name of a definition for a GPU or core index and the rank that
// sampled it ("gpu3.util", "host.cpu3.user", "rank2.proc.cpu_util",
// "rank4.gpu0.util"; rank 0 has no prefix).
std::string MetricName(const MetricDef& def, int index, int rank = 0);
// "rankR." for R > 0, "" for rank 0: what MetricName puts before a name.
std::string RankPrefix(int rank);
// Finds the definition of a stored name ("rank4.gpu3.util" -> the gpuN.util
// entry), its index (3) and rank (4); nullptr for unknown names.
const MetricDef* FindMetric(const std::string& name, int* index = nullptr, int* rank = nullptr);
// Every valid reading of a snapshot as (name, value).
std::vector<std::pair<std::string, double>> Flatten(const Snapshot& s);

// ---- Clock-event (throttle) reasons ---------------------------------------

struct ThrottleFlag {
  uint64_t bit;
  const char* name;
  bool slows_down;  // counts as throttling (idle and app clocks do not)
};
const std::vector<ThrottleFlag>& ThrottleFlags();
std::vector<std::string> DecodeThrottleReasons(uint64_t mask);
bool IsThrottled(uint64_t mask);
bool IsPowerThrottled(uint64_t mask);
bool IsThermalThrottled(uint64_t mask);

// ---- Collectors -------------------------------------------------------------

class HostCollector {
 public:
  explicit HostCollector(const Env* env) : env_(env) {}
  // Fills what can be read; a file that cannot be read leaves its metrics absent.
  void Collect(HostSample* out);

 private:
  struct CpuTicks {
    uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  };
  struct Counters {
    double time = 0;
    std::vector<CpuTicks> cpus;  // [0] = all, [1..] = cores
    std::optional<uint64_t> swap_in, swap_out, disk_read_sectors, disk_write_sectors, net_rx,
        net_tx;
  };
  void ReadCpu(Counters* c);
  void ReadCounters(Counters* c);
  void ReadMemory(HostSample* out);
  void ReadLoad(HostSample* out);
  void ReadQuota(double now, HostSample* out);
  const Env* env_;
  // The quota is looked up again every few seconds (a limit can change);
  // throttling is the change of cpu.stat's counters since the last sample.
  CpuQuota quota_;
  double quota_checked_ = -1e9;
  std::optional<std::pair<uint64_t, uint64_t>> last_periods_;  // nr_periods, nr_throttled
  std::optional<Counters> last_;
  std::vector<std::string> whole_disks_;
  bool disks_listed_ = false;
};

// A process as /proc/PID/stat tells it: its state letter ('Z': a zombie its
// parent has not reaped) and its start time in clock ticks since boot, which
// tells it from a later process given the same PID. NotFound once it is gone.
struct ProcessIdentity {
  char state = '?';
  uint64_t start_ticks = 0;
};
Result<ProcessIdentity> ReadProcessIdentity(const Env& env, int pid);
// When process `pid` started, in Unix seconds (its start ticks after the
// boot time of /proc/stat); none when it cannot be read.
std::optional<double> ProcessStartTime(const Env& env, int pid);

class ProcTreeCollector {
 public:
  // `adopter_pid` > 0: a subreaper (fullburn run) whose other children are
  // orphans of the tree, adopted when their parent exited: they stay in it.
  ProcTreeCollector(const Env* env, int root_pid, int adopter_pid = -1)
      : env_(env), root_pid_(root_pid), adopter_pid_(adopter_pid) {}
  void Collect(ProcTreeSample* out);

 private:
  struct Key {
    int pid;
    uint64_t start_ticks;  // tells a reused pid apart
    bool operator==(const Key& o) const { return pid == o.pid && start_ticks == o.start_ticks; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>()(k.start_ticks * 4194304u + k.pid);
    }
  };
  const Env* env_;
  int root_pid_;
  int adopter_pid_;
  double last_time_ = -1;
  double last_full_scan_ = -1;
  std::unordered_set<int> outside_;  // pids seen outside the tree
  std::unordered_map<Key, uint64_t, KeyHash> last_ticks_;
};

class NvmlLibrary;  // src/telemetry/nvml_library.h

class GpuSource {
 public:
  // `library` empty: $FULLBURN_NVML_LIBRARY if set, else the system NVML.
  static Result<std::unique_ptr<GpuSource>> Open(std::string library = "");
  ~GpuSource();

  bool available() const { return !gpus_.empty(); }
  const std::string& unavailable_reason() const { return reason_; }
  const std::string& library_path() const { return library_path_; }
  const std::string& driver_version() const { return driver_version_; }
  const std::vector<GpuInfo>& gpus() const { return gpus_; }
  // Reads every GPU. `tree_pids` select the processes whose memory forms
  // proc_mem_used_bytes (empty: that metric is absent).
  std::vector<GpuSample> Collect(const std::vector<int>& tree_pids, double mono_now);

 private:
  struct Device;
  struct PcieReader;
  GpuSource() = default;
  void CollectOne(Device& d, const std::vector<int>& tree_pids, double mono_now, GpuSample* out);
  std::unique_ptr<NvmlLibrary> lib_;
  std::vector<Device> devices_;
  std::unique_ptr<PcieReader> pcie_;
  std::vector<GpuInfo> gpus_;
  std::string reason_, library_path_, driver_version_;
};

// ---- Who holds a GPU ----------------------------------------------------------

// A process as the kernel and its scheduler name it, read from /proc/PID
// (stat, status, environ, cgroup) through an Env, so tests replay recorded
// files. NVML reports host PIDs; a process in a PID namespace of its own (a
// container, `unshare --pid`) has another PID there: the last of ns_pids.
// Empty strings: not known.
struct ProcessOwner {
  int pid = 0;
  std::vector<int> ns_pids;  // `NSpid:`: the pid here first, the innermost namespace's last
  int ppid = 0;
  uint64_t start_ticks = 0;
  double start_unix = 0;    // boot time (/proc/stat btime) + start ticks
  std::string user;         // SLURM_JOB_USER, else the uid's name (/etc/passwd), else "uid N"
  std::string hpc_job;      // SLURM_JOB_ID, else job_<id> in a Slurm cgroup path
  std::string partition;    // SLURM_JOB_PARTITION
  std::string pod_uid;      // ...kubepods...pod<uid>... in the cgroup path
  std::string pod;          // in a pod: POD_NAME, else HOSTNAME (the pod's name)
  std::string kube_namespace;  // POD_NAMESPACE, else the service account's namespace file
};
// NotFound when the process is gone.
Result<ProcessOwner> ReadProcessOwner(const Env& env, int pid);
// The pids of a `NSpid:` line of /proc/PID/status (empty without one).
std::vector<int> ParseNsPids(const std::string& status);
// A Slurm job id or a Kubernetes pod uid from /proc/PID/cgroup's text.
std::string SlurmJobFromCgroup(const std::string& cgroup);
std::string PodUidFromCgroup(const std::string& cgroup);

// A run being recorded on this host, as the store has it: the pid of its
// recorder (fullburn run, train), or of the job `fullburn attach` follows,
// as that process saw it (inside a container: the container's pid).
struct RecordedJob {
  int64_t run = 0;
  int pid = 0;
  double start_time = 0;  // Unix seconds: the run's start
  bool attached = false;
  // The recorder's own start (RunInfo::recorder_start): a process matches
  // only if it started then. Absent (runs recorded before schema v5): the
  // window of kRecorderStartSlackS before the run's start.
  std::optional<double> recorder_start;
};

// The labels of the job holding each GPU, for every series of that GPU:
// `run` (a recorded run whose recorder is the holding process or one of its
// ancestors, or whose attached pid is), `hpc_job`, `user`, `partition`
// (Slurm), `namespace`, `pod` (Kubernetes). A GPU held by several processes
// is labelled with the one using the most memory. A recorder's pid is
// matched on the host's pid and on the innermost namespace's, and only when
// that process started before its run (a recorder at most
// kRecorderStartSlackS before): a reused pid, or a container's pid 1 against
// the host's init, never matches. Not thread-safe: one caller at a time.
class GpuHolders {
 public:
  static constexpr double kRecorderStartSlackS = 300;
  explicit GpuHolders(const Env* env) : env_(env) {}
  // One list of labels per GPU, in the order of `gpus` (empty: unknown or free).
  std::vector<std::vector<PromLabel>> Labels(const std::vector<GpuSample>& gpus,
                                         const std::vector<RecordedJob>& runs);

 private:
  const ProcessOwner* Owner(int pid);
  std::string MatchRun(int pid, const std::vector<RecordedJob>& runs);
  const Env* env_;
  std::unordered_map<int, ProcessOwner> owners_;  // this call's reads
};
// The label names GpuHolders sets, in order, with their meaning (docs/metrics.md).
struct LabelDef {
  const char* name;
  const char* meaning;
};
const std::vector<LabelDef>& GpuHolderLabels();

// ---- Sampler ----------------------------------------------------------------

struct SamplerOptions {
  double interval_s = 1.0;
  int root_pid = -1;  // < 0: no process tree
  int adopter_pid = -1;  // > 0: its other children are the tree's orphans (ProcTreeCollector)
  // Host readings (CPU, memory, disks). Off for data-parallel ranks whose
  // host another rank samples: only their own process tree is theirs.
  bool host = true;
  int rank = 0;  // stored in Snapshot::rank
};

// The host's readings (CPU, memory, disks, the cgroup quota) come from
// /proc and /sys below $FULLBURN_HOST_ROOT when it is set: the seam at the
// hardware boundary that end-to-end tests script the host's load through, as
// FULLBURN_NVML_LIBRARY is the GPUs'. The process tree is always read from
// the real /proc (its pids are real).
constexpr const char* kHostRootEnvVar = "FULLBURN_HOST_ROOT";

class Sampler {
 public:
  // `gpus` may be null or unavailable. Both pointers must outlive the Sampler.
  Sampler(const Env* env, GpuSource* gpus, SamplerOptions options);
  ~Sampler();

  // Takes one sample now, on the calling thread (not while the thread runs).
  Snapshot SampleOnce();
  // Samples every interval on a new thread; `on_sample` runs on that thread.
  void Start(std::function<void(const Snapshot&)> on_sample);
  void Stop();
  // The most recent snapshot, if any (any thread).
  std::optional<Snapshot> Latest() const;
  // CPU seconds the sampling thread spent collecting, and samples taken.
  double collect_cpu_seconds() const { return collect_cpu_ns_.load() * 1e-9; }
  uint64_t samples_taken() const { return samples_.load(); }

 private:
  void Loop(std::function<void(const Snapshot&)> on_sample);
  const Env* env_;
  GpuSource* gpus_;
  SamplerOptions options_;
  std::unique_ptr<Env> host_env_;  // $FULLBURN_HOST_ROOT's, when set
  HostCollector host_;
  std::unique_ptr<ProcTreeCollector> tree_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> collect_cpu_ns_{0}, samples_{0};
  mutable std::mutex mu_;
  std::optional<Snapshot> latest_;
  std::mutex wake_mu_;
  std::condition_variable wake_;
};

}  // namespace fullburn
