// Sample ring: what every loader shares: worker threads, the epoch's order
// and its shards across ranks, and a ring of batch slots, with the tuner of
// its threads and depth. ImageLoader (image_loader.h) makes images into its
// slots; a program's own dataset (DatasetLoader, torch_loader.h) makes
// tensors; the Python module's loaders take the slots' memory over.
//
// Contract
// - Ownership: the ring owns its worker threads (started by Open, stopped and
//   joined by the destructor) and its slots. A slot's memory is taken with
//   its first batch, from RingOptions::allocate (which must outlive the ring)
//   or the ring's own; HandOverMemory gives a handed-out batch's memory to
//   the consumer. A Batch points into a slot: valid until Release(). All of
//   the ring's state is private to src/pipeline/ring.cpp (SampleRing::State).
// - Slots cycle free -> filling -> ready -> in use -> free. Next() hands out
//   ready slots in batch order; Release() frees one. A slot is never written
//   while the consumer holds it.
// - Threads: the maker (MakeSample) runs on several worker threads at once;
//   StartEpoch/Next/TryNext/Release/HandOverMemory are for one consumer
//   thread; status(), stats(), position(), CountSkipped() and Fail() may be
//   called from any thread.
// - Order: the batch sequence is a function of (seed, epoch) only, the same
//   whatever the thread count; a SampleJob carries the sample's place in the
//   whole epoch's permutation, so a maker seeds its randomness from it and a
//   resumed run (any world size) makes each sample as the first run did.
// - Errors: Open refuses bad options and a dataset smaller than one batch
//   (InvalidArgument). Afterwards one error (a maker that returns false or
//   throws, slot memory that cannot be had, Fail()) stops the ring, wakes
//   every waiting thread and is returned through status() once Next() says
//   false; no exception leaves a worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

// ---- What a ring hands out -----------------------------------------------------

struct StageTimes {
  double read_s = 0, decode_s = 0, augment_s = 0;  // summed over worker threads
  double dataset_s = 0;  // a program's own Dataset::Get (torch_loader.h), likewise
};

struct LoaderStats {
  int64_t batches = 0, samples = 0, skipped = 0;
  int64_t cache_hits = 0, cache_bytes = 0;
  StageTimes stages;
  double consumer_wait_s = 0;  // time Next() blocked: the data wait
  int threads = 0;             // active workers now
  int prefetch = 0;            // batches allowed ahead of the consumer now
  int ready_batches = 0;       // prepared and waiting for the consumer (queue depth)
};

struct Batch {
  int64_t index = -1;  // within the epoch
  int epoch = 0;
  int size = 0;
  // The slot's memory; ImageLoader's: size x H x W x 3 (NHWC) or size x 3 x
  // H x W, uint8, or float32 (4 bytes a value) with LoaderOptions::normalize.
  const uint8_t* images = nullptr;
  const int32_t* labels = nullptr;
  const int64_t* samples = nullptr;  // dataset indices, for tracing and tests
  int slot = -1;
};

// Where a consumer is: the epoch and the next batch it will receive. Saved
// with a checkpoint, it resumes the exact remaining sequence of batches.
struct LoaderPosition {
  int epoch = 0;
  int64_t next_batch = 0;
};

// ---- The slot ring: every loader's threads, order and slots ---------------

struct RingOptions {
  int64_t dataset_size = 0;
  size_t batch_bytes = 0;  // one slot's memory, for batch_size samples
  // As LoaderOptions: batch_size, threads (0: tuned), cpu_budget, prefetch
  // (0: tuned), seed, rank/world_size/shard_pad (shards), keep_last.
  int batch_size = 64, threads = 0, cpu_budget = 0, prefetch = 0;
  uint64_t seed = 0;
  bool shuffle = true;  // false: the dataset's order, every epoch
  int rank = 0, world_size = 1;
  bool shard_pad = true, keep_last = false;
  // Slot memory (pinned host memory for a GPU); by default the ring's own.
  // It must outlive the ring.
  std::function<uint8_t*(size_t bytes)> allocate;
};

