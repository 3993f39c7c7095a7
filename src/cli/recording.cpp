#include "recording.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "fullburn/diagnose.h"
#include "fullburn/gpu_peaks.h"
#include "fullburn/recorder.h"

namespace fullburn::cli {

void AddRecordOptions(CLI::App* app, RecordOptions* opts, const std::string& what) {
  app->add_option("--name", opts->name, "Name of the run (default: " + what + ")");
  app->add_flag("-q,--quiet", opts->quiet, "No live line and no summary");
  AddIntervalOption(app, &opts->common, 1.0);
  AddStoreOption(app, &opts->common);
  app->add_option("--peak-tflops", opts->peak_tflops,
                  "Dense bf16 TFLOPS of one GPU, for MFU, in place of fullburn's table of GPU "
                  "models (docs/diagnosis.md); 0: the table's")
      ->check(CLI::Range(0.0, 1e6))
      ->envname(kPeakTflopsEnvVar);
}

void AddRecordConfig(const RecordOptions& opts, nlohmann::json* config) {
  if (opts.peak_tflops > 0) (*config)["peak_tflops"] = opts.peak_tflops;
}

void NoteIfNoPeak(const GpuSource& gpus, const RecordOptions& opts) {
  if (opts.peak_tflops > 0) return;
  std::string missing;
  for (const GpuInfo& g : gpus.gpus())
    if (!FindGpuPeak(g.name) && missing.find(g.name) == std::string::npos)
      missing += (missing.empty() ? "" : ", ") + g.name;
  if (!missing.empty())
    std::fprintf(stderr,
                 "fullburn: %s is not in fullburn's table of GPU peaks: MFU needs "
                 "--peak-tflops (%s), the GPU's dense bf16 TFLOPS\n",
                 missing.c_str(), kPeakTflopsEnvVar);
}

std::string GpusJson(const GpuSource& gpus) {
  nlohmann::json j = nlohmann::json::array();
  for (const GpuInfo& g : gpus.gpus())
    j.push_back({{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}});
  return j.dump();
}

int RecordUntil(const Recording& rec, const std::function<int()>& wait) {
  std::unique_ptr<LiveStatus> live;
  if (!rec.quiet) live.reset(new LiveStatus(STDERR_FILENO));
  const bool drawn = live && live->active();
  const double t0 = rec.env->MonotonicSeconds();
  RecentSteps recent;  // the sampler thread's
  Recorder::Options o;
  o.sampler.interval_s = rec.info.interval_s;
  o.sampler.root_pid = rec.root_pid;
  o.sampler.adopter_pid = rec.adopter_pid;
  o.gpus = rec.gpus;
  o.live_diagnosis = drawn;
  o.spill = rec.spill;
  const double start = rec.info.start_time;
  if (rec.events)  // what the job appended to its events file since the last look
    o.poll_job = [&rec, start] {
      RunRecords got;
      rec.events->Poll(start, &got.steps, &got.events);
      return got;
    };
  Recorder* recorder = nullptr;  // set before Start: on_snapshot runs only after it
  o.on_snapshot = [&](const Snapshot& s, const RunRecords& polled) {
    recent.Add(polled.steps);
    if (drawn)
      live->Draw(RenderLiveLine(s, s.mono_time - t0, recent.Render() + recorder->LiveFinding()));
  };
  Recorder recording(rec.env, rec.store, rec.info, std::move(o));
  recorder = &recording;
  recording.Start();
  int code = wait();
  recording.StopSampling();
  live.reset();
  (void)recording.Finish();  // what could not be stored is said; the job's code stands
  return code;
}

void EndRun(const Recording& rec, double end_time, std::optional<int> exit_code,
            const std::string& status) {
  std::string said = FinishRunOrKeep(rec.store, rec.spill, rec.info.id, end_time, exit_code, status);
  for (size_t at = 0, nl; (nl = said.find('\n', at)) != std::string::npos; at = nl + 1)
    std::fprintf(stderr, "fullburn: %s\n", said.substr(at, nl - at).c_str());
}

void PrintRunEnd(const Recording& rec) {
  if (rec.quiet) return;
  const int64_t id = rec.info.id;
  if (Result<RunData> stored = rec.store->LoadRun(std::to_string(id)); stored.ok()) {
    std::string note = rec.gpus->available() ? "" : rec.gpus->unavailable_reason();
    std::fputs(RenderSummary(stored->run, Summarize(stored->run, stored->samples), note).c_str(),
               stderr);
    if (!stored->steps.empty()) std::fputs(RenderStepsSummary(stored->steps).c_str(), stderr);
    std::fputs(RenderMfu(ComputeMfu(*stored)).c_str(), stderr);
    std::fputs(RenderFindings(Diagnose(*stored)).c_str(), stderr);
  }
  if (rec.spill && !rec.spill->empty()) {
    std::fprintf(stderr,
                 "fullburn: run %lld is in %s only in part until the spill is imported (above)\n",
                 static_cast<long long>(id), rec.store->path().c_str());
    return;
  }
  std::fprintf(stderr, "fullburn: stored as run %lld in %s (fullburn runs show %lld)\n",
               static_cast<long long>(id), rec.store->path().c_str(), static_cast<long long>(id));
}

}  // namespace fullburn::cli
