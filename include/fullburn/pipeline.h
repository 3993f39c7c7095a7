// Pipeline: the input pipeline's stages, from JPEG files to uint8 batches.
//
// Contract
// - This core is libtorch-free: it produces uint8 batches (NHWC or NCHW) plus
//   int32 labels in pre-allocated slots. Normalization and the cast to float
//   happen later, on the device (the libtorch adapter, in the training half).
// - Stages are plain functions (decode, crop geometry, resize) so each is
//   tested alone; ImageLoader runs them on its own worker threads.
// - SampleRing is what every loader shares: worker threads, the epoch's order
//   and its shards, and batch slots that cycle free -> filling -> ready -> in
//   use -> free. Next() hands out ready slots in batch order; Release() frees
//   one. A slot is never written while the consumer holds it. One error (a
//   sample that cannot be made, on_bad_sample=fail, an unreadable dataset, a
//   maker that throws, slot memory that cannot be had) wakes every waiting
//   thread and is returned by Next() through status(); no exception leaves a
//   worker thread.
//   Next()/Release() are for one consumer thread. ImageLoader makes images
//   into its slots; a program's own dataset (torch_loader.h) makes tensors.
// - The batch sequence is a function of (seed, epoch) only: the same whatever
//   the thread count.
// - Bad samples (corrupt, truncated, empty, not JPEG) with on_bad_sample=skip
//   are replaced by the next good sample of the permutation, counted, and named
//   once on stderr: a batch always has batch_size samples (but the last of an
//   epoch with keep_last, for evaluation).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

// ---- JPEG ----------------------------------------------------------------

struct JpegHeader {
  int width = 0, height = 0, components = 0;
};
// A decoded region: rgb holds width x height x 3 bytes. Pixel (0, 0) is the
// source point (origin_x, origin_y); one decoded pixel spans 1/scale source
// pixels (scale = DCT scaling factor, 1/8 to 1).
struct DecodedRegion {
  int width = 0, height = 0;
  double scale = 1, origin_x = 0, origin_y = 0;
  std::vector<uint8_t> rgb;
};
struct BoxF {
  double x = 0, y = 0, w = 0, h = 0;  // in source pixels
};
// Pixels to resample: a decoded region, or raw pixels of a packed dataset
// (scale 1, origin 0), without copying either.
struct ImageView {
  const uint8_t* rgb = nullptr;
  int width = 0, height = 0;
  double scale = 1, origin_x = 0, origin_y = 0;
  static ImageView Of(const DecodedRegion& d) {
    return ImageView{d.rgb.data(), d.width, d.height, d.scale, d.origin_x, d.origin_y};
  }
};

Result<JpegHeader> ReadJpegHeader(const uint8_t* data, size_t size);
// Decodes the part of the image under `crop`, downscaled in the DCT domain by
// the largest factor that keeps the crop at least min_w x min_h decoded pixels.
// Rows above and below the crop are skipped, columns outside it are cropped.
Status DecodeJpegRegion(const uint8_t* data, size_t size, const BoxF& crop, int min_w, int min_h,
                        DecodedRegion* out);
// Full decode at scale 1 (the decode-only baseline).
Status DecodeJpeg(const uint8_t* data, size_t size, DecodedRegion* out);
// Encodes RGB pixels as a baseline JPEG (4:2:0) of the given quality.
Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality);

// ---- PNG (decoded whole; no partial or scaled decode exists for it) ---------

bool IsPng(const uint8_t* data, size_t size);
Status DecodePng(const uint8_t* data, size_t size, DecodedRegion* out);
Result<std::vector<uint8_t>> EncodePng(const uint8_t* rgb, int width, int height);

// ---- Crop geometry (torchvision's definitions) -----------------------------

struct CropParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};
// torchvision.transforms.RandomResizedCrop.get_params with `uniform` standing
// in for torch.rand: up to 10 tries of (area, log-ratio, top, left) draws, then
// the whole image clamped to the ratio range, centered. Integer box.
BoxF RandomResizedCropBox(int width, int height, const CropParams& p,
                          const std::function<double()>& uniform);
