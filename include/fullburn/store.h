// Store: the run store, one SQLite file (WAL mode) holding every run.
//
// Contract
// - RunStore::Open never creates a missing directory and never overwrites a
//   file that is not a fullburn store: such cases come back as a Status with
//   a one-line message naming the path and the fix. A store written by a newer
//   fullburn (higher schema version) is refused rather than misread.
// - Samples are appended in one transaction per AppendSamples call; the caller
//   batches (about once a second), so a recorder killed with SIGKILL loses at
//   most the last batch and the file stays consistent (WAL, synchronous=NORMAL).
// - A RunStore may be used from several threads; calls are serialized by an
//   internal mutex. Several processes may use the same file (busy timeout 5 s),
//   and may open a new file together (the ranks of a job): the switch to WAL
//   is retried for as long, and the schema is read in one snapshot.
// - The schema is written down in docs/store.md; kSchemaVersion counts it.
#pragma once

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fullburn/status.h"
#include "fullburn/telemetry.h"

struct sqlite3;
struct sqlite3_stmt;

namespace fullburn {

class SpillFile;  // spill.h

constexpr int kSchemaVersion = 5;

struct RunInfo {
  int64_t id = 0;
  std::string name;
  std::vector<std::string> command;
  std::string cwd, host;
  double start_time = 0;  // Unix seconds
  std::optional<double> end_time;
  std::optional<int> exit_code;
  // running | finished | failed_to_start | detached (fullburn attach stopped
  // recording a job that goes on); reads report "interrupted" for a
  // run whose recorder on this host died without finishing it.
  std::string status = "running";
  int recorder_pid = 0;
  // When the recorder process started (Unix seconds, schema v5): with its
  // pid it names that one process, never a later one given the same pid.
  // BeginRun fills it for a recorder that is the calling process.
  std::optional<double> recorder_start;
  double interval_s = 1.0;
  std::string config_json = "{}";  // effective configuration, JSON object
  std::string gpus_json = "[]";    // [{index, name, uuid}], JSON array
  int64_t sample_count = 0;        // filled by reads
  // The run this one belongs to (schema v3): a tuning, for its trials.
  std::optional<int64_t> parent_id;
};

// One reading by its stored name ("rank1.proc.cpu_util"), t relative to the run's start.
struct NamedSample {
  std::string name;
  double t;
  double v;
};

struct SeriesPoint {
  double t;  // seconds since the run's start_time
  double v;
};
using Series = std::vector<SeriesPoint>;

// One training step as `fullburn train` records it (schema v2). Phase times
// are seconds of wall time; absent when the step was not timed (timing every
// Nth step) or the phase does not exist (comm_s without data parallelism).
struct StepRecord {
  int rank = 0;
  int64_t step = 0;  // optimizer steps taken, counting from 1
  int epoch = 0;
  double t = 0;      // seconds since the run's start_time, at the step's end
  double loss = 0;   // mean over the step's micro-batches; inf kept; NaN: not a number or none reported
  double lr = 0;
  std::optional<double> loss_scale;  // fp16 only
  int64_t samples = 0;               // samples in the step (all micro-batches)
  double step_s = 0;
  std::optional<double> data_wait_s, h2d_s, forward_s, backward_s, optimizer_s, comm_s;
  bool skipped = false;  // the loss scaler skipped the update (inf/NaN gradients)
};

// The phases of a step in the order they happen (also the trace's layout):
// `name` is the column/JSON stem ("data_wait" -> "data_wait_s"), `label` is
// for people. Every exporter, reader and chart walks this one table.
struct StepPhase {
  const char* name;
  const char* label;
  std::optional<double> StepRecord::*field;
};
inline constexpr StepPhase kStepPhases[] = {
    {"data_wait", "data wait", &StepRecord::data_wait_s}, {"h2d", "host-to-device", &StepRecord::h2d_s},
    {"forward", "forward", &StepRecord::forward_s},       {"backward", "backward", &StepRecord::backward_s},
    {"comm", "communication", &StepRecord::comm_s},       {"optimizer", "optimizer", &StepRecord::optimizer_s}};

struct CheckpointRecord {
  int64_t step = 0;
  double t = 0;       // seconds since the run's start_time, when the file was complete
  std::string path;
  int64_t bytes = 0;
  double stall_s = 0;  // the training loop was blocked this long (snapshot)
  double write_s = 0;  // background serialization and write
};

// Anything else a run wants to keep, in time order: batch-size trials,
// warnings, the tuner's trials. `data` is a JSON object.
struct RunEvent {
  double t = 0;
  std::string kind;
  std::string data = "{}";
};

// Everything stored about one run, as the diagnosis and the reports read it.
// The kind of event LoadRun adds (never stored) for a stretch a spill holds
// and the store does not: data {to, why, spill}, its time the stretch's start.
constexpr const char* kStoreGapEvent = "store_gap";
// Stored by fullburn run when the job's events file filled its file system:
// the steps after its time were not recorded (data {to, why}).
constexpr const char* kEventsCutEvent = "events_cut";

struct RunData {
  RunInfo run;
  std::map<std::string, Series> samples;
  std::vector<StepRecord> steps;
  std::vector<CheckpointRecord> checkpoints;
  std::vector<RunEvent> events;
};

class RunStore {
 public:
  // $XDG_DATA_HOME/fullburn/runs.db, else ~/.local/share/fullburn/runs.db.
  // (--store and $FULLBURN_STORE are the command line's, see src/cli.)
  static std::string DefaultPath();
  static Result<std::unique_ptr<RunStore>> Open(const std::string& path);
  ~RunStore();

