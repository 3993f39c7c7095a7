// The image loader: worker threads fill batch slots in a ring.
//
// Batch k of an epoch always lives in slot k % slots. Workers claim samples
// one at a time in batch order, (k, 0), (k, 1), ..., so all threads work on
// the oldest unfinished batches first; a worker whose next sample belongs to
// a slot the consumer still holds waits for Release(). What a sample becomes
// depends only on (seed, epoch, position), never on the thread that made it.

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "fullburn/env.h"
#include "fullburn/pipeline.h"

namespace fullburn {

struct ImageLoader::Slot {
  enum class State { kFree, kFilling, kReady, kInUse };
  State state = State::kFree;
  int64_t batch = -1;
  int epoch = -1;
  int filled = 0;
  std::vector<uint8_t> own_images;  // unless LoaderOptions::allocate_images
  uint8_t* images = nullptr;
  std::vector<int32_t> labels;
  std::vector<int64_t> samples;
};

namespace {

constexpr int kStartDepth = 3, kMaxDepth = 8;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<ImageLoader>> ImageLoader::Open(const LoaderOptions& options) {
  if (options.batch_size < 1) return Status::InvalidArgument("batch size must be at least 1");
  if (options.prefetch < 0)
    return Status::InvalidArgument("prefetch must be at least 1 (0: tuned)");
  if (options.out_w < 1 || options.out_h < 1)
    return Status::InvalidArgument("output size must be positive");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return Status::InvalidArgument("rank " + std::to_string(options.rank) + " is not in 0.." +
                                   std::to_string(options.world_size - 1) + " (world size " +
                                   std::to_string(options.world_size) + ")");
  std::unique_ptr<ImageLoader> l(new ImageLoader());
  l->options_ = options;
  if (PackReader::IsPack(options.root)) {
    Result<std::unique_ptr<PackReader>> pack = PackReader::Open(options.root);
    if (!pack.ok()) return pack.status();
    l->pack_ = std::move(*pack);
    l->folder_.classes = l->pack_->classes();
    for (size_t i = 0; i < l->pack_->records().size(); ++i) {
      l->folder_.files.push_back(options.root + "#" + std::to_string(i));
      l->folder_.labels.push_back(l->pack_->records()[i].label);
    }
  } else {
    Result<ImageFolder> folder = ScanImageFolder(options.root);
    if (!folder.ok()) return folder.status();
    l->folder_ = std::move(*folder);
  }
  if (l->epoch_size() < (options.keep_last ? 1 : options.batch_size))
    return Status::InvalidArgument("the dataset has " + std::to_string(l->folder_.files.size()) +
                                   " images (" + std::to_string(l->epoch_size()) +
                                   " for this rank), fewer than one batch of " +
                                   std::to_string(options.batch_size) + ": lower the batch size");
  if (options.cache_bytes > 0) l->cache_.resize(l->folder_.files.size());
  l->image_bytes_ = static_cast<size_t>(options.out_w) * options.out_h * 3;
  int budget = options.cpu_budget > 0 ? options.cpu_budget
                                      : std::max(1, RankCpus(ReadCpuView(Env::Default()), 1) - 1);
  int threads = options.threads > 0 ? options.threads : budget;
  l->autotune_ = options.threads <= 0;
  l->active_ = l->autotune_ ? 1 : threads;
  l->stats_.threads = l->active_;
  // The consumer holds one slot; up to `depth_` more are prepared ahead of it.
  l->tune_depth_ = options.prefetch == 0;
  l->depth_ = l->tune_depth_ ? kStartDepth : options.prefetch;
  int slots = (l->tune_depth_ ? kMaxDepth : options.prefetch) + 1;
  l->stats_.prefetch = l->depth_;
  for (int i = 0; i < slots; ++i) {
    auto slot = std::make_unique<Slot>();  // image memory comes with its first batch
    slot->labels.resize(static_cast<size_t>(options.batch_size));
    slot->samples.resize(static_cast<size_t>(options.batch_size));
    l->slots_.push_back(std::move(slot));
  }
  for (int i = 0; i < threads; ++i) l->workers_.emplace_back(&ImageLoader::Worker, l.get(), i);
  return l;
}

ImageLoader::~ImageLoader() { StopWorkers(); }

void ImageLoader::Allocate(Slot& s) {
  size_t bytes = image_bytes_ * static_cast<size_t>(options_.batch_size);
  if (options_.allocate_images) {
    s.images = options_.allocate_images(bytes);
  } else {
    s.own_images.resize(bytes);
    s.images = s.own_images.data();
  }
}

void ImageLoader::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
}

int64_t ImageLoader::BatchSize(int64_t batch) const {
  return std::min<int64_t>(options_.batch_size, epoch_items_ - batch * options_.batch_size);
}

int64_t ImageLoader::epoch_size() const { return RankShare(dataset_size()); }

// This rank's part of `samples` spread over the ranks: padded to equal
// counts, or the remainder dropped.
int64_t ImageLoader::RankShare(int64_t samples) const {
  const int64_t w = options_.world_size;
  if (options_.keep_last)
    return samples > options_.rank ? (samples - options_.rank + w - 1) / w : 0;
  return options_.shard_pad ? (samples + w - 1) / w : samples / w;
}

LoaderPosition ImageLoader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LoaderPosition{epoch_, next_to_hand_};
}

