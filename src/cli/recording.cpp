#include "recording.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "fullburn/diagnose.h"

namespace fullburn::cli {
namespace {

// Records a store that refuses writes for a while (locked by another
// process past its busy timeout, a full disk) would lose: they are kept and
// written once it takes writes again, so a long job loses nothing to a
// passing problem. Stopping and resuming are each said once. Used from one
// thread at a time (the sampler's, then the caller's once it stopped).
class StoreWrites {
 public:
  explicit StoreWrites(const Recording& rec)
      : rec_(rec),
        samples_(rec.store, rec.info.id, rec.info.start_time),
        records_(rec.store, rec.info.id) {}

  // Stores the snapshot (if any) and the job's new step events; returns the
  // events (for the live line).
  RunRecords Tick(const Snapshot* s) {
    Status st = s ? samples_.Add(*s) : samples_.Flush();
    RunRecords got;  // what the job appended to its events file since the last look
    if (rec_.events) rec_.events->Poll(rec_.info.start_time, &got.steps, &got.events);
    records_.Add(got);
    if (st.ok()) st = records_.Flush();
    Note(st);
    return got;
  }

  // At the end: what could not be stored, if anything.
  void Finish() {
    Tick(nullptr);
    if (failing_)
      std::fprintf(stderr, "fullburn: %zu step records and %zu events could not be stored: %s\n",
                   records_.kept_steps(), records_.kept_events(), error_.c_str());
  }

 private:
  void Note(const Status& st) {
    if (!st.ok() && !failing_) {
      failing_ = true;
      error_ = st.message();
      std::fprintf(stderr,
                   "\nfullburn: %s; the job keeps running, and its samples and steps are kept "
                   "to be written once the store takes writes again\n",
                   error_.c_str());
    } else if (st.ok() && failing_) {
      failing_ = false;
      int64_t snapshots = samples_.dropped() - snapshots_said_;
      int64_t records = records_.dropped() - records_said_;
      snapshots_said_ = samples_.dropped();
      records_said_ = records_.dropped();
      std::string what = snapshots || records ? std::to_string(snapshots) + " snapshots and " +
                                                    std::to_string(records) + " step records lost"
                                              : "nothing lost";
      std::fprintf(stderr, "\nfullburn: the run store takes writes again (%s)\n", what.c_str());
    }
  }

  const Recording& rec_;
  BatchWriter samples_;
  RecordWriter records_;
  bool failing_ = false;
  std::string error_;
  int64_t snapshots_said_ = 0, records_said_ = 0;
};

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
  so.adopter_pid = rec.adopter_pid;
  Sampler sampler(rec.env, rec.gpus, so);
  StoreWrites writes(rec);
  std::unique_ptr<LiveStatus> live;
  if (!rec.quiet) live.reset(new LiveStatus(STDERR_FILENO));
  double t0 = rec.env->MonotonicSeconds();
  // Only the sampler thread touches these.
  RecentSteps recent;
  LiveDiagnosis now(rec.info);
  bool drawn = live && live->active();
  sampler.Start([&](const Snapshot& s) {
    RunRecords got = writes.Tick(&s);
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
  writes.Finish();
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
