// One trial of fullburn tune: a child process (fullburn-train, or fullburn
// run around the user's command) recorded as a run linked to the tuning,
// then measured from the store.
#include "tune_trial.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "child.h"
#include "fullburn/env.h"
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

std::string TrialLogDir(const std::string& store_path, int64_t tuning_id) {
  std::string dir = store_path.substr(0, store_path.rfind('/') + 1) + "tune-" + std::to_string(tuning_id);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void RunTrial(const TrialSpec& spec, RunStore* store, Trial* trial) {
  const Env* env = Env::Default();
  double start = env->MonotonicSeconds();
  int64_t before = FindTrialRun(store, spec.tuning_id, 0);
  auto child = SpawnChild(spec.argv, spec.extra_env, trial->log);
  if (!child.ok()) {
    trial->status = "failed";
    trial->reason = child.status().message();
    return;
  }
  bool timed_out = false;
  int code = WaitChildFor(*child, spec.timeout_s, &timed_out);
  trial->wall_s = env->MonotonicSeconds() - start;
  trial->run_id = FindTrialRun(store, spec.tuning_id, before);
  if (ReceivedSignal()) {
    trial->status = "interrupted";
    trial->reason = "stopped by signal " + std::to_string(ReceivedSignal());
    return;
  }
  bool stopped_by_us = timed_out && spec.stop_is_normal;
  if (timed_out && !spec.stop_is_normal) {
    trial->status = "failed";
    trial->reason = "timeout: still running after " + std::to_string(static_cast<int>(spec.timeout_s)) + " s";
    return;
  }
  if (code != 0 && !stopped_by_us) {
    trial->status = "failed";
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
  }
  if (!m.ok()) {
    trial->status = "failed";
    trial->reason = m.status().message();
    return;
  }
  trial->status = "ok";
  trial->measure = *m;
}

std::string Verdict(const Trial& t, const Trial& best, double min_gain, bool* kept) {
  double gain = 0;
  *kept = BeatsBest(t.measure, best.measure, min_gain, &gain);
  if (*kept) return fmt::format("kept {:+.0f}%", gain * 100);
  return fmt::format("{} {:+.0f}%", gain < 0 ? "slower" : "within noise", gain * 100);
}

}  // namespace fullburn::cli
