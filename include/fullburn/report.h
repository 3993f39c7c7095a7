// Report: turns snapshots and stored runs into text for people and programs.
//
// Contract: pure functions of their inputs (no I/O, no clocks), so the
// terminal view, JSON, CSV and Prometheus all render the same structs and can
// be tested on hand-made data. Absent metrics are shown as "-" or left out,
// never as 0. Safe to call from any thread.
#pragma once

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/store.h"
#include "fullburn/telemetry.h"

namespace fullburn {

struct MetricStats {
  std::string name, unit;
  size_t count = 0;
  double min = 0, median = 0, p95 = 0, max = 0, mean = 0;
};

// Nearest-rank percentile of an unsorted series, p in [0, 100].
double Percentile(std::vector<double> values, double p);
std::map<std::string, MetricStats> ComputeStats(const std::map<std::string, Series>& samples);

struct GpuRunSummary {
  int index = 0;
  std::optional<double> low_util_share;  // share of samples with util < 50 %
  std::optional<double> peak_mem_bytes, mem_total_bytes, peak_proc_mem_bytes;
  std::optional<double> throttled_share;  // share of samples with a slowdown reason
  std::vector<std::string> throttle_reasons_seen;
  // Known once some GPU ran the job's processes; false: a shared node's GPU
  // that ran none of them (idle, or another job's).
  std::optional<bool> used_by_job;
};

struct RunSummary {
  double wall_s = 0;
  std::map<std::string, MetricStats> stats;
  std::vector<GpuRunSummary> gpus;
};

RunSummary Summarize(const RunInfo& run, const std::map<std::string, Series>& samples);

// One screen of text shown when `fullburn run` ends.
std::string RenderSummary(const RunInfo& run, const RunSummary& summary,
                          const std::string& gpu_note);
// The one-line live status of `fullburn run` (no newline).
// `steps` (RecentSteps::Render) goes right after the time, so a narrow
// terminal cuts GPUs off the end before it cuts the job's progress.
std::string RenderLiveLine(const Snapshot& s, double elapsed_s, const std::string& steps = "");
// A full frame of `fullburn watch`, `width` columns wide.
std::string RenderWatchFrame(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                             const std::string& gpu_note, int width);
// The exported name: the DCGM field name where one exists, else fullburn_*.
std::string PrometheusName(const MetricDef& def);
// Prometheus text exposition (version 0.0.4) of one snapshot.
std::string RenderPrometheus(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                             const std::string& hostname);

// A job being recorded on this host (fullburn run, train, attach), as
// fullburn serve exports it: its steps of the last minute and what limits it
// now (LiveDiagnosis). Unset fields are not exported (no steps: no rate).
struct JobNow {
  RunInfo run;
  std::optional<int64_t> step;            // the latest step, any rank
  std::optional<double> loss;             // that step's
  std::optional<double> samples_per_s;    // the job's (every rank's samples) over the window
  std::optional<double> step_s;           // median step time
  std::optional<double> data_wait_share;  // of step time, steps that timed it
  std::optional<Finding> now;             // the top finding of the last minute
  std::optional<double> mfu;              // over the last minute (LiveDiagnosis::mfu)
};
// `window`: the job's steps of its last minute (several ranks' alike).
JobNow SummarizeJob(const RunInfo& run, const std::vector<StepRecord>& window,
                    std::optional<Finding> now);
// fullburn_job_* families, labelled run, name and Hostname (and cause).
std::string RenderJobsPrometheus(const std::vector<JobNow>& jobs, const std::string& hostname);
// fullburn watch's lines for them ("" for none), and its --json list:
// [{run, name, step, loss, samples_per_s, step_s, data_wait_share,
//   now: {cause, time_lost_pct}}], absent fields left out.
std::string RenderJobLines(const std::vector<JobNow>& jobs);
nlohmann::json JobsJson(const std::vector<JobNow>& jobs);

nlohmann::json SnapshotJson(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                            const std::string& gpu_note);
nlohmann::json RunJson(const RunInfo& run);
nlohmann::json RunShowJson(const RunInfo& run, const RunSummary& summary);
// Wide CSV: one row per sample time, one column per metric; blank = absent.
std::string SamplesCsv(const std::map<std::string, Series>& samples);
nlohmann::json SamplesJson(const RunInfo& run, const std::map<std::string, Series>& samples);

// What a training run's steps add up to. Phase shares are of the step time of
// timed steps; the first 10% of steps (warm-up) are left out of the rate.
// A run's steps as the job took them: with several ranks, step N is every
// rank's record of step N (samples summed over ranks, its time the slowest
// rank's, its loss the ranks' mean); the phase shares are over all records.
struct StepsSummary {
  int64_t steps = 0, skipped = 0, samples = 0;
  int ranks = 0;
  // Means of the first and last 10 finite losses (of half of them, at least
  // one, in a run of fewer than 20: the two windows never overlap).
  double first_loss = NAN, final_loss = NAN;
  double median_samples_per_s = 0;            // the job's, first tenth of the steps left out
  // Every sample over the wall time from the first step's start to the last
  // one's end: what happened between steps (evaluations, saves) included.
  double span_s = 0, overall_samples_per_s = NAN;
  std::vector<std::pair<std::string, double>> phase_share;  // in step order
};
StepsSummary SummarizeSteps(const std::vector<StepRecord>& steps);
std::string RenderStepsSummary(const std::vector<StepRecord>& steps);

// Per-step records of `fullburn train`: CSV (blank = absent) and JSON (null).
std::string StepsCsv(const std::vector<StepRecord>& steps);
nlohmann::json StepsJson(const std::vector<StepRecord>& steps);
// Chrome trace / Perfetto JSON: one track of steps and one of their phases per
// rank, one of its run events (evaluations, a wrapped job's torch.save calls
// and phases as spans, the rest as instants) and checkpoint writes, loss and
// throughput counters, utilization counters.
nlohmann::json ChromeTrace(const RunInfo& run, const std::vector<StepRecord>& steps,
                           const std::vector<CheckpointRecord>& checkpoints,
                           const std::vector<RunEvent>& run_events,
                           const std::map<std::string, Series>& samples);

// The steps a wrapped job marked lately, for `fullburn run`'s live line:
// " | step 120  epoch 1  loss 0.3120  850 samples/s  data-wait 12%". Steps
// of every rank count toward samples/s (the job's rate); the step, epoch and
// loss are the lowest rank's. Not thread-safe: one caller feeds and renders.
class RecentSteps {
 public:
  static constexpr double kWindowS = 10;  // the rate and data wait are over this
  void Add(const std::vector<StepRecord>& steps);
  std::string Render() const;  // "" before the first step

