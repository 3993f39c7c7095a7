#include "trackers_live.h"

#include <chrono>
#include <cstdio>

#include "child.h"
#include "cli.h"
#include "fullburn/trackers.h"

namespace fullburn::cli {

std::vector<std::string> MlflowFollowArgs(int64_t run_id, const std::string& store, const std::string& uri,
                                          const std::string& experiment) {
  std::vector<std::string> args = {"mlflow-follow", std::to_string(run_id), "--store", store};
  if (!uri.empty()) args.insert(args.end(), {"--mlflow", uri});
  if (!experiment.empty()) args.insert(args.end(), {"--mlflow-experiment", experiment});
  return args;
}

TrackersLive::TrackersLive(const TrackerOptions& o, const std::string& store_path, const RunInfo& run, bool quiet)
    : quiet_(quiet) {
  if (!o.tensorboard.empty())
    tensorboard_ = std::thread(&TrackersLive::FollowTensorBoard, this, o.tensorboard, store_path, run);
  if (o.mlflow) {
    std::string net = NetworkExecutable();
    if (net.empty()) {
      std::fprintf(stderr,
                   "fullburn: --mlflow needs fullburn-net beside this fullburn, which is missing: the run "
                   "goes on without MLflow (reinstall fullburn, then fullburn runs push %lld --mlflow URI)\n",
                   static_cast<long long>(run.id));
      return;
    }
    std::vector<std::string> args = MlflowFollowArgs(run.id, store_path, o.mlflow_uri, o.mlflow_experiment);
    args.insert(args.begin(), net);
    Result<pid_t> pid = SpawnHelper(args);
    if (!pid.ok())
      std::fprintf(stderr, "fullburn: --mlflow: cannot start %s: %s; the run goes on without MLflow\n", net.c_str(),
                   pid.status().message().c_str());
    else
      mlflow_ = *pid;
  }
}

TrackersLive::~TrackersLive() { Finish(); }

void TrackersLive::Finish() {
  stop_ = true;
  if (tensorboard_.joinable()) tensorboard_.join();
  if (mlflow_ > 0) {
    WaitHelper(mlflow_, kMlflowFinishS);
    mlflow_ = -1;
  }
}

void TrackersLive::FollowTensorBoard(std::string dir, std::string store_path, RunInfo run) {
  auto writer = TfEventsWriter::Open(dir, run.start_time);
  auto store = RunStore::Open(store_path);
  if (!writer.ok() || !store.ok()) {
    std::fprintf(stderr, "fullburn: --tensorboard: %s; the run goes on without it\n",
                 (writer.ok() ? store.status() : writer.status()).message().c_str());
    return;
  }
  if (!quiet_)
    std::fprintf(stderr, "fullburn: TensorBoard: writing %s (tensorboard --logdir %s)\n", (*writer)->path().c_str(),
                 dir.c_str());
  TrackerFeed feed(run, TrackerStyle::kTensorBoard);
  std::string said;
  for (bool last = false; !last;) {
    for (double slept = 0; slept < kPollS && !stop_; slept += 0.05)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    last = stop_;  // Finish comes after the run's end is stored: this poll reads the rest
    auto batch = feed.Poll(store->get());
    if (!batch.ok()) {
      if (said != batch.status().message())
        std::fprintf(stderr, "fullburn: --tensorboard: %s; trying again\n", batch.status().message().c_str());
      said = batch.status().message();
      continue;
    }
    std::vector<TrackerPoint> points = std::move(batch->points);
    if (last) {  // the run has ended: its whole diagnosis, as runs export writes it
      auto data = (*store)->LoadRun(std::to_string(run.id));
      if (data.ok()) {
        std::vector<TrackerPoint> d = RunDiagnosisPoints(*data);
        points.insert(points.end(), d.begin(), d.end());
      }
    }
    if (Status s = (*writer)->Write(points); !s.ok()) {
      std::fprintf(stderr, "fullburn: --tensorboard: %s\n", s.message().c_str());
      return;  // the job goes on; the store has it all
    }
  }
}

}  // namespace fullburn::cli
