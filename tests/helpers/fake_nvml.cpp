// A fake NVML for tests: a shared library exporting the NVML entry points the
// sampler uses, with values scripted per call in a JSON file named by
// $FAKE_NVML_SCRIPT (read again at every nvmlInit). Each scripted metric is a
// list; call k returns element min(k, size-1). "errors" maps a metric to the
// NVML return code its call gives instead. Build variants leave symbols out:
// FAKE_NVML_OLD exports only the old, unversioned names and no PCIe/GPM;
// FAKE_NVML_BROKEN lacks nvmlDeviceGetCount altogether.
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using json = nlohmann::json;
json g_script;
// "gpu index/metric" -> calls so far. The real NVML is thread-safe and
// fullburn calls it from two threads (PCIe throughput has its own), so the
// fake must be too.
std::map<std::string, size_t> g_calls;
std::mutex g_calls_mu;

struct FakeDevice {
  int index;
};
FakeDevice g_devices[16];

struct ProcessInfoV1 {
  unsigned pid;
  unsigned long long used;
};
struct ProcessInfoV2 {
  unsigned pid;
  unsigned long long used;
  unsigned gi, ci;
};
struct GpmSupport {
  unsigned version, supported;
};
struct GpmSampleFake {
  int index;
};
struct GpmMetric {
  unsigned id;
  int ret;
  double value;
  char *a, *b, *c;
};
struct GpmMetricsGet {
  unsigned version, num;
  GpmSampleFake *s1, *s2;
  GpmMetric metrics[210];
};

const json& Gpu(void* dev) { return g_script["gpus"][static_cast<FakeDevice*>(dev)->index]; }

// Error code scripted for this metric on this GPU, else 0.
int ErrorFor(void* dev, const char* metric) {
  const json& g = Gpu(dev);
  if (g.contains("errors") && g["errors"].contains(metric)) return g["errors"][metric].get<int>();
  return 0;
}

// The next scripted value of `metric`, or false when it is not scripted.
bool Next(void* dev, const char* metric, json* out) {
  const json& g = Gpu(dev);
  if (!g.contains(metric)) return false;
  const json& v = g[metric];
  if (!v.is_array()) {
    *out = v;
    return true;
  }
  std::string key = std::to_string(static_cast<FakeDevice*>(dev)->index) + "/" + metric;
  size_t k;
  {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    k = g_calls[key]++;
  }
  *out = v[std::min(k, v.size() - 1)];
  return true;
}

template <typename T>
int Scripted(void* dev, const char* metric, T* out) {
  if (int e = ErrorFor(dev, metric)) return e;
  json v;
  if (!Next(dev, metric, &v)) return 3;  // NVML_ERROR_NOT_SUPPORTED
  *out = v.get<T>();
  return 0;
}

}  // namespace

extern "C" {

#ifdef FAKE_NVML_OLD
int nvmlInit() {
#else
int nvmlInit_v2() {
#endif
  const char* path = std::getenv("FAKE_NVML_SCRIPT");
  if (!path) return 1;  // NVML_ERROR_UNINITIALIZED
  std::ifstream in(path);
  g_script = json::parse(in, nullptr, false);
  g_calls.clear();
  if (g_script.is_discarded()) return 999;
  return g_script.value("init_return", 0);
}

int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int r) { return r == 3 ? "Not Supported" : "Fake Error"; }

int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", g_script.value("driver", "999.99").c_str());
  return 0;
}

