// fullburn run: start a command, sample the machine and the command's process
// tree until it exits, store the run, print a summary, exit with its code.
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "child.h"
#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/report.h"
#include "fullburn/store_layout.h"
#include "fullburn/run_traces.h"
#include "recording.h"
#include "fullburn/step_range.h"
#include "stacks_sampler.h"
#include "trackers_live.h"

namespace fullburn::cli {
namespace {

struct RunOptions : RecordOptions {
  int64_t parent = 0;  // 0: none
  bool no_auto_steps = false;
  bool keep_orphans = false;
  double kill_wait_s = 10;
  std::string profile;  // "A-B": trace those steps (docs/analyze.md)
  bool profile_stacks = false;
  bool no_stacks = false;
  bool layers = false;  // per-layer time and activations (python/fullburn_layers.py)
  double stacks_rate = kDefaultStacksRate;
  TrackerOptions trackers;  // --tensorboard, --mlflow
  std::vector<std::string> command;
};

// PYTHONPATH for the child: python/ (so `import fullburn_markers` works), a
// build tree's `import fullburn` package, and, unless turned off,
// python/autosteps/, whose sitecustomize.py marks a PyTorch job's steps with
// no change to it. The job's own PYTHONPATH follows.
std::string ChildPythonPath(const std::string& python_dir, bool auto_steps) {
  std::string path = auto_steps ? python_dir + "/autosteps:" : "";
  if (std::string package = PythonPackageDir(); !package.empty()) path += package + ":";
  path += python_dir;
  const char* own = std::getenv("PYTHONPATH");
  if (own && *own) path += std::string(":") + own;
  return path;
}

// A fresh, empty file for the child's step events ($FULLBURN_EVENTS), in the
// temporary directory; "" if none can be made (markers are then off).
std::string MakeEventsFile(int64_t run_id) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/fullburn-run-" + std::to_string(run_id) + "-XXXXXX";
  int fd = ::mkstemp(path.data());
  if (fd < 0) return "";
  ::close(fd);
  return path;
}

// The job's markers stop writing when the events file's file system fills
// (python/fullburn_markers.py says so on the job's stderr): its steps after
// the last one written were not recorded. Said here, and kept as an
// events_cut event so the diagnosis reads that stretch as missing, not idle.
void NoteIfEventsCut(const Recording& rec, const std::string& events_path, double end_t,
                     bool quiet) {
  struct statvfs fs {};
  if (::statvfs(events_path.c_str(), &fs) != 0) return;
  constexpr double kFullBelow = 64 * 1024;  // less than a few hundred more lines fit
  if (static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) >= kFullBelow) return;
  Result<std::vector<StepRecord>> steps = rec.store->LoadSteps(rec.info.id);
  double last = 0;
  if (steps.ok())
    for (const StepRecord& s : *steps) last = std::max(last, s.t);
  std::string why = "the file system of the job's step events file " + events_path +
                    " is full: its markers could not write the steps after this";
  rec.store->AddEvent(rec.info.id,
                      {last, kEventsCutEvent, nlohmann::json{{"to", end_t}, {"why", why}}.dump()});
  if (!quiet)
    std::fprintf(stderr,
                 "fullburn: the job's steps after %.1f s were not recorded: %s; give fullburn run "
                 "a TMPDIR with room\n",
                 last, why.c_str());
}

// The job is its main process: when that exits, whatever it left running
// (DataLoader workers whose parent died, a forgotten server) is ended, as
// srun ends a job step, so no orphan keeps a GPU or loads the machine.
void EndTheRest(const RunOptions& opts) {
  if (opts.keep_orphans) return;
  Leftovers ended = EndLeftovers(opts.kill_wait_s);
  if (ended.terminated == 0 || opts.quiet) return;
  std::fprintf(stderr,
               "fullburn: the job's main process exited and left %d process(es) running: sent "
               "them SIGTERM%s (--keep-orphans leaves them)\n",
               ended.terminated,
               ended.killed ? fmt::format(", and SIGKILL to {} still running {:g} s later",
                                          ended.killed, opts.kill_wait_s)
                                  .c_str()
                            : "");
}

// --profile A-B (or N: that step alone): the steps, 1 <= A <= B.
Status ParseSteps(const std::string& text, int64_t* first, int64_t* last) {
  auto range = ParseStepRange(text, 1);
  if (!range.ok())
    return Status::InvalidArgument("--profile " + range.status().message() + " (e.g. --profile 20-25)");
  std::tie(*first, *last) = *range;
  return Status::Ok();
}

