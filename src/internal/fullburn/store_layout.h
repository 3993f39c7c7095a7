// StoreLayout: every path fullburn keeps in its store folder, named in one
// place (as LevelDB's filename.h names a database's files).
//
//   <folder>/runs.db                 the run store (RunStore; -wal, -shm beside it)
//   <folder>/traces/run-ID/          profiler traces of run ID (run --profile, profile.steps)
//   <folder>/stacks/run-ID.pyspy     run ID's Python stacks, py-spy's raw samples (stacks.h;
//                                    .log beside it: py-spy's own output)
//   <folder>/checkpoints/run-ID/     run ID's checkpoints when checkpoint.dir is empty
//   <folder>/datasets/               synthetic data made on a first run without data.path
//   <folder>/tune-ID/trial-N.log     each trial's output of tuning ID
//   <folder>/tune-ID/pack/           the pack a tuning made to try data.pack
//   SPILL/spill-HASH-runID.fbspill   records the store refused (spill.h: SPILL is a
//                                    folder on another file system; HASH names this store)
//
// Contract: pure string functions of the store's path; nothing here touches
// the disk (the writers create what they need). The folder is the store
// file's; a bare file name means the working directory. Safe from any thread.
#pragma once

#include <cstdint>
#include <string>

namespace fullburn {

class StoreLayout {
 public:
  // `store_path` is the run store's file (--store, FULLBURN_STORE, or
  // RunStore::DefaultPath()).
  explicit StoreLayout(std::string store_path);

  const std::string& store() const { return store_; }
  const std::string& folder() const { return folder_; }
  std::string Traces(int64_t run_id) const;
  std::string Stacks(int64_t run_id) const;
  std::string Checkpoints(int64_t run_id) const;
  std::string Datasets() const;
  std::string TuneLogs(int64_t tuning_id) const;
  std::string TrialLog(int64_t tuning_id, int trial) const;
  std::string TunePack(int64_t tuning_id) const;
  // A spill's file name (its folder is spill.h's): "spill-HASH-runID.fbspill",
  // "-N" before the extension for the run's Nth; HASH is the store path's CRC-32.
  std::string SpillName(int64_t run_id, int n = 0) const;
  std::string SpillPrefix(int64_t run_id) const;  // what every spill of the run starts with

 private:
  std::string store_, folder_;
};

}  // namespace fullburn
