// fullburn-example-workload: small programs that behave like parts of a
// training job, for the README demo and the end-to-end tests.
//
//   train   --seconds S --workers N   worker processes "decode" batches (CPU
//                                     work) and send them through pipes to a
//                                     trainer that does matrix products, like a
//                                     data loader feeding a model
//   burn    --seconds S               keep one core busy
//   burn    --cpu-seconds C [--hold-file H]
//                                     use C seconds of CPU time, however long that
//                                     takes on a loaded machine; prints
//                                     "cpu_seconds X" (what it used) at the end;
//                                     with H: prints "burned" when done and waits
//                                     for H to exist before exiting
//   fork    --workers N --seconds S   N child processes, each keeping a core busy
//   fork    --workers N --cpu-seconds C [--start-file F] [--hold-file H]
//                                     each child uses C seconds of CPU time (after
//                                     F exists, when given; then prints "burned"
//                                     and waits for H, when given); the parent
//                                     waits for them and prints the whole tree's
//                                     "cpu_seconds X"
//   orphans --workers N --pids FILE [--ignore-term]
//                                     N children that outlive their parent (as
//                                     orphaned DataLoader workers do): each waits
//                                     forever, SIGTERM ignored with
//                                     --ignore-term; the parent writes their pids
//                                     to FILE and exits 3
//   exit    --code N                  exit with code N
//   signal  --marker FILE --seconds S on SIGTERM or SIGINT write the signal's
//                                     name to FILE and exit 42; prints "ready"
//                                     once its handlers are in place
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Arg(int argc, char** argv, const char* name, double fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return fallback;
}

std::string StrArg(int argc, char** argv, const char* name) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return "";
}

bool HasFlag(int argc, char** argv, const char* name) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

volatile double g_sink = 0;

void Burn(double seconds) {
  double end = Now() + seconds;
  double x = 1.0;
  while (Now() < end)
    for (int i = 0; i < 100000; ++i) x = std::sin(x) + 1.0;
  g_sink = x;
}

double CpuSeconds(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// CPU time, not wall time: the amount of work is the same on an idle machine
// and on one whose cores other programs keep busy, so a test can compare
// what fullburn read with what was used.
void BurnCpu(double cpu_seconds) {
  double end = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) + cpu_seconds;
  double x = 1.0;
  while (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) < end)
    for (int i = 0; i < 20000; ++i) x = std::sin(x) + 1.0;
  g_sink = x;
}

double Seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; }

// This process's CPU time and that of the children it waited for.
double TreeCpuSeconds() {
  rusage self{}, children{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &children);
  return Seconds(self.ru_utime) + Seconds(self.ru_stime) + Seconds(children.ru_utime) +
         Seconds(children.ru_stime);
}

void WaitForFile(const std::string& path) {
  struct stat st;
  while (!path.empty() && ::stat(path.c_str(), &st) != 0) ::usleep(10000);
}

// "burned" on stdout (one write: forked children share it), then wait for
// `hold`, so a test can let the recorder sample a finished burn before the
// process exits and its last CPU time leaves the tree.
void Hold(const std::string& hold) {
  if (hold.empty()) return;
  ssize_t written = ::write(STDOUT_FILENO, "burned\n", 7);
  (void)written;
  WaitForFile(hold);
}

// A "decoded image": smooth noise, about as much work as a small JPEG decode.
void MakeBatch(std::vector<float>* batch, unsigned seed) {
  for (size_t i = 0; i < batch->size(); ++i) {
    seed = seed * 1103515245u + 12345u;
    (*batch)[i] = std::sin(i * 0.001f + (seed >> 16) * 1e-5f);
  }
}

