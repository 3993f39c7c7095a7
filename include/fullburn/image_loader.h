// Image loader: images into batches: JPEG/PNG files of a folder (or a pack)
// read, their crop decoded, resized and flipped by worker threads straight
// into the slots of a SampleRing (sample_ring.h), handed out in batch order.
//
// Contract
// - Batches: uint8 images (NHWC or NCHW, LoaderOptions::layout) plus int32
//   labels, in the ring's pre-allocated slots; with LoaderOptions::normalize
//   enabled the workers write float32 images instead, (v / 255 - mean) / std
//   (crop.h's NormalizeInto). Otherwise the cast to float and normalization
//   happen later, on the device (torch_loader.h) or in the caller.
// - Ownership: the loader owns its ring, its folder listing, its pack
//   mapping and its RAM cache; a Batch points into a slot, valid until
//   Release(). Slot memory from LoaderOptions::allocate_images must outlive
//   the loader. All of the loader's state is private to
//   src/pipeline/loader.cpp (ImageLoader::Rep).
// - Threads: the ring's worker threads run the stages; StartEpoch/Next/
//   TryNext/Release are for one consumer thread; status() and stats() may be
//   called from any thread.
// - Order: the batch sequence is a function of (seed, epoch) only: the same
//   whatever the thread count. The crop and flip of a sample are drawn from
//   (seed, epoch, its place in the epoch's permutation).
// - Errors: Open returns a Status (a bad option, an unreadable folder or a
//   corrupt pack, a dataset smaller than one batch). Bad samples (corrupt,
//   truncated, empty, not JPEG or PNG) with on_bad_sample=skip are replaced
//   by the next good sample of the permutation, counted (LoaderStats::skipped)
//   and named once on stderr: a batch always has batch_size samples (but the
//   last of an epoch with keep_last, for evaluation); 64 bad samples in a
//   row stop the loader as fail does. With fail, the first one stops the
//   loader: Next() returns false and status() says which
//   sample and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fullburn/crop.h"
#include "fullburn/image_folder.h"
#include "fullburn/sample_ring.h"
#include "fullburn/status.h"

namespace fullburn {

enum class BadSamplePolicy { kSkip, kFail };

struct LoaderOptions {
  std::string root;  // image folder, or a pack written by WritePack
  int batch_size = 64;
  // 0: tuned while running (below); else fixed. The tuner starts with one
  // worker and adds one whenever the consumer waited more than 5% of the last
  // few batches, up to cpu_budget; it parks one when the consumer never waited
  // and the measured per-sample time says fewer workers keep up.
  int threads = 0;
  // Most worker threads; 0: the CPUs this process may use (its affinity, or
  // its container's CPU quota where lower: RankCpus) - 1, one for training.
  int cpu_budget = 0;
  // Batches prepared ahead of the consumer. 0: tuned, starting at 3: the
  // depth grows (up to 8) when the consumer waits although the workers could
  // keep up on average, i.e. when production is bursty rather than slow.
  int prefetch = 0;
  int out_w = 224, out_h = 224;
  bool train = true;  // RandomResizedCrop + flip; else Resize + CenterCrop
  int eval_resize = 256;
  Layout layout = Layout::kNHWC;
  // Slots hold float32 images normalized by the workers (4 bytes a value),
  // not uint8 ones to normalize later on the device.
  Normalization normalize;
  uint64_t seed = 0;
  // False: every epoch reads the dataset in its own order (evaluation
  // without shuffling); the crops of training still vary with the seed.
  bool shuffle = true;
  BadSamplePolicy on_bad_sample = BadSamplePolicy::kSkip;
  // The end of the kFail error: the caller names its own setting.
  std::string bad_sample_fix = "use on_bad_sample = skip to go on without it";
  CropParams crop;
  // Data parallelism: this process reads every world_size-th sample of the
  // epoch's permutation, starting at rank, like torch's DistributedSampler.
  // With pad (the default) the permutation is extended by its own start so
  // every rank gets ceil(n / world_size) samples; without, the remainder is
  // dropped and every rank gets floor(n / world_size).
  int rank = 0, world_size = 1;
  bool shard_pad = true;
  // Evaluation: every sample read exactly once over all ranks. Ranks split
  // the samples without padding (shares differ by at most one; shard_pad is
  // ignored) and an epoch's last batch holds what is left, so it may be
  // smaller than batch_size (Batch::size says).
  bool keep_last = false;
  // Keep encoded files in RAM up to this many bytes. The first files read are
  // kept and none is evicted: under a fresh random order every epoch, any
  // fixed subset hits equally often, so eviction would only cost.
  int64_t cache_bytes = 0;
  // Where batch images live: by default the loader allocates them; the
  // libtorch adapter passes pinned host memory so the copy to the GPU reads
  // the slot directly. The memory must outlive the loader.
  std::function<uint8_t*(size_t bytes)> allocate_images;
};

// Images into the ring's slots: JPEG/PNG files of a folder, or a pack,
// cropped, resized and flipped (LoaderOptions).
class ImageLoader {
 public:
  static Result<std::unique_ptr<ImageLoader>> Open(const LoaderOptions& options);
  ~ImageLoader();

  int64_t dataset_size() const;
  // Samples this rank reads per epoch (see LoaderOptions::world_size).
  int64_t epoch_size() const;
  int64_t batches_per_epoch() const;
  const ImageFolder& folder() const;
  const LoaderOptions& options() const;

  // Starts producing the batches of `epoch` (drop_last: every batch is full),
  // from batch `first_batch` on (a resumed run passes its saved position).
  // Unless this start repeats the epoch before it (as an evaluation loop
  // does), the workers begin the epoch after as soon as every sample of the
  // current one is claimed, into
  // the slots behind it, so the first batches of the next epoch do not wait
  // for the pipeline to fill again; StartEpoch(epoch + 1) from its first
  // batch keeps what they made, any other start drops it (the batches are
  // the same either way: they follow from seed, epoch and position).
  // `consumed_samples`: the first samples of the epoch's permutation that
  // every rank together already read, in a run whose world size or batch may
  // have been different; this rank reads every world_size-th of the rest
  // (fewer batches this epoch), and `first_batch` counts from there.
  void StartEpoch(int epoch, int64_t first_batch = 0, int64_t consumed_samples = 0);
  LoaderPosition position() const;
  // Blocks for the next batch of the epoch; false at its end or on error.
  bool Next(Batch* batch);
  // The next batch if it is ready now; never blocks.
  bool TryNext(Batch* batch);
  void Release(const Batch& batch);
  // Ok, or the error that stopped the loader.
  Status status() const;
  LoaderStats stats() const;
  SampleRing& ring();

 private:
  // The options, the folder (or pack), the RAM cache, the bad samples named
  // so far and the ring whose workers make the images (src/pipeline/loader.cpp).
  struct Rep;
  ImageLoader();
  std::unique_ptr<Rep> rep_;
};

}  // namespace fullburn