// Resize(shorter side = resize) then CenterCrop(crop), as one box in source pixels.
BoxF ResizeCenterCropBox(int width, int height, int resize, int crop);

enum class Layout { kNHWC, kNCHW };
// Bilinear resize (pixel centers, align_corners=False) of the source box of a
// decoded region into an out_w x out_h image at `dst`, optionally mirrored.
// Each output pixel is written exactly once.
void ResizeInto(const ImageView& src, const BoxF& box, int out_w, int out_h, bool flip,
                Layout layout, uint8_t* dst);
inline void ResizeInto(const DecodedRegion& src, const BoxF& box, int out_w, int out_h, bool flip,
                       Layout layout, uint8_t* dst) {
  ResizeInto(ImageView::Of(src), box, out_w, out_h, flip, layout, dst);
}
struct Normalization;
// `pixels` RGB values of one image (in `layout`) as floats, (v / 255 - mean) / std
// per channel, into `dst` in the same layout.
void NormalizeInto(const uint8_t* src, int pixels, Layout layout, const Normalization& n, float* dst);

// ---- Datasets ----------------------------------------------------------------

struct ImageFolder {
  std::vector<std::string> classes;  // sorted subfolder names
  std::vector<std::string> files;    // sorted by class, then name
  std::vector<int32_t> labels;
};
// Scans root/<class>/*.{jpg,jpeg,png} (any case). An empty or unreadable folder is an error.
Result<ImageFolder> ScanImageFolder(const std::string& root);

// A whole file, read with pread (shared by the loader, pack and bench).
Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out);

struct SyntheticImagesOptions {
  int classes = 10, per_class = 100, width = 500, height = 375, quality = 90;
  uint64_t seed = 0;
};
// Writes a learnable, photo-like JPEG folder: each class has its own shape,
// palette and texture frequency on a smooth background with noise.
Status MakeSyntheticImages(const std::string& dir, const SyntheticImagesOptions& opts);

// ---- Packed datasets (docs/formats.md) ------------------------------------

enum class PackFormat : uint32_t { kJpeg = 0, kRaw = 1 };

struct PackOptions {
  PackFormat format = PackFormat::kJpeg;
  int max_side = 0;  // resize so neither side exceeds this (0: keep the size)
  int quality = 90;  // for kJpeg
  int threads = 0;   // 0: one per CPU this process may use (RankCpus)
};
// Writes an image folder as a pack: DST/index.fbpx plus DST/shard-NNNNN.fbp
// files, in the folder's order. Unreadable images are left out and counted.
struct PackReport {
  int64_t images = 0, skipped = 0, bytes = 0;
};
Result<PackReport> WritePack(const std::string& src, const std::string& dst, const PackOptions& o);
// The same for a folder already scanned (from `src`), so a caller that
// needed its file list first does not walk a large tree twice.
Result<PackReport> WritePack(const ImageFolder& folder, const std::string& src,
                             const std::string& dst, const PackOptions& o);

struct PackRecord {
  uint32_t shard;
  uint64_t offset;
  uint32_t size;
  uint16_t width, height;
  int32_t label;
};

// A pack opened for reading: shards are mapped read-only and shared by all
// threads; Data() points into the mapping (valid while the reader lives).
class PackReader {
 public:
  static bool IsPack(const std::string& dir);
  // Checks the index's magic, version and checksum and that every record lies
  // inside its shard: a truncated or corrupt pack is refused here, not mid-epoch.
  static Result<std::unique_ptr<PackReader>> Open(const std::string& dir);
  ~PackReader();
  PackFormat format() const { return format_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<PackRecord>& records() const { return records_; }
  const uint8_t* Data(const PackRecord& r) const { return maps_[r.shard] + r.offset; }

 private:
  PackReader() = default;
  PackFormat format_ = PackFormat::kJpeg;
  std::vector<std::string> classes_;
  std::vector<PackRecord> records_;
  std::vector<const uint8_t*> maps_;
  std::vector<size_t> map_sizes_;
};

// ---- Token shards (language models) -------------------------------------------

// Files of uint16 token ids: the nanoGPT layout (the bare array) or llm.c's
// (a 256 x int32 header: magic 20240520, version 1, token count; then the
// array). Several files form one stream, sampled in proportion to their size.
class TokenShards {
 public:
  static Result<std::unique_ptr<TokenShards>> Open(const std::vector<std::string>& paths,
                                                   int seq_len);
  ~TokenShards();
  int64_t tokens() const { return total_; }
  int seq_len() const { return seq_len_; }
  // Batch `step` of `batch` windows of seq_len + 1 tokens at random offsets
  // drawn from (seed, step): x = window[0, seq_len), y = window[1, seq_len].
  // The same step always gives the same batch, so a resumed run continues exactly.
  void Batch(uint64_t seed, int64_t step, int batch, int32_t* x, int32_t* y) const;

