// The sampling thread. Deadlines advance by a fixed interval from the start,
// so time spent collecting or in the callback does not make samples drift.
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "fullburn/telemetry.h"

namespace fullburn {
namespace {

uint64_t ThreadCpuNanos() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

// NVML lists host PIDs. A recorder in a PID namespace of its own (a
// container) sees none of them as a process: its tree's share of a GPU
// cannot be told, and a sum of 0 would be a guess. (A host PID that happens
// to be some process here still reads 0.)
void ForgetUnmatchable(const Env& env, std::vector<GpuSample>* gpus) {
  for (GpuSample& g : *gpus) {
    if (!g.proc_mem_used_bytes || *g.proc_mem_used_bytes != 0 || g.processes.empty()) continue;
    bool any_here = false;
    for (const GpuProcess& p : g.processes)
      any_here = any_here || ReadProcessIdentity(env, p.pid).ok();
    if (!any_here) g.proc_mem_used_bytes.reset();
  }
}

}  // namespace

namespace {

std::unique_ptr<Env> HostEnvFromEnvironment() {
  const char* root = std::getenv(kHostRootEnvVar);
  if (!root || !*root) return nullptr;
  return std::make_unique<RootedEnv>(root);
}

}  // namespace

Sampler::Sampler(const Env* env, GpuSource* gpus, SamplerOptions options)
    : env_(env),
      gpus_(gpus),
      options_(options),
      host_env_(HostEnvFromEnvironment()),
      host_(host_env_ ? host_env_.get() : env) {
  if (options_.root_pid > 0) tree_.reset(new ProcTreeCollector(env, options_.root_pid, options_.adopter_pid));
}

Sampler::~Sampler() { Stop(); }

Snapshot Sampler::SampleOnce() {
  uint64_t cpu_start = ThreadCpuNanos();
  Snapshot s;
  s.unix_time = env_->UnixSeconds();
  s.mono_time = env_->MonotonicSeconds();
  s.rank = options_.rank;
  if (options_.host) host_.Collect(&s.host);
  std::vector<int> pids;
  if (tree_) {
    ProcTreeSample p;
    tree_->Collect(&p);
    pids = p.pids;
    s.proc = std::move(p);
  }
  if (gpus_ && gpus_->available()) s.gpus = gpus_->Collect(pids, s.mono_time);
  if (!pids.empty()) ForgetUnmatchable(*env_, &s.gpus);
  collect_cpu_ns_ += ThreadCpuNanos() - cpu_start;
  ++samples_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = s;
  }
  return s;
}

void Sampler::Start(std::function<void(const Snapshot&)> on_sample) {
  FB_CHECK(!thread_.joinable());
  stop_ = false;
  thread_ = std::thread(&Sampler::Loop, this, std::move(on_sample));
}

void Sampler::Stop() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<Snapshot> Sampler::Latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void Sampler::Loop(std::function<void(const Snapshot&)> on_sample) {
  using Clock = std::chrono::steady_clock;
  auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.interval_s));
  auto deadline = Clock::now();
  for (;;) {
    Snapshot s = SampleOnce();
    if (on_sample) on_sample(s);
    deadline += interval;
    auto now = Clock::now();
    if (deadline < now) deadline = now;  // fell behind: skip, do not burst
    std::unique_lock<std::mutex> lock(wake_mu_);
    if (wake_.wait_until(lock, deadline, [this] { return stop_.load(); })) return;
  }
}

}  // namespace fullburn