  const std::string& path() const { return path_; }

  Result<int64_t> BeginRun(const RunInfo& run);
  Status AppendSamples(int64_t run_id, double run_start, const std::vector<Snapshot>& batch);
  // Readings already named (forwarded by another process); `snapshots` is
  // added to the run's snapshot count.
  Status AppendNamedSamples(int64_t run_id, const std::vector<NamedSample>& samples, int64_t snapshots = 0);
  Status FinishRun(int64_t run_id, double end_time, std::optional<int> exit_code,
                   const std::string& status);

  Result<std::vector<RunInfo>> ListRuns();
  // Only the runs still being recorded (a poller's few, in a store of many).
  Result<std::vector<RunInfo>> ListRunning();
  // `ref` is a run id or "last".
  Result<RunInfo> GetRun(const std::string& ref);
  // Every metric of a run, by name, in time order. `after` (seconds since
  // the run's start): only readings after it, so a poller of a running job
  // (fullburn serve) reads what is new, not the whole run again.
  Result<std::map<std::string, Series>> LoadSamples(int64_t run_id, double after = -INFINITY);
  Status DeleteRun(int64_t run_id);
  // Bytes of pages that deleted runs left free inside the file: reused by
  // new runs, given back to the disk only by Vacuum.
  Result<int64_t> FreeBytes();
  // Rewrites the file without its free pages (SQLite VACUUM). It holds the
  // write lock throughout, so a recorder appending meanwhile would wait and
  // then fail: the caller makes sure no run is being recorded.
  Status Vacuum();
  // "ok" for a healthy file, else SQLite's report.
  Result<std::string> IntegrityCheck();

  // Training records (schema v2): steps in one transaction per call.
  Status AppendSteps(int64_t run_id, const std::vector<StepRecord>& steps);
  Result<std::vector<StepRecord>> LoadSteps(int64_t run_id, double after = -INFINITY);
  Status AddCheckpoint(int64_t run_id, const CheckpointRecord& checkpoint);
  Result<std::vector<CheckpointRecord>> LoadCheckpoints(int64_t run_id);
  Status AddEvent(int64_t run_id, const RunEvent& event);
  // The event unless the run has the same one (time, kind, data) already:
  // whether it was added (a spill imported twice adds each once).
  Result<bool> AddEventOnce(int64_t run_id, const RunEvent& event);
  // The run's snapshot count from its stored readings (after an import).
  Status CountSnapshots(int64_t run_id);
  Result<std::vector<RunEvent>> LoadEvents(int64_t run_id, double after = -INFINITY);
  // `ref` as for GetRun; every table of the run.
  Result<RunData> LoadRun(const std::string& ref);

