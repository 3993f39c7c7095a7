// fullburn watch: a live view of every GPU, the host and the jobs recorded
// on it (their last minute, as fullburn serve exports them), or one JSON
// snapshot.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli.h"
#include "fullburn/report.h"
#include "serve_jobs.h"

namespace fullburn::cli {
namespace {

struct WatchOptions {
  CommonOptions common;
  bool once = false;
  bool json = false;
};

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

int TerminalWidth() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

void NameProcesses(const Env* env, Snapshot* s) {
  for (GpuSample& g : s->gpus)
    for (GpuProcess& p : g.processes) {
      Result<std::string> comm = env->ReadFile("/proc/" + std::to_string(p.pid) + "/comm");
      p.name = comm.ok() ? comm->substr(0, comm->find('\n')) : "?";
    }
}

int Watch(const WatchOptions& opts) {
  Result<std::unique_ptr<GpuSource>> gpus = GpuSource::Open();
  if (!gpus.ok()) return Fail(gpus.status().message());
  std::string note = (*gpus)->available() ? "" : (*gpus)->unavailable_reason();
  const Env* env = Env::Default();
  // Jobs only where there is a store to read: watching never fails for it.
  auto jobs = std::make_unique<JobsWatcher>(StorePath(opts.common), env, HostName());
  jobs->Poll();
  if (std::string problem = jobs->Problem(); !problem.empty()) {
    std::fprintf(stderr, "fullburn: %s; watching without the jobs\n", problem.c_str());
    jobs.reset();
  }
  // One snapshot and the jobs now, as JSON or as a frame.
  auto as_json = [&](const Snapshot& s) {
    nlohmann::json j = SnapshotJson(s, (*gpus)->gpus(), note);
    if (jobs) jobs->Poll();
    j["jobs"] = JobsJson(jobs ? jobs->Jobs() : std::vector<JobNow>{});
    return j;
  };
  auto as_frame = [&](const Snapshot& s) {
    if (jobs) jobs->Poll();
    return RenderWatchFrame(s, (*gpus)->gpus(), note, TerminalWidth()) +
           RenderJobLines(jobs ? jobs->Jobs() : std::vector<JobNow>{});
  };
  Sampler sampler(env, gpus->get(), SamplerOptions{opts.common.interval_s, -1});
  // Rates need two readings: take a first one and wait a little.
  sampler.SampleOnce();
  double first_wait = opts.once ? std::min(opts.common.interval_s, 0.25) : 0.25;
  std::this_thread::sleep_for(std::chrono::duration<double>(first_wait));
  if (opts.once) {
    Snapshot s = sampler.SampleOnce();
    NameProcesses(env, &s);
    if (opts.json)
      std::printf("%s\n", as_json(s).dump(2).c_str());
    else
      std::fputs(as_frame(s).c_str(), stdout);
    return 0;
  }
  ::signal(SIGINT, OnStop);
  ::signal(SIGTERM, OnStop);
  bool tty = ::isatty(STDOUT_FILENO);
  if (tty) std::fputs("\033[?25l", stdout);  // hide the cursor while drawing
  auto next = std::chrono::steady_clock::now();
  while (!g_stop) {
    Snapshot s = sampler.SampleOnce();
    NameProcesses(env, &s);
    if (opts.json)
      std::printf("%s\n", as_json(s).dump().c_str());
    else
      std::printf("%s%s(Ctrl-C to quit)\n", tty ? "\033[H\033[2J" : "\n", as_frame(s).c_str());
    std::fflush(stdout);
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opts.common.interval_s));
    while (!g_stop && std::chrono::steady_clock::now() < next)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (tty) std::fputs("\033[?25h", stdout);
  return 0;
}

}  // namespace

void SetupWatch(CLI::App& app) {
  auto opts = std::make_shared<WatchOptions>();
  CLI::App* watch = app.add_subcommand("watch", "Live view of every GPU and the host");
  watch->add_flag("--once", opts->once, "Print one snapshot and exit");
  watch->add_flag("--json", opts->json, "JSON output: {\"metrics\": {name: value}, \"gpus\": [...]}");
  AddIntervalOption(watch, &opts->common, 1.0);
  AddStoreOption(watch, &opts->common);
  watch->callback([opts] { ExitCode() = Watch(*opts); });
}

}  // namespace fullburn::cli
