// fullburn runs list|show|export|trace: what the store holds (rm: cmd_runs_rm.cpp).
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <set>

#include "cli.h"
#include "fullburn/spill.h"
#include "fullburn/diagnose.h"
#include "fullburn/report.h"
#include "fullburn/stacks.h"
#include "fullburn/store_layout.h"
#include "fullburn/trackers.h"

namespace fullburn::cli {
namespace {

struct RunsOptions {
  CommonOptions common;
  std::string run = "last";
  bool json = false;
  std::string format = "csv";
  std::string table = "samples";
  // runs list: which runs
  int last = -1;  // top-level runs, newest; -1: all in JSON, kListDefault in the table
  bool all = false;
  std::string status, name;
  std::vector<std::string> spills;  // runs import
  bool keep = false;
  std::string phase;  // runs stacks: one phase ("" all)
  std::string dir;    // runs export --format tensorboard: the folder
};

constexpr int kListDefault = 20;

// The statuses a run can have (RunInfo), and "failed": a non-zero exit or
// a command that could not start.
const std::vector<std::string> kListStatuses = {"running",  "finished",        "interrupted",
                                                "detached", "failed_to_start", "failed"};

bool Contains(std::string text, std::string part) {
  auto lower = [](std::string* t) {
    for (char& c : *t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  lower(&text);
  lower(&part);
  return text.find(part) != std::string::npos;
}

bool Matches(const RunInfo& r, const RunsOptions& o) {
  if (!o.name.empty() && !Contains(r.name, o.name)) return false;
  if (o.status.empty()) return true;
  if (o.status == "failed")
    return r.status == "failed_to_start" || (r.exit_code && *r.exit_code != 0);
  return r.status == o.status;
}

// Runs in id order, each followed by the runs recorded as its parts (a
// tuning's trials), indented one level per generation.
std::vector<std::pair<const RunInfo*, int>> Grouped(const std::vector<RunInfo>& runs) {
  std::map<int64_t, std::vector<const RunInfo*>> parts;
  std::set<int64_t> ids;
  for (const RunInfo& r : runs) ids.insert(r.id);
  for (const RunInfo& r : runs)
    if (r.parent_id && ids.count(*r.parent_id)) parts[*r.parent_id].push_back(&r);
  std::vector<std::pair<const RunInfo*, int>> out;
  std::set<int64_t> listed;
  std::function<void(const RunInfo*, int)> add = [&](const RunInfo* r, int depth) {
    if (!listed.insert(r->id).second) return;
    out.emplace_back(r, depth);
    for (const RunInfo* part : parts[r->id]) add(part, depth + 1);
  };
  for (const RunInfo& r : runs)
    if (!r.parent_id || !ids.count(*r.parent_id)) add(&r, 0);
  for (const RunInfo& r : runs) add(&r, 0);  // a parent cycle: still listed once
  return out;
}

// A command on one table row: `python -c "..."` may hold line breaks.
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    bool space = c == '\n' || c == '\r' || c == '\t' || c == ' ';
    if (!space)
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

// The runs that match, with the parts of each (a tuning's trials), in id
// order; of those, the newest `last` top-level runs with their parts.
// `older` counts the top-level runs left out by `last`.
std::vector<RunInfo> Selected(const std::vector<RunInfo>& runs, const RunsOptions& o, int last,
                              int* older) {
  std::set<int64_t> matched;
  for (const RunInfo& r : runs)
    if (Matches(r, o)) matched.insert(r.id);
  std::set<int64_t> picked = WithParts(matched, runs);
  std::vector<RunInfo> out;
  for (const RunInfo& r : runs)
    if (picked.count(r.id)) out.push_back(r);
  std::vector<std::pair<const RunInfo*, int>> grouped = Grouped(out);
  std::vector<size_t> tops;  // where each top-level group starts
  for (size_t i = 0; i < grouped.size(); ++i)
    if (grouped[i].second == 0) tops.push_back(i);
  *older = 0;
  if (last < 0 || tops.size() <= static_cast<size_t>(last)) return out;
  *older = static_cast<int>(tops.size()) - last;
  std::set<int64_t> kept;
  for (size_t i = tops[static_cast<size_t>(*older)]; i < grouped.size(); ++i)
    kept.insert(grouped[i].first->id);
  std::vector<RunInfo> newest;
  for (const RunInfo& r : out)
    if (kept.count(r.id)) newest.push_back(r);
  return newest;
}

int List(const RunsOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  auto stored = (*store)->ListRuns();
  if (!stored.ok()) return Fail(stored.status().message());
  // A script gets every run unless it asks; a terminal the newest few.
  int last = o.all ? -1 : o.last >= 0 ? o.last : o.json ? -1 : kListDefault;
  int older = 0;
  std::vector<RunInfo> runs = Selected(*stored, o, last, &older);
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const RunInfo& r : runs) j.push_back(RunJson(r));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (stored->empty()) {
    std::printf("no runs in %s yet: record one with 'fullburn run -- CMD'\n",
                (*store)->path().c_str());
    return 0;
  }
  if (runs.empty()) {
    std::printf("none of the %zu runs in %s matches\n", stored->size(), (*store)->path().c_str());
    return 0;
  }
  std::printf("%-5s %-20s %-12s %-5s %-19s %10s %8s  %s\n", "id", "name", "status", "exit",
              "started", "duration", "samples", "command");
  for (const auto& [run, depth] : Grouped(runs)) {
    const RunInfo& r = *run;
    std::string dur = r.end_time ? FormatDuration(*r.end_time - r.start_time) : "-";
    std::string code = r.exit_code ? std::to_string(*r.exit_code) : "-";
    std::string name = depth ? std::string(2 * (depth - 1), ' ') + "- " + r.name : r.name;
    std::printf("%-5lld %-20.20s %-12s %-5s %-19s %10s %8lld  %.60s\n",
                static_cast<long long>(r.id), name.c_str(), r.status.c_str(), code.c_str(),
                FormatLocalTime(r.start_time).c_str(), dur.c_str(),
                static_cast<long long>(r.sample_count), OneLine(JoinedCommand(r.command)).c_str());
  }
  if (older > 0)
    std::printf("(%d older run%s not shown: --last N or --all)\n", older, older == 1 ? "" : "s");
  return 0;
}

int Show(const RunsOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  Result<RunData> data = (*store)->LoadRun(o.run);
  if (!data.ok()) return Fail(data.status().message());
  const RunInfo* run = &data->run;
  RunSummary sum = Summarize(*run, data->samples);
  const std::vector<StepRecord>& step_records = data->steps;
  std::vector<Finding> findings = Diagnose(*data);
  if (o.json) {
    nlohmann::json j = RunShowJson(*run, sum);
    j["findings"] = FindingsJson(findings);
    if (Mfu m = ComputeMfu(*data); m.counted) j["mfu"] = MfuJson(m);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("run %lld \"%s\"\n  command: %s\n  cwd:     %s\n  host:    %s\n  started: %s\n",
              static_cast<long long>(run->id), run->name.c_str(),
              JoinedCommand(run->command).c_str(), run->cwd.c_str(), run->host.c_str(),
              FormatLocalTime(run->start_time).c_str());
  std::printf("  samples: %lld every %gs\n", static_cast<long long>(run->sample_count),
              run->interval_s);
  if (run->sample_count == 0) std::printf("  (no samples were recorded)\n");
  std::fputs(RenderSummary(*run, sum, "").c_str(), stdout);
  if (!step_records.empty()) std::fputs(RenderStepsSummary(step_records).c_str(), stdout);
  std::fputs(RenderMfu(ComputeMfu(*data)).c_str(), stdout);
  std::fputs(RenderFindings(findings).c_str(), stdout);
  if (StackSummary stacks = RunStacks(*data); !stacks.empty() || stacks.errors > 0)
    std::printf("  python stacks (%lld samples at %g/s per thread; fullburn runs stacks %lld):\n%s",
                static_cast<long long>(stacks.samples), stacks.rate_hz, static_cast<long long>(run->id),
                RenderStackPhases(stacks).c_str());
  std::fputs(RenderLayers(RunLayers(*data)).c_str(), stdout);
  if (!data->checkpoints.empty()) {
    std::printf("  checkpoints:\n");
    for (const CheckpointRecord& c : data->checkpoints)
      std::printf("    step %-7lld %9s  loop blocked %s, written in %s  %s%s\n",
                  static_cast<long long>(c.step), FormatBytes(static_cast<double>(c.bytes)).c_str(),
                  fmt::format("{:.1f} ms", c.stall_s * 1e3).c_str(),
                  fmt::format("{:.0f} ms", c.write_s * 1e3).c_str(), c.path.c_str(),
                  ::access(c.path.c_str(), F_OK) == 0 ? "" : " (deleted: checkpoint.keep)");
  }
  return 0;
}

// The whole run as TensorBoard scalars (docs/trackers.md).
int ExportTensorBoard(RunStore* store, const RunInfo& run, const std::string& dir) {
  auto data = store->LoadRun(std::to_string(run.id));
  if (!data.ok()) return Fail(data.status().message());
  std::vector<TrackerPoint> points = RunPoints(*data, TrackerStyle::kTensorBoard);
  if (points.empty())
    return Fail("run " + std::to_string(run.id) + " has neither readings nor steps to export");
  auto writer = TfEventsWriter::Open(dir, run.start_time);
  if (!writer.ok()) return Fail(writer.status().message(), 1);
  if (Status s = (*writer)->Write(points); !s.ok()) return Fail(s.message(), 1);
  std::fprintf(stderr, "fullburn: run %lld: %zu scalars into %s (tensorboard --logdir %s)\n",
               static_cast<long long>(run.id), points.size(), (*writer)->path().c_str(), dir.c_str());
  return 0;
}

int Export(const RunsOptions& o) {
  if (o.format == "tensorboard" && o.dir.empty())
    return Fail("--format tensorboard writes files: give their folder, e.g. fullburn runs export " + o.run +
                " --format tensorboard runs/tb");
  if (o.format != "tensorboard" && !o.dir.empty())
    return Fail("a folder (" + o.dir + ") is only for --format tensorboard; csv and json go to stdout");
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  auto run = (*store)->GetRun(o.run);
  if (!run.ok()) return Fail(run.status().message());
  if (o.format == "tensorboard") return ExportTensorBoard(store->get(), *run, o.dir);
  if (o.table == "steps") {
    auto steps = (*store)->LoadSteps(run->id);
    if (!steps.ok()) return Fail(steps.status().message());
    if (steps->empty())
      return Fail(
          "run " + std::to_string(run->id) +
          " has no per-step records (fullburn train writes them, PyTorch jobs under fullburn run "
          "get them, other jobs mark steps with python/fullburn_markers.py): export "
          "--table samples instead");
    if (o.format == "json")
      std::printf("%s\n", StepsJson(*steps).dump().c_str());
    else
      std::fputs(StepsCsv(*steps).c_str(), stdout);
    return 0;
  }
  auto samples = (*store)->LoadSamples(run->id);
  if (!samples.ok()) return Fail(samples.status().message());
  if (o.format == "json")
    std::printf("%s\n", SamplesJson(*run, *samples).dump().c_str());
  else
    std::fputs(SamplesCsv(*samples).c_str(), stdout);
  return 0;
}

int Trace(const RunsOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  auto run = (*store)->GetRun(o.run);
  if (!run.ok()) return Fail(run.status().message());
  auto steps = (*store)->LoadSteps(run->id);
  if (!steps.ok()) return Fail(steps.status().message());
  auto checkpoints = (*store)->LoadCheckpoints(run->id);
  if (!checkpoints.ok()) return Fail(checkpoints.status().message());
  auto samples = (*store)->LoadSamples(run->id);
  if (!samples.ok()) return Fail(samples.status().message());
  auto events = (*store)->LoadEvents(run->id);
  if (!events.ok()) return Fail(events.status().message());
  if (steps->empty() && samples->empty())
    return Fail("run " + std::to_string(run->id) + " has neither steps nor samples to trace");
  std::printf("%s\n", ChromeTrace(*run, *steps, *checkpoints, *events, *samples).dump().c_str());
  return 0;
}

// fullburn runs stacks RUN: the run's Python stacks, as py-spy sampled them,
// by phase: folded (flamegraph.pl, inferno) or speedscope's JSON.
int Stacks(const RunsOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  Result<RunData> data = (*store)->LoadRun(o.run);
  if (!data.ok()) return Fail(data.status().message());
  StackPhase phase;
  if (!o.phase.empty() && !ParseStackPhase(o.phase, &phase))
    return Fail("--phase " + o.phase +
                " is no phase: data_wait, forward, backward, optimizer, evaluation, checkpoint, "
                "other, startup, threads, workers or processes");
  std::string file = StoreLayout((*store)->path()).Stacks(data->run.id);
  Result<std::string> text = Env::Default()->ReadFile(file);
  if (!text.ok())
    return Fail(fmt::format(
        "run {} has no Python stacks ({} cannot be read: {}): fullburn run samples them when "
        "py-spy is installed (pip install py-spy), unless --no-stacks",
        data->run.id, file, text.status().message()));
  int64_t bad = 0;
  std::vector<StackSample> samples = ParseFoldedStacks(*text, &bad);
  if (samples.empty()) return Fail(file + " holds no stack sample (py-spy's raw format)");
  StackSummary summary = RunStacks(*data);
  int root = summary.root;
  double rate = summary.rate_hz > 0 ? summary.rate_hz : 100;
  if (o.format == "speedscope") {
    nlohmann::json j = SpeedscopeJson(samples, root, rate, fmt::format("fullburn run {}", data->run.id));
    if (!o.phase.empty()) {
      nlohmann::json kept = nlohmann::json::array();
      for (const auto& p : j["profiles"])
        if (p["name"] == o.phase) kept.push_back(p);
      j["profiles"] = kept;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputs(FoldedStacks(samples, root, o.phase).c_str(), stdout);
  }
  if (bad > 0)
    std::fprintf(stderr, "fullburn: %lld line(s) of %s were no stack and were skipped\n",
                 static_cast<long long>(bad), file.c_str());
  return 0;
}

CLI::App* AddRunArg(CLI::App* sub, RunsOptions* o) {
  sub->add_option("RUN", o->run, "Run id, or 'last'")->required();
  AddStoreOption(sub, &o->common);
  return sub;
}

}  // namespace

std::set<int64_t> WithParts(std::set<int64_t> chosen, const std::vector<RunInfo>& runs) {
  for (bool grew = true; grew;) {
    grew = false;
    for (const RunInfo& r : runs)
      if (r.parent_id && chosen.count(*r.parent_id) && chosen.insert(r.id).second) grew = true;
  }
  return chosen;
}

// fullburn runs import SPILL...: what a store refused, loaded once it has
// room. Idempotent; a damaged line is skipped and said, and the exit is 1.
int Import(const RunsOptions& o) {
  Result<std::unique_ptr<RunStore>> store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  int code = 0;
  for (const std::string& path : o.spills) {
    Result<SpillImport> got = ImportSpill(store->get(), path);
    if (!got.ok()) {
      Fail(got.status().message());
      code = 1;
      continue;
    }
    std::printf("%s: into run %lld%s: %lld steps, %lld samples, %lld events, %lld checkpoints%s\n",
                path.c_str(), static_cast<long long>(got->run_id),
                got->new_run ? " (made anew: this store had no such run)" : "",
                static_cast<long long>(got->steps), static_cast<long long>(got->samples),
                static_cast<long long>(got->events), static_cast<long long>(got->checkpoints),
                got->end ? ", and the run's end" : "");
    if (got->skipped > 0) {
      std::fprintf(stderr,
                   "fullburn: %s: %lld damaged or cut-short lines skipped (the first at %s); the "
                   "rest is stored\n",
                   path.c_str(), static_cast<long long>(got->skipped), got->first_skip.c_str());
      code = 1;
    } else if (!o.keep) {
      ::unlink(path.c_str());  // whole and stored: importing it again would add nothing
    }
  }
  return code;
}

void SetupRuns(CLI::App& app) {
  CLI::App* runs = app.add_subcommand("runs", "List, show, export and delete stored runs");
  runs->require_subcommand(1);
  auto o = std::make_shared<RunsOptions>();
  CLI::App* list = runs->add_subcommand("list", "List the stored runs");
  list->add_flag("--json", o->json, "JSON array of runs (all that match, unless --last)");
  list->add_option("-n,--last", o->last,
                   "Only the newest N runs, each with its parts (a tuning's trials); the table "
                   "shows the newest " +
                       std::to_string(kListDefault) + " unless told")
      ->check(CLI::NonNegativeNumber);
  list->add_flag("--all", o->all, "Every run that matches");
  list->add_option("--status", o->status,
                   "Only runs with this status; failed: a non-zero exit or failed to start")
      ->check(CLI::IsMember(kListStatuses));
  list->add_option("--name", o->name, "Only runs whose name contains this (any case)");
  AddStoreOption(list, &o->common);
  list->callback([o] { ExitCode() = List(*o); });

  CLI::App* show = AddRunArg(
      runs->add_subcommand("show", "A run's metadata and per-metric statistics"), o.get());
  show->add_flag("--json", o->json,
                 "JSON: metadata and, per metric, min/median/p95/max, unit, count");
  show->callback([o] { ExitCode() = Show(*o); });

  CLI::App* exp = AddRunArg(
      runs->add_subcommand("export", "Every sample of a run, to stdout (csv, json) or TensorBoard's files"),
      o.get());
  exp->add_option("DIR", o->dir, "With --format tensorboard: the folder its event file goes into");
  exp->add_option("--format", o->format,
                  "csv (one column per metric), json, or tensorboard (readings, steps and the "
                  "diagnosis as scalars under fullburn/..., into DIR; docs/trackers.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"csv", "json", "tensorboard"}));
  exp->add_option("--table", o->table,
                  "samples (telemetry) or steps (fullburn train's per-step records)")
      ->capture_default_str()
      ->check(CLI::IsMember({"samples", "steps"}));
  exp->callback([o] { ExitCode() = Export(*o); });

  CLI::App* trace =
      AddRunArg(runs->add_subcommand(
                    "trace", "The run's step timeline as Chrome trace / Perfetto JSON, to stdout"),
                o.get());
  trace->callback([o] { ExitCode() = Trace(*o); });

  auto so = std::make_shared<RunsOptions>();
  so->format = "folded";
  CLI::App* stacks = AddRunArg(
      runs->add_subcommand("stacks", "The run's Python stacks by phase, to stdout: folded "
                                     "(flamegraph.pl) or speedscope JSON (docs/stacks.md)"),
      so.get());
  stacks->add_option("--format", so->format, "folded (one line per stack, its phase first) or speedscope")
      ->capture_default_str()
      ->check(CLI::IsMember({"folded", "speedscope"}));
  stacks->add_option("--phase", so->phase,
                     "Only this phase's stacks: data_wait, forward, backward, optimizer, evaluation, "
                     "checkpoint, other, startup, threads, workers, processes");
  stacks->callback([so] { ExitCode() = Stacks(*so); });

  CLI::App* import = runs->add_subcommand(
      "import", "Load spill files (what a store refused while recording) into the store");
  import->add_option("SPILL", o->spills, "Spill files, as fullburn named them")->required();
  import->add_flag("--keep", o->keep, "Keep a spill file once it is wholly stored (default: remove it)");
  AddStoreOption(import, &o->common);
  import->callback([o] { ExitCode() = Import(*o); });

  SetupRunsRemove(runs);
  // Listed for --help: main() hands `runs push` to fullburn-net (MLflow's HTTP).
  runs->add_subcommand("push", kRunsPushAbout);
}

}  // namespace fullburn::cli
