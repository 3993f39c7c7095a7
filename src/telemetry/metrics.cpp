// The metric catalog: the one place where metric names, units, help texts and
// Prometheus names are defined. Flatten() walks the same table, so a metric
// added here appears in the store, JSON, CSV and Prometheus at once.
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "fullburn/telemetry.h"

namespace fullburn {
namespace {

constexpr double kMiB = 1.0 / (1024.0 * 1024.0);

struct Accessors {
  Value HostSample::*host = nullptr;
  Value CpuShare::*cpu = nullptr;
  Value ProcTreeSample::*proc = nullptr;
  Value GpuSample::*gpu = nullptr;
};

struct Entry {
  MetricDef def;
  Accessors get;
};

Entry Host(const char* s, Value HostSample::*f, const char* unit, const char* help) {
  Entry e{{MetricScope::kHost, s, unit, help, "", 1.0}, {}};
  e.get.host = f;
  return e;
}
Entry Cpu(MetricScope scope, const char* s, Value CpuShare::*f, const char* help) {
  Entry e{{scope, s, "%", help, "", 1.0}, {}};
  e.get.cpu = f;
  return e;
}
Entry Proc(const char* s, Value ProcTreeSample::*f, const char* unit, const char* help) {
  Entry e{{MetricScope::kProc, s, unit, help, "", 1.0}, {}};
  e.get.proc = f;
  return e;
}
Entry Gpu(const char* s, Value GpuSample::*f, const char* unit, const char* help,
          const char* prom = "", double scale = 1.0) {
  Entry e{{MetricScope::kGpu, s, unit, help, prom, scale}, {}};
  e.get.gpu = f;
  return e;
}

const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = [] {
    using H = HostSample;
    using C = CpuShare;
    using P = ProcTreeSample;
    using G = GpuSample;
    const MetricScope kAll = MetricScope::kHostCpu, kCore = MetricScope::kCore;
    return std::vector<Entry>{
        Gpu("util", &G::util, "%", "Time a kernel was running (NVML utilization.gpu)",
            "DCGM_FI_DEV_GPU_UTIL"),
        Gpu("mem_util", &G::mem_util, "%", "Time the memory controller was busy",
            "DCGM_FI_DEV_MEM_COPY_UTIL"),
        Gpu("mem_used_bytes", &G::mem_used_bytes, "bytes", "GPU memory used (exported in MiB)",
            "DCGM_FI_DEV_FB_USED", kMiB),
        Gpu("mem_total_bytes", &G::mem_total_bytes, "bytes", "GPU memory size (exported in MiB)",
            "DCGM_FI_DEV_FB_TOTAL", kMiB),
        Gpu("power_w", &G::power_w, "W", "Power draw", "DCGM_FI_DEV_POWER_USAGE"),
        Gpu("power_limit_w", &G::power_limit_w, "W", "Enforced power limit",
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
        Gpu("temp_c", &G::temp_c, "C", "GPU temperature", "DCGM_FI_DEV_GPU_TEMP"),
        Gpu("sm_clock_mhz", &G::sm_clock_mhz, "MHz", "SM clock", "DCGM_FI_DEV_SM_CLOCK"),
        Gpu("max_sm_clock_mhz", &G::max_sm_clock_mhz, "MHz", "Maximum SM clock",
            "DCGM_FI_DEV_MAX_SM_CLOCK"),
        Gpu("throttle_reasons", &G::throttle_reasons, "bitmask",
            "Clock-event (throttle) reasons, NVML bitmask", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        Gpu("pcie_tx_bytes_per_s", &G::pcie_tx_bytes_per_s, "bytes/s", "PCIe transmit rate",
            "DCGM_FI_PROF_PCIE_TX_BYTES"),
        Gpu("pcie_rx_bytes_per_s", &G::pcie_rx_bytes_per_s, "bytes/s", "PCIe receive rate",
            "DCGM_FI_PROF_PCIE_RX_BYTES"),
        Gpu("proc_mem_used_bytes", &G::proc_mem_used_bytes, "bytes",
            "GPU memory used by the monitored process tree"),
        Gpu("sm_active", &G::sm_active, "%", "SM activity from GPM (exported as a ratio)",
            "DCGM_FI_PROF_SM_ACTIVE", 0.01),
        Gpu("tensor_active", &G::tensor_active, "%",
            "Tensor pipe activity from GPM (exported as a ratio)",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
        Gpu("sm_occupancy", &G::sm_occupancy, "%",
            "Warps resident of the SMs' warp slots, from GPM (exported as a ratio)",
            "DCGM_FI_PROF_SM_OCCUPANCY", 0.01),
        Gpu("tensor_hmma_active", &G::tensor_hmma_active, "%",
            "Tensor pipe activity of 16-bit float matrix math (HMMA: fp16, bf16), from GPM "
            "(exported as a ratio)",
            "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 0.01),
        Gpu("tensor_imma_active", &G::tensor_imma_active, "%",
            "Tensor pipe activity of integer matrix math (IMMA: int8), from GPM (exported as a "
            "ratio)",
            "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", 0.01),
        Gpu("tensor_dfma_active", &G::tensor_dfma_active, "%",
            "Tensor pipe activity of fp64 matrix math (DFMA), from GPM (exported as a ratio)",
            "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", 0.01),
        Gpu("fp16_active", &G::fp16_active, "%",
            "FP16 pipe activity (not tensor cores), from GPM (exported as a ratio)",
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.01),
        Gpu("fp32_active", &G::fp32_active, "%",
            "FP32 pipe activity (CUDA cores: fp32 math outside tensor cores), from GPM (exported "
            "as a ratio)",
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 0.01),
        Gpu("fp64_active", &G::fp64_active, "%",
            "FP64 pipe activity, from GPM (exported as a ratio)", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            0.01),
        Gpu("dram_active", &G::dram_active, "%",
            "DRAM bandwidth used, of its peak, from GPM (exported as a ratio)",
            "DCGM_FI_PROF_DRAM_ACTIVE", 0.01),
        Gpu("held", &G::held, "",
            "1 when a compute process holds a context on the GPU (NVML's process list), else 0"),
        Gpu("held_idle", &G::held_idle, "",
            "1 when held while utilization is under 5%: a job keeps the GPU and runs nothing"),
        Gpu("throttled", &G::throttled, "",
            "1 when a slowdown clock-event reason (power or thermal, below) is set, else 0"),
        Cpu(kAll, "util", &C::util, "CPU busy, all cores (100 = every core busy)"),
        Cpu(kAll, "user", &C::user, "CPU in user mode, all cores"),
        Cpu(kAll, "system", &C::system, "CPU in kernel mode (with irq), all cores"),
        Cpu(kAll, "iowait", &C::iowait, "CPU idle waiting for I/O, all cores"),
        Cpu(kAll, "steal", &C::steal, "CPU stolen by the hypervisor, all cores"),
        Cpu(kCore, "util", &C::util, "CPU busy, one core"),
        Cpu(kCore, "user", &C::user, "CPU in user mode, one core"),
        Cpu(kCore, "system", &C::system, "CPU in kernel mode, one core"),
        Cpu(kCore, "iowait", &C::iowait, "CPU waiting for I/O, one core"),
        Cpu(kCore, "steal", &C::steal, "CPU stolen, one core"),
        Host("mem_total_bytes", &H::mem_total_bytes, "bytes", "Host memory size"),
        Host("mem_used_bytes", &H::mem_used_bytes, "bytes", "Host memory used (total - available)"),
        Host("mem_available_bytes", &H::mem_available_bytes, "bytes", "Host memory available"),
        Host("swap_in_per_s", &H::swap_in_per_s, "pages/s", "Pages swapped in"),
        Host("swap_out_per_s", &H::swap_out_per_s, "pages/s", "Pages swapped out"),
        Host("disk_read_bytes_per_s", &H::disk_read_bytes_per_s, "bytes/s",
             "Disk reads, whole disks"),
        Host("disk_write_bytes_per_s", &H::disk_write_bytes_per_s, "bytes/s",
             "Disk writes, whole disks"),
        Host("net_rx_bytes_per_s", &H::net_rx_bytes_per_s, "bytes/s",
             "Network receive, all but lo"),
        Host("net_tx_bytes_per_s", &H::net_tx_bytes_per_s, "bytes/s",
             "Network transmit, all but lo"),
        Host("load1", &H::load1, "", "Load average, 1 minute"),
        Host("load5", &H::load5, "", "Load average, 5 minutes"),
        Host("load15", &H::load15, "", "Load average, 15 minutes"),
        Host("cpu_quota", &H::cpu_quota, "cpus",
             "CPU quota of the recorder's cgroup (a container's CPU limit: cgroup v2 cpu.max, v1 "
             "cpu.cfs_quota_us); absent without one"),
        Host("cpu_throttled", &H::cpu_throttled, "%",
             "Share of the cgroup's CFS periods in which it was throttled at its quota (cpu.stat "
             "nr_throttled / nr_periods, as cAdvisor's container_cpu_cfs_throttled_periods_total)"),
        Proc("cpu_util", &P::cpu_util, "%", "CPU of the process tree (100 = one core)"),
        Proc("rss_bytes", &P::rss_bytes, "bytes", "Resident memory of the process tree"),
        Proc("threads", &P::threads, "", "Threads in the process tree"),
        Proc("processes", &P::processes, "", "Processes in the process tree"),
    };
  }();
  return entries;
}

void AddCpu(const Entry& e, const CpuShare& share, const std::string& name,
            std::vector<std::pair<std::string, double>>* out) {
  const Value& v = share.*(e.get.cpu);
  if (v) out->emplace_back(name, *v);
}

}  // namespace

const std::vector<MetricDef>& MetricCatalog() {
  static const std::vector<MetricDef> defs = [] {
    std::vector<MetricDef> d;
    for (const Entry& e : Entries()) d.push_back(e.def);
    return d;
  }();
  return defs;
}

std::string RankPrefix(int rank) { return rank > 0 ? "rank" + std::to_string(rank) + "." : ""; }

std::string MetricName(const MetricDef& def, int index, int rank) {
  std::string prefix = RankPrefix(rank);
  std::string i = std::to_string(index);
  switch (def.scope) {
    case MetricScope::kGpu:
      return prefix + "gpu" + i + "." + def.suffix;
    case MetricScope::kCore:
      return prefix + "host.cpu" + i + "." + def.suffix;
    case MetricScope::kProc:
      return prefix + "proc." + def.suffix;
    case MetricScope::kHostCpu:
      return prefix + "host.cpu_" + def.suffix;
    case MetricScope::kHost:
      break;
  }
  return prefix + "host." + def.suffix;
}

namespace {

// "12." at the start of `s` -> 12 and the rest; false otherwise.
bool LeadingIndex(const std::string& s, size_t at, int* value, std::string* rest) {
  size_t end = at;
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  if (end == at || end - at > 6 || end >= s.size() || s[end] != '.') return false;
  *value = std::atoi(s.c_str() + at);
  *rest = s.substr(end + 1);
  return true;
}

}  // namespace

const MetricDef* FindMetric(const std::string& name, int* index, int* rank) {
  int r = 0;
  std::string bare = name;
  if (name.rfind("rank", 0) == 0) {
    // rank0 is never written: rank 0's names are bare.
    if (!LeadingIndex(name, 4, &r, &bare) || r == 0) return nullptr;
  }
  for (const MetricDef& d : MetricCatalog()) {
    int idx = 0;
    std::string rest;
    if (d.scope == MetricScope::kGpu && bare.rfind("gpu", 0) == 0) {
      if (!LeadingIndex(bare, 3, &idx, &rest)) continue;
    } else if (d.scope == MetricScope::kCore && bare.rfind("host.cpu", 0) == 0) {
      if (!LeadingIndex(bare, 8, &idx, &rest)) continue;
    } else if (d.scope == MetricScope::kGpu || d.scope == MetricScope::kCore) {
      continue;
    }
    if (MetricName(d, idx) == bare) {
      if (index) *index = idx;
      if (rank) *rank = r;
      return &d;
    }
  }
  return nullptr;
}

std::vector<std::pair<std::string, double>> Flatten(const Snapshot& s) {
  std::vector<std::pair<std::string, double>> out;
  const std::vector<MetricDef>& defs = MetricCatalog();
  const std::vector<Entry>& entries = Entries();
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    switch (e.def.scope) {
      case MetricScope::kGpu:
        for (const GpuSample& g : s.gpus) {
          const Value& v = g.*(e.get.gpu);
          if (v) out.emplace_back(MetricName(defs[k], g.index, s.rank), *v);
        }
        break;
      case MetricScope::kCore:
        for (size_t c = 0; c < s.host.cores.size(); ++c)
          AddCpu(e, s.host.cores[c], MetricName(defs[k], static_cast<int>(c), s.rank), &out);
        break;
      case MetricScope::kProc:
        if (s.proc) {
          const Value& v = (*s.proc).*(e.get.proc);
          if (v) out.emplace_back(MetricName(defs[k], 0, s.rank), *v);
        }
        break;
      case MetricScope::kHostCpu:
        AddCpu(e, s.host.cpu, MetricName(defs[k], 0, s.rank), &out);
        break;
      case MetricScope::kHost: {
        const Value& v = s.host.*(e.get.host);
        if (v) out.emplace_back(MetricName(defs[k], 0, s.rank), *v);
        break;
      }
    }
  }
  return out;
}

const std::vector<ThrottleFlag>& ThrottleFlags() {
  static const std::vector<ThrottleFlag> flags = {
      {0x1, "gpu_idle", false},
      {0x2, "applications_clocks_setting", false},
      {0x4, "sw_power_cap", true},
      {0x8, "hw_slowdown", true},
      {0x10, "sync_boost", false},
      {0x20, "sw_thermal_slowdown", true},
      {0x40, "hw_thermal_slowdown", true},
      {0x80, "hw_power_brake_slowdown", true},
      {0x100, "display_clock_setting", false},
  };
  return flags;
}

std::vector<std::string> DecodeThrottleReasons(uint64_t mask) {
  std::vector<std::string> names;
  uint64_t known = 0;
  for (const ThrottleFlag& f : ThrottleFlags()) {
    known |= f.bit;
    if (mask & f.bit) names.emplace_back(f.name);
  }
  if (mask & ~known) names.emplace_back("other");
  return names;
}

bool IsThrottled(uint64_t mask) {
  for (const ThrottleFlag& f : ThrottleFlags())
    if (f.slows_down && (mask & f.bit)) return true;
  return false;
}
bool IsPowerThrottled(uint64_t mask) { return mask & (0x4 | 0x80); }
bool IsThermalThrottled(uint64_t mask) { return mask & (0x20 | 0x40); }

}  // namespace fullburn
