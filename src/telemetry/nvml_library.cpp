#include "nvml_library.h"

#include <dlfcn.h>

#include <initializer_list>

namespace fullburn {
namespace {

// Resolves the first of `names` that the library exports.
template <typename Fn>
bool Resolve(void* handle, Fn* fn, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* sym = ::dlsym(handle, name)) {
      *fn = reinterpret_cast<Fn>(sym);
      return true;
    }
  }
  return false;
}

}  // namespace

NvmlLibrary::~NvmlLibrary() {
  if (handle_) ::dlclose(handle_);
}

NvmlLibrary* NvmlLibrary::Load(const std::string& path, std::string* error) {
  // The unversioned .so is often missing in containers, so try .so.1 first.
  std::initializer_list<const char*> defaults = {"libnvidia-ml.so.1", "libnvidia-ml.so"};
  void* handle = nullptr;
  std::string used;
  if (!path.empty()) {
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    used = path;
  } else {
    for (const char* name : defaults) {
      if ((handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
        used = name;
        break;
      }
    }
  }
  if (!handle) {
    const char* why = ::dlerror();
    *error = path.empty() ? "NVML (libnvidia-ml.so.1) not found, so no NVIDIA driver is installed"
                          : "cannot load NVML library " + path + ": " + (why ? why : "unknown error");
    return nullptr;
  }
  auto* lib = new NvmlLibrary();
  lib->handle_ = handle;
  lib->path_ = used;
  nvml::Api& a = lib->api_;
  bool core = Resolve(handle, &a.Init, {"nvmlInit_v2", "nvmlInit"}) &&
              Resolve(handle, &a.DeviceGetCount, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}) &&
              Resolve(handle, &a.DeviceGetHandleByIndex,
                      {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  if (!core) {
    *error = "NVML library " + used +
             " lacks nvmlInit, nvmlDeviceGetCount or nvmlDeviceGetHandleByIndex: it is not a usable "
             "NVML; point FULLBURN_NVML_LIBRARY at the driver's libnvidia-ml.so.1 or unset it";
    delete lib;
    return nullptr;
  }
  Resolve(handle, &a.Shutdown, {"nvmlShutdown"});
  Resolve(handle, &a.ErrorString, {"nvmlErrorString"});
  Resolve(handle, &a.SystemGetDriverVersion, {"nvmlSystemGetDriverVersion"});
  Resolve(handle, &a.DeviceGetName, {"nvmlDeviceGetName"});
  Resolve(handle, &a.DeviceGetUUID, {"nvmlDeviceGetUUID"});
  Resolve(handle, &a.DeviceGetUtilizationRates, {"nvmlDeviceGetUtilizationRates"});
  Resolve(handle, &a.DeviceGetMemoryInfo, {"nvmlDeviceGetMemoryInfo"});
  Resolve(handle, &a.DeviceGetPowerUsage, {"nvmlDeviceGetPowerUsage"});
  Resolve(handle, &a.DeviceGetEnforcedPowerLimit, {"nvmlDeviceGetEnforcedPowerLimit"});
  Resolve(handle, &a.DeviceGetTemperature, {"nvmlDeviceGetTemperature"});
  Resolve(handle, &a.DeviceGetClockInfo, {"nvmlDeviceGetClockInfo"});
  Resolve(handle, &a.DeviceGetMaxClockInfo, {"nvmlDeviceGetMaxClockInfo"});
  Resolve(handle, &a.DeviceGetClocksEventReasons,
          {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  Resolve(handle, &a.DeviceGetPcieThroughput, {"nvmlDeviceGetPcieThroughput"});
  if (!Resolve(handle, &a.DeviceGetProcessesV2,
               {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"}))
    Resolve(handle, &a.DeviceGetProcessesV1, {"nvmlDeviceGetComputeRunningProcesses"});
  bool gpm = Resolve(handle, &a.GpmQueryDeviceSupport, {"nvmlGpmQueryDeviceSupport"}) &&
             Resolve(handle, &a.GpmSampleAlloc, {"nvmlGpmSampleAlloc"}) &&
             Resolve(handle, &a.GpmSampleFree, {"nvmlGpmSampleFree"}) &&
             Resolve(handle, &a.GpmSampleGet, {"nvmlGpmSampleGet"}) &&
             Resolve(handle, &a.GpmMetricsGet, {"nvmlGpmMetricsGet"});
  if (!gpm) a.GpmQueryDeviceSupport = nullptr;  // GPM needs all five
  Resolve(handle, &a.DeviceGetMigMode, {"nvmlDeviceGetMigMode"});
  Resolve(handle, &a.DeviceGetMigDeviceHandleByIndex, {"nvmlDeviceGetMigDeviceHandleByIndex"});
  Resolve(handle, &a.DeviceGetGpuInstanceId, {"nvmlDeviceGetGpuInstanceId"});
  Resolve(handle, &a.GpmMigSampleGet, {"nvmlGpmMigSampleGet"});
  return lib;
}

std::string NvmlLibrary::ErrorString(nvml::Return r) const {
  const char* s = api_.ErrorString ? api_.ErrorString(r) : nullptr;
  return (s ? std::string(s) : std::string("error")) + " (NVML code " + std::to_string(r) + ")";
}

}  // namespace fullburn