// The ring's share of a loader's options (LoaderOptions, DatasetLoaderOptions:
// any with these fields of the same names).
template <class LoaderOpts>
RingOptions RingOptionsOf(const LoaderOpts& o) {
  RingOptions r;
  r.batch_size = o.batch_size;
  r.threads = o.threads;
  r.cpu_budget = o.cpu_budget;
  r.prefetch = o.prefetch;
  r.seed = o.seed;
  r.rank = o.rank;
  r.world_size = o.world_size;
  r.keep_last = o.keep_last;
  return r;
}

// One sample for a worker to make: the `position`-th of this rank's epoch,
// the `index_in_batch`-th of its batch, into the batch's slot memory.
struct SampleJob {
  int epoch = 0;
  int64_t position = 0;
  // The sample's place in the whole epoch's permutation (all ranks, the
  // samples a resumed run skipped counted): the same for a sample whatever
  // the world size and after a resume, so random augmentation is seeded
  // from it.
  int64_t place = 0;
  int index_in_batch = 0;
  const std::vector<int64_t>* order = nullptr;  // this rank's dataset indices, by position
  uint8_t* slot = nullptr;                      // RingOptions::batch_bytes
  int32_t* label = nullptr;                     // the sample's label, where the maker has one
  int64_t* sample = nullptr;  // the dataset index it made (normally (*order)[position])
  StageTimes* times = nullptr;
};
// Called on several worker threads at once; false (with `error`) stops the
// ring and is what status() then says.
using MakeSample = std::function<bool(const SampleJob& job, std::string* error)>;

// This rank's part of `samples` spread over world_size ranks: padded to equal
// counts, or the remainder dropped; with keep_last, split without padding.
int64_t RankShare(int64_t samples, int rank, int world_size, bool pad, bool keep_last);

// One decision of the ring's tuner, from one window of batches the consumer
// took. Pure, so that tests script the readings instead of depending on how
// fast a busy machine decodes.
struct RingWindow {
  double wait_share = 0;  // the consumer's wait / the window's wall time
  double needed = 0;      // workers the epoch's average consumption needs
  int active = 1;         // workers allowed to claim samples
  int started = 1;        // workers that exist
  int depth = 3, max_depth = 8;
  bool tune_depth = false, tune_threads = false;
};
enum class RingTune { kKeep, kDeepen, kAddWorker, kParkWorker };
// The consumer waits although the workers keep up on average: the production
// is bursty (a consumer that pauses, then takes batches fast), so the queue
// deepens; it waits and they do not keep up: one more worker; it never waits
// and fewer workers would do: one parks.
RingTune DecideRingTune(const RingWindow& w);

class SampleRing {
 public:
  static Result<std::unique_ptr<SampleRing>> Open(const RingOptions& options, MakeSample make);
  ~SampleRing();  // stops and joins the workers

  int64_t epoch_size() const;  // samples this rank reads per epoch
  int64_t batches_per_epoch() const;
  const RingOptions& options() const;
  // As ImageLoader's (image_loader.h), with the read-ahead across epochs it describes.
  void StartEpoch(int epoch, int64_t first_batch = 0, int64_t consumed_samples = 0);
  LoaderPosition position() const;
  bool Next(Batch* batch);
  bool TryNext(Batch* batch);
  void Release(const Batch& batch);
  // The consumer keeps the memory of `batch` (handed out, not yet released;
  // from RingOptions::allocate, whose owner now belongs to the consumer): its
  // slot takes new memory for its next batch. No copy of a batch the consumer
  // keeps, and no slot waits for the consumer to drop it.
  void HandOverMemory(const Batch& batch);
  Status status() const;
  LoaderStats stats() const;
  void CountSkipped();  // a bad sample the maker replaced (LoaderStats::skipped)
  // Stops the ring with `message` (as a failed sample would).
  void Fail(const std::string& message);

 private:
  // The workers, the slots, the epoch's order and the tuner, under one lock
  // (src/pipeline/ring.cpp).
  struct State;
  SampleRing();
  std::unique_ptr<State> state_;
};

}  // namespace fullburn
