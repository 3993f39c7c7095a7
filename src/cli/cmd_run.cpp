// fullburn run: start a command, sample the machine and the command's process
// tree until it exits, store the run, print a summary, exit with its code.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "child.h"
#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/report.h"

namespace fullburn::cli {
namespace {

struct RunOptions {
  CommonOptions common;
  std::string name;
  bool quiet = false;
  std::vector<std::string> command;
};

std::string CurrentDir() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) ? buf : "";
}

std::string GpusJson(const GpuSource& gpus) {
  nlohmann::json j = nlohmann::json::array();
  for (const GpuInfo& g : gpus.gpus()) j.push_back({{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}});
  return j.dump();
}

int Run(const RunOptions& opts) {
  if (opts.command.empty()) return Fail("no command given: use fullburn run [options] -- CMD ARGS...");
  // First, so a signal that comes while we start up is passed on, not lost.
  InstallSignalForwarding();
  // GPUs before the store: a bad NVML library must not leave an empty run behind.
  Result<std::unique_ptr<GpuSource>> gpus = OpenGpus();
  if (!gpus.ok()) return Fail(gpus.status().message());
  Result<std::unique_ptr<RunStore>> store = OpenStore(opts.common);
  if (!store.ok()) return Fail(store.status().message());
  if (!opts.quiet) NoteIfGpusUnavailable(**gpus);
  const Env* env = Env::Default();

  RunInfo info;
  info.name = opts.name.empty() ? opts.command.front() : opts.name;
  info.command = opts.command;
  info.cwd = CurrentDir();
  info.start_time = env->UnixSeconds();
  info.recorder_pid = static_cast<int>(::getpid());
  info.interval_s = opts.common.interval_s;
  info.gpus_json = GpusJson(**gpus);
  nlohmann::json config{{"interval_s", opts.common.interval_s}};
  info.config_json = config.dump();
  Result<int64_t> run_id = (*store)->BeginRun(info);
  if (!run_id.ok()) return Fail(run_id.status().message());
  info.id = *run_id;

  std::vector<std::string> child_env = {"FULLBURN_RUN_ID=" + std::to_string(info.id),
                                        "FULLBURN_STORE=" + (*store)->path()};
  Result<pid_t> child = SpawnChild(opts.command, child_env);
  if (!child.ok()) {
    (*store)->FinishRun(info.id, env->UnixSeconds(), kExitCannotStart, "failed_to_start");
    return Fail(child.status().message(), kExitCannotStart);
  }

  SamplerOptions so;
  so.interval_s = opts.common.interval_s;
  so.root_pid = *child;
  Sampler sampler(env, gpus->get(), so);
  BatchWriter writer(store->get(), info.id, info.start_time);
  std::unique_ptr<LiveStatus> live;
  if (!opts.quiet) live.reset(new LiveStatus(STDERR_FILENO));
  std::atomic<bool> write_failed{false};
  double t0 = env->MonotonicSeconds();
  sampler.Start([&](const Snapshot& s) {
    Status st = writer.Add(s);
    if (!st.ok() && !write_failed.exchange(true))
      std::fprintf(stderr, "\nfullburn: %s; the command keeps running, later samples are lost\n",
                   st.message().c_str());
    if (live) live->Draw(RenderLiveLine(s, s.mono_time - t0));
  });
  int code = WaitChild(*child);
  sampler.Stop();
  live.reset();
  writer.Flush();
  double end = env->UnixSeconds();
  (*store)->FinishRun(info.id, end, code, "finished");

  if (Result<RunInfo> stored = (*store)->GetRun(std::to_string(info.id)); stored.ok()) {
    Result<std::map<std::string, Series>> samples = (*store)->LoadSamples(info.id);
    if (samples.ok() && !opts.quiet) {
      std::string note = (*gpus)->available() ? "" : (*gpus)->unavailable_reason();
      std::fputs(RenderSummary(*stored, Summarize(*stored, *samples), note).c_str(), stderr);
      std::fputs(RenderFindings(Diagnose(*stored, *samples, {})).c_str(), stderr);
    }
  }
  if (!opts.quiet)
    std::fprintf(stderr, "fullburn: stored as run %lld in %s (fullburn runs show %lld)\n",
                 static_cast<long long>(info.id), (*store)->path().c_str(),
                 static_cast<long long>(info.id));
  return code;
}

}  // namespace

void SetupRun(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand(
      "run", "Run a command, record GPU, host and process-tree metrics, exit with its code");
  run->footer("Usage: fullburn run [OPTIONS] -- CMD [ARGS...]");
  run->add_option("--name", opts->name, "Name of the run (default: the command)");
  run->add_flag("-q,--quiet", opts->quiet, "No live line and no summary");
  AddIntervalOption(run, &opts->common, 1.0);
  AddStoreOption(run, &opts->common);
  run->add_option("command", opts->command, "The command to run, after --")->required();
  run->positionals_at_end();
  run->callback([opts] { ExitCode() = Run(*opts); });
}

}  // namespace fullburn::cli
