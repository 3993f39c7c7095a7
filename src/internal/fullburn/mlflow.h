// MLflow: a run's points, params, tags and artifacts into an MLflow
// tracking server, through its REST API (/api/2.0/mlflow/...). Only
// fullburn-net links this (it speaks HTTP and TLS); docs/trackers.md.
//
// Contract
// - MlflowClient makes one HTTP request per call, none in the background;
//   it is not thread-safe (one sender thread uses it).
// - Errors are one line naming the server and the fix, with a code the
//   sender acts on: kUnavailable (no answer, HTTP 5xx or 429: try again
//   later), kAborted (401/403: the credentials; try again, slowly),
//   kInvalidArgument (MLflow refused what was sent: sending it again will
//   not help).
// - LogBatch keeps within log-batch's limits (kMaxBatchMetrics metrics,
//   kMaxBatchBytes of JSON per request). Where MLflow refuses a batch, each
//   metric key of it is sent alone once, and the keys it refuses are named
//   in `refused` for the caller to leave out from then on.
// - Sending a point twice is harmless with MLflow's SQL stores (they drop a
//   repeat of key, step, timestamp and value); NotYetLogged leaves out what
//   a run already has, so a push after a live run sends only the rest.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fullburn/status.h"
#include "fullburn/trackers.h"

namespace fullburn {

constexpr size_t kMaxBatchMetrics = 1000;      // MLflow's log-batch limit
constexpr size_t kMaxBatchBytes = 900 * 1000;  // under its 1 MB request limit
constexpr size_t kMaxParamValue = 6000;        // MLflow's param value limit
constexpr size_t kMaxTagValue = 8000;

// Where and as whom: MLflow's own client environment variables.
struct MlflowConnection {
  std::string uri;                // http(s)://host:port[/prefix]
  std::string token;              // MLFLOW_TRACKING_TOKEN (bearer)
  std::string user, password;     // MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD
  bool insecure_tls = false;      // MLFLOW_TRACKING_INSECURE_TLS=true
  std::string ca_file;            // MLFLOW_TRACKING_SERVER_CERT_PATH
  double timeout_s = 10;
  // `uri`, or MLFLOW_TRACKING_URI when empty; credentials from the environment.
  static MlflowConnection FromEnv(const std::string& uri);
};

struct MlflowRun {
  std::string run_id, experiment_id, artifact_uri, status, name;
  // Per metric key, the newest (step, timestamp ms) the run holds.
  std::map<std::string, std::pair<int64_t, int64_t>> latest;
  std::map<std::string, std::string> tags;
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

class MlflowClient {
 public:
  static Result<MlflowClient> Open(const MlflowConnection& connection);
  const std::string& uri() const { return c_.uri; }

  // The experiment's id; made when there is none of that name.
  Result<std::string> ExperimentId(const std::string& name);
  Result<MlflowRun> CreateRun(const std::string& experiment_id, const std::string& name, double start_time,
                              const KeyValues& tags);
  Result<MlflowRun> GetRun(const std::string& run_id);
  Status LogBatch(const std::string& run_id, const std::vector<TrackerPoint>& points, const KeyValues& params,
                  const KeyValues& tags, std::set<std::string>* refused);
  // FINISHED, FAILED or KILLED, and the end time.
  Status EndRun(const std::string& run_id, const std::string& status, double end_time);
  // Into the run's artifact store: the server's (mlflow-artifacts:/, an
  // `mlflow server` that serves artifacts) or a local folder (file:).
  Status UploadArtifact(const MlflowRun& run, const std::string& name, const std::string& bytes,
                        const std::string& content_type);

 private:
  Result<std::string> Call(const char* method, const std::string& path, const std::string& body,
                           const std::string& content_type = "application/json");
  MlflowConnection c_;
  std::string scheme_host_port_, prefix_;
};

// The points `run` does not hold yet: per key, those after its newest
// (step, timestamp).
std::vector<TrackerPoint> NotYetLogged(const std::vector<TrackerPoint>& points, const MlflowRun& run);
// Points cut into log-batch requests: at most `max_metrics` each and about
// `max_bytes` of JSON.
std::vector<std::vector<TrackerPoint>> SplitBatches(const std::vector<TrackerPoint>& points,
                                                    size_t max_metrics = kMaxBatchMetrics,
                                                    size_t max_bytes = kMaxBatchBytes);

// What a run's end adds to its MLflow run: params (fullburn.command,
// fullburn.config, fullburn.framework) and tags (fullburn.top_cause, its
// share of time, fullburn.run_id), values cut to MLflow's limits.
struct MlflowRunEnd {
  KeyValues params, tags;
};
MlflowRunEnd RunEndRecords(const RunData& run, const std::vector<Finding>& findings);

// The run a job's own MLflow run is: the newest "mlflow_run" event the step
// hooks wrote (python/fullburn_autosteps/) or fullburn sent to before, for
// this tracking URI (any, when `uri` is empty). "" when none.
std::string MlflowRunOf(const std::vector<RunEvent>& events, const std::string& uri);
constexpr const char* kMlflowRunEvent = "mlflow_run";

}  // namespace fullburn
