// fullburn diagnose | report | compare: findings, the HTML report and the
// side-by-side table of stored runs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/report.h"
#include "fullburn/tune.h"
#include "fullburn/run_traces.h"

namespace fullburn::cli {
namespace {

struct ReportOptions {
  CommonOptions common;
  std::vector<std::string> runs;
  std::string output;
  bool json = false;
  std::string from, to, last;  // diagnose: a stretch of the run (durations into it)
};

// Seconds from the run's start to its end, or to its newest record.
double RunLength(const RunData& d) {
  if (d.run.end_time) return *d.run.end_time - d.run.start_time;
  double t = 0;
  for (const auto& [name, series] : d.samples)
    if (!series.empty()) t = std::max(t, series.back().t);
  for (const StepRecord& r : d.steps) t = std::max(t, r.t);
  return t;
}

// The stretch --from/--to/--last ask for, checked against the run's length.
Result<std::pair<double, double>> Stretch(const ReportOptions& o, const RunData& d) {
  double length = RunLength(d);
  auto parse = [](const std::string& flag, const std::string& text) -> Result<double> {
    Result<double> v = ParseDuration(text);
    if (!v.ok()) return Status::InvalidArgument(flag + ": " + v.status().message());
    return v;
  };
  double from = 0, to = length;
  if (!o.last.empty()) {
    if (!o.from.empty() || !o.to.empty())
      return Status::InvalidArgument("--last and --from/--to both given: use one or the other");
    Result<double> last = parse("--last", o.last);
    if (!last.ok()) return last.status();
    from = std::max(0.0, length - *last);
  }
  if (!o.from.empty()) {
    Result<double> v = parse("--from", o.from);
    if (!v.ok()) return v.status();
    from = *v;
  }
  if (!o.to.empty()) {
    Result<double> v = parse("--to", o.to);
    if (!v.ok()) return v.status();
    to = std::min(*v, length);
  }
  if (from >= length)
    return Status::InvalidArgument(
        fmt::format("--from {} is past the run's end (it lasted {}): give a time inside it", o.from,
                    FormatDuration(length)));
  if (from >= to)
    return Status::InvalidArgument(
        fmt::format("the stretch from {} to {} is empty: --from must come before --to",
                    FormatDuration(from), FormatDuration(to)));
  return std::make_pair(from, to);
}

// Every run named, with its findings; the first failure as a one-line error.
Result<std::vector<ReportRun>> LoadRuns(const ReportOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return store.status();
  std::vector<ReportRun> out;
  for (const std::string& ref : o.runs) {
    Result<RunData> data = (*store)->LoadRun(ref);
    if (!data.ok()) return data.status();
    ReportRun r{std::move(*data), {}};
    r.findings = Diagnose(r.data);
    RunTraces traces = AnalyzeRunTraces(r.data);
    if (!traces.error.empty())
      std::fprintf(stderr, "fullburn: run %lld's profiler trace could not be analysed: %s\n",
                   static_cast<long long>(r.data.run.id), traces.error.c_str());
    r.trace_steps = traces.steps;
    r.trace_findings = traces.findings;
    r.trace_text = traces.text;
    out.push_back(std::move(r));
  }
  return out;
}

// What a reader of partial data should know first.
void NotePartial(const RunData& d) {
  if (IsTuning(d)) return;  // its trials are the runs with data
  if (!d.run.end_time)
    std::fprintf(stderr, "fullburn: run %lld is %s: diagnosed from the data so far\n",
                 static_cast<long long>(d.run.id), d.run.status.c_str());
  if (d.run.sample_count == 0 && d.steps.empty())
    std::fprintf(stderr, "fullburn: run %lld has no samples and no step records: nothing to diagnose\n",
                 static_cast<long long>(d.run.id));
}

int DiagnoseCommand(const ReportOptions& o) {
  auto runs = LoadRuns(o);
  if (!runs.ok()) return Fail(runs.status().message());
  ReportRun& r = runs->front();
  NotePartial(r.data);
  std::string stretch;
  if (!o.from.empty() || !o.to.empty() || !o.last.empty()) {
    Result<std::pair<double, double>> window = Stretch(o, r.data);
    if (!window.ok()) return Fail(window.status().message());
    auto [from, to] = *window;
    r.findings = Diagnose(RunWindow(r.data, from, to));
    stretch = fmt::format(", from {} to {}", FormatDuration(from), FormatDuration(to));
  }
  // A stretch of the run is not what the trace held: its findings only for the whole run.
  bool traced = stretch.empty() && !r.trace_findings.empty();
  if (o.json) {
    nlohmann::json j = FindingsJson(r.findings);
    if (traced)
      for (nlohmann::json f : FindingsJson(r.trace_findings)) {
        f["source"] = "profiler trace, steps " + r.trace_steps;
        j.push_back(f);
      }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("run %lld \"%s\"%s\n", static_cast<long long>(r.data.run.id), r.data.run.name.c_str(),
              stretch.c_str());
  std::fputs(RenderFindings(r.findings, r.findings.size()).c_str(), stdout);
  if (traced) {
    std::printf("from the profiler trace of steps %s (fullburn analyze for all of it):\n",
                r.trace_steps.c_str());
    std::fputs(RenderFindings(r.trace_findings, r.trace_findings.size()).c_str(), stdout);
  }
  return 0;
}

int ReportCommand(const ReportOptions& o) {
  auto runs = LoadRuns(o);
  if (!runs.ok()) return Fail(runs.status().message());
  for (const ReportRun& r : *runs) NotePartial(r.data);
  std::string path = o.output;
  if (path.empty()) {
    path = "fullburn-report";
    for (const ReportRun& r : *runs) path += "-" + std::to_string(r.data.run.id);
    path += ".html";
  }
  std::string html = RenderHtmlReport(*runs);
  if (Status s = WriteFileAtomically(path, html); !s.ok()) return Fail(s.message());
  std::fprintf(stderr, "fullburn: wrote %s (%s); open it in a browser, no network needed\n", path.c_str(),
               FormatBytes(static_cast<double>(html.size())).c_str());
  return 0;
}

int CompareCommand(const ReportOptions& o) {
  if (o.runs.size() < 2) return Fail("compare needs two runs or more: fullburn compare RUN_A RUN_B [...]");
  auto runs = LoadRuns(o);
  if (!runs.ok()) return Fail(runs.status().message());
  std::vector<RunDigest> digests;
  for (const ReportRun& r : *runs) digests.push_back(Digest(r.data, r.findings));
  if (o.json)
    std::printf("%s\n", ComparisonJson(digests).dump(2).c_str());
  else
    std::fputs(RenderComparison(digests).c_str(), stdout);
  return 0;
}

}  // namespace

void SetupReport(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* diag = app.add_subcommand("diagnose", "Findings for a stored run: cause, time lost, evidence, fix");
  diag->add_option("RUN", o->runs, "Run id, or 'last'")->required()->expected(1);
  diag->add_flag("--json", o->json, "JSON list of {cause, title, time_lost_pct, confidence, evidence, fix}");
  diag->add_option("--from", o->from, "Only the run from this far into it (90s, 10m, 1h30m)");
  diag->add_option("--to", o->to, "Only the run up to this far into it");
  diag->add_option("--last", o->last, "Only the run's last stretch of this length (10m)");
  AddStoreOption(diag, &o->common);
  diag->callback([o] { ExitCode() = DiagnoseCommand(*o); });

  CLI::App* report = app.add_subcommand(
      "report", "One self-contained HTML file: findings, charts, step breakdown, config (several runs: compared)");
  report->add_option("RUN", o->runs, "Run ids, or 'last'")->required();
  report->add_option("-o,--output", o->output, "Where to write (default: fullburn-report-RUN.html here)");
  AddStoreOption(report, &o->common);
  report->callback([o] { ExitCode() = ReportCommand(*o); });

  CLI::App* compare = app.add_subcommand(
      "compare", "Runs side by side: throughput, utilization, data wait, time lost per cause, config differences");
  compare->add_option("RUN", o->runs, "Two run ids or more ('last' allowed)")->required();
  compare->add_flag("--json", o->json, "JSON: one object per run");
  AddStoreOption(compare, &o->common);
  compare->callback([o] { ExitCode() = CompareCommand(*o); });
}

}  // namespace fullburn::cli
