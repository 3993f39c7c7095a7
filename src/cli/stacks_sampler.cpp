// py-spy beside the job (stacks_sampler.h).
#include "stacks_sampler.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "cli.h"
#include "fullburn/store_layout.h"

namespace fullburn::cli {

namespace {

bool Executable(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

std::string Dir(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && Executable(dir + "/" + name)) return dir + "/" + name;
  return "";
}

std::string ReadLink(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// Whether `pid` has exited (and been reaped by its waiter) or is a zombie.
bool Gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z';
}

// Waits up to `timeout_s` for `pid` (our child) to exit: its status, or -1.
// `cpu_s`: the CPU time (user + system) of the process once reaped.
int WaitFor(pid_t pid, double timeout_s, double* cpu_s = nullptr) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    int status = 0;
    struct rusage usage {};
    pid_t r = ::wait4(pid, &status, WNOHANG, &usage);
    if (r == pid) {
      if (cpu_s)
        *cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
      return status;
    }
    if (r < 0) return 0;  // reaped elsewhere
    if (std::chrono::steady_clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string FindPySpy(const std::vector<std::string>& command) {
  if (const char* named = std::getenv("FULLBURN_PY_SPY"); named && *named) return named;
  // Beside this executable, or in the bin/ of a prefix above it: a pip
  // install's venv/bin, from venv/lib/pythonX.Y/site-packages/fullburn/_bin.
  std::string dir = Dir(SelfExecutable());
  if (!dir.empty() && Executable(dir + "/py-spy")) return dir + "/py-spy";
  for (int up = 0; up < 5 && !dir.empty(); ++up) {
    dir = Dir(dir);
    if (Executable(dir + "/bin/py-spy")) return dir + "/bin/py-spy";
  }
  if (std::string found = OnPath("py-spy"); !found.empty()) return found;
  if (!command.empty()) {
    std::string interpreter = command[0].find('/') != std::string::npos ? command[0] : OnPath(command[0]);
    if (!interpreter.empty() && Executable(Dir(interpreter) + "/py-spy")) return Dir(interpreter) + "/py-spy";
  }
  return "";
}

std::string PySpyTooOld(const std::string& version_output) {
  std::smatch m;
  if (!std::regex_search(version_output, m, std::regex(R"((\d+)\.(\d+)\.(\d+))")))
    return "its version could not be read (py-spy --version said \"" +
           version_output.substr(0, version_output.find('\n')) + "\")";
  int major = std::stoi(m[1]), minor = std::stoi(m[2]), patch = std::stoi(m[3]);
  // 0.3.14 reads Python 3.11, the oldest the step hooks' torch 2.x wheels need;
  // and it has every flag used here (--nonblocking, -f raw, --full-filenames).
  if (major == 0 && (minor < 3 || (minor == 3 && patch < 14)))
    return "py-spy " + m.str(0) + " is older than 0.3.14: pip install -U py-spy";
  return "";
}

std::string PtraceRefusal(const Env& env, bool is_root) {
  Result<std::string> scope = env.ReadFile("/proc/sys/kernel/yama/ptrace_scope");
  if (!scope.ok()) return "";  // no Yama: same-user processes may be read
  int value = std::atoi(scope->c_str());
  if (value == 3)
    return "kernel.yama.ptrace_scope is 3: no process may read another's memory (set it to 1, "
           "which needs a reboot)";
  if (value == 2 && !is_root)
    return "kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may read another process "
           "(sysctl kernel.yama.ptrace_scope=1, or run fullburn as root)";
  return "";  // 0, or 1: the job allows fullburn's children (PR_SET_PTRACER)
}

StacksSampler::StacksSampler(std::string py_spy, std::string out_file, double rate_hz)
    : py_spy_(std::move(py_spy)), out_(std::move(out_file)), log_(out_ + ".log"), rate_(rate_hz) {}

StacksSampler::~StacksSampler() {
  if (starter_.joinable()) starter_.join();
  if (spy_ > 0) {
    ::kill(spy_, SIGKILL);
    ::waitpid(spy_, nullptr, 0);
  }
}

std::string StacksSampler::PtracerEnv() { return "FULLBURN_PTRACER=" + std::to_string(::getpid()); }

bool StacksSampler::Launch() {
  std::string rate = std::to_string(static_cast<int>(rate_));
  std::string pid = std::to_string(job_);
  std::vector<std::string> argv = {py_spy_, "record", "--pid", pid, "--subprocesses", "--threads", "--idle",
                                   "--nonblocking", "--full-filenames", "--format", "raw",
                                   "--rate", rate, "--output", out_};
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  pid_t parent = ::getpid();
  pid_t spy = ::fork();
  if (spy < 0) {
    if (log >= 0) ::close(log);
    start_note_ = std::string("cannot start py-spy: ") + std::strerror(errno);
    return false;
  }
  if (spy == 0) {
    // Its own group, so the terminal's Ctrl-C is the job's. No death signal:
    // that fires when the thread that forked it ends; if fullburn dies, the
    // job gets its own and py-spy writes when the job is gone.
    ::setpgid(0, 0);
    if (::getppid() != parent) ::_exit(1);
    // Below the job, not starved by it: at nice 19 (1.5% of a core beside
    // a busy process) py-spy fell seconds behind and missed the workers of
    // a job that kept both cores busy; nice 10 leaves it ~10%, and it takes
    // ~2-5% (its rusage, shown by runs show).
    ::setpriority(PRIO_PROCESS, 0, kSamplerNice);
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (log >= 0) ::close(log);
  spy_ = spy;
  // py-spy that cannot read the job says so and exits at once.
  int status = WaitFor(spy_, 1.5);
  if (status == -1) return true;
  spy_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;  // the job was that short
  start_note_ = WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "cannot run " + py_spy_ : LogTail();
  return false;
}

void StacksSampler::Start(pid_t job) {
  job_ = job;
  starter_ = std::thread([this] { Attach(); });
}

void StacksSampler::Attach() {
  pid_t job = job_;
  // Until exec, the job is a copy of this process: py-spy would find no Python.
  std::string self = ReadLink("/proc/self/exe");
  for (int i = 0; i < 1000 && !Gone(job); ++i) {
    if (ReadLink("/proc/" + std::to_string(job) + "/exe") != self) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A job that has not started its interpreter yet: tried a few times.
  for (int attempt = 0; attempt < 3 && !Gone(job); ++attempt) {
    if (Launch()) {
      HoldToBudget();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

namespace {
// A process's CPU seconds so far (user + system, all its threads); < 0 once gone.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)  // utime and stime are fields 14 and 15
    if (i >= 14) ticks += std::atof(field.c_str());
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
}  // namespace

// A token bucket of CPU time: kSamplerCpuBudget of a core accrues each
// second (up to half a second's worth banked); py-spy using more is stopped
// until the bucket covers it.
void StacksSampler::HoldToBudget() {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  double used_before = CpuSeconds(spy_), bank = 0.05;
  while (!stopping_.load() && spy_ > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    double used = CpuSeconds(spy_);
    if (used < 0) return;  // py-spy is done (the job ended)
    auto now = Clock::now();
    bank = std::min(0.5 * kSamplerCpuBudget + 0.05,
                    bank + kSamplerCpuBudget * std::chrono::duration<double>(now - last).count());
    bank -= used - used_before;
    used_before = used, last = now;
    if (bank >= 0) continue;
    double pause = std::min(1.0, -bank / kSamplerCpuBudget);
    if (::kill(spy_, SIGSTOP) != 0) return;
    for (double waited = 0; waited < pause && !stopping_.load(); waited += 0.05)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(spy_, SIGCONT);
    paused_s_ += std::chrono::duration<double>(Clock::now() - now).count();
    last = Clock::now();
    bank = std::min(0.0, bank + kSamplerCpuBudget * pause);
  }
}

std::string StacksSampler::LogTail() const {
  std::ifstream in(log_);
  std::string line, last;
  while (std::getline(in, line)) {
    // py-spy colours its messages on a terminal: not in a file, but be sure.
    line = std::regex_replace(line, std::regex("\x1b\\[[0-9;]*m"), "");
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (line.empty() || line.rfind("py-spy> You can use", 0) == 0) continue;
    last = line;
  }
  if (last.rfind("Error: ", 0) == 0) last = last.substr(7);
  return last.empty() ? "py-spy exited without a word" : last;
}

StacksResult StacksSampler::Finish() {
  StacksResult r;
  r.file = out_;
  stopping_ = true;
  if (starter_.joinable()) starter_.join();
  r.paused_s = paused_s_;
  if (spy_ > 0) {
    // py-spy stops by itself within a sample of the job's exit; one that
    // waits on the job's leftover workers is told to write.
    int status = WaitFor(spy_, 3, &r.sampler_cpu_s);
    if (status == -1) {
      ::kill(spy_, SIGINT);
      status = WaitFor(spy_, 10, &r.sampler_cpu_s);
    }
    if (status == -1) {
      ::kill(spy_, SIGKILL);
      ::waitpid(spy_, nullptr, 0);
      r.note = "py-spy did not write its samples within 10 s of being told to: no stacks";
    }
    spy_ = -1;
  } else {
    r.note = start_note_.empty() ? "py-spy did not start" : start_note_;
  }
  std::string tail = LogTail();
  std::smatch m;
  if (std::regex_search(tail, m, std::regex(R"(Samples: (\d+) Errors: (\d+))"))) r.errors = std::stoll(m[2]);
  struct stat st {};
  r.sampled = r.note.empty() && ::stat(out_.c_str(), &st) == 0 && st.st_size > 0;
  if (r.note.empty() && !r.sampled) r.note = "py-spy wrote no samples (" + tail + ")";
  return r;
}

}  // namespace fullburn::cli

namespace fullburn::cli {

namespace {

std::string PySpyVersion(const std::string& py_spy) {
  std::string cmd = "'" + py_spy + "' --version 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out;
}

void Note(bool quiet, const std::string& line) {
  if (!quiet) std::fprintf(stderr, "fullburn: no Python stacks: %s (--no-stacks: none asked)\n", line.c_str());
}

}  // namespace

std::vector<std::string> ToolDirs() {
  std::vector<std::string> dirs;
  if (std::string d = PythonDir(); !d.empty()) dirs.push_back(d + "/");
  if (std::string d = PythonPackageDir(); !d.empty()) dirs.push_back(d + "/");
  return dirs;
}

std::unique_ptr<StacksSampler> PrepareStacks(const Env& env, const std::vector<std::string>& command,
                                             const std::string& store_path, int64_t run_id,
                                             double rate_hz, bool quiet,
                                             std::vector<std::string>* child_env) {
  std::string py_spy = FindPySpy(command);
  if (py_spy.empty()) {
    Note(quiet, "py-spy not found (pip install py-spy, or fullburn[stacks]; $FULLBURN_PY_SPY names one)");
    return nullptr;
  }
  std::string version = PySpyVersion(py_spy);
  if (version.empty()) {
    Note(quiet, "cannot run " + py_spy);
    return nullptr;
  }
  if (std::string old = PySpyTooOld(version); !old.empty()) {
    Note(quiet, py_spy + ": " + old);
    return nullptr;
  }
  if (std::string refused = PtraceRefusal(env, ::geteuid() == 0); !refused.empty()) {
    Note(quiet, refused);
    return nullptr;
  }
  std::string file = StoreLayout(store_path).Stacks(run_id);
  std::string dir = file.substr(0, file.rfind('/'));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    Note(quiet, "cannot make " + dir + ": " + std::strerror(errno));
    return nullptr;
  }
  child_env->push_back(StacksSampler::PtracerEnv());
  return std::make_unique<StacksSampler>(py_spy, file, rate_hz);
}

void KeepStacks(StacksSampler* sampler, RunStore* store, int64_t run_id, double t, int root_pid,
                double rate_hz, bool quiet) {
  if (!sampler) return;
  StacksResult r = sampler->Finish();
  // py-spy that read no stack whole (each one deeper than it reads, say)
  // still counted its tries: that count is kept, so `runs show` says why
  // this run has no stacks.
  bool only_errors = !r.sampled && r.errors > 0 && r.note.rfind("py-spy wrote no samples", 0) == 0;
  if (!r.sampled) Note(quiet, r.note);
  if (!r.sampled && !only_errors) return;
  StackSummary summary;
  summary.rate_hz = rate_hz;
  if (r.sampled) {
    std::ifstream in(r.file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    int64_t bad = 0;
    std::vector<StackSample> samples = ParseFoldedStacks(text.str(), &bad);
    summary = SummarizeStacks(samples, root_pid, rate_hz, ToolDirs());
    summary.bad_lines = bad;
  }
  summary.errors = r.errors;
  summary.sampler_cpu_s = r.sampler_cpu_s;
  summary.sampler_paused_s = r.paused_s;
  summary.duration_s = t;
  if (summary.empty() && !only_errors) {
    Note(quiet, "py-spy's file " + r.file + " holds no stack");
    return;
  }
  Status s = store->AddEvent(run_id, {t, kStacksEvent, StackSummaryJson(summary).dump()});
  if (!s.ok() && !quiet)
    std::fprintf(stderr, "fullburn: the stacks' summary was not stored (%s); %s keeps them\n",
                 s.message().c_str(), r.file.c_str());
}

}  // namespace fullburn::cli