int Train(double seconds, int workers) {
  const size_t kBatch = 256 * 1024;  // floats per batch
  std::vector<int> read_fds;
  std::vector<pid_t> pids;
  for (int w = 0; w < workers; ++w) {
    int fds[2];
    if (::pipe(fds) != 0) return 1;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::vector<float> batch(kBatch);
      for (unsigned k = 0;; ++k) {
        MakeBatch(&batch, k * 31 + w);
        const char* p = reinterpret_cast<const char*>(batch.data());
        size_t left = batch.size() * sizeof(float);
        while (left > 0) {
          ssize_t n = ::write(fds[1], p, left);
          if (n <= 0) ::_exit(0);  // the trainer is gone
          p += n;
          left -= static_cast<size_t>(n);
        }
      }
    }
    ::close(fds[1]);
    read_fds.push_back(fds[0]);
    pids.push_back(pid);
  }
  const int n = 128;
  std::vector<float> a(n * n, 0.5f), b(n * n), c(n * n);
  std::vector<float> batch(kBatch);
  double start = Now(), last_print = start, wait = 0;
  long steps = 0;
  while (Now() - start < seconds) {
    double t0 = Now();
    char* p = reinterpret_cast<char*>(batch.data());
    size_t left = batch.size() * sizeof(float);
    int fd = read_fds[steps % read_fds.size()];
    while (left > 0) {
      ssize_t got = ::read(fd, p, left);
      if (got <= 0) return 1;
      p += got;
      left -= static_cast<size_t>(got);
    }
    wait += Now() - t0;
    for (int i = 0; i < n * n; ++i) b[i] = batch[i];
    for (int rep = 0; rep < 6; ++rep)  // the "model": a few matrix products
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) {
          float aik = a[i * n + k];
          for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
        }
    ++steps;
    if (Now() - last_print >= 2.0) {
      double el = Now() - start;
      std::printf("step %ld  %.1f steps/s  data wait %.0f%%\n", steps, steps / el, 100.0 * wait / el);
      std::fflush(stdout);
      last_print = Now();
    }
  }
  for (int fd : read_fds) ::close(fd);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  double el = Now() - start;
  std::printf("done: %ld steps in %.1fs, data wait %.0f%% of the time\n", steps, el, 100.0 * wait / el);
  g_sink = c[0];
  return 0;
}

int Fork(int workers, double seconds, double cpu_seconds, const std::string& start_file,
         const std::string& hold_file) {
  std::vector<pid_t> pids;
  for (int w = 0; w < workers; ++w) {
    pid_t pid = ::fork();
    if (pid == 0) {
      WaitForFile(start_file);
      if (cpu_seconds > 0)
        BurnCpu(cpu_seconds);
      else
        Burn(seconds);
      Hold(hold_file);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  if (cpu_seconds <= 0) ::usleep(static_cast<useconds_t>(seconds * 1e6));
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  if (cpu_seconds > 0) std::printf("cpu_seconds %.3f\n", TreeCpuSeconds());
  return 0;
}

int Orphans(int workers, const std::string& pids_path, bool ignore_term) {
  std::string pids;
  // Ignored before the fork, so each worker ignores SIGTERM from its first
  // instruction: set in the child, a loaded machine could run the parent's
  // exit (and fullburn's SIGTERM) before the child got to it.
  auto before = ::signal(SIGTERM, ignore_term ? SIG_IGN : SIG_DFL);
  for (int w = 0; w < workers; ++w) {
    pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0)
      for (;;) ::pause();
    pids += std::to_string(pid) + "\n";
  }
  ::signal(SIGTERM, before);
  FILE* f = std::fopen(pids_path.c_str(), "w");
  if (!f) return 1;
  std::fputs(pids.c_str(), f);
  std::fclose(f);
  return 3;
}

std::string g_marker;
void OnSignal(int sig) {
  // open/write/close: stdio is not async-signal-safe.
  int fd = ::open(g_marker.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    ssize_t written = ::write(fd, name, std::strlen(name));
    (void)written;
    ::close(fd);
  }
  ::_exit(42);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train")
    return Train(Arg(argc, argv, "--seconds", 15), static_cast<int>(Arg(argc, argv, "--workers", 1)));
  if (mode == "burn") {
    if (double cpu = Arg(argc, argv, "--cpu-seconds", 0); cpu > 0) {
      BurnCpu(cpu);
      Hold(StrArg(argc, argv, "--hold-file"));
      std::printf("cpu_seconds %.3f\n", TreeCpuSeconds());
      return 0;
    }
    Burn(Arg(argc, argv, "--seconds", 2));
    return 0;
  }
  if (mode == "fork")
    return Fork(static_cast<int>(Arg(argc, argv, "--workers", 2)), Arg(argc, argv, "--seconds", 2),
                Arg(argc, argv, "--cpu-seconds", 0), StrArg(argc, argv, "--start-file"),
                StrArg(argc, argv, "--hold-file"));
  if (mode == "orphans")
    return Orphans(static_cast<int>(Arg(argc, argv, "--workers", 2)), StrArg(argc, argv, "--pids"),
                   HasFlag(argc, argv, "--ignore-term"));
  if (mode == "exit") return static_cast<int>(Arg(argc, argv, "--code", 0));
  if (mode == "signal") {
    g_marker = StrArg(argc, argv, "--marker");
    ::signal(SIGTERM, OnSignal);
    ::signal(SIGINT, OnSignal);
    std::printf("ready\n");  // the handlers are in place: a test may signal now
    std::fflush(stdout);
    ::usleep(static_cast<useconds_t>(Arg(argc, argv, "--seconds", 10) * 1e6));
    return 0;
  }
  std::fprintf(stderr, "usage: %s train|burn|fork|orphans|exit|signal [options]\n", argv[0]);
  return 2;
}
