#include "child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>

#include "fullburn/env.h"

namespace fullburn::cli {
namespace {

// Every started child (fullburn launch starts several); 0 marks a free slot.
// Atomics, not volatile: the signal handler, the main thread and launch's
// grace-period thread all read them. Lock-free ones are async-signal-safe.
constexpr int kMaxChildren = 1024;
std::atomic<pid_t> g_children[kMaxChildren] = {};
static_assert(std::atomic<pid_t>::is_always_lock_free, "used in a signal handler");
volatile sig_atomic_t g_pending = 0;
volatile sig_atomic_t g_received = 0;

bool AnyChild() {
  for (int i = 0; i < kMaxChildren; ++i)
    if (g_children[i] > 0) return true;
  return false;
}

// fullburn's own helpers (SpawnHelper): not the job's, so never its leftovers;
// a helper reaped by ReapExited leaves its exit code here for WaitHelper.
constexpr int kMaxHelpers = 8;
std::atomic<pid_t> g_helpers[kMaxHelpers] = {};
std::atomic<int> g_helper_codes[kMaxHelpers] = {};

int HelperSlot(pid_t pid) {
  for (int i = 0; i < kMaxHelpers; ++i)
    if (g_helpers[i] == pid) return i;
  return -1;
}

void Remember(pid_t pid) {
  for (int i = 0; i < kMaxChildren; ++i) {
    pid_t free_slot = 0;
    if (g_children[i].compare_exchange_strong(free_slot, pid)) return;
  }
}

void Forget(pid_t pid) {
  for (int i = 0; i < kMaxChildren; ++i) {
    pid_t slot = pid;
    g_children[i].compare_exchange_strong(slot, 0);
  }
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}
const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

}  // namespace
void SignalChildren(int sig);
namespace {

void Forward(int sig, siginfo_t* info, void*) {
  int saved_errno = errno;  // kill() below may set it under the interrupted code
  g_received = sig;
  // SI_KERNEL: the terminal sent it to the whole process group, child included.
  if (!info || info->si_code != SI_KERNEL) {
    if (AnyChild())
      SignalChildren(sig);
    else
      g_pending = sig;
  }
  errno = saved_errno;
}

}  // namespace

void SignalChildren(int sig) {
  for (int i = 0; i < kMaxChildren; ++i)
    if (pid_t pid = g_children[i].load(); pid > 0) ::kill(pid, sig);
}

void InstallSignalForwarding() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = Forward;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : kForwarded) ::sigaction(sig, &sa, nullptr);
}

int ReceivedSignal() { return g_received; }

Result<pid_t> SpawnChild(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                         const std::string& output_path) {
  if (argv.empty()) return Status::InvalidArgument("no command given: use fullburn run -- CMD ARGS...");
  int out = -1;
  if (!output_path.empty()) {
    out = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) return Status::IoError("cannot write " + output_path + ": " + std::strerror(errno));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    if (out >= 0) ::close(out);
    return Status::IoError(std::string("cannot create a pipe: ") + std::strerror(errno));
  }
  pid_t parent = ::getpid();
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Built before fork: between fork and exec only async-signal-safe calls.
  std::vector<std::string> env_strings;
  // extra_env replaces a variable of the same name: with both, C's getenv
  // would read the first and Python's os.environ the last.
  auto overridden = [&](const char* kv) {
    for (const std::string& extra : extra_env) {
      size_t eq = extra.find('=');
      if (eq != std::string::npos && std::strncmp(kv, extra.c_str(), eq + 1) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e; ++e)
    if (!overridden(*e)) env_strings.emplace_back(*e);
  for (const std::string& kv : extra_env) env_strings.push_back(kv);
  std::vector<char*> envp;
  for (const std::string& kv : env_strings) envp.push_back(const_cast<char*>(kv.c_str()));
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (out >= 0) ::close(out);
    return Status::IoError(std::string("cannot fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);  // fullburn died before prctl
    // Under Yama's ptrace_scope=1, fullburn's children (the stack sampler,
    // py-spy) may then read the job, as fullburn itself, its parent, may.
    ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    ::execvpe(args[0], args.data(), envp.data());
    int err = errno;
    ssize_t ignored = ::write(fds[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  ::close(fds[1]);
  if (out >= 0) ::close(out);
  int err = 0;
  ssize_t n;
  do {
    n = ::read(fds[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(fds[0]);
  if (n == sizeof err) {
    ::waitpid(pid, nullptr, 0);
    std::string hint = err == ENOENT ? "check the command name and PATH"
                       : err == EACCES ? "check that the file is executable"
                                       : "check the command";
    return Status::NotFound("cannot start '" + argv[0] + "': " + std::strerror(err) + "; " + hint);
  }
  Remember(pid);
  if (g_pending) ::kill(pid, g_pending);
  return pid;
}

int WaitChild(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 1;
  }
  Forget(pid);
  return ExitCodeOf(status);
}

int WaitChildFor(pid_t pid, double timeout_s, bool* timed_out) {
  *timed_out = false;
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  double stop_at = timeout_s, kill_at = timeout_s + 10;  // SIGTERM, then 10 s to finish
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return 1;
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = static_cast<double>(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) * 1e-9;
    if (elapsed >= kill_at) {
      ::kill(pid, SIGKILL);
      kill_at = 1e300;
    } else if (elapsed >= stop_at) {
      *timed_out = true;
      ::kill(pid, SIGTERM);
      stop_at = 1e300;
    }
    ::usleep(20000);
  }
  Forget(pid);
  return ExitCodeOf(status);
}

std::pair<pid_t, int> WaitAnyChild() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, 0)) < 0) {
    if (errno != EINTR) return {-1, 1};
  }
  Forget(pid);
  return {pid, ExitCodeOf(status)};
}

void BecomeSubreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

namespace {

// The parent pid from /proc/<pid>/stat, counted from the last ')' (the
// command name may hold spaces and parentheses); -1 if it is gone.
pid_t ParentOf(const Env& env, const std::string& pid) {
  Result<std::string> text = env.ReadFile("/proc/" + pid + "/stat");
  if (!text.ok()) return -1;
  size_t close = text->rfind(')');
  if (close == std::string::npos || close + 4 >= text->size()) return -1;
  return static_cast<pid_t>(std::atol(text->c_str() + close + 4));  // ") S PPID"
}

bool IsZombie(pid_t pid) {
  Result<std::string> text = Env::Default()->ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return true;  // gone
  size_t close = text->rfind(')');
  return close != std::string::npos && close + 2 < text->size() && (*text)[close + 2] == 'Z';
}

double MonotonicNow() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Collects every exited child without waiting; forgets the ones we started.
void ReapExited() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    Forget(pid);
    if (int slot = HelperSlot(pid); slot >= 0) g_helper_codes[slot] = ExitCodeOf(status);
  }
}

}  // namespace