 private:
  std::vector<StepRecord> window_;  // ends within kWindowS of the newest
};

// The live status line of `fullburn run` and `fullburn train`, kept on the terminal's last row.
// The command shares the terminal, so its output must not be overwritten: like
// apt's progress bar, the rows above are made a scroll region (DECSTBM) and the
// status is drawn below it with the cursor saved and restored around it.
class LiveStatus {
 public:
  // Active only when `fd` is a terminal of at least 3 rows.
  explicit LiveStatus(int fd);
  ~LiveStatus();  // gives the row back and resets the scroll region
  bool active() const { return rows_ > 0; }
  void Draw(const std::string& line);

 private:
  void Reserve();
  int fd_;
  int rows_ = 0;
};

// What one run amounts to, for `fullburn compare` and the report's table.
// NaN where the run has no such data (no GPU, no step records).
struct RunDigest {
  int64_t id = 0;
  std::string name, status;
  double wall_s = 0;
  double samples_per_s = NAN;  // median over steps after warm-up (SummarizeSteps)
  double step_s = NAN;         // median
  double data_wait_share = NAN, gpu_util = NAN, cpu_util = NAN, gpu_mem_peak_share = NAN;
  double mfu = NAN;  // ComputeMfu's value (NaN: unknown)
  // The other phases' shares of timed step time (SummarizeSteps: "forward",
  // ..., "other" for the rest); only the phases the run measured.
  std::map<std::string, double> phase_share;
  std::map<std::string, double> time_lost;    // cause -> share of wall time
  std::map<std::string, std::string> config;  // flattened ("train.batch_size") plus "command"
  std::vector<std::string> command;           // the run's argv
};
RunDigest Digest(const RunData& run, const std::vector<Finding>& findings);
// Rows of measures, one column per run; config rows only where runs differ.
// Commands of one length show only the arguments that differ (with the flag
// before each), since a long command elided in the middle hid them.
using ComparisonRow = std::pair<std::string, std::vector<std::string>>;  // label, a cell per run
std::vector<ComparisonRow> ComparisonTable(const std::vector<RunDigest>& runs);
std::string RenderComparison(const std::vector<RunDigest>& runs);
nlohmann::json ComparisonJson(const std::vector<RunDigest>& runs);

// Min/max per bucket so peaks survive; at most about `max_points` points. A
// gap longer than `gap_s` becomes a NaN point, drawn as a break.
Series Downsample(const Series& s, size_t max_points, double gap_s);

// One self-contained HTML file (uPlot inlined, no network): findings,
// comparison (several runs), time-series charts of telemetry and steps, the
// step-time breakdown, config and environment.
struct ReportRun {
  RunData data;
  std::vector<Finding> findings;
  // From the profiler traces `fullburn run --profile` attached (the CLI
  // reads them: this component does no I/O); empty: none.
  std::string trace_steps;  // "20-25"
  std::vector<Finding> trace_findings;
  std::string trace_text;  // fullburn analyze's report
};
std::string RenderHtmlReport(const std::vector<ReportRun>& runs);
std::string HtmlEscape(const std::string& s);

// The self-contained page every HTML view is (the run report, fleet --html):
// `title` as <title> and <h1>, uPlot's CSS then `style`, `body`, `data` as
// the JSON element #fb-data the page's `script` reads, uPlot's script
// inlined. Readable offline, attachable to a ticket.
std::string HtmlPage(const std::string& title, const std::string& style, const std::string& body,
                     const nlohmann::json& data, const std::string& script);

// A tuning run (fullburn tune): it has `tune_trial` events (docs/tune.md).
// The report shows its trials as a table and a bar chart instead of findings.
bool IsTuning(const RunData& run);
std::string TuningHtml(const RunData& run);
nlohmann::json TuningChart(const RunData& run);  // a chart of the report's JSON

std::string FormatBytes(double bytes);
std::string FormatDuration(double seconds);
// "exit code 3"; a signal's 128 + N is named: "exit code 137 (SIGKILL: ...)".
std::string DescribeExitCode(int code);
std::string FormatLocalTime(double unix_seconds);  // "2026-11-22 08:30:00"
std::string JoinedCommand(const std::vector<std::string>& argv);

}  // namespace fullburn
