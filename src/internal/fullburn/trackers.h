// Trackers: a run's records as the scalars an experiment tracker keeps
// (MLflow's metrics, TensorBoard's summaries), and TensorBoard's event file.
// docs/trackers.md lists every name.
//
// Contract
// - Naming is a pure function of the stored records: the same run gives the
//   same (key, step, time, value) points each time, so a run sent twice
//   gives a tracker repeats it can drop (MLflow's SQL store does), never
//   near-duplicates. Non-finite values are left out: trackers refuse them.
// - TrackerFeed reads a run out of the store from where its last Poll ended;
//   it keeps no store handle and is used from one thread.
// - TfEventsWriter owns one file, used from one thread. Every Write appends
//   whole records and flushes them; the first failed write is returned (a
//   Status naming the file and the fix) and every later Write refuses, so the
//   caller says it once and the job goes on.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/status.h"
#include "fullburn/store.h"

namespace fullburn {

// Whose names the system metrics take: MLflow's System Metrics tab charts
// its own ("system/gpu_0_utilization_percentage"); TensorBoard has no such
// convention, so there every point is under "fullburn/".
enum class TrackerStyle { kMlflow, kTensorBoard };

struct TrackerPoint {
  std::string key;
  double value = 0;
  int64_t step = 0;  // the training step for step metrics, the sample's index for readings
  double unix_time = 0;
};

// The stored name's key: MLflow's own name where it has one for rank 0's
// readings ("gpu0.util" -> "system/gpu_0_utilization_percentage", in its
// units), else "fullburn/<stored name>"; `scale` converts the stored value.
std::string TrackerKey(const std::string& stored_name, TrackerStyle style, double* scale);

// Readings as points: step = round(t / interval), the sample's index as
// MLflow's own system-metrics monitor counts them. With MLflow's style, the
// memory shares MLflow charts (GPU and host memory used, %) are derived too.
std::vector<TrackerPoint> SamplePoints(const RunInfo& run, const std::map<std::string, Series>& samples,
                                       TrackerStyle style);
// Per training step: fullburn/step_time_ms, data_wait_pct, steps_per_s,
// samples_per_s, loss, lr (rank R > 0: fullburn/rankR.step_time_ms ...).
std::vector<TrackerPoint> StepPoints(const RunInfo& run, const std::vector<StepRecord>& steps);
// What limits the job now, as points at `step` and time `unix_time`:
// fullburn/now/<cause>_pct (the top finding's share of time) and
// fullburn/mfu_pct where known.
std::vector<TrackerPoint> DiagnosisPoints(const std::optional<Finding>& top, const Mfu& mfu, int64_t step,
                                          double unix_time);

// A whole stored run's points: its readings, its steps and, at its last
// step, the diagnosis of the whole run: fullburn/run/<cause>_pct (its top
// finding's share of time) and fullburn/mfu_pct where known.
std::vector<TrackerPoint> RunPoints(const RunData& run, TrackerStyle style);
// Only that diagnosis (the last points of RunPoints).
std::vector<TrackerPoint> RunDiagnosisPoints(const RunData& run);

// What one Poll found since the last.
struct TrackerBatch {
  std::vector<TrackerPoint> points;
  std::vector<RunEvent> events;  // the run's new events (an "mlflow_run" the job's hooks saw)
  std::optional<Finding> now;    // the live finding, when it was re-diagnosed
  bool finished = false;         // the run has ended: nothing more will come
  RunInfo run;                   // as the store has it now
};

// Follows one run in the store. Readings and steps that arrive late (another
// rank's, written a batch later) are still read: each Poll looks back
// kLookBackS and keeps, per series, only what is newer than it sent.
class TrackerFeed {
 public:
  static constexpr double kLookBackS = 15;
  TrackerFeed(RunInfo run, TrackerStyle style);
  Result<TrackerBatch> Poll(RunStore* store);

 private:
  RunInfo run_;
  TrackerStyle style_;
  double read_to_ = -INFINITY;              // samples' t of the last Poll's newest
  double steps_to_ = -INFINITY, events_to_ = -INFINITY;
  std::map<std::string, double> last_t_;    // per stored name: the newest t sent
  std::map<int, int64_t> last_step_;        // per rank: the newest step sent
  LiveDiagnosis live_;
  double last_diagnosis_t_ = -1e300;
};

// CRC-32C (Castagnoli), as TFRecord frames it: crc32c("123456789") = 0xE3069283.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked CRC: rotated right by 15 bits, plus 0xa282ead8.
uint32_t MaskedCrc32c(const void* data, size_t size);
// One TFRecord: length, its masked CRC, the data, its masked CRC.
std::string TfRecord(const std::string& data);
// A serialized tensorflow.Event with scalar Summary values (simple_value).
std::string ScalarEvent(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);

// events.out.tfevents.<secs>.<host>.<pid>.fullburn in `dir` (made if missing),
// starting with the file_version record TensorBoard looks for.
class TfEventsWriter {
 public:
  static Result<std::unique_ptr<TfEventsWriter>> Open(const std::string& dir, double unix_time);
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;
  // One event per (step, time): the points that share both go together.
  Status Write(const std::vector<TrackerPoint>& points);
  const std::string& path() const { return path_; }

 private:
  TfEventsWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  Status Append(const std::string& records);
  std::string path_;
  std::FILE* file_;
  Status failed_;
};

}  // namespace fullburn