std::vector<pid_t> Descendants() {
  const Env& env = *Env::Default();
  std::multimap<pid_t, pid_t> children;
  Result<std::vector<std::string>> names = env.ListDir("/proc");
  if (!names.ok()) return {};
  for (const std::string& name : *names) {
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t parent = ParentOf(env, name);
    if (parent > 0) children.emplace(parent, static_cast<pid_t>(std::atol(name.c_str())));
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {::getpid()};
  for (size_t i = 0; i < todo.size(); ++i) {
    auto range = children.equal_range(todo[i]);
    for (auto it = range.first; it != range.second; ++it) {
      if (HelperSlot(it->second) >= 0) continue;  // fullburn's own, and what it runs
      todo.push_back(it->second);
      out.push_back(it->second);
    }
  }
  return out;
}

Leftovers EndLeftovers(double kill_wait_s) {
  Leftovers done;
  ReapExited();
  std::set<pid_t> signalled, killed;
  double deadline = MonotonicNow() + kill_wait_s;
  for (;;) {
    std::vector<pid_t> left = Descendants();
    // A zombie is gone already: it only waits to be reaped, by us or its parent.
    bool any_alive = false;
    for (pid_t pid : left) {
      if (IsZombie(pid)) continue;
      any_alive = true;
      // Each gets SIGTERM once, whenever it first shows up (a worker's own
      // children are seen once their parent has ended).
      if (signalled.insert(pid).second) {
        ::kill(pid, SIGTERM);
        ++done.terminated;
      } else if (MonotonicNow() >= deadline && killed.insert(pid).second) {
        ::kill(pid, SIGKILL);
        ++done.killed;
      }
    }
    ReapExited();
    if (!any_alive) break;
    ::usleep(20000);
  }
  ReapExited();
  return done;
}

Result<pid_t> SpawnHelper(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int slot = -1;
  for (int i = 0; i < kMaxHelpers && slot < 0; ++i) {
    pid_t free_slot = 0;
    if (g_helpers[i].compare_exchange_strong(free_slot, -1)) slot = i;
  }
  if (slot < 0) return Status::Unavailable("too many helper processes");
  g_helper_codes[slot] = -1;
  pid_t pid = ::fork();
  if (pid < 0) {
    g_helpers[slot] = 0;
    return Status::IoError(std::string("cannot fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  g_helpers[slot] = pid;
  return pid;
}

bool WaitHelper(pid_t pid, double timeout_s) {
  int slot = HelperSlot(pid);
  double deadline = MonotonicNow() + timeout_s, kill_at = 1e300;
  int code = -1;
  bool in_time = true;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      code = ExitCodeOf(status);
      break;
    }
    if (r < 0 && errno == ECHILD) {  // reaped by ReapExited meanwhile
      code = slot >= 0 ? g_helper_codes[slot].load() : 1;
      break;
    }
    double now = MonotonicNow();
    if (now >= deadline && kill_at == 1e300) {
      in_time = false;
      ::kill(pid, SIGTERM);
      kill_at = now + 5;
    } else if (now >= kill_at) {
      ::kill(pid, SIGKILL);
      kill_at = 1e299;
    }
    ::usleep(20000);
  }
  if (slot >= 0) g_helpers[slot] = 0;
  return in_time && code == 0;
}

}  // namespace fullburn::cli