void ImageLoader::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  std::unique_lock<std::mutex> lock(mu_);
  // Samples being made for the old epoch finish first; slots they filled are freed.
  ready_cv_.wait(lock, [this] { return inflight_ == 0 || stop_; });
  for (auto& s : slots_)
    if (s->state != Slot::State::kInUse) {
      s->state = Slot::State::kFree;
      s->batch = -1;
    }
  epoch_ = epoch;
  // This rank's samples: every world_size-th of the (padded) permutation,
  // after the samples every rank together already read.
  const int64_t n = dataset_size(), w = options_.world_size;
  const int64_t skip = std::max<int64_t>(0, std::min(consumed_samples, n));
  std::vector<int64_t> perm = EpochPermutation(n, options_.seed, epoch);
  const int64_t per_rank = RankShare(n - skip);
  order_.resize(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i)
    order_[static_cast<size_t>(i)] = perm[static_cast<size_t>((skip + options_.rank + i * w) % n)];
  const int64_t b = options_.batch_size;
  epoch_items_ = options_.keep_last ? per_rank : per_rank / b * b;
  epoch_batches_ = (epoch_items_ + b - 1) / b;
  first_batch = std::max<int64_t>(0, std::min(first_batch, epoch_batches_));
  next_item_ = first_batch * options_.batch_size;
  next_to_hand_ = first_batch;
  window_start_ = -1;  // the tuner does not count the pause between epochs
  epoch_start_ = Seconds();
  epoch_first_batch_ = first_batch;
  lock.unlock();
  work_cv_.notify_all();
}

void ImageLoader::Fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = Status::Corruption(message);
    stop_ = true;
  }
  // One error wakes everyone: workers stop, the consumer's Next() returns false.
  work_cv_.notify_all();
  ready_cv_.notify_all();
}

Status ImageLoader::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

LoaderStats ImageLoader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s = stats_;
  for (const auto& slot : slots_) s.ready_batches += slot->state == Slot::State::kReady;
  std::lock_guard<std::mutex> cache_lock(cache_mu_);
  s.cache_hits = stats_cache_hits_;
  s.cache_bytes = cache_used_;
  return s;
}

Status ImageLoader::Read(int64_t sample, std::vector<uint8_t>* bytes) {
  if (!cache_.empty()) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const std::vector<uint8_t>& hit = cache_[static_cast<size_t>(sample)];
    if (!hit.empty()) {
      *bytes = hit;
      ++stats_cache_hits_;
      return Status::Ok();
    }
  }
  Status s = ReadWholeFile(folder_.files[static_cast<size_t>(sample)], bytes);
  if (s.ok() && !cache_.empty() && !bytes->empty()) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_used_ + static_cast<int64_t>(bytes->size()) <= options_.cache_bytes &&
        cache_[static_cast<size_t>(sample)].empty()) {
      cache_[static_cast<size_t>(sample)] = *bytes;
      cache_used_ += static_cast<int64_t>(bytes->size());
    }
  }
  return s;
}

Status ImageLoader::Locate(int64_t sample, std::vector<uint8_t>* buffer, Encoded* out) {
  if (pack_) {
    const PackRecord& r = pack_->records()[static_cast<size_t>(sample)];
    *out = Encoded{pack_->Data(r), r.size, r.width, r.height, pack_->format() == PackFormat::kRaw};
    return Status::Ok();
  }
  if (Status s = Read(sample, buffer); !s.ok()) return s;
  if (IsPng(buffer->data(), buffer->size())) {
    // PNG has no region decode: decode it whole now and hand out its pixels.
    thread_local DecodedRegion png;
    if (Status s = DecodePng(buffer->data(), buffer->size(), &png); !s.ok()) return s;
    *out = Encoded{png.rgb.data(), png.rgb.size(), png.width, png.height, true};
    return Status::Ok();
  }
  Result<JpegHeader> header = ReadJpegHeader(buffer->data(), buffer->size());
  if (!header.ok()) return header.status();
  *out = Encoded{buffer->data(), buffer->size(), header->width, header->height, false};
  return Status::Ok();
}

