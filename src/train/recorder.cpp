#include "fullburn/recorder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "fullburn/diagnose.h"

namespace fullburn {

struct Recorder::Rep {
  const Env* env;
  RunStore* store;
  RunInfo run;
  Options o;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<BatchWriter> samples;        // null when forwarding
  std::unique_ptr<AsyncRecordWriter> records;  // null when forwarding
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> events_out{nullptr, &std::fclose};
  std::vector<StepRecord> pending_steps;  // job thread
  std::vector<RunEvent> forward_events;   // job thread
  bool dropping = false;  // the job thread writes it under mu; the sampler reads it under mu
  bool sampling_stopped = false, finished = false;
  Status final_status;
  // The store's refusals, from both writers (job thread, but samples_* under mu).
  bool said_failing = false, records_failing = false;
  std::string spill_said;  // the spill file named on stderr (a new one is named again)
  int64_t restored = 0;    // spilled records stored since the last "takes writes again"
  std::string records_error;
  int64_t records_lost = 0, records_lost_said = 0, samples_dropped_said = 0;

  mutable std::mutex mu;
  std::vector<NamedSample> forward_samples;  // under mu (the sampler thread adds)
  std::unique_ptr<LiveDiagnosis> live;       // sampler thread
  std::vector<StepRecord> live_steps;        // under mu
  std::vector<RunEvent> live_events;         // under mu
  std::string live_finding;                  // under mu
  Status samples_status;                     // under mu: the snapshots' last write
  int64_t samples_dropped = 0;               // under mu
  // Other ranks' steps, read back from the store (sampler thread).
  double ranks_read_at = -INFINITY, ranks_read_to = -INFINITY;
  std::map<int, int64_t> ranks_last_step;