 private:
  RunStore() = default;
  Status Exec(const char* sql);
  Status SwitchToWal();
  Status Migrate();
  Result<int64_t> MetricId(const std::string& name);
  Result<std::vector<RunInfo>> QueryRuns(const std::string& where, int64_t id);
  Status SqlError(const std::string& what);
  // The file at path_ is still the one opened: a store whose folder was
  // deleted (or file replaced) while it is written would take the writes
  // into an unlinked file and lose them on close. Under mu_.
  Status StillThere();

  std::mutex mu_;
  sqlite3* db_ = nullptr;
  std::string path_;
  uint64_t file_dev_ = 0, file_ino_ = 0;  // of path_ when opened
  std::map<std::string, int64_t> metric_ids_;
  sqlite3_stmt* insert_sample_ = nullptr;
};

// Step events (docs/formats.md, "Step events"): what a wrapped job tells
// `fullburn run` through the file named by $FULLBURN_EVENTS, one JSON object
// per line. Writers append whole lines (O_APPEND), so several processes
// (ranks, workers) may share one file.
//   {"kind":"step","step":N,"time":UNIX_END,"step_s":S, optional: "rank",
//    "epoch","samples","loss","lr","loss_scale","skipped","data_wait_s",
//    "h2d_s","forward_s","backward_s","optimizer_s","comm_s"}
//   {"kind":"event","name":"evaluation","time":UNIX_END, optional:
//    "duration_s","rank","data":{...}}
// python/fullburn_markers.py and fullburn train write this format.
constexpr const char* kEventsEnvVar = "FULLBURN_EVENTS";

struct MarkerEvent {
  bool is_step = false;
  StepRecord step;  // t relative to the run's start
  RunEvent event;
};
std::string StepEventLine(const StepRecord& step, double run_start);
std::string RunEventLine(const RunEvent& event, double run_start);
Result<MarkerEvent> ParseEventLine(const std::string& line, double run_start);

// Follows an events file that other processes append to: each Poll reads the
// lines completed since the last one. A malformed line is counted and
// skipped (the first one's reason kept), never fatal: a job's markers must
// not stop its recording. A rank whose step number does not grow (its
// counter started again: a new Markers each epoch) has those steps numbered
// on from its last one, since the store keeps one record per (rank, step).
// Used from one thread at a time.
class EventFileReader {
 public:
  explicit EventFileReader(std::string path) : path_(std::move(path)) {}
  Status Poll(double run_start, std::vector<StepRecord>* steps, std::vector<RunEvent>* events);
  const std::string& path() const { return path_; }
  int64_t bad_lines() const { return bad_lines_; }
  const std::string& first_error() const { return first_error_; }
  // Times a rank's step counter started again; the first such rank.
  int64_t restarts() const { return restarts_; }
  int first_restarted_rank() const { return first_restarted_rank_; }

 private:
  void Renumber(StepRecord* step);

  struct RankCounter {
    bool seen = false;
    int64_t last = 0, offset = 0;
  };
  std::string path_;
  uint64_t offset_ = 0;
  std::string partial_;
  int64_t lines_ = 0, bad_lines_ = 0;
  std::string first_error_;
  std::map<int, RankCounter> counters_;
  int64_t restarts_ = 0;
  int first_restarted_rank_ = -1;
};

// Buffers snapshots of one run and appends them in one transaction once
// `flush_every_s` has passed since the last write, so a killed recorder loses
// at most about that much.
// Used from one thread at a time.
class BatchWriter {
 public:
  BatchWriter(RunStore* store, int64_t run_id, double run_start, double flush_every_s = 1.0,
              double keep_s = 300, SpillFile* spill = nullptr)
      : store_(store),
        run_id_(run_id),
        run_start_(run_start),
        flush_every_s_(flush_every_s),
        keep_s_(keep_s),
        spill_(spill) {}
  // The status of the last write: a failed one (the store locked, the disk
  // full) keeps its batch, written with the next once the store takes it
  // again. With a spill, a batch the store refused for kSpillAfterS goes to
  // it; without one (or when it cannot be written either), samples older
  // than keep_s are dropped and counted.
  Status Add(const Snapshot& s);
  // `last`: nothing comes after, so what the store refuses goes to the spill now.
  Status Flush(bool last = false);
  int64_t dropped() const { return dropped_; }
  int64_t spilled() const { return spilled_; }