// At the end of a run with --profile: the trace's findings, or why there is none.
void PrintTraces(const RunOptions& opts, RunStore* store, int64_t run_id, const std::string& dir) {
  if (opts.profile.empty() || opts.quiet) return;
  Result<RunData> data = store->LoadRun(std::to_string(run_id));
  if (!data.ok()) return;
  RunTraces t = AnalyzeRunTraces(*data);
  if (t.paths.empty()) {
    std::fprintf(stderr,
                 "fullburn: --profile %s wrote no trace: the job took fewer steps, or they were "
                 "not a PyTorch job's automatic markers' (a job's own Markers are not traced)\n",
                 opts.profile.c_str());
    return;
  }
  std::fprintf(stderr, "fullburn: the profiler's trace of steps %s: %s\n", t.steps.c_str(),
               dir.c_str());
  if (!t.error.empty()) {
    std::fprintf(stderr, "fullburn: it could not be analysed: %s\n", t.error.c_str());
    return;
  }
  std::fputs(RenderFindings(t.findings).c_str(), stderr);
  std::fprintf(stderr, "fullburn: the whole analysis: fullburn analyze %s\n", dir.c_str());
}

int Run(const RunOptions& opts) {
  if (opts.command.empty()) return Fail("no command given: use fullburn run [options] -- CMD ARGS...");
  int64_t profile_first = 0, profile_last = 0;
  if (!opts.profile.empty())
    if (Status s = ParseSteps(opts.profile, &profile_first, &profile_last); !s.ok())
      return Fail(s.message(), 2);
  // First, so a signal that comes while we start up is passed on, not lost.
  InstallSignalForwarding();
  // GPUs before the store: a bad NVML library must not leave an empty run behind.
  Result<std::unique_ptr<GpuSource>> gpus = OpenGpus();
  if (!gpus.ok()) return Fail(gpus.status().message());
  Result<std::unique_ptr<RunStore>> store = OpenStore(opts.common);
  if (!store.ok()) return Fail(store.status().message());
  if (!opts.quiet) {
    NoteIfGpusUnavailable(**gpus);
    NoteIfNoPeak(**gpus, opts);
  }
  const Env* env = Env::Default();

  RunInfo info;
  info.name = opts.name.empty() ? opts.command.front() : opts.name;
  info.command = opts.command;
  info.cwd = CurrentDir();
  info.start_time = env->UnixSeconds();
  info.recorder_pid = static_cast<int>(::getpid());
  info.interval_s = opts.common.interval_s;
  info.gpus_json = GpusJson(**gpus);
  if (opts.parent > 0) info.parent_id = opts.parent;
  std::string python_dir = PythonDir();
  bool auto_steps = !opts.no_auto_steps && !python_dir.empty();
  nlohmann::json config{{"interval_s", opts.common.interval_s}, {"auto_steps", auto_steps}};
  AddRecordConfig(opts, &config);
  info.config_json = config.dump();
  Result<int64_t> run_id = (*store)->BeginRun(info);
  if (!run_id.ok()) return Fail(run_id.status().message());
  info.id = *run_id;

  std::vector<std::string> child_env = {"FULLBURN_RUN_ID=" + std::to_string(info.id),
                                        "FULLBURN_STORE=" + (*store)->path()};
  std::string events_path = MakeEventsFile(info.id);
  if (!events_path.empty()) child_env.push_back(std::string(kEventsEnvVar) + "=" + events_path);
  if (!python_dir.empty())
    child_env.push_back("PYTHONPATH=" + ChildPythonPath(python_dir, auto_steps));
  std::string trace_dir;
  if (!opts.profile.empty()) {
    trace_dir = StoreLayout((*store)->path()).Traces(info.id);
    std::error_code ec;
    std::filesystem::create_directories(trace_dir, ec);
    if (ec) return Fail("cannot make " + trace_dir + " for --profile's trace: " + ec.message());
    child_env.push_back(fmt::format("FULLBURN_PROFILE={}-{}", profile_first, profile_last));
    child_env.push_back("FULLBURN_PROFILE_DIR=" + trace_dir);
    if (opts.profile_stacks) child_env.push_back("FULLBURN_PROFILE_STACKS=1");
  }
  if (opts.layers) child_env.push_back("FULLBURN_LAYERS=1");
  std::unique_ptr<StacksSampler> stacks;
  if (!opts.no_stacks)
    stacks = PrepareStacks(*env, opts.command, (*store)->path(), info.id, opts.stacks_rate, opts.quiet,
                           &child_env);
  EventFileReader events(events_path);
  // Orphaned workers become ours: they stay in the job's tree while it runs
  // and are ended with it (EndLeftovers).
  BecomeSubreaper();
  Result<pid_t> child = SpawnChild(opts.command, child_env);
  if (!child.ok()) {
    (*store)->FinishRun(info.id, env->UnixSeconds(), kExitCannotStart, "failed_to_start");
    return Fail(child.status().message(), kExitCannotStart);
  }

  if (stacks) stacks->Start(*child);
  TrackersLive trackers(opts.trackers, (*store)->path(), info, opts.quiet);
  SpillFile spill(env, (*store)->path(), info);
  Recording rec;
  rec.env = env;
  rec.gpus = gpus->get();
  rec.store = store->get();
  rec.info = info;
  rec.spill = &spill;
  rec.root_pid = *child;
  rec.adopter_pid = static_cast<int>(::getpid());
  rec.quiet = opts.quiet;
  rec.events = events_path.empty() ? nullptr : &events;
  int code = RecordUntil(rec, [&] { return WaitChild(*child); });
  // Before the leftovers are ended: py-spy is this process's child too.
  // The wait for py-spy to write is fullburn's, not the job's: the run's
  // end leaves it out, so no finding counts it as the job's time.
  double job_end = env->UnixSeconds();
  KeepStacks(stacks.get(), store->get(), info.id, job_end - info.start_time, *child, opts.stacks_rate,
             opts.quiet);
  double sampler_wait = env->UnixSeconds() - job_end;
  EndTheRest(opts);
  if (!events_path.empty()) {
    NoteIfEventsCut(rec, events_path, env->UnixSeconds() - info.start_time, opts.quiet);
    ::unlink(events_path.c_str());
    if (events.bad_lines() > 0 && !opts.quiet)
      std::fprintf(stderr, "fullburn: %lld malformed step event line(s) skipped; first: %s\n",
                   static_cast<long long>(events.bad_lines()), events.first_error().c_str());
    if (events.restarts() > 0 && !opts.quiet)
      std::fprintf(stderr,
                   "fullburn: rank %d's step numbers started again %lld time(s) (a new "
                   "fullburn_markers.Markers per epoch?): its steps were numbered on so none was "
                   "lost; keep one Markers for the whole run\n",
                   events.first_restarted_rank(), static_cast<long long>(events.restarts()));
  }
  EndRun(rec, env->UnixSeconds() - sampler_wait, code, "finished");

  PrintRunEnd(rec);
  trackers.Finish();  // after the run's end is stored: their last poll sends the rest
  PrintTraces(opts, store->get(), info.id, trace_dir);
  return code;
}

}  // namespace