bool ImageLoader::FillSample(Slot& slot, int64_t batch, int i, StageTimes* t, std::string* error) {
  thread_local std::vector<uint8_t> bytes;
  thread_local DecodedRegion region;
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t pos = batch * options_.batch_size + i;
  SplitMix rng{(options_.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(epoch_) << 40) ^
               static_cast<uint64_t>(pos)};
  uint8_t* dst = slot.images + image_bytes_ * static_cast<size_t>(i);
  // A bad sample is replaced by the next sample of the permutation.
  for (int64_t attempt = 0; attempt < std::min<int64_t>(n, 64); ++attempt) {
    int64_t sample = order_[static_cast<size_t>((pos + attempt) % n)];
    double t0 = Seconds();
    Encoded e;
    Status s = Locate(sample, &bytes, &e);
    double t1 = Seconds();
    t->read_s += t1 - t0;
    BoxF box;
    ImageView view;
    if (s.ok()) {
      box = options_.train ? RandomResizedCropBox(e.width, e.height, options_.crop,
                                                  [&rng] { return rng.Uniform(); })
                           : ResizeCenterCropBox(e.width, e.height, options_.eval_resize,
                                                 std::min(options_.out_w, options_.out_h));
      if (e.raw) {
        view = ImageView{e.data, e.width, e.height, 1, 0, 0};  // nothing to decode
      } else {
        s = DecodeJpegRegion(e.data, e.size, box, options_.out_w, options_.out_h, &region);
        view = ImageView::Of(region);
      }
    }
    double t2 = Seconds();
    t->decode_s += t2 - t1;
    if (s.ok()) {
      bool flip = options_.train && rng.Uniform() < 0.5;
      ResizeInto(view, box, options_.out_w, options_.out_h, flip, options_.layout, dst);
      slot.labels[static_cast<size_t>(i)] = folder_.labels[static_cast<size_t>(sample)];
      slot.samples[static_cast<size_t>(i)] = sample;
      t->augment_s += Seconds() - t2;
      return true;
    }
    if (!Skip(folder_.files[static_cast<size_t>(sample)], s.message(), error)) return false;
  }
  *error = "no decodable image among 64 consecutive samples of " + options_.root;
  return false;
}

bool ImageLoader::Skip(const std::string& path, const std::string& reason, std::string* error) {
  if (options_.on_bad_sample == BadSamplePolicy::kFail) {
    *error = "bad sample " + path + ": " + reason + ": " + options_.bad_sample_fix;
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.skipped;
  if (std::find(bad_named_.begin(), bad_named_.end(), path) == bad_named_.end()) {
    bad_named_.push_back(path);
    std::fprintf(stderr, "fullburn: skipping %s: %s\n", path.c_str(), reason.c_str());
  }
  return true;
}

void ImageLoader::Worker(int id) {
  const int b = options_.batch_size;
  const int64_t slots = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Slot* slot = nullptr;
    int64_t batch = -1;
    int i = 0;
    work_cv_.wait(lock, [&] {
      if (stop_) return true;
      if (id >= active_) return false;  // parked by the tuner
      if (epoch_ < 0 || next_item_ >= epoch_items_) return false;
      batch = next_item_ / b;
      // Up to depth_ batches ready ahead of the consumer, plus one being filled.
      if (batch > next_to_hand_ + depth_) {
        gated_ = true;
        return false;
      }
      Slot& s = *slots_[static_cast<size_t>(batch % slots)];
      if (s.state == Slot::State::kFree && !s.images) Allocate(s);
      if (s.state == Slot::State::kFree) {
        s.state = Slot::State::kFilling;
        s.batch = batch;
        s.epoch = epoch_;
        s.filled = 0;
      }
      return s.state == Slot::State::kFilling && s.batch == batch && s.epoch == epoch_;
    });
    if (stop_) return;
    slot = slots_[static_cast<size_t>(batch % slots)].get();
    i = static_cast<int>(next_item_ % b);
    ++next_item_;
    ++inflight_;
    lock.unlock();
    StageTimes t;
    std::string error;
    bool ok = FillSample(*slot, batch, i, &t, &error);
    lock.lock();
    --inflight_;
    stats_.stages.read_s += t.read_s;
    stats_.stages.decode_s += t.decode_s;
    stats_.stages.augment_s += t.augment_s;
    window_work_ += t.read_s + t.decode_s + t.augment_s;
    ++window_samples_;
    if (!ok) {
      lock.unlock();
      Fail(error);
      return;
    }
    if (++slot->filled == BatchSize(batch)) slot->state = Slot::State::kReady;
    ready_cv_.notify_all();
  }
}

