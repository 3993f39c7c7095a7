// fullburn attach PID: record a job that is already running (started
// without fullburn) until it exits, --for has passed, or Ctrl-C; store it as
// a run and diagnose it. Its own code is not run again, so there are no step
// markers: the diagnosis rests on the GPUs, the host and the job's tree.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "child.h"
#include "cli.h"
#include "fullburn/tune.h"
#include "recording.h"

namespace fullburn::cli {
namespace {

struct AttachOptions : RecordOptions {
  std::string pid;
  std::string duration;  // empty: until the process exits
};

// Still the process attached to, and not a zombie its parent has yet to reap.
bool StillRunning(const Env& env, int pid, const ProcessIdentity& attached) {
  Result<ProcessIdentity> now = ReadProcessIdentity(env, pid);
  return now.ok() && now->start_ticks == attached.start_ticks && now->state != 'Z' &&
         now->state != 'X';
}

std::vector<std::string> CommandLine(const Env& env, int pid) {
  std::vector<std::string> argv;
  Result<std::string> raw = env.ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  if (!raw.ok()) return argv;
  std::string arg;
  for (char c : *raw) {
    if (c != '\0') {
      arg += c;
      continue;
    }
    argv.push_back(arg);
    arg.clear();
  }
  if (!arg.empty()) argv.push_back(arg);
  if (argv.empty()) {  // a kernel thread, or one that rewrote its arguments away
    Result<std::string> comm = env.ReadFile("/proc/" + std::to_string(pid) + "/comm");
    if (comm.ok()) argv.push_back(comm->substr(0, comm->find('\n')));
  }
  return argv;
}

int Attach(const AttachOptions& opts) {
  const Env* env = Env::Default();
  char* end = nullptr;
  long pid = std::strtol(opts.pid.c_str(), &end, 10);
  if (opts.pid.empty() || *end != '\0' || pid <= 0)
    return Fail("'" + opts.pid +
                "' is not a process id: give the PID of the training job (pgrep -af train.py)");
  if (pid == ::getpid())
    return Fail("fullburn cannot attach to itself: give the training job's PID");
  Result<ProcessIdentity> attached = ReadProcessIdentity(*env, static_cast<int>(pid));
  if (!attached.ok() || attached->state == 'Z')
    return Fail(
        fmt::format("no running process {}: give the PID of a running training job "
                    "(pgrep -af train.py)",
                    pid));
  double for_s = INFINITY;
  if (!opts.duration.empty()) {
    Result<double> d = ParseDuration(opts.duration);
    if (!d.ok() || *d <= 0)
      return Fail("--for '" + opts.duration + "' is not a duration: write 90s, 10m or 2h");
    for_s = *d;
  }
  // Ctrl-C ends the recording; the job is not ours and is not sent anything.
  InstallSignalForwarding();
  Result<std::unique_ptr<GpuSource>> gpus = OpenGpus();
  if (!gpus.ok()) return Fail(gpus.status().message());
  Result<std::unique_ptr<RunStore>> store = OpenStore(opts.common);
  if (!store.ok()) return Fail(store.status().message());
  if (!opts.quiet) {
    NoteIfGpusUnavailable(**gpus);
    NoteIfNoPeak(**gpus, opts);
  }

  RunInfo info;
  info.command = CommandLine(*env, static_cast<int>(pid));
  info.name = !opts.name.empty()     ? opts.name
              : info.command.empty() ? "pid " + std::to_string(pid)
                                     : info.command.front();
  std::error_code ec;
  info.cwd = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/cwd", ec).string();
  info.start_time = env->UnixSeconds();
  info.recorder_pid = static_cast<int>(::getpid());
  info.interval_s = opts.common.interval_s;
  info.gpus_json = GpusJson(**gpus);
  nlohmann::json config{{"interval_s", opts.common.interval_s}, {"attached_pid", pid}};
  AddRecordConfig(opts, &config);
  info.config_json = config.dump();
  Result<int64_t> run_id = (*store)->BeginRun(info);
  if (!run_id.ok()) return Fail(run_id.status().message());
  info.id = *run_id;
  if (!opts.quiet)
    std::fprintf(stderr,
                 "fullburn: recording process %ld as run %lld until it exits%s (Ctrl-C stops)\n",
                 pid, static_cast<long long>(info.id),
                 std::isinf(for_s) ? "" : (" or for " + FormatDuration(for_s)).c_str());

  SpillFile spill(env, (*store)->path(), info);
  Recording rec;
  rec.env = env;
  rec.gpus = gpus->get();
  rec.store = store->get();
  rec.info = info;
  rec.spill = &spill;
  rec.root_pid = static_cast<int>(pid);
  rec.quiet = opts.quiet;
  double t0 = env->MonotonicSeconds();
  bool exited = false;
  RecordUntil(rec, [&] {
    while (ReceivedSignal() == 0 && env->MonotonicSeconds() - t0 < for_s) {
      if (!StillRunning(*env, static_cast<int>(pid), *attached)) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  });
  // Its exit code went to its parent: none is stored.
  EndRun(rec, env->UnixSeconds(), std::nullopt, exited ? "finished" : "detached");
  if (!opts.quiet)
    std::fprintf(stderr, "fullburn: %s\n",
                 exited ? "the process exited" : "recording stopped; the process goes on");
  PrintRunEnd(rec);
  return 0;
}

}  // namespace

void SetupAttach(CLI::App& app) {
  auto opts = std::make_shared<AttachOptions>();
  CLI::App* cmd = app.add_subcommand(
      "attach", "Record a job already running (and its child processes) until it exits, as a run");
  cmd->footer("Usage: fullburn attach [OPTIONS] PID");
  cmd->add_option("pid", opts->pid, "The job's process id (pgrep -af train.py)")->required();
  cmd->add_option("--for", opts->duration,
                  "Stop recording after this long (90s, 10m, 2h); default: when the process exits");
  AddRecordOptions(cmd, opts.get(), "the process's command");
  cmd->callback([opts] { ExitCode() = Attach(*opts); });
}

}  // namespace fullburn::cli
