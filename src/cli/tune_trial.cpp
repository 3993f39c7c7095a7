// One trial of fullburn tune: a child process (fullburn-train, or fullburn
// run around the user's command) recorded as a run linked to the tuning,
// then measured from the store.
#include "tune_trial.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>

#include "child.h"
#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/env.h"
#include "fullburn/pipeline.h"
#include "fullburn/report.h"

namespace fullburn::cli {
namespace {

// The line that says why a child failed: its last "fullburn:" line, else its
// last line, shortened.
std::string FailureLine(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line, last, last_ours;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    last = line;
    size_t at = line.find("fullburn: ");
    if (at != std::string::npos) last_ours = line.substr(at + 10);
  }
  std::string why = last_ours.empty() ? last : last_ours;
  return why.size() > 200 ? why.substr(0, 197) + "..." : why;
}

// The run the child recorded: the newest run of this tuning not seen before.
int64_t FindTrialRun(RunStore* store, int64_t tuning_id, int64_t after) {
  auto runs = store->ListRuns();
  if (!runs.ok()) return 0;
  int64_t found = 0;
  for (const RunInfo& r : *runs)
    if (r.parent_id && *r.parent_id == tuning_id && r.id > after) found = std::max(found, r.id);
  return found;
}

Result<Measure> MeasureFromOutput(const std::string& log_path, const std::string& pattern) {
  std::regex re(pattern);
  std::ifstream in(log_path);
  std::string line;
  std::vector<double> values;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, re)) continue;
    try {
      values.push_back(std::stod(m.size() > 1 ? m[1].str() : m[0].str()));
    } catch (...) {
      // A match that is not a number: the pattern's group is wrong, said below if nothing matches.
    }
  }
  return MeasureValues(values, "metric");
}

}  // namespace

void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial) {
  const Env* env = Env::Default();
  double start = env->MonotonicSeconds();
  int64_t before = FindTrialRun(store, spec.tuning_id, 0);
  auto child = SpawnChild(spec.argv, spec.extra_env, trial->log);
  if (!child.ok()) {
    trial->status = TrialStatus::kFailed;
    trial->reason = child.status().message();
    return;
  }
  bool timed_out = false;
  int code = WaitChildFor(*child, spec.timeout_s, &timed_out);
  trial->wall_s = env->MonotonicSeconds() - start;
  trial->run_id = FindTrialRun(store, spec.tuning_id, before);
  if (ReceivedSignal()) {
    trial->status = TrialStatus::kInterrupted;
    trial->reason = "stopped by signal " + std::to_string(ReceivedSignal());
    return;
  }
  bool stopped_by_us = timed_out && spec.stop_is_normal;
  if (timed_out && !spec.stop_is_normal) {
    trial->status = TrialStatus::kFailed;
    trial->reason = "timeout: still running after " + std::to_string(static_cast<int>(spec.timeout_s)) + " s";
    return;
  }
  if (code != 0 && !stopped_by_us) {
    trial->status = TrialStatus::kFailed;
    std::string why = FailureLine(trial->log);
    trial->reason = DescribeExitCode(code) + (why.empty() ? "" : ": " + why);
    return;
  }
  Result<Measure> m = Status::NotFound("no run");
  if (!spec.metric_regex.empty()) {
    m = MeasureFromOutput(trial->log, spec.metric_regex);
  } else if (trial->run_id == 0) {
    m = Status::NotFound("the trial recorded no run (see " + trial->log + ")");
  } else {
    auto data = store->LoadRun(std::to_string(trial->run_id));
    if (!data.ok())
      m = data.status();
    else if (data->steps.empty())
      m = Status::NotFound(
          "no step records: no torch optimizer.step() seen; mark the steps with "
          "python/fullburn_markers.py, or measure the output with --grid and --metric-regex");
    else
      m = MeasureRun(*data, spec.objective);
    // Stopped at the trial's end before its first step (fullburn-train
    // never ends on its time limit before one: there no step is a failure).
    trial->no_steps = data.ok() && data->steps.empty() && stopped_by_us;
  }
  if (!m.ok()) {
    trial->status = TrialStatus::kFailed;
    trial->reason = m.status().message();
    // Only a child that ran the whole trial would have had more steps in a
    // longer one; one that ended by itself would not.
    trial->too_short = m.status().code() == Status::Code::kUnavailable &&
                       (stopped_by_us || trial->wall_s >= spec.length_s);
    return;
  }
  trial->status = TrialStatus::kOk;
  trial->measure = *m;
}

TrialSpec CommandTrialSpec(const Tuning& t, const std::string& label,
                           const std::vector<std::string>& command) {
  TrialSpec spec;
  spec.argv = {SelfExecutable(),
               "run",
               "-q",
               "--parent",
               std::to_string(t.id()),
               "--name",
               fmt::format("tune {} #{}: {}", t.id(), t.trials().size() + 1, label),
               "--store",
               t.store()->path(),
               "--"};
  spec.argv.insert(spec.argv.end(), command.begin(), command.end());
  spec.tuning_id = t.id();
  spec.timeout_s = t.plan().trial_s;
  spec.length_s = t.plan().trial_s;
  spec.stop_is_normal = true;  // a command still running at the trial's end is measured
  spec.objective = t.plan().objective;
  return spec;
}

bool ChildTrialRunner::Interrupted() const { return ReceivedSignal() != 0; }

Status ChildTrialRunner::WritePack(const PackJob& job) {
  auto folder = ScanImageFolder(job.src);
  if (!folder.ok()) return folder.status();
  std::string parent = job.dst.substr(0, job.dst.rfind('/'));
  struct statvfs fsinfo {};
  if (::statvfs(parent.c_str(), &fsinfo) == 0) {
    double free_bytes =
        static_cast<double>(fsinfo.f_bavail) * static_cast<double>(fsinfo.f_frsize);
    if (Status room = CheckPackSpace(folder->files.size(), job.max_side, free_bytes, parent);
        !room.ok())
      return room;
  }
  std::fprintf(stderr, "tune: packing the %zu images of %s into %s (raw, max side %d)\n",
               folder->files.size(), job.src.c_str(), job.dst.c_str(), job.max_side);
  const Env* env = Env::Default();
  double started = env->MonotonicSeconds();
  PackOptions po;
  po.format = PackFormat::kRaw;
  po.max_side = job.max_side;
  auto report = fullburn::WritePack(*folder, job.src, job.dst, po);
  if (!report.ok())  // WritePack has removed what it wrote
    return Status::IoError("packing " + job.src + " failed: " + report.status().message());
  std::fprintf(
      stderr, "tune: packed %lld images (%.0f MiB) in %.1fs%s\n",
      static_cast<long long>(report->images), report->bytes / 1048576.0,
      env->MonotonicSeconds() - started,
      report->skipped ? fmt::format(", {} unreadable left out", report->skipped).c_str() : "");
  return Status::Ok();
}

}  // namespace fullburn::cli
