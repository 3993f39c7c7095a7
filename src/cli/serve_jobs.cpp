#include "serve_jobs.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace fullburn::cli {

void JobsWatcher::Read(const RunInfo& run, Watched* w) {
  double now = env_->UnixSeconds() - run.start_time;
  // First sight: the last minute only, however long the job has run.
  const bool first = std::isinf(w->read_to);
  double after = first ? now - LiveDiagnosis::kWindowS - 1 : w->read_to - kLookBackS;
  if (Result<std::map<std::string, Series>> samples = store_->LoadSamples(run.id, after);
      samples.ok()) {
    std::map<double, std::vector<std::pair<std::string, double>>> by_time;
    for (const auto& [name, series] : *samples) {
      double& last = w->last_reading.emplace(name, -INFINITY).first->second;
      for (const SeriesPoint& p : series)
        if (p.t > last) {
          by_time[p.t].push_back({name, p.v});
          last = p.t;
          w->read_to = std::max(w->read_to, p.t);
        }
    }
    for (const auto& [t, readings] : by_time) w->live.AddReadings(t, readings);
  }
  if (Result<std::vector<StepRecord>> steps = store_->LoadSteps(run.id, after); steps.ok()) {
    std::vector<StepRecord> fresh;
    for (const StepRecord& r : *steps)
      if (w->steps_seen.emplace(std::make_pair(r.rank, r.step), r.t).second) {
        fresh.push_back(r);
        w->read_to = std::max(w->read_to, r.t);
      }
    w->live.AddSteps(fresh);
  }
  // The job's settings (its DataLoader) may be older than the minute: all
  // events at first sight, LiveDiagnosis keeps what it needs.
  if (Result<std::vector<RunEvent>> events = store_->LoadEvents(run.id, first ? -INFINITY : after);
      events.ok()) {
    std::vector<RunEvent> fresh;
    for (const RunEvent& e : *events)
      if (w->events_seen.insert({e.t, e.kind, e.data}).second) fresh.push_back(e);
    w->live.AddEvents(fresh);
  }
  // Forget what the next look-back cannot return again.
  double keep_from = w->read_to - 2 * kLookBackS;
  for (auto it = w->steps_seen.begin(); it != w->steps_seen.end();)
    it = it->second < keep_from ? w->steps_seen.erase(it) : std::next(it);
  for (auto it = w->events_seen.begin(); it != w->events_seen.end();)
    it = std::get<0>(*it) < keep_from ? w->events_seen.erase(it) : std::next(it);
}

bool JobsWatcher::StoreOpen() {
  if (store_) return true;
  std::error_code missing;
  if (!problem_.empty() || !std::filesystem::exists(store_path_, missing)) return false;
  Result<std::unique_ptr<RunStore>> store = RunStore::Open(store_path_);
  if (!store.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    problem_ = store.status().message();
    return false;
  }
  store_ = std::move(*store);
  return true;
}

std::string JobsWatcher::Problem() const {
  std::lock_guard<std::mutex> lock(mu_);
  return problem_;
}

void JobsWatcher::Poll() {
  if (!StoreOpen()) return;
  Result<std::vector<RunInfo>> runs = store_->ListRunning();
  if (!runs.ok()) return;
  std::vector<JobNow> jobs;
  std::set<int64_t> running;
  for (const RunInfo& run : *runs) {
    if (run.host != host_) continue;
    running.insert(run.id);
    std::unique_ptr<Watched>& w = watched_[run.id];
    if (!w) w = std::make_unique<Watched>(run);
    Read(run, w.get());
    double now = env_->UnixSeconds() - run.start_time;
    std::vector<StepRecord> minute;
    for (const StepRecord& r : w->live.steps())
      if (r.t >= now - LiveDiagnosis::kWindowS) minute.push_back(r);
    jobs.push_back(SummarizeJob(run, minute, w->live.Update(now)));
    if (w->live.mfu().known()) jobs.back().mfu = w->live.mfu().value;
  }
  for (auto it = watched_.begin(); it != watched_.end();)
    it = running.count(it->first) ? std::next(it) : watched_.erase(it);
  std::lock_guard<std::mutex> lock(mu_);
  jobs_ = std::move(jobs);
}

std::vector<JobNow> JobsWatcher::Jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_;
}

std::vector<RecordedJob> RecordedJobs(const std::vector<JobNow>& jobs) {
  std::vector<RecordedJob> out;
  for (const JobNow& j : jobs) {
    if (j.run.recorder_pid > 0)
      out.push_back({j.run.id, j.run.recorder_pid, j.run.start_time, false, j.run.recorder_start});
    nlohmann::json config = nlohmann::json::parse(j.run.config_json, nullptr, false);
    if (config.is_object() && config.contains("attached_pid") && config["attached_pid"].is_number_integer())
      out.push_back({j.run.id, config["attached_pid"].get<int>(), j.run.start_time, true});
  }
  return out;
}

void LabelHolders(const std::vector<GpuSample>& gpus, const std::vector<std::vector<PromLabel>>& labels,
                  std::vector<GpuInfo>* info) {
  for (size_t i = 0; i < gpus.size() && i < labels.size(); ++i)
    for (GpuInfo& g : *info)
      if (g.index == gpus[i].index) g.labels = labels[i];
}

}  // namespace fullburn::cli
