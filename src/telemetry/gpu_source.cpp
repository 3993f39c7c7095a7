// GPU readings from NVML. Handles are opened once and kept; each Collect()
// reads every metric separately so one unsupported call leaves just its
// metric absent. PCIe throughput calls block for NVML's 20 ms window each, so
// on GPUs without GPM they run on their own thread (as nvtop does) and the
// sampler takes the latest reading.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <thread>

#include "fullburn/telemetry.h"
#include "nvml_library.h"

namespace fullburn {

struct GpuSource::Device {
  nvml::Device handle = nullptr;
  Value max_sm_clock_mhz;
  bool gpm = false;
  int gpm_instance = -1;  // >= 0: MIG is on, GPM reads this GPU instance
  nvml::GpmSample gpm_prev = nullptr, gpm_next = nullptr;
  double gpm_prev_time = -1;
};

struct GpuSource::PcieReader {
  struct Reading {
    Value tx, rx;
    double time = -1;
  };
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::vector<Reading> readings;
  std::thread thread;
};

namespace {

constexpr double kGpmMinInterval = 0.1;  // NVML: GPM samples must be > 100 ms apart
constexpr double kPcieMaxAge = 2.0;      // older PCIe readings are not reported
constexpr int kClockSm = 1;

Value FromUnsigned(nvml::Return (*fn)(nvml::Device, unsigned*), nvml::Device d, double scale) {
  unsigned v = 0;
  if (!fn || fn(d, &v) != nvml::kSuccess) return std::nullopt;
  return v * scale;
}

// Sums the memory of the monitored tree's processes on this GPU. False when
// NVML could not list them.
bool CollectProcesses(const nvml::Api& api, nvml::Device h, const std::vector<int>& tree_pids,
                      GpuSample* g) {
  std::vector<GpuProcess> procs;
  bool ok = false;
  for (unsigned capacity = 64; capacity <= 64 * 1024 && !ok; capacity *= 4) {
    unsigned count = capacity;
    nvml::Return r = nvml::kNotSupported;
    if (api.DeviceGetProcessesV2) {
      std::vector<nvml::ProcessInfoV2> buf(capacity);
      r = api.DeviceGetProcessesV2(h, &count, buf.data());
      for (unsigned i = 0; r == nvml::kSuccess && i < count; ++i)
        procs.push_back({static_cast<int>(buf[i].pid),
                         buf[i].used_gpu_memory == nvml::kUnavailableMemory
                             ? Value()
                             : Value(static_cast<double>(buf[i].used_gpu_memory)),
                         ""});
    } else if (api.DeviceGetProcessesV1) {
      std::vector<nvml::ProcessInfoV1> buf(capacity);
      r = api.DeviceGetProcessesV1(h, &count, buf.data());
      for (unsigned i = 0; r == nvml::kSuccess && i < count; ++i)
        procs.push_back({static_cast<int>(buf[i].pid),
                         buf[i].used_gpu_memory == nvml::kUnavailableMemory
                             ? Value()
                             : Value(static_cast<double>(buf[i].used_gpu_memory)),
                         ""});
    }
    if (r == nvml::kSuccess) ok = true;
    else if (r != nvml::kInsufficientSize) break;
  }
  if (!ok) return false;
  if (!tree_pids.empty()) {
    double sum = 0;
    for (const GpuProcess& p : procs)
      for (int pid : tree_pids)
        if (p.pid == pid && p.used_memory_bytes) sum += *p.used_memory_bytes;
    g->proc_mem_used_bytes = sum;
  }
  g->processes = std::move(procs);
  return true;
}

// The states a cluster's view counts GPU-hours by (GpuSample::held, ...).
void DeriveStates(bool listed, GpuSample* g) {
  if (listed) {
    g->held = g->processes.empty() ? 0 : 1;
    if (g->util) g->held_idle = *g->held == 1 && *g->util < kHeldIdleUtilPct ? 1 : 0;
  }
  if (g->throttle_reasons)
    g->throttled = IsThrottled(static_cast<uint64_t>(*g->throttle_reasons)) ? 1 : 0;
}

// What GPM reads, in request order, and where each value goes. PCIe comes
// in MiB/s and is stored in bytes/s; the rest are percentages.
struct GpmField {
  unsigned id;
  Value GpuSample::*field;
};
constexpr GpmField kGpmFields[] = {
    {nvml::kGpmSmUtil, &GpuSample::sm_active},
    {nvml::kGpmAnyTensorUtil, &GpuSample::tensor_active},
    {nvml::kGpmPcieTx, &GpuSample::pcie_tx_bytes_per_s},
    {nvml::kGpmPcieRx, &GpuSample::pcie_rx_bytes_per_s},
    {nvml::kGpmSmOccupancy, &GpuSample::sm_occupancy},
    {nvml::kGpmHmmaTensorUtil, &GpuSample::tensor_hmma_active},
    {nvml::kGpmImmaTensorUtil, &GpuSample::tensor_imma_active},
    {nvml::kGpmDfmaTensorUtil, &GpuSample::tensor_dfma_active},
    {nvml::kGpmFp16Util, &GpuSample::fp16_active},
    {nvml::kGpmFp32Util, &GpuSample::fp32_active},
    {nvml::kGpmFp64Util, &GpuSample::fp64_active},
    {nvml::kGpmDramBwUtil, &GpuSample::dram_active},
};
constexpr unsigned kGpmFieldCount = sizeof(kGpmFields) / sizeof(kGpmFields[0]);

// Every GPM reading over the window since the previous GPM sample; each
// metric the driver refuses stays absent on its own.
void CollectGpm(const nvml::Api& api, nvml::Device h, int instance, nvml::GpmSample* prev,
                nvml::GpmSample* next, double* prev_time, double now, GpuSample* g) {
  nvml::Return got = instance >= 0 ? api.GpmMigSampleGet(h, static_cast<unsigned>(instance), *next)
                                   : api.GpmSampleGet(h, *next);
  if (got != nvml::kSuccess) return;
  bool have_window = *prev_time >= 0;
  if (have_window) {
    thread_local nvml::GpmMetricsGet req;  // ~10 KB: kept off the stack
    req = nvml::GpmMetricsGet{};
    req.version = nvml::kGpmMetricsGetVersion;
    req.num_metrics = kGpmFieldCount;
    req.sample1 = *prev;
    req.sample2 = *next;
    for (unsigned i = 0; i < kGpmFieldCount; ++i) req.metrics[i].metric_id = kGpmFields[i].id;
    if (api.GpmMetricsGet(&req) == nvml::kSuccess) {
      constexpr double kMiB = 1024.0 * 1024.0;  // GPM reports PCIe in MiB/s
      for (unsigned i = 0; i < kGpmFieldCount; ++i) {
        if (req.metrics[i].nvml_return != nvml::kSuccess) continue;
        bool pcie = kGpmFields[i].id == nvml::kGpmPcieTx || kGpmFields[i].id == nvml::kGpmPcieRx;
        g->*kGpmFields[i].field = req.metrics[i].value * (pcie ? kMiB : 1.0);
      }
    }
  }
  std::swap(*prev, *next);
  *prev_time = now;
}

// With MIG on, the GPU instance GPM can read (the first MIG device's), else
// -1 (MIG off, or its instance cannot be told: the whole GPU is tried).
int MigInstance(const nvml::Api& api, nvml::Device h) {
  unsigned current = 0, pending = 0;
  if (!api.DeviceGetMigMode || api.DeviceGetMigMode(h, &current, &pending) != nvml::kSuccess ||
      current != 1 || !api.DeviceGetMigDeviceHandleByIndex || !api.DeviceGetGpuInstanceId ||
      !api.GpmMigSampleGet)
    return -1;
  nvml::Device mig = nullptr;
  unsigned id = 0;
  if (api.DeviceGetMigDeviceHandleByIndex(h, 0, &mig) != nvml::kSuccess ||
      api.DeviceGetGpuInstanceId(mig, &id) != nvml::kSuccess)
    return -1;
  return static_cast<int>(id);
}

// Opens GPM on a device; "" when its readings can be taken, else why not.
std::string OpenGpm(const nvml::Api& api, const NvmlLibrary& lib, nvml::Device handle,
                    int* instance, nvml::GpmSample* prev, nvml::GpmSample* next) {
  if (!api.GpmQueryDeviceSupport)
    return "this NVML has no GPM (a driver older than R520): update the driver";
  nvml::GpmSupport support{nvml::kGpmSupportVersion, 0};
  if (nvml::Return r = api.GpmQueryDeviceSupport(handle, &support); r != nvml::kSuccess)
    return "NVML refused GPM's support query: " + lib.ErrorString(r);
  if (!support.is_supported_device) return "GPM is not supported on this GPU (Hopper and newer have it)";
  *instance = MigInstance(api, handle);
  if (api.GpmSampleAlloc(prev) != nvml::kSuccess ||
      api.GpmSampleAlloc(next) != nvml::kSuccess)
    return "NVML could not allocate GPM samples";
  // One sample now: a GPU (or MIG instance) that refuses it is said at start,
  // not found out sample by sample.
  nvml::Return r = *instance >= 0
                       ? api.GpmMigSampleGet(handle, static_cast<unsigned>(*instance), *prev)
                       : api.GpmSampleGet(handle, *prev);
  if (r != nvml::kSuccess)
    return (*instance >= 0
                ? "NVML refused a GPM sample of MIG GPU instance " + std::to_string(*instance)
                : std::string("NVML refused a GPM sample")) +
           ": " + lib.ErrorString(r);
  return "";
}

double MonotonicNow() { return Env::Default()->MonotonicSeconds(); }

}  // namespace

Result<std::unique_ptr<GpuSource>> GpuSource::Open(std::string library) {
  bool explicit_library = !library.empty();
  if (!explicit_library) {
    if (const char* env = std::getenv("FULLBURN_NVML_LIBRARY"); env && *env) {
      library = env;
      explicit_library = true;
    }
  }
  std::unique_ptr<GpuSource> src(new GpuSource());
  std::string error;
  src->lib_.reset(NvmlLibrary::Load(library, &error));
  if (!src->lib_) {
    if (explicit_library) return Status::InvalidArgument(error);
    src->reason_ = error;
    return src;
  }
  src->library_path_ = src->lib_->path();
  const nvml::Api& api = src->lib_->api();
  if (nvml::Return r = api.Init(); r != nvml::kSuccess) {
    src->reason_ = "nvmlInit failed: " + src->lib_->ErrorString(r);
    src->lib_.reset();
    return src;
  }
  char driver[96] = {0};
  if (api.SystemGetDriverVersion && api.SystemGetDriverVersion(driver, sizeof driver) == 0)
    src->driver_version_ = driver;
  unsigned count = 0;
  if (nvml::Return r = api.DeviceGetCount(&count); r != nvml::kSuccess) {
    src->reason_ = "nvmlDeviceGetCount failed: " + src->lib_->ErrorString(r);
    return src;
  }
  for (unsigned i = 0; i < count; ++i) {
    Device d;
    if (api.DeviceGetHandleByIndex(i, &d.handle) != nvml::kSuccess) continue;
    GpuInfo info;
    info.index = static_cast<int>(i);
    char buf[96] = {0};
    if (api.DeviceGetName && api.DeviceGetName(d.handle, buf, sizeof buf) == 0) info.name = buf;
    buf[0] = 0;
    if (api.DeviceGetUUID && api.DeviceGetUUID(d.handle, buf, sizeof buf) == 0) info.uuid = buf;
    unsigned mhz = 0;
    if (api.DeviceGetMaxClockInfo && api.DeviceGetMaxClockInfo(d.handle, kClockSm, &mhz) == 0)
      d.max_sm_clock_mhz = mhz;
    info.no_gpm = OpenGpm(api, *src->lib_, d.handle, &d.gpm_instance, &d.gpm_prev, &d.gpm_next);
    d.gpm = info.no_gpm.empty();
    src->devices_.push_back(d);
    src->gpus_.push_back(info);
  }
  if (src->gpus_.empty()) {
    src->reason_ = "NVML found no NVIDIA GPU";
    return src;
  }
  bool need_pcie_thread = false;
  for (const Device& d : src->devices_) need_pcie_thread |= !d.gpm;
  if (api.DeviceGetPcieThroughput && need_pcie_thread) {
    src->pcie_.reset(new PcieReader());
    src->pcie_->readings.resize(src->devices_.size());
    GpuSource* self = src.get();
    src->pcie_->thread = std::thread([self] {
      PcieReader& p = *self->pcie_;
      const nvml::Api& a = self->lib_->api();
      std::unique_lock<std::mutex> lock(p.mu);
      while (!p.stop) {
        for (size_t i = 0; i < self->devices_.size(); ++i) {
          if (self->devices_[i].gpm) continue;
          lock.unlock();
          unsigned t = 0, r = 0;
          nvml::Device h = self->devices_[i].handle;
          bool tx_ok = a.DeviceGetPcieThroughput(h, 0, &t) == nvml::kSuccess;
          bool rx_ok = a.DeviceGetPcieThroughput(h, 1, &r) == nvml::kSuccess;
          double now = MonotonicNow();
          lock.lock();
          PcieReader::Reading& out = p.readings[i];
          out.tx = tx_ok ? Value(t * 1024.0) : std::nullopt;  // NVML reports KB/s
          out.rx = rx_ok ? Value(r * 1024.0) : std::nullopt;
          out.time = now;
        }
        p.cv.wait_for(lock, std::chrono::milliseconds(50), [&p] { return p.stop; });
      }
    });
  }
  return src;
}

GpuSource::~GpuSource() {
  if (pcie_) {
    {
      std::lock_guard<std::mutex> lock(pcie_->mu);
      pcie_->stop = true;
    }
    pcie_->cv.notify_all();
    pcie_->thread.join();
  }
  if (!lib_) return;
  const nvml::Api& api = lib_->api();
  for (Device& d : devices_) {
    if (d.gpm_prev) api.GpmSampleFree(d.gpm_prev);
    if (d.gpm_next) api.GpmSampleFree(d.gpm_next);
  }
  if (api.Shutdown) api.Shutdown();
}

std::vector<GpuSample> GpuSource::Collect(const std::vector<int>& tree_pids, double mono_now) {
  std::vector<GpuSample> out(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    out[i].index = gpus_[i].index;
    CollectOne(devices_[i], tree_pids, mono_now, &out[i]);
    if (pcie_ && !devices_[i].gpm) {
      std::lock_guard<std::mutex> lock(pcie_->mu);
      const PcieReader::Reading& r = pcie_->readings[i];
      if (r.time >= 0 && MonotonicNow() - r.time < kPcieMaxAge) {
        out[i].pcie_tx_bytes_per_s = r.tx;
        out[i].pcie_rx_bytes_per_s = r.rx;
      }
    }
  }
  return out;
}

void GpuSource::CollectOne(Device& d, const std::vector<int>& tree_pids, double mono_now,
                           GpuSample* g) {
  const nvml::Api& api = lib_->api();
  nvml::Device h = d.handle;
  nvml::Utilization u{};
  if (api.DeviceGetUtilizationRates && api.DeviceGetUtilizationRates(h, &u) == 0) {
    g->util = u.gpu;
    g->mem_util = u.memory;
  }
  nvml::Memory m{};
  if (api.DeviceGetMemoryInfo && api.DeviceGetMemoryInfo(h, &m) == 0) {
    g->mem_used_bytes = static_cast<double>(m.used);
    g->mem_total_bytes = static_cast<double>(m.total);
  }
  g->power_w = FromUnsigned(api.DeviceGetPowerUsage, h, 1e-3);  // mW
  g->power_limit_w = FromUnsigned(api.DeviceGetEnforcedPowerLimit, h, 1e-3);
  unsigned v = 0;
  if (api.DeviceGetTemperature && api.DeviceGetTemperature(h, 0, &v) == 0) g->temp_c = v;
  if (api.DeviceGetClockInfo && api.DeviceGetClockInfo(h, kClockSm, &v) == 0) g->sm_clock_mhz = v;
  g->max_sm_clock_mhz = d.max_sm_clock_mhz;
  unsigned long long reasons = 0;
  if (api.DeviceGetClocksEventReasons && api.DeviceGetClocksEventReasons(h, &reasons) == 0)
    g->throttle_reasons = static_cast<double>(reasons);
  DeriveStates(CollectProcesses(api, h, tree_pids, g), g);
  if (d.gpm && (d.gpm_prev_time < 0 || mono_now - d.gpm_prev_time >= kGpmMinInterval))
    CollectGpm(api, h, d.gpm_instance, &d.gpm_prev, &d.gpm_next, &d.gpm_prev_time, mono_now, g);
}

}  // namespace fullburn