  void OnSnapshot(const Snapshot& s, Recorder* self);
  void RecordPolled(const RunRecords& got, Recorder* self);
  void Say(bool failing, const std::string& why);
  void FeedLiveDiagnosis(const Snapshot& s);
  void ReadOtherRanksSteps(double t, std::vector<StepRecord>* steps);
  void SayStoreChanges();
};

Recorder::Recorder(const Env* env, RunStore* store, RunInfo run, Options o)
    : rep_(std::make_unique<Rep>()), forward_(o.forward) {
  Rep& r = *rep_;
  r.env = env;
  r.store = store;
  r.run = std::move(run);
  r.o = std::move(o);
  r.sampler = std::make_unique<Sampler>(env, r.o.gpus, r.o.sampler);
  if (!forward_) {
    r.samples = std::make_unique<BatchWriter>(store, r.run.id, r.run.start_time, 1.0, 300, r.o.spill);
    r.records = std::make_unique<AsyncRecordWriter>(store, r.run.id, 200000, 1.0, r.o.spill);
  }
  if (r.o.live_diagnosis) r.live = std::make_unique<LiveDiagnosis>(r.run);
  if (!r.o.events_path.empty()) {
    r.events_out.reset(std::fopen(r.o.events_path.c_str(), "a"));
    if (!r.events_out)
      std::fprintf(stderr, "fullburn: cannot append step events to %s (%s): not sent\n",
                   r.o.events_path.c_str(), kEventsEnvVar);
  }
}

Recorder::~Recorder() { (void)Finish(); }

void Recorder::Start() {
  rep_->sampler->Start([this](const Snapshot& s) { rep_->OnSnapshot(s, this); });
}

void Recorder::Rep::RecordPolled(const RunRecords& got, Recorder* self) {
  for (const StepRecord& step : got.steps) self->AddStep(step);
  for (const RunEvent& event : got.events) self->AddEvent(event);
  self->Flush();
}

void Recorder::Rep::OnSnapshot(const Snapshot& s, Recorder* self) {
  RunRecords polled;
  if (o.poll_job) {
    polled = o.poll_job();
    RecordPolled(polled, self);
  }
  if (samples) {
    Status st = samples->Add(s);  // a refused batch is kept and written with the next
    std::lock_guard<std::mutex> lock(mu);
    samples_status = st;
    samples_dropped = samples->dropped();
  }
  if (live) FeedLiveDiagnosis(s);
  if (o.forward) {
    std::lock_guard<std::mutex> lock(mu);
    if (!dropping)
      for (const auto& [name, value] : Flatten(s))
        forward_samples.push_back({name, s.unix_time - run.start_time, value});
  }
  if (o.on_snapshot) o.on_snapshot(s, polled);
}

// On the sampler thread: a diagnosis of a minute's data every 10 s would
// otherwise be time the training loop does not train.
void Recorder::Rep::FeedLiveDiagnosis(const Snapshot& s) {
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  {
    std::lock_guard<std::mutex> lock(mu);
    steps.swap(live_steps);
    events.swap(live_events);
  }
  double t = s.unix_time - run.start_time;
  ReadOtherRanksSteps(t, &steps);
  live->AddSteps(steps);
  live->AddEvents(events);
  live->AddReadings(t, Flatten(s));
  const std::optional<Finding>& top = live->Update(t);
  std::string finding = RenderLiveMfu(live->mfu()) + RenderLiveFinding(top);
  std::lock_guard<std::mutex> lock(mu);
  live_finding = std::move(finding);
}

// Every rank's steps reach rank 0's store (written by the rank, or sent to
// rank 0 and written by it), a second or two late: read back every 2 s.
void Recorder::Rep::ReadOtherRanksSteps(double t, std::vector<StepRecord>* steps) {
  if (o.world_size <= 1 || t - ranks_read_at < 2) return;
  ranks_read_at = t;
  // Rows land out of time order across ranks: look back, keep only steps
  // beyond each rank's last.
  Result<std::vector<StepRecord>> read = store->LoadSteps(run.id, ranks_read_to - 5);
  if (!read.ok()) return;
  std::sort(read->begin(), read->end(), [](const StepRecord& a, const StepRecord& b) {
    return std::tie(a.rank, a.step) < std::tie(b.rank, b.step);
  });
  for (const StepRecord& r : *read) {
    if (r.rank == o.rank) continue;
    auto [last, fresh] = ranks_last_step.emplace(r.rank, r.step);
    if (!fresh && r.step <= last->second) continue;
    last->second = r.step;
    ranks_read_to = std::max(ranks_read_to, r.t);
    steps->push_back(r);
  }
}

// On the job's thread, so the line does not cut into a progress line half
// drawn. A store that refuses writes keeps the records: the job goes on.
// The step writer's changes are taken in order, so a refusal and its end
// between two looks are both said.
void Recorder::Rep::SayStoreChanges() {
  if (!records) return;
  Status snapshots;
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshots = samples_status;
  }
  while (std::optional<AsyncRecordWriter::Change> c = records->TakeChange()) {
    records_failing = c->failing;
    if (c->failing) {
      records_error = c->error;
    } else {
      records_lost += c->lost;
      restored += c->restored;
    }
    Say(records_failing || !snapshots.ok(), records_failing ? records_error : snapshots.message());
  }
  Say(records_failing || !snapshots.ok(), records_failing ? records_error : snapshots.message());
  std::string spilling = o.spill ? o.spill->path() : "";
  if (!spilling.empty() && spilling != spill_said) {
    spill_said = spilling;
    std::fprintf(stderr,
                 "\nfullburn: what the store refuses now goes to %s, on another file system; "
                 "once the store takes writes, fullburn runs import %s (this recorder does it "
                 "itself if the store recovers before it ends)\n",
                 spilling.c_str(), spilling.c_str());
  }
}

void Recorder::Rep::Say(bool failing, const std::string& why) {
  if (failing == said_failing) return;
  said_failing = failing;
  if (failing) {
    std::fprintf(stderr,
                 "\nfullburn: %s; the job keeps running, and its samples and steps are kept to be "
                 "written once the store takes writes again (in memory for %.0f s, then in a "
                 "spill file on another file system)\n",
                 why.c_str(), kSpillAfterS);
    return;
  }
  int64_t dropped;
  {
    std::lock_guard<std::mutex> lock(mu);
    dropped = samples_dropped;
  }
  int64_t snapshots = dropped - samples_dropped_said, steps = records_lost - records_lost_said;
  samples_dropped_said = dropped;
  records_lost_said = records_lost;
  std::string what = snapshots || steps ? std::to_string(snapshots) + " snapshots and " +
                                              std::to_string(steps) + " step records lost"
                                        : "nothing lost";
  if (restored > 0)
    what += ": the " + std::to_string(restored) + " records kept meanwhile in " + spill_said +
            " are stored";
  restored = 0;
  spill_said.clear();
  std::fprintf(stderr, "\nfullburn: the run store takes writes again (%s)\n", what.c_str());
}

void Recorder::AddStep(const StepRecord& step) {
  Rep& r = *rep_;
  if (r.dropping) return;
  r.pending_steps.push_back(step);
  if (r.live) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.live_steps.push_back(step);
  }
}

void Recorder::AddEvent(const RunEvent& event, bool to_events_file) {
  Rep& r = *rep_;
  if (r.live) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.live_events.push_back(event);
  }
  if (forward_) {
    if (!r.dropping) r.forward_events.push_back(event);
  } else {
    RunRecords one;
    one.events.push_back(event);
    r.records->Add(std::move(one));
  }
  if (to_events_file && r.events_out) {
    std::fputs(RunEventLine(event, r.run.start_time).c_str(), r.events_out.get());
    std::fflush(r.events_out.get());
  }
}