 private:
  struct File {
    const uint16_t* tokens;
    int64_t count;
    void* map;
    size_t map_size;
  };
  TokenShards() = default;
  std::vector<File> files_;
  int64_t total_ = 0;
  int seq_len_ = 0;
};

struct SyntheticTokensOptions {
  int64_t tokens = 1 << 20;
  int vocab = 256;
  uint64_t seed = 0;
};
// Writes a nanoGPT-layout token file with learnable structure: each token
// follows its predecessor by a fixed random transition 85% of the time.
Status MakeSyntheticTokens(const std::string& path, const SyntheticTokensOptions& opts);

// Deterministic 64-bit generator (splitmix64), so crops depend only on
// (seed, epoch, sample) and not on which thread did the work.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
};
// The epoch's order: a full permutation of 0..n-1 from (seed, epoch); the
// identity without `shuffle`.
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int epoch, bool shuffle = true);

// ---- Loader --------------------------------------------------------------------

enum class BadSamplePolicy { kSkip, kFail };

// Float images normalized by the loader's workers, in place of uint8 pixels:
// (pixel / 255 - mean) / std per RGB channel, torchvision's ToTensor +
// Normalize. The defaults are ImageNet's, as torchvision's examples use.
struct Normalization {
  bool enabled = false;
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};

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
  // The slot's memory; ImageLoader's: size x H x W x 3 (NHWC) or size x 3 x H x W.
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
  int64_t batches_per_epoch() const {
    return options_.keep_last ? (epoch_size() + options_.batch_size - 1) / options_.batch_size
                              : epoch_size() / options_.batch_size;
  }
  const RingOptions& options() const { return options_; }
  // As ImageLoader's (below), with the read-ahead across epochs it describes.
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
  struct Slot;
  SampleRing() = default;
  // One epoch's share of this rank: its samples by position, and how many
  // of them its batches hold.
  struct EpochPlan {
    std::vector<int64_t> order;
    int64_t items = 0;
    int64_t skip = 0;  // the samples of the permutation read before (consumed_samples)
  };
  EpochPlan PlanEpoch(int epoch, int64_t consumed_samples) const;  // no lock needed
  bool HandOut(Slot& slot, Batch* out);           // with mu_ held
  int SlotIndex(int64_t in_sequence) const;       // batch k of this epoch: SlotIndex(base_ + k)
  Slot& SlotAt(int64_t in_sequence) { return *slots_[static_cast<size_t>(SlotIndex(in_sequence))]; }
  void Tune();                                    // with mu_ held
  bool Allocate(Slot& slot, std::string* error);  // with mu_ held
  bool MakeOrExplain(const SampleJob& job, std::string* error);
  void Worker(int id);
  // batch_size, or less for keep_last's last batch of an epoch of `items` samples.
  int64_t BatchSize(int64_t batch, int64_t items) const;
  void StopWorkers();

  RingOptions options_;
  MakeSample make_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::thread> workers_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  bool stop_ = false;
  Status error_;
  int epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t next_item_ = 0;     // next (batch, i) to claim, as batch * batch_size + i
  int64_t next_to_hand_ = 0;  // the batch Next() returns next
  int inflight_ = 0;          // samples being made outside the lock
  int active_ = 1;            // workers allowed to claim samples
  bool autotune_ = false;
  int depth_ = 3;          // batches workers may prepare ahead of the consumer
  bool gated_ = false;     // a worker waits because it is depth_ ahead
  bool draining_ = false;  // StartEpoch waits for samples in flight
  bool tune_depth_ = false;
  double window_start_ = -1, window_wait_ = 0, window_work_ = 0;
  double epoch_start_ = 0;
  int64_t epoch_first_batch_ = 0;
  // This epoch's batches: fewer than batches_per_epoch() after consumed samples.
  int64_t epoch_batches_ = 0;
  int64_t epoch_items_ = 0;  // samples of this rank in the epoch's batches
  int64_t epoch_skip_ = 0;   // the epoch's samples read before this start (consumed_samples)
  int64_t window_batches_ = 0, window_samples_ = 0;
  // Batch k of this epoch lives in slot (base_ + k) % slots: the batches of
  // the epoch read ahead follow this one's in the same sequence of slots.
  int64_t base_ = 0;
  // The loop did not start this epoch again (as evaluation does): it will
  // likely go on to the next, which the workers then begin once this one is
  // all claimed.
  bool advancing_ = false;
  struct ReadAhead {
    bool planned = false, planning = false;  // planning: a worker makes it, unlocked
    EpochPlan plan;                          // epoch_ + 1, from its first sample
    int64_t next_item = 0;
  } ahead_;
  LoaderStats stats_;
};

