// Recorder: what a job records into its run while it runs — the sampler's
// snapshots, the job's steps and events, what limits it now (a live
// diagnosis), and, for a rank that cannot write rank 0's store, the same
// records gathered to be sent to rank 0. `fullburn train` feeds it from its
// loop; `fullburn run` and `attach` from the job's events file (poll_job).
// Train component, but needs no libtorch (store, telemetry, diagnose), so
// the monitoring half shares it.
//
// Contract
// - The job's thread (the training loop) calls Add*, Flush, TakeForwarded,
//   AddForwarded and Finish; it never waits on the store: steps and events
//   are written by a writer thread of the recorder's own, and a store that
//   refuses writes (locked, a full disk) keeps them, and the snapshots, to be
//   written later; each change is said once on stderr, from the job's thread,
//   for both writers in one voice.
// - With Options::poll_job the sampler thread is the job's thread until
//   StopSampling: the caller adds nothing itself.
// - The sampler runs on a thread of its own from Start until StopSampling
//   (or Finish); snapshots are stored there, the live diagnosis runs there
//   (off the training loop), and Latest and LiveFinding read what it left,
//   from any thread. AddRecords may be called from any thread (a checkpoint
//   writer's) until Finish; what comes after it is not written.
// - Forwarding (Options::forward): nothing is written to the store; steps,
//   events and readings wait for TakeForwarded, whose text rank 0 hands to
//   its AddForwarded. The transport is the caller's.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/spill.h"
#include "fullburn/store.h"
#include "fullburn/telemetry.h"

namespace fullburn {

class Recorder {
 public:
  struct Options {
    SamplerOptions sampler;
    GpuSource* gpus = nullptr;  // sampled here; null: no GPU readings
    int rank = 0, world_size = 1;
    // A rank whose store is not rank 0's: its records go through
    // TakeForwarded instead of the store.
    bool forward = false;
    // What limits the job now (LiveFinding), for a progress line. With
    // several ranks the other ranks' steps are read back from the store
    // every 2 s, so it can name uneven ranks and the straggler.
    bool live_diagnosis = false;
    // Step and event lines appended here too: the $FULLBURN_EVENTS of an
    // enclosing `fullburn run`, which then records the same steps; "": none.
    std::string events_path;
    // On the sampler thread before each snapshot is stored: what the job
    // wrote since the last call (its events file), recorded as the job's;
    // once more, on the caller's thread, in Finish.
    std::function<RunRecords()> poll_job;
    // On the sampler thread after each snapshot is stored and diagnosed,
    // with what poll_job returned for it (a live line's drawing).
    std::function<void(const Snapshot&, const RunRecords& polled)> on_snapshot;
    // Where what the store refuses goes (spill.h); null: kept in memory for
    // a while, then dropped. Must outlive the recorder.
    SpillFile* spill = nullptr;
  };
  // `store` and `gpus` must outlive the recorder; `run` is begun in `store`
  // (rank 0's run, for a forwarding rank).
  Recorder(const Env* env, RunStore* store, RunInfo run, Options o);
  ~Recorder();  // Finish(), if it was not called
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void Start();  // the sampler
  // One step of this rank: kept until Flush, seen by the live diagnosis now.
  void AddStep(const StepRecord& step);
  // An event of the run; `to_events_file`: also to Options::events_path.
  void AddEvent(const RunEvent& event, bool to_events_file = false);
  // Records of another kind (checkpoints), from any thread.
  void AddRecords(RunRecords records);
  // The steps kept so far to the store (and the events file); no-op when
  // forwarding (see TakeForwarded).
  void Flush();
  // Returns once everything added before is written or refused.
  void Sync();
  // Forwarding: everything recorded since the last call, as one text for
  // rank 0's AddForwarded; "" when there is nothing.
  std::string TakeForwarded();
  // Forwarding that cannot go on (rank 0 gone): what is recorded from now
  // on is dropped.
  void StopForwarding();
  bool forwarding() const { return forward_; }
  // Rank 0: another rank's TakeForwarded text; damaged text is ignored.
  void AddForwarded(const std::string& text);
  // Stops the sampler and stores its last snapshots (so nothing the sampler
  // adds comes after the caller's last TakeForwarded).
  void StopSampling();
  // StopSampling, then writes everything kept (the steps since the last
  // Flush too); the status of that last write, said on stderr with what
  // could not be stored.
  Status Finish();

  std::optional<Snapshot> Latest() const;
  std::string LiveFinding() const;  // " | now: ...", or ""

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
  bool forward_;
};

}  // namespace fullburn