void Recorder::AddRecords(RunRecords records) {
  // A forwarding rank writes no checkpoints (rank 0 does): nothing to send.
  if (rep_->records) rep_->records->Add(std::move(records));
}

void Recorder::Flush() {
  Rep& r = *rep_;
  if (forward_) return;  // TakeForwarded sends them
  if (r.events_out) {
    for (const StepRecord& s : r.pending_steps)
      std::fputs(StepEventLine(s, r.run.start_time).c_str(), r.events_out.get());
    std::fflush(r.events_out.get());
  }
  RunRecords steps;
  steps.steps.swap(r.pending_steps);
  r.records->Add(std::move(steps));
  r.SayStoreChanges();
}

void Recorder::Sync() {
  if (rep_->records) rep_->records->Sync();
}

std::string Recorder::TakeForwarded() {
  Rep& r = *rep_;
  nlohmann::json payload{{"steps", nlohmann::json::array()},
                         {"events", nlohmann::json::array()},
                         {"samples", nlohmann::json::array()}};
  for (const StepRecord& s : r.pending_steps)
    payload["steps"].push_back(StepEventLine(s, r.run.start_time));
  for (const RunEvent& e : r.forward_events)
    payload["events"].push_back(RunEventLine(e, r.run.start_time));
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const NamedSample& s : r.forward_samples) payload["samples"].push_back({s.name, s.t, s.v});
    r.forward_samples.clear();
  }
  r.pending_steps.clear();
  r.forward_events.clear();
  bool empty = payload["steps"].empty() && payload["events"].empty() && payload["samples"].empty();
  return empty ? "" : payload.dump();
}

void Recorder::StopForwarding() {
  Rep& r = *rep_;
  std::lock_guard<std::mutex> lock(r.mu);
  r.dropping = true;
  r.pending_steps.clear();
  r.forward_events.clear();
  r.forward_samples.clear();
}

void Recorder::AddForwarded(const std::string& text) {
  Rep& r = *rep_;
  if (!r.records) return;
  nlohmann::json payload = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (payload.is_discarded() || !payload.is_object()) return;
  RunRecords got;
  for (const auto& line : payload.value("steps", nlohmann::json::array())) {
    if (!line.is_string()) continue;
    auto m = ParseEventLine(line.get<std::string>(), r.run.start_time);
    if (m.ok() && m->is_step) got.steps.push_back(m->step);
  }
  for (const auto& line : payload.value("events", nlohmann::json::array())) {
    if (!line.is_string()) continue;
    auto m = ParseEventLine(line.get<std::string>(), r.run.start_time);
    if (m.ok() && !m->is_step) got.events.push_back(m->event);
  }
  for (const auto& s : payload.value("samples", nlohmann::json::array()))
    if (s.is_array() && s.size() == 3 && s[0].is_string() && s[1].is_number() && s[2].is_number())
      got.samples.push_back({s[0].get<std::string>(), s[1].get<double>(), s[2].get<double>()});
  r.records->Add(std::move(got));
}

void Recorder::StopSampling() {
  Rep& r = *rep_;
  if (r.sampling_stopped) return;
  r.sampling_stopped = true;
  r.sampler->Stop();
  if (r.samples) {
    Status st = r.samples->Flush(/*last=*/true);
    std::lock_guard<std::mutex> lock(r.mu);
    r.samples_status = st;
    r.samples_dropped = r.samples->dropped();
  }
}

Status Recorder::Finish() {
  Rep& r = *rep_;
  if (r.finished) return r.final_status;
  r.finished = true;
  StopSampling();
  if (r.o.poll_job)
    r.RecordPolled(r.o.poll_job(), this);  // the last the job wrote
  else
    Flush();
  if (r.records) {
    r.final_status = r.records->Finish();
    r.SayStoreChanges();
    if (!r.final_status.ok() && (r.records->kept_steps() || r.records->kept_events()))
      std::fprintf(stderr, "fullburn: %zu step records and %zu events could not be stored: %s\n",
                   r.records->kept_steps(), r.records->kept_events(),
                   r.final_status.message().c_str());
  }
  return r.final_status;
}

std::optional<Snapshot> Recorder::Latest() const { return rep_->sampler->Latest(); }

std::string Recorder::LiveFinding() const {
  std::lock_guard<std::mutex> lock(rep_->mu);
  return rep_->live_finding;
}

}  // namespace fullburn