bool ImageLoader::Next(Batch* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (epoch_ < 0 || next_to_hand_ >= epoch_batches_) return false;
  Slot& s = *slots_[static_cast<size_t>(next_to_hand_ % static_cast<int64_t>(slots_.size()))];
  double t0 = Seconds();
  ready_cv_.wait(lock, [&] {
    return stop_ ||
           (s.state == Slot::State::kReady && s.batch == next_to_hand_ && s.epoch == epoch_);
  });
  double waited = Seconds() - t0;
  stats_.consumer_wait_s += waited;
  window_wait_ += waited;
  bool ok = HandOut(s, out);
  if (ok && (autotune_ || tune_depth_)) Tune();
  bool wake = gated_;  // a worker waits for room ahead of the consumer
  gated_ = false;
  lock.unlock();
  if (wake) work_cv_.notify_all();
  return ok;
}

void ImageLoader::Tune() {
  constexpr int kWindow = 4;  // batches per decision
  double now = Seconds();
  if (window_start_ < 0) {
    window_start_ = now;
    window_wait_ = window_work_ = 0;
    window_batches_ = window_samples_ = 0;
    return;
  }
  if (++window_batches_ < kWindow) return;
  double wall = now - window_start_;
  double wait_share = wall > 0 ? window_wait_ / wall : 0;
  // Workers needed to match the consumer: per-sample work x samples per second
  // consumed, the latter over the whole epoch so far, so a consumer's pauses
  // count (a burst after a pause is what a deeper queue is for).
  double per_sample = window_samples_ ? window_work_ / window_samples_ : 0;
  double epoch_wall = now - epoch_start_;
  double consumed_per_s =
      epoch_wall > 0 ? (next_to_hand_ - epoch_first_batch_) * options_.batch_size / epoch_wall : 0;
  double needed = per_sample * consumed_per_s;
  int most = static_cast<int>(workers_.size());
  bool keeps_up = needed < 0.8 * active_;  // on average the workers are fast enough
  if (wait_share > 0.05 && keeps_up && tune_depth_ && depth_ < kMaxDepth) {
    ++depth_;  // bursty production: a deeper queue absorbs it
    work_cv_.notify_all();
  } else if (wait_share > 0.05 && autotune_ && active_ < most) {
    ++active_;
    work_cv_.notify_all();
  } else if (wait_share < 0.005 && autotune_ && active_ > 1 && needed < active_ - 1.5) {
    --active_;  // parks the highest-numbered worker after its current sample
  }
  stats_.threads = active_;
  stats_.prefetch = depth_;
  window_start_ = now;
  window_wait_ = window_work_ = 0;
  window_batches_ = window_samples_ = 0;
}

bool ImageLoader::TryNext(Batch* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch_ < 0 || next_to_hand_ >= epoch_batches_) return false;
  Slot& s = *slots_[static_cast<size_t>(next_to_hand_ % static_cast<int64_t>(slots_.size()))];
  if (s.state != Slot::State::kReady || s.batch != next_to_hand_ || s.epoch != epoch_) return false;
  bool ok = HandOut(s, out);
  if (gated_) {
    gated_ = false;
    work_cv_.notify_all();
  }
  return ok;
}

bool ImageLoader::HandOut(Slot& s, Batch* out) {
  if (!error_.ok() || s.state != Slot::State::kReady) return false;
  s.state = Slot::State::kInUse;
  out->index = next_to_hand_;
  out->epoch = epoch_;
  out->size = static_cast<int>(BatchSize(next_to_hand_));
  out->images = s.images;
  out->labels = s.labels.data();
  out->samples = s.samples.data();
  out->slot = static_cast<int>(next_to_hand_ % static_cast<int64_t>(slots_.size()));
  ++next_to_hand_;
  ++stats_.batches;
  stats_.samples += out->size;
  return true;
}

void ImageLoader::Release(const Batch& batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = *slots_[static_cast<size_t>(batch.slot)];
    FB_CHECK(s.state == Slot::State::kInUse && s.batch == batch.index);
    s.state = Slot::State::kFree;
    s.batch = -1;
  }
  work_cv_.notify_all();
}

}  // namespace fullburn
