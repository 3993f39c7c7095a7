// Internal to the fullburn command: the subcommands and what they share.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <set>
#include <string>

#include "fullburn/atomic_file.h"
#include "fullburn/store.h"
#include "fullburn/telemetry.h"

namespace fullburn::cli {

// Exit codes of fullburn's own failures (a wrapped command's code passes through).
// kExitUsage (status.h): a bad flag, bad input, an unusable store.
constexpr int kExitCannotStart = 127; // `run`: the command could not be started

// Options shared by several subcommands: each is defined once, here, with
// its default, help text and environment variable.
struct CommonOptions {
  std::string store;      // empty: RunStore::DefaultPath()
  double interval_s = 1.0;
};
void AddStoreOption(CLI::App* app, CommonOptions* opts);
void AddIntervalOption(CLI::App* app, CommonOptions* opts, double default_s);

// The process exit code, set by the subcommand that ran.
int& ExitCode();

// Prints "fullburn: <message>" as one line on stderr and returns `code`.
int Fail(const std::string& message, int code = kExitUsage);

// Opens the store named by the options; the default location's directory is
// created on first use, an explicit path's directory never is.
Result<std::unique_ptr<RunStore>> OpenStore(const CommonOptions& opts);
// The store's path (--store, $FULLBURN_STORE or the default), for readers
// that must not create it.
std::string StorePath(const CommonOptions& opts);

// GPU source for a command: an explicitly named NVML that cannot be used is
// an error (GpuSource::Open).
Result<std::unique_ptr<GpuSource>> OpenGpus();
// The one line saying GPU metrics are unavailable and why (if they are).
void NoteIfGpusUnavailable(const GpuSource& gpus);

// This process's argv (argv[0] as "fullburn"), as stored with a run.
std::vector<std::string> OwnCommandLine();

// This executable's path ("" if /proc/self/exe cannot be read); when the file
// was replaced while this process runs, the new one at the same path.
std::string SelfExecutable();
std::string CurrentDir();
// gethostname(): the Hostname label, and the host a run was recorded on.
std::string HostName();

// python/ (fullburn_markers.py, the automatic markers): an installed
// fullburn's share/fullburn/python, else the source tree's; "" if neither.
std::string PythonDir();
// The build tree's `import fullburn` package (BUILD/python), which fullburn
// run puts on a job's PYTHONPATH ahead of the helpers; "" for an installed
// fullburn or a build without the Python module.
std::string PythonPackageDir();

// fullburn-train beside this executable (the libtorch half), or "" if not built.
std::string TrainingExecutable();
// fullburn-net beside this executable (serve and fleet: the HTTP and TLS
// libraries, kept out of every other command's process), or "" if missing.
std::string NetworkExecutable();
// Replaces this process with `exe` given argv[1..]: signals, the pid and the
// exit code are then exe's. Returns only when exec failed (the exit code).
int HandOff(const std::string& exe, int argc, char** argv);
// Parses argv into `app`, runs the chosen subcommand's callback and returns
// the exit code; a parse error is one line naming the --help to read.
int ParseAndRun(CLI::App& app, int argc, char** argv);
// What to do when it is absent: "needs the training half (fullburn-train),
// which <this>" — a pip install never has it, a CMake build lacked libtorch.
std::string WithoutTrainingHalf();

void SetupRun(CLI::App& app);
void SetupAttach(CLI::App& app);
void SetupWatch(CLI::App& app);
void SetupRuns(CLI::App& app);
void SetupRunsRemove(CLI::App* runs);  // fullburn runs rm
// The chosen runs with their parts (a tuning's trials), and the parts' parts.
std::set<int64_t> WithParts(std::set<int64_t> chosen, const std::vector<RunInfo>& runs);
// `fullburn serve` and `fullburn fleet` run in fullburn-net (net_main.cpp);
// fullburn lists them in its --help with these lines.
constexpr const char* kServeAbout = "Prometheus exporter: /metrics and /healthz";
constexpr const char* kFleetAbout =
    "GPU-hours lost across a cluster, by job and cause, from Prometheus (docs/fleet.md)";
void SetupServe(CLI::App& app);
void SetupReport(CLI::App& app);  // diagnose, report, compare
void SetupLaunch(CLI::App& app);
void SetupData(CLI::App& app);  // make-dataset, bench
void SetupTune(CLI::App& app);
void SetupAnalyze(CLI::App& app);  // fullburn analyze TRACE...
void SetupFleet(CLI::App& app);    // fullburn fleet --prometheus URL
// fullburn-net's: runs push, and mlflow-follow (what run --mlflow starts).
void SetupMlflow(CLI::App& app);
constexpr const char* kRunsPushAbout =
    "Send a stored run to MLflow: its readings, steps, findings, params, tags and report "
    "(docs/trackers.md)";
// --mlflow URI (MLFLOW_TRACKING_URI when empty: MlflowConnection reads it)
// and --mlflow-experiment, for runs push and mlflow-follow.
constexpr const char* kMlflowUriHelp =
    "MLflow tracking server, http(s)://HOST:PORT; empty: $MLFLOW_TRACKING_URI";
constexpr const char* kMlflowExperimentHelp =
    "MLflow experiment for a run fullburn makes (when the job has no MLflow run of its own); "
    "default $MLFLOW_EXPERIMENT_NAME, else Default";
// fullburn-net's `mlflow-follow` for the run `run_id`: its arguments.
std::vector<std::string> MlflowFollowArgs(int64_t run_id, const std::string& store, const std::string& uri,
                                          const std::string& experiment);
// `fullburn train|export-weights ...`: argv as main got it; handed to fullburn-train.
int Train(int argc, char** argv);

}  // namespace fullburn::cli
