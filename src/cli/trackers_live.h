// fullburn run's trackers while the job runs (docs/trackers.md):
// --tensorboard DIR (a thread of fullburn's writing TensorBoard's file) and
// --mlflow [URI] (fullburn-net's mlflow-follow, a helper process: only
// fullburn-net speaks HTTP). Both read the run from the store, never from
// the recorder, so the job and its recording never wait on a tracker.
//
// Contract
// - Start after the run is begun in the store; Finish after its end is
//   stored (EndRun): the last poll then sends the rest, and MLflow's follower
//   logs the params, tags and report. Finish waits a bounded time.
// - A tracker that cannot be used (a folder it cannot write, no fullburn-net)
//   is one line, and the run goes on without it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "fullburn/store.h"

namespace fullburn::cli {

struct TrackerOptions {
  std::string tensorboard;  // a folder; "" none
  bool mlflow = false;      // --mlflow given
  std::string mlflow_uri;   // "": $MLFLOW_TRACKING_URI
  std::string mlflow_experiment;
};

class TrackersLive {
 public:
  TrackersLive(const TrackerOptions& o, const std::string& store_path, const RunInfo& run, bool quiet);
  ~TrackersLive();
  TrackersLive(const TrackersLive&) = delete;
  TrackersLive& operator=(const TrackersLive&) = delete;
  void Finish();

  static constexpr double kPollS = 2;
  // How long Finish waits for the MLflow follower (it gives up sending by
  // itself after its --end-wait, 20 s, and names `runs push`).
  static constexpr double kMlflowFinishS = 40;

 private:
  void FollowTensorBoard(std::string dir, std::string store_path, RunInfo run);

  std::atomic<bool> stop_{false};
  std::thread tensorboard_;
  pid_t mlflow_ = -1;
  bool quiet_;
};

}  // namespace fullburn::cli