void SetupRun(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand(
      "run", "Run a command, record GPU, host and process-tree metrics, exit with its code");
  run->footer("Usage: fullburn run [OPTIONS] -- CMD [ARGS...]");
  AddRecordOptions(run, opts.get(), "the command");
  run->add_flag("--no-auto-steps", opts->no_auto_steps,
                "Do not time a PyTorch job's steps by itself (optimizer.step, DataLoader waits; "
                "python/fullburn_autosteps/)")
      ->envname("FULLBURN_NO_AUTO_STEPS");
  run->add_flag("--keep-orphans", opts->keep_orphans,
                "Leave running the processes the job leaves behind when its main process exits "
                "(default: end them, as srun ends a job step: SIGTERM, then SIGKILL after "
                "--kill-wait)")
      ->envname("FULLBURN_KEEP_ORPHANS");
  run->add_option("--kill-wait", opts->kill_wait_s,
                  "Seconds the job's leftover processes get between SIGTERM and SIGKILL")
      ->default_val(10)
      ->check(CLI::Range(0.0, 3600.0))
      ->envname("FULLBURN_KILL_WAIT");
  run->add_option("--profile", opts->profile,
                  "Trace steps A-B of a PyTorch job with torch.profiler (CPU and CUDA "
                  "activities), keep the trace beside the store and analyse it at the end "
                  "(fullburn analyze), e.g. 20-25")
      ->envname("FULLBURN_PROFILE");
  run->add_flag("--profile-stacks", opts->profile_stacks,
                "With --profile: record Python stacks too (larger traces; names the line of a "
                "host sync)")
      ->envname("FULLBURN_PROFILE_STACKS");
  run->add_flag("--no-stacks", opts->no_stacks,
                "Do not sample the job's Python stacks (py-spy, when it is installed: where the "
                "time goes in the job's code, docs/stacks.md)")
      ->envname("FULLBURN_NO_STACKS");
  run->add_flag("--layers", opts->layers,
                "Time each of the model's top-level layers, forward and backward, and count its "
                "activation memory (module hooks; CUDA events on a GPU; docs/stacks.md, \"Layers\")")
      ->envname("FULLBURN_LAYERS");
  run->add_option("--stacks-rate", opts->stacks_rate,
                  "Python stack samples per second and thread (py-spy's --rate)")
      ->default_val(kDefaultStacksRate)
      ->check(CLI::Range(1.0, 1000.0))
      ->envname("FULLBURN_STACKS_RATE");
  run->add_option("--tensorboard", opts->trackers.tensorboard,
                  "Write the run's readings, steps and live finding as TensorBoard scalars into this "
                  "folder while it runs (fullburn/...; docs/trackers.md)")
      ->envname("FULLBURN_TENSORBOARD");
  run->add_option("--mlflow", opts->trackers.mlflow_uri,
                  "Log the run into MLflow while it runs: the job's own MLflow run when it has one, "
                  "else a run of fullburn's (docs/trackers.md). URI: the tracking server, "
                  "$MLFLOW_TRACKING_URI when left out")
      ->expected(0, 1);
  run->add_option("--mlflow-experiment", opts->trackers.mlflow_experiment, kMlflowExperimentHelp);
  run->add_option("--parent", opts->parent,
                  "Record the run as part of another (fullburn tune's trials)");
  run->add_option("command", opts->command, "The command to run, after --")->required();
  run->positionals_at_end();
  run->callback([opts, run] {
    opts->trackers.mlflow = run->count("--mlflow") > 0;
    ExitCode() = Run(*opts);
  });
}

}  // namespace fullburn::cli