 private:
  RunStore* store_;
  int64_t run_id_;
  double run_start_, flush_every_s_, keep_s_;
  double last_flush_ = -1e300;
  SpillFile* spill_;
  std::vector<Snapshot> pending_;
  Status last_error_;
  int64_t dropped_ = 0, spilled_ = 0;
};

// What a run records besides its sampled snapshots, written as one batch.
struct RunRecords {
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  std::vector<NamedSample> samples;  // other ranks' readings, by stored name
  std::vector<CheckpointRecord> checkpoints;
  bool empty() const {
    return steps.empty() && events.empty() && samples.empty() && checkpoints.empty();
  }
  void Append(RunRecords more);
};

// A run's records, kept until the store takes them: a write the store
// refuses (locked past its busy timeout, a full disk) keeps them for the
// next, up to max_kept of each kind (the oldest dropped and counted;
// checkpoint records, few and needed to resume, are never dropped).
// Used from one thread at a time.
class RecordWriter {
 public:
  RecordWriter(RunStore* store, int64_t run_id, size_t max_kept = 200000)
      : store_(store), run_id_(run_id), max_kept_(max_kept) {}
  void Add(RunRecords more);
  // Writes what is kept: checkpoints, steps in one transaction, samples in
  // another, then the events.
  Status Flush();
  // What is kept goes to `spill` (the store refused it long enough): false
  // when the spill could not take it either, which then stays kept.
  bool SpillKept(SpillFile* spill, const std::string& why);
  bool empty() const { return kept_.empty(); }
  size_t kept_steps() const { return kept_.steps.size(); }
  size_t kept_events() const { return kept_.events.size(); }
  int64_t dropped() const { return dropped_; }

 private:
  RunStore* store_;
  int64_t run_id_;
  size_t max_kept_;
  RunRecords kept_;
  int64_t dropped_ = 0;
};

// A RecordWriter on a thread of its own, so the thread that makes the records
// (a training loop) never waits on the store: a write lock held past the busy
// timeout, or a slow or full disk, holds up only this thread. Each Add wakes
// it to write; while the store refuses, it tries again every retry_s.
// Add and TakeChange may be called from any thread; Sync and Finish from the
// owner. What is added after Finish is not written.
class AsyncRecordWriter {
 public:
  // The store started refusing writes (failing, with why), or takes them again.
  struct Change {
    bool failing = false;
    std::string error;
    int64_t lost = 0;      // records dropped while it refused
    int64_t restored = 0;  // records kept in the spill meanwhile, now stored
  };
  // With a spill, records the store refused for kSpillAfterS (and, at
  // Finish, all it refuses) go to it; once the store takes writes again,
  // the spill is drained into it.
  AsyncRecordWriter(RunStore* store, int64_t run_id, size_t max_kept = 200000,
                    double retry_s = 1.0, SpillFile* spill = nullptr);
  ~AsyncRecordWriter();
  AsyncRecordWriter(const AsyncRecordWriter&) = delete;
  AsyncRecordWriter& operator=(const AsyncRecordWriter&) = delete;
  void Add(RunRecords more);
  // Returns once everything added before the call was written, or refused.
  void Sync();
  // The oldest change not yet taken, for the owner to tell the user.
  std::optional<Change> TakeChange();
  // Writes what is queued or kept (one more try if the store refuses) and
  // stops the thread; the status of that last write. After it, kept_*()
  // count what could not be written. Later calls return the same status.
  Status Finish();
  size_t kept_steps() const { return writer_.kept_steps(); }
  size_t kept_events() const { return writer_.kept_events(); }

 private:
  void Loop();
  void NoteLocked(const Status& s);

  RecordWriter writer_;  // the thread's, and Finish's once it joined
  RunStore* store_;
  SpillFile* spill_;
  double retry_s_;
  double failing_since_ = 0;  // steady seconds, while failing_
  std::mutex mu_;
  std::condition_variable wake_, written_;
  RunRecords queued_;              // by Add, under mu_
  int64_t added_ = 0, tried_ = 0;  // Add calls, and how many of them a write has tried
  std::vector<Change> changes_;
  bool stop_ = false, done_ = false, failing_ = false;
  int64_t dropped_said_ = 0;
  Status last_status_;
  std::thread thread_;
};

}  // namespace fullburn