// Images into the ring's slots: JPEG/PNG files of a folder, or a pack,
// cropped, resized and flipped (LoaderOptions).
class ImageLoader {
 public:
  static Result<std::unique_ptr<ImageLoader>> Open(const LoaderOptions& options);
  ~ImageLoader();

  int64_t dataset_size() const { return static_cast<int64_t>(folder_.files.size()); }
  // Samples this rank reads per epoch (see LoaderOptions::world_size).
  int64_t epoch_size() const { return ring_->epoch_size(); }
  int64_t batches_per_epoch() const { return ring_->batches_per_epoch(); }
  const ImageFolder& folder() const { return folder_; }
  const LoaderOptions& options() const { return options_; }

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
  void StartEpoch(int epoch, int64_t first_batch = 0, int64_t consumed_samples = 0) {
    ring_->StartEpoch(epoch, first_batch, consumed_samples);
  }
  LoaderPosition position() const { return ring_->position(); }
  // Blocks for the next batch of the epoch; false at its end or on error.
  bool Next(Batch* batch) { return ring_->Next(batch); }
  // The next batch if it is ready now; never blocks.
  bool TryNext(Batch* batch) { return ring_->TryNext(batch); }
  void Release(const Batch& batch) { ring_->Release(batch); }
  // Ok, or the error that stopped the loader.
  Status status() const { return ring_->status(); }
  LoaderStats stats() const;
  SampleRing& ring() { return *ring_; }

 private:
  ImageLoader() = default;
  // A sample's stored form: encoded JPEG bytes, or raw pixels from a pack.
  struct Encoded {
    const uint8_t* data = nullptr;
    size_t size = 0;
    int width = 0, height = 0;
    bool raw = false;
  };
  bool MakeImage(const SampleJob& job, std::string* error);
  Status Locate(int64_t sample, std::vector<uint8_t>* buffer, Encoded* out);
  Status Read(int64_t sample, std::vector<uint8_t>* bytes);
  // Counts and names (once) a bad sample; false when the policy is to fail.
  bool Skip(const std::string& path, const std::string& reason, std::string* error);

  LoaderOptions options_;
  ImageFolder folder_;  // for a pack: its classes and labels, files named DIR#i
  std::unique_ptr<PackReader> pack_;
  size_t image_bytes_ = 0;
  std::mutex bad_mu_;
  std::vector<std::string> bad_named_;  // under bad_mu_
  mutable std::mutex cache_mu_;
  std::vector<std::vector<uint8_t>> cache_;  // by sample; empty = not cached
  int64_t cache_used_ = 0;
  int64_t stats_cache_hits_ = 0;  // under cache_mu_
  // Last: destroyed first, so no worker runs once the members above go.
  std::unique_ptr<SampleRing> ring_;
};

}  // namespace fullburn
