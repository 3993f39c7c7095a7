#include "recording.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "fullburn/diagnose.h"

namespace fullburn::cli {
namespace {

// What the job appended to its events file since the last look.
struct NewEvents {
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
};

// Moves them into the store; returns them (for the live line).
NewEvents DrainEvents(const Recording& rec) {
  NewEvents got;
  if (!rec.events) return got;
  rec.events->Poll(rec.info.start_time, &got.steps, &got.events);
  if (!got.steps.empty()) rec.store->AppendSteps(rec.info.id, got.steps);
  for (const RunEvent& e : got.events) rec.store->AddEvent(rec.info.id, e);
  return got;
}

}  // namespace

void AddRecordOptions(CLI::App* app, RecordOptions* opts, const std::string& what) {
  app->add_option("--name", opts->name, "Name of the run (default: " + what + ")");
  app->add_flag("-q,--quiet", opts->quiet, "No live line and no summary");
  AddIntervalOption(app, &opts->common, 1.0);
  AddStoreOption(app, &opts->common);
}

std::string GpusJson(const GpuSource& gpus) {
  nlohmann::json j = nlohmann::json::array();
  for (const GpuInfo& g : gpus.gpus())
    j.push_back({{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}});
  return j.dump();
}

int RecordUntil(const Recording& rec, const std::function<int()>& wait) {
  SamplerOptions so;
  so.interval_s = rec.info.interval_s;
  so.root_pid = rec.root_pid;
  Sampler sampler(rec.env, rec.gpus, so);
  BatchWriter writer(rec.store, rec.info.id, rec.info.start_time);
  std::unique_ptr<LiveStatus> live;
  if (!rec.quiet) live.reset(new LiveStatus(STDERR_FILENO));
  std::atomic<bool> write_failed{false};
  double t0 = rec.env->MonotonicSeconds();
  // Only the sampler thread touches these.
  RecentSteps recent;
  LiveDiagnosis now(rec.info);
  bool drawn = live && live->active();
  sampler.Start([&](const Snapshot& s) {
    Status st = writer.Add(s);
    if (!st.ok() && !write_failed.exchange(true))
      std::fprintf(stderr, "\nfullburn: %s; the job keeps running, later samples are lost\n",
                   st.message().c_str());
    NewEvents got = DrainEvents(rec);
    recent.Add(got.steps);
    if (!drawn) return;
    now.AddSteps(got.steps);
    now.AddEvents(got.events);
    double t = s.unix_time - rec.info.start_time;
    now.AddReadings(t, Flatten(s));
    live->Draw(
        RenderLiveLine(s, s.mono_time - t0, recent.Render() + RenderLiveFinding(now.Update(t))));
  });
  int code = wait();
  sampler.Stop();
  live.reset();
  writer.Flush();
  DrainEvents(rec);
  return code;
}

void PrintRunEnd(const Recording& rec) {
  if (rec.quiet) return;
  const int64_t id = rec.info.id;
  if (Result<RunData> stored = rec.store->LoadRun(std::to_string(id)); stored.ok()) {
    std::string note = rec.gpus->available() ? "" : rec.gpus->unavailable_reason();
    std::fputs(RenderSummary(stored->run, Summarize(stored->run, stored->samples), note).c_str(),
               stderr);
    if (!stored->steps.empty()) std::fputs(RenderStepsSummary(stored->steps).c_str(), stderr);
    std::fputs(RenderFindings(Diagnose(*stored)).c_str(), stderr);
  }
  std::fprintf(stderr, "fullburn: stored as run %lld in %s (fullburn runs show %lld)\n",
               static_cast<long long>(id), rec.store->path().c_str(), static_cast<long long>(id));
}

}  // namespace fullburn::cli
