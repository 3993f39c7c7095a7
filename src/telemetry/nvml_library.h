// Our own minimal NVML declarations and the dlopen'd function table.
// No nvml.h is needed to build: like nvtop and btop we declare just the
// types we use, with layouts as in NVIDIA's public header. Each function is
// resolved with versioned fallbacks; a symbol that is missing leaves its
// pointer null and disables the metrics it feeds, nothing more.
#pragma once

#include <string>

namespace fullburn {
namespace nvml {

using Return = int;  // nvmlReturn_t: 0 = success
constexpr Return kSuccess = 0;
constexpr Return kNotSupported = 3;
constexpr Return kInsufficientSize = 7;
using Device = struct DeviceOpaque*;
using GpmSample = struct GpmSampleOpaque*;

struct Utilization {
  unsigned gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
// nvmlProcessInfo_v1_t: what nvmlDeviceGetComputeRunningProcesses (no suffix) fills.
struct ProcessInfoV1 {
  unsigned pid;
  unsigned long long used_gpu_memory;
};
// nvmlProcessInfo_t / _v2_t: filled by the _v2 and _v3 entry points.
struct ProcessInfoV2 {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
struct GpmSupport {
  unsigned version, is_supported_device;
};
constexpr int kGpmMetricMax = 210;
struct GpmMetric {
  unsigned metric_id;
  Return nvml_return;
  double value;
  struct {
    char *short_name, *long_name, *unit;
  } info;
};
struct GpmMetricsGet {
  unsigned version, num_metrics;
  GpmSample sample1, sample2;
  GpmMetric metrics[kGpmMetricMax];
};
constexpr unsigned kGpmSupportVersion = 1;
constexpr unsigned kGpmMetricsGetVersion = 1;
constexpr unsigned kGpmSmUtil = 2;          // NVML_GPM_METRIC_SM_UTIL
constexpr unsigned kGpmSmOccupancy = 3;     // NVML_GPM_METRIC_SM_OCCUPANCY
constexpr unsigned kGpmAnyTensorUtil = 5;   // NVML_GPM_METRIC_ANY_TENSOR_UTIL
constexpr unsigned kGpmDfmaTensorUtil = 6;  // NVML_GPM_METRIC_DFMA_TENSOR_UTIL
constexpr unsigned kGpmHmmaTensorUtil = 7;  // NVML_GPM_METRIC_HMMA_TENSOR_UTIL
constexpr unsigned kGpmImmaTensorUtil = 9;  // NVML_GPM_METRIC_IMMA_TENSOR_UTIL
constexpr unsigned kGpmDramBwUtil = 10;     // NVML_GPM_METRIC_DRAM_BW_UTIL
constexpr unsigned kGpmFp64Util = 11;       // NVML_GPM_METRIC_FP64_UTIL
constexpr unsigned kGpmFp32Util = 12;       // NVML_GPM_METRIC_FP32_UTIL
constexpr unsigned kGpmFp16Util = 13;       // NVML_GPM_METRIC_FP16_UTIL
constexpr unsigned kGpmPcieTx = 20;         // NVML_GPM_METRIC_PCIE_TX_PER_SEC (MiB/s)
constexpr unsigned kGpmPcieRx = 21;         // NVML_GPM_METRIC_PCIE_RX_PER_SEC (MiB/s)

constexpr unsigned long long kUnavailableMemory = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

struct Api {
  Return (*Init)() = nullptr;
  Return (*Shutdown)() = nullptr;
  const char* (*ErrorString)(Return) = nullptr;
  Return (*SystemGetDriverVersion)(char*, unsigned) = nullptr;
  Return (*DeviceGetCount)(unsigned*) = nullptr;
  Return (*DeviceGetHandleByIndex)(unsigned, Device*) = nullptr;
  Return (*DeviceGetName)(Device, char*, unsigned) = nullptr;
  Return (*DeviceGetUUID)(Device, char*, unsigned) = nullptr;
  Return (*DeviceGetUtilizationRates)(Device, Utilization*) = nullptr;
  Return (*DeviceGetMemoryInfo)(Device, Memory*) = nullptr;
  Return (*DeviceGetPowerUsage)(Device, unsigned*) = nullptr;
  Return (*DeviceGetEnforcedPowerLimit)(Device, unsigned*) = nullptr;
  Return (*DeviceGetTemperature)(Device, int, unsigned*) = nullptr;
  Return (*DeviceGetClockInfo)(Device, int, unsigned*) = nullptr;
  Return (*DeviceGetMaxClockInfo)(Device, int, unsigned*) = nullptr;
  Return (*DeviceGetClocksEventReasons)(Device, unsigned long long*) = nullptr;
  Return (*DeviceGetPcieThroughput)(Device, int, unsigned*) = nullptr;
  // Running processes: exactly one of these two is set, by symbol version.
  Return (*DeviceGetProcessesV2)(Device, unsigned*, ProcessInfoV2*) = nullptr;
  Return (*DeviceGetProcessesV1)(Device, unsigned*, ProcessInfoV1*) = nullptr;
  Return (*GpmQueryDeviceSupport)(Device, GpmSupport*) = nullptr;
  Return (*GpmSampleAlloc)(GpmSample*) = nullptr;
  Return (*GpmSampleFree)(GpmSample) = nullptr;
  Return (*GpmSampleGet)(Device, GpmSample) = nullptr;
  Return (*GpmMetricsGet)(GpmMetricsGet*) = nullptr;
  // MIG: GPM reads a GPU instance of a MIG-enabled GPU (its id from the
  // first MIG device), where the whole GPU's sample is refused.
  Return (*DeviceGetMigMode)(Device, unsigned*, unsigned*) = nullptr;
  Return (*DeviceGetMigDeviceHandleByIndex)(Device, unsigned, Device*) = nullptr;
  Return (*DeviceGetGpuInstanceId)(Device, unsigned*) = nullptr;
  Return (*GpmMigSampleGet)(Device, unsigned, GpmSample) = nullptr;
};

}  // namespace nvml

// A loaded NVML: the handle from dlopen and the resolved function table.
class NvmlLibrary {
 public:
  ~NvmlLibrary();
  // Loads `path` (or the system NVML when empty). On failure returns null and
  // sets *error to a one-line reason.
  static NvmlLibrary* Load(const std::string& path, std::string* error);
  const nvml::Api& api() const { return api_; }
  const std::string& path() const { return path_; }
  std::string ErrorString(nvml::Return r) const;

 private:
  void* handle_ = nullptr;
  std::string path_;
  nvml::Api api_;
};

}  // namespace fullburn
