// Test double at the hardware boundary: a host whose load the test sets.
//
// A finding that rests on the host's CPU ("cores to spare", "CPU saturated")
// must not depend on what else runs on the machine while CTest runs tests
// side by side. ScriptedHost writes a /proc below a folder of its own and
// points fullburn's host readings at it ($FULLBURN_HOST_ROOT, read by every
// Sampler): /proc/stat's counters advance, on a thread, with exactly the
// busy share the test asks for on the number of CPUs it asks for, so the
// utilisation fullburn computes from any two readings is that share whatever
// the real machine's load and however late its sampler runs. Memory, load
// average and the rest are a recording (tests/telemetry/fixtures/t0).
// The process tree and the GPUs are not touched: the job's pids are real.
#pragma once

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "fullburn/telemetry.h"
#include "replay_env.h"

namespace fullburn::testing {

class ScriptedHost {
 public:
  // `busy_share` of every one of `cpus` CPUs is user time, `iowait_share`
  // waits on storage, the rest is idle.
  ScriptedHost(const std::string& dir, int cpus, double busy_share, double iowait_share = 0)
      : root_(dir + "/host"), cpus_(cpus), busy_share_(busy_share), iowait_share_(iowait_share) {
    namespace fs = std::filesystem;
    fs::create_directories(root_ + "/proc");
    for (const char* name : {"meminfo", "loadavg", "vmstat"})
      fs::copy_file(Recording(0) + "/proc/" + name, root_ + "/proc/" + name,
                    fs::copy_options::overwrite_existing);
    Write();
    ::setenv(kHostRootEnvVar, root_.c_str(), 1);
    thread_ = std::thread([this] {
      while (!stop_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        Write();
      }
    });
  }
  ~ScriptedHost() {
    stop_ = true;
    thread_.join();
    ::unsetenv(kHostRootEnvVar);
  }

 private:
  // Every write advances each CPU by 100 ticks, busy_share of them user time;
  // written whole to a new file and renamed, so a reader never sees half.
  void Write() {
    tick_ += 100;
    uint64_t user = static_cast<uint64_t>(tick_ * busy_share_);
    uint64_t iowait = static_cast<uint64_t>(tick_ * iowait_share_);
    uint64_t idle = tick_ - user - iowait;
    // user nice system idle iowait irq softirq steal guest guest_nice
    auto line = [&](const std::string& name, uint64_t times) {
      return name + " " + std::to_string(user * times) + " 0 0 " + std::to_string(idle * times) +
             " " + std::to_string(iowait * times) + " 0 0 0 0 0\n";
    };
    std::string text = line("cpu", cpus_);
    for (int i = 0; i < cpus_; ++i) text += line("cpu" + std::to_string(i), 1);
    std::string tmp = root_ + "/proc/stat.tmp";
    std::ofstream(tmp) << text;
    std::rename(tmp.c_str(), (root_ + "/proc/stat").c_str());
  }

  std::string root_;
  int cpus_;
  double busy_share_, iowait_share_;
  uint64_t tick_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fullburn::testing
