// Runs the sampler alone (host, process tree of this process, GPUs through
// NVML when present) at a given interval and prints its own CPU time per
// sample as JSON. Used by bench/telemetry_overhead.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <unistd.h>

#include "fullburn/telemetry.h"

int main(int argc, char** argv) {
  double interval = argc > 1 ? std::atof(argv[1]) : 0.1;
  double seconds = argc > 2 ? std::atof(argv[2]) : 10;
  auto gpus = fullburn::GpuSource::Open();
  if (!gpus.ok()) {
    std::fprintf(stderr, "%s\n", gpus.status().message().c_str());
    return 2;
  }
  fullburn::SamplerOptions opts;
  opts.interval_s = interval;
  opts.root_pid = static_cast<int>(::getpid());
  fullburn::Sampler sampler(fullburn::Env::Default(), gpus->get(), opts);
  sampler.Start(nullptr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  sampler.Stop();
  double cpu = sampler.collect_cpu_seconds();
  unsigned long long n = sampler.samples_taken();
  std::printf("{\"samples\": %llu, \"cpu_s\": %.6f, \"cpu_ms_per_sample\": %.4f, \"gpus\": %zu}\n", n,
              cpu, n ? 1e3 * cpu / n : 0.0, (*gpus)->gpus().size());
  return 0;
}
