// Spill: what the run store refuses to take (a full disk, a read-only or
// deleted file, a write lock held past the retry time), kept in a file on
// another file system, so nothing a recorder saw is lost. `fullburn runs
// import FILE` (ImportSpill) loads it once the store takes writes; a
// recorder whose store takes writes again before it finishes imports its
// own spill and removes it (docs/store.md, "When the store refuses writes").
//
// Contract
// - Where: the first of $XDG_RUNTIME_DIR/fullburn, /dev/shm/fullburn-UID and
//   $TMPDIR/fullburn-UID (else /tmp/fullburn-UID) that is on a file system
//   other than the store's and can be written; none: the records stay in
//   memory for the writers' keep_s and are then dropped and counted. The
//   user's own tmpfs first (private, memory-backed, on no disk the store's
//   can fill), then the machine's shared one, then the temporary folder
//   (often a disk, but not the store's).
// - Format: one JSON object per line, then a tab and the line's CRC-32 in
//   hex; the first line names the format, the store and the run. A line cut
//   short or damaged is found on import and skipped, never misread.
// - Bounded: kSpillMaxBytes per file. Past 3/4 of it samples are dropped,
//   past all of it steps and events too (each counted); the run's end is
//   always written.
// - A SpillFile may be used from several threads (the sampler's writer and
//   the step writer); calls are serialized. Nothing is created before the
//   first Add.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/status.h"
#include "fullburn/store.h"

namespace fullburn {

constexpr int64_t kSpillMaxBytes = 256LL << 20;
// Records the store refused for this long go to the spill rather than wait
// in memory: a lock held for a moment costs nothing, a full disk only this.
constexpr double kSpillAfterS = 10;

class SpillFile {
 public:
  // `store_path` is the store that refuses; `run` the run being recorded.
  SpillFile(const Env* env, std::string store_path, RunInfo run);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // `why` is the store's refusal (kept for the file's header and the diagnosis).
  Status AddRecords(const RunRecords& records, const std::string& why);
  Status AddSnapshots(const std::vector<Snapshot>& snapshots, const std::string& why);
  Status AddEnd(double end_time, std::optional<int> exit_code, const std::string& status,
                const std::string& why);

  std::string path() const;  // "" until something was written
  int64_t written() const;   // records kept in it
  int64_t dropped() const;   // records past its caps
  bool empty() const { return written() == 0; }
  // The store takes writes again: loads what is kept into it and removes
  // the file (the next refusal starts a new one). The import's status.
  Status DrainInto(RunStore* store, int64_t* imported);

 private:
  Status OpenLocked(const std::string& why);
  Status WriteLocked(const std::string& json, bool always);

  const Env* env_;
  std::string store_path_;
  RunInfo run_;
  mutable std::mutex mu_;
  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0, written_ = 0, dropped_ = 0;
};

// The run's end into the store, or into `spill` when the store refuses it
// (a finished job is never left to read as interrupted); then what the
// spill holds goes to the store if it takes writes now. What to tell the
// user, one line each ("" when all is stored): the records it imported, or
// the spill file and the `fullburn runs import` that loads it. `spill` may
// be null (the end's Status is then all there is).
std::string FinishRunOrKeep(RunStore* store, SpillFile* spill, int64_t run_id, double end_time,
                            std::optional<int> exit_code, const std::string& status);

// The folder a spill of a store at `store_path` goes to, or why there is none.
Result<std::string> SpillFolder(const Env& env, const std::string& store_path);

struct SpillImport {
  int64_t run_id = 0;      // in this store
  bool new_run = false;    // the store had no such run (or another under its id): made anew
  int64_t steps = 0, samples = 0, events = 0, checkpoints = 0;
  bool end = false;        // the run's end was in it, and is stored
  int64_t skipped = 0;     // lines cut short or damaged
  std::string first_skip;  // why the first was skipped ("line 12: its checksum does not match")
};
// Loads a spill into `store`. Idempotent: steps, samples and checkpoints are
// keyed, events are added only where the same one is not stored yet.
// Damaged lines are skipped and counted; a file whose header is not a
// spill's is an error.
Result<SpillImport> ImportSpill(RunStore* store, const std::string& path);

// A stretch of a run that its store does not hold because it refused it:
// in a spill file not yet imported.
struct StoreGap {
  double from_t = 0, to_t = 0;  // seconds since the run's start
  std::string why, spill;
  std::optional<double> end_time;  // the run's end, when the spill holds it
  std::optional<int> exit_code;
  std::string status;
};
// The spills of run `run_id` of the store at `store_path` in the spill
// folders: their stretches, for the diagnosis of a cut record.
std::vector<StoreGap> FindStoreGaps(const Env& env, const std::string& store_path, int64_t run_id);

}  // namespace fullburn
