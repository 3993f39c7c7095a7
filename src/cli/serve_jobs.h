// The jobs fullburn serve exports besides the machine: every run being
// recorded on this host into the store (fullburn run, train, attach), each
// kept as its last minute and diagnosed as on the live line.
//
// Poll() reads only what is new since the last poll (the store's time
// ranges), from one thread; Jobs() may be called from any thread. A store
// that cannot be read leaves the last jobs in place; a run no longer
// running is dropped. The store is never created here: until a recording
// command creates it there are no jobs, and Poll() opens it once it is
// there. One that is there but cannot be opened gives no jobs and its
// reason in Problem(), to be said once.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/env.h"
#include "fullburn/report.h"
#include "fullburn/store.h"

namespace fullburn::cli {

class JobsWatcher {
 public:
  JobsWatcher(std::string store_path, const Env* env, std::string host)
      : store_path_(std::move(store_path)), env_(env), host_(std::move(host)) {}
  void Poll();
  std::vector<JobNow> Jobs() const;
  std::string Problem() const;  // "" or why the store could not be opened

 private:
  // Rows can land a little after rows with later times (each rank and the
  // sampler flush about once a second): every read looks back this far and
  // drops what it already has.
  static constexpr double kLookBackS = 5;
  struct Watched {
    explicit Watched(const RunInfo& run) : live(run) {}
    LiveDiagnosis live;
    double read_to = -INFINITY;                            // the latest time read
    std::map<std::string, double> last_reading;            // per metric
    std::map<std::pair<int, int64_t>, double> steps_seen;  // (rank, step) -> t, recent
    std::set<std::tuple<double, std::string, std::string>> events_seen;  // recent
  };
  void Read(const RunInfo& run, Watched* w);
  bool StoreOpen();

  std::string store_path_;
  std::unique_ptr<RunStore> store_;  // once it exists and opens
  std::string problem_;              // under mu_
  const Env* env_;
  std::string host_;
  std::map<int64_t, std::unique_ptr<Watched>> watched_;  // poll thread
  mutable std::mutex mu_;
  std::vector<JobNow> jobs_;  // under mu_
};

// The runs of `jobs` as GpuHolders matches them: each recorder's pid, and
// the pid `fullburn attach` follows (its config's attached_pid).
std::vector<RecordedJob> RecordedJobs(const std::vector<JobNow>& jobs);
// Gives each GPU of `info` the labels found for the sample of the same index.
void LabelHolders(const std::vector<GpuSample>& gpus, const std::vector<std::vector<PromLabel>>& labels,
                  std::vector<GpuInfo>* info);

}  // namespace fullburn::cli