#ifndef FAKE_NVML_BROKEN
#ifdef FAKE_NVML_OLD
int nvmlDeviceGetCount(unsigned* n) {
#else
int nvmlDeviceGetCount_v2(unsigned* n) {
#endif
  *n = static_cast<unsigned>(g_script["gpus"].size());
  return 0;
}
#endif

#ifdef FAKE_NVML_OLD
int nvmlDeviceGetHandleByIndex(unsigned i, void** dev) {
#else
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** dev) {
#endif
  if (i >= 16 || i >= g_script["gpus"].size()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  g_devices[i].index = static_cast<int>(i);
  *dev = &g_devices[i];
  return 0;
}

int nvmlDeviceGetName(void* dev, char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", Gpu(dev).value("name", "Fake GPU").c_str());
  return 0;
}
int nvmlDeviceGetUUID(void* dev, char* buf, unsigned len) {
  std::snprintf(buf, len, "%s", Gpu(dev).value("uuid", "GPU-fake").c_str());
  return 0;
}

struct Utilization {
  unsigned gpu, memory;
};
int nvmlDeviceGetUtilizationRates(void* dev, Utilization* u) {
  if (int e = ErrorFor(dev, "util")) return e;
  json a, b;
  if (!Next(dev, "util", &a) || !Next(dev, "mem_util", &b)) return 3;
  u->gpu = a.get<unsigned>();
  u->memory = b.get<unsigned>();
  return 0;
}

struct Memory {
  unsigned long long total, free, used;
};
int nvmlDeviceGetMemoryInfo(void* dev, Memory* m) {
  if (int e = ErrorFor(dev, "mem_used")) return e;
  json used, total;
  if (!Next(dev, "mem_used", &used) || !Next(dev, "mem_total", &total)) return 3;
  m->used = used.get<unsigned long long>();
  m->total = total.get<unsigned long long>();
  m->free = m->total - m->used;
  return 0;
}

int nvmlDeviceGetPowerUsage(void* dev, unsigned* mw) { return Scripted(dev, "power_mw", mw); }
int nvmlDeviceGetEnforcedPowerLimit(void* dev, unsigned* mw) {
  return Scripted(dev, "power_limit_mw", mw);
}
int nvmlDeviceGetTemperature(void* dev, int sensor, unsigned* c) {
  return sensor == 0 ? Scripted(dev, "temp", c) : 2;
}
int nvmlDeviceGetClockInfo(void* dev, int type, unsigned* mhz) {
  return type == 1 ? Scripted(dev, "sm_clock", mhz) : 3;
}
int nvmlDeviceGetMaxClockInfo(void* dev, int type, unsigned* mhz) {
  return type == 1 ? Scripted(dev, "max_sm_clock", mhz) : 3;
}

#ifdef FAKE_NVML_OLD
int nvmlDeviceGetCurrentClocksThrottleReasons(void* dev, unsigned long long* r) {
#else
int nvmlDeviceGetCurrentClocksEventReasons(void* dev, unsigned long long* r) {
#endif
  return Scripted(dev, "throttle", r);
}

}  // extern "C"

namespace {
// The pid scripted as "child": a process whose parent is the caller, that is
// the job `fullburn run` started (0 when there is none yet).
unsigned ChildPid() {
  DIR* proc = opendir("/proc");
  unsigned found = 0;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;  // not a process
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = text.rfind(')');
    char state = 0;
    int ppid = 0;
    if (paren != std::string::npos &&
        std::sscanf(text.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 && ppid == getpid()) {
      found = static_cast<unsigned>(std::strtoul(e->d_name, nullptr, 10));
      break;
    }
  }
  if (proc) closedir(proc);
  return found;
}

template <typename Info>
int Processes(void* dev, unsigned* count, Info* infos) {
  if (int e = ErrorFor(dev, "processes")) return e;
  json list;
  if (!Next(dev, "processes", &list)) return 3;
  if (list.size() > *count) {
    *count = static_cast<unsigned>(list.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  *count = static_cast<unsigned>(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::memset(&infos[i], 0, sizeof(Info));
    const json& pid = list[i]["pid"];
    infos[i].pid = pid == "child" ? ChildPid() : pid.get<unsigned>();
    infos[i].used = list[i]["mem"].get<unsigned long long>();
  }
  return 0;
}

}  // namespace

extern "C" {

#ifdef FAKE_NVML_OLD
int nvmlDeviceGetComputeRunningProcesses(void* dev, unsigned* count, ProcessInfoV1* infos) {
  return Processes(dev, count, infos);
}
#else
int nvmlDeviceGetComputeRunningProcesses_v3(void* dev, unsigned* count, ProcessInfoV2* infos) {
  return Processes(dev, count, infos);
}

int nvmlDeviceGetPcieThroughput(void* dev, int counter, unsigned* kbps) {
  return Scripted(dev, counter == 0 ? "pcie_tx_kbps" : "pcie_rx_kbps", kbps);
}

// The script's key for each GPM metric id the sampler asks for.
static const char* GpmScriptName(unsigned id) {
  switch (id) {
    case 2: return "sm_active";
    case 3: return "sm_occupancy";
    case 5: return "tensor_active";
    case 6: return "tensor_dfma_active";
    case 7: return "tensor_hmma_active";
    case 9: return "tensor_imma_active";
    case 10: return "dram_active";
    case 11: return "fp64_active";
    case 12: return "fp32_active";
    case 13: return "fp16_active";
    case 20: return "gpm_pcie_tx_mibps";
    case 21: return "gpm_pcie_rx_mibps";
    default: return "";
  }
}

// MIG: "mig_instance": N scripts a MIG-enabled GPU whose first MIG device
// is in GPU instance N; GPM then answers only through nvmlGpmMigSampleGet
// for that instance (the whole GPU's sample is refused, as on real MIG).
int nvmlDeviceGetMigMode(void* dev, unsigned* current, unsigned* pending) {
  *current = *pending = Gpu(dev).contains("mig_instance") ? 1 : 0;
  return 0;
}
int nvmlDeviceGetMigDeviceHandleByIndex(void* dev, unsigned i, void** mig) {
  if (!Gpu(dev).contains("mig_instance") || i > 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *mig = dev;  // the instance id is the parent's script
  return 0;
}
int nvmlDeviceGetGpuInstanceId(void* dev, unsigned* id) {
  if (!Gpu(dev).contains("mig_instance")) return 2;
  *id = Gpu(dev)["mig_instance"].get<unsigned>();
  return 0;
}
int nvmlGpmMigSampleGet(void* dev, unsigned instance, GpmSampleFake* s) {
  if (int e = ErrorFor(dev, "gpm_sample")) return e;
  if (!Gpu(dev).contains("mig_instance") || Gpu(dev)["mig_instance"].get<unsigned>() != instance)
    return 2;
  s->index = static_cast<FakeDevice*>(dev)->index;
  return 0;
}

int nvmlGpmQueryDeviceSupport(void* dev, GpmSupport* s) {
  s->supported = Gpu(dev).value("gpm", false) ? 1 : 0;
  return 0;
}
int nvmlGpmSampleAlloc(GpmSampleFake** s) {
  *s = new GpmSampleFake{-1};
  return 0;
}
int nvmlGpmSampleFree(GpmSampleFake* s) {
  delete s;
  return 0;
}
int nvmlGpmSampleGet(void* dev, GpmSampleFake* s) {
  if (int e = ErrorFor(dev, "gpm_sample")) return e;
  if (Gpu(dev).contains("mig_instance")) return 3;  // MIG: per instance only
  s->index = static_cast<FakeDevice*>(dev)->index;
  return 0;
}
int nvmlGpmMetricsGet(GpmMetricsGet* req) {
  if (req->version != 1 || !req->s1 || !req->s2 || req->s1->index < 0) return 2;
  FakeDevice& dev = g_devices[req->s2->index];
  for (unsigned i = 0; i < req->num; ++i) {
    GpmMetric& m = req->metrics[i];
    const char* name = GpmScriptName(m.id);
    json v;
    int scripted_error = *name ? ErrorFor(&dev, name) : 0;
    m.ret = scripted_error ? scripted_error : Next(&dev, name, &v) ? 0 : 3;
    m.value = m.ret == 0 ? v.get<double>() : 0;
  }
  return 0;
}
#endif

}  // extern "C"
