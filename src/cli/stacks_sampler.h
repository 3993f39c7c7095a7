// fullburn run's stack sampler: py-spy, started beside the job, reading the
// Python stacks of the job's whole process tree (stacks.h reads its file).
//
// Contract
// - One sampler per run, driven from the run's thread: Start after the job
//   is spawned, Finish once its main process has exited (before its
//   leftover processes are ended: py-spy is one of this process's children
//   too). Finish stops py-spy if it has not stopped by itself.
// - py-spy runs non-blocking (it never stops the job's threads: py-spy #872)
//   and at nice 10 (kSamplerNice), in its own process group (a terminal's Ctrl-C is the
//   job's to handle; Finish tells py-spy when to write). Its starter thread
//   then holds it to kSamplerCpuBudget of a core (SIGSTOP/SIGCONT), so its
//   cost is bounded whatever the number of processes it samples.
// - Anything that keeps stacks from being sampled (py-spy absent or too old,
//   Yama's ptrace_scope, a container without CAP_SYS_PTRACE, a Python
//   py-spy cannot read) is one line in `note` and leaves the run as it is.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/stacks.h"
#include "fullburn/store.h"

namespace fullburn::cli {

constexpr double kDefaultStacksRate = 50;  // samples per second per thread
constexpr int kSamplerNice = 10;
// py-spy's CPU is held to this share of one core: past it, py-spy is paused
// (SIGSTOP) until its use falls back under, and its samples thin out. With
// many processes (64 DataLoader workers) py-spy would take a core at 50/s.
constexpr double kSamplerCpuBudget = 0.10;

// py-spy to use: $FULLBURN_PY_SPY, else beside this executable (a pip
// install's bin/), else on PATH, else beside the job's interpreter
// (`command`'s argv[0]); "" when none is found.
std::string FindPySpy(const std::vector<std::string>& command);

// "" when py-spy at `path` will do; else why not, in a few words. Its
// version comes from `py-spy --version`.
std::string PySpyTooOld(const std::string& version_output);

// Why sampling another process of this user would be refused, "" if it
// should not be: Yama's ptrace_scope (read through `env`), for a process
// that is not root.
std::string PtraceRefusal(const Env& env, bool is_root);

struct StacksResult {
  bool sampled = false;
  std::string file;  // py-spy's raw output
  std::string note;  // one line when no stacks came (or some were lost)
  int64_t errors = 0;
  double sampler_cpu_s = 0;  // py-spy's own CPU time (user + system)
  double paused_s = 0;       // py-spy held paused to keep it within kSamplerCpuBudget
};

class StacksSampler {
 public:
  StacksSampler(std::string py_spy, std::string out_file, double rate_hz);
  ~StacksSampler();
  StacksSampler(const StacksSampler&) = delete;
  StacksSampler& operator=(const StacksSampler&) = delete;

  // On a thread of its own: waits for the job to have exec'd, then starts
  // py-spy on it (again, a few times, while py-spy finds no Python yet).
  void Start(pid_t job);
  StacksResult Finish();

  // PR_SET_PTRACER's argument for the job and its workers ($FULLBURN_PTRACER):
  // this process, whose children (py-spy) Yama then admits.
  static std::string PtracerEnv();

 private:
  void Attach();
  bool Launch();
  void HoldToBudget();
  std::string LogTail() const;
  std::string py_spy_, out_, log_;
  double rate_;
  pid_t job_ = -1, spy_ = -1;
  std::string start_note_;
  std::atomic<bool> stopping_{false};
  double paused_s_ = 0;
  std::thread starter_;
};

// fullburn run's part: a sampler for the run when stacks are on and can be
// sampled (else null, with the one line said unless `quiet`), its
// $FULLBURN_PTRACER added to `child_env`.
std::unique_ptr<StacksSampler> PrepareStacks(const Env& env, const std::vector<std::string>& command,
                                             const std::string& store_path, int64_t run_id,
                                             double rate_hz, bool quiet,
                                             std::vector<std::string>* child_env);
// After the job's main process exited: py-spy's samples summarized into
// the run's `stacks` event (its raw file stays beside the store for
// `fullburn runs stacks`); a note when there are none.
void KeepStacks(StacksSampler* sampler, RunStore* store, int64_t run_id, double t, int root_pid,
                double rate_hz, bool quiet);

// Folders of fullburn's own Python files, whose frames are not the job's.
std::vector<std::string> ToolDirs();

}  // namespace fullburn::cli
