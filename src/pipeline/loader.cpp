// The image loader: images made into the slot ring's batches (ring.cpp).
// Each sample is read (or taken from the RAM cache or a pack), its crop
// decoded at the smallest DCT scale that covers it, resized (and flipped)
// straight into the slot; a bad one is replaced by the next of the epoch's
// order (on_bad_sample = skip) or stops the loader (fail).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include "fullburn/codec.h"
#include "fullburn/crop.h"
#include "fullburn/image_loader.h"
#include "fullburn/pack.h"
#include "fullburn/rng.h"

namespace fullburn {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// Everything behind ImageLoader's interface (image_loader.h keeps it out of
// sight): options_, folder_, pack_ and image_bytes_ are fixed once Open
// returns; the worker threads share the cache (under cache_mu_) and the
// names of the bad samples (under bad_mu_).
struct ImageLoader::Rep {
  // A sample's stored form: encoded JPEG bytes, or raw pixels from a pack.
  struct Encoded {
    const uint8_t* data = nullptr;
    size_t size = 0;
    int width = 0, height = 0;
    bool raw = false;
  };

  // The ring's maker: one sample into its place in the slot.
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
  std::mutex cache_mu_;
  std::vector<std::vector<uint8_t>> cache_;  // by sample; empty = not cached
  int64_t cache_used_ = 0;
  int64_t stats_cache_hits_ = 0;  // under cache_mu_
  // Last: destroyed first, so no worker runs once the members above go.
  std::unique_ptr<SampleRing> ring_;
};

Result<std::unique_ptr<ImageLoader>> ImageLoader::Open(const LoaderOptions& options) {
  if (options.out_w < 1 || options.out_h < 1)
    return Status::InvalidArgument("output size must be positive");
  std::unique_ptr<ImageLoader> loader(new ImageLoader());
  Rep* l = loader->rep_.get();
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
  if (options.cache_bytes > 0) l->cache_.resize(l->folder_.files.size());
  l->image_bytes_ = static_cast<size_t>(options.out_w) * options.out_h * 3 *
                    (options.normalize.enabled ? sizeof(float) : 1);
  RingOptions r = RingOptionsOf(options);
  r.shuffle = options.shuffle;
  r.dataset_size = static_cast<int64_t>(l->folder_.files.size());
  r.batch_bytes = l->image_bytes_ * static_cast<size_t>(std::max(0, options.batch_size));
  r.shard_pad = options.shard_pad;
  r.allocate = options.allocate_images;
  auto ring = SampleRing::Open(
      r, [l](const SampleJob& job, std::string* error) { return l->MakeImage(job, error); });
  if (!ring.ok()) return ring.status();
  l->ring_ = std::move(*ring);
  return loader;
}

ImageLoader::ImageLoader() : rep_(std::make_unique<Rep>()) {}

ImageLoader::~ImageLoader() = default;

int64_t ImageLoader::dataset_size() const {
  return static_cast<int64_t>(rep_->folder_.files.size());
}
int64_t ImageLoader::epoch_size() const { return rep_->ring_->epoch_size(); }
int64_t ImageLoader::batches_per_epoch() const { return rep_->ring_->batches_per_epoch(); }
const ImageFolder& ImageLoader::folder() const { return rep_->folder_; }
const LoaderOptions& ImageLoader::options() const { return rep_->options_; }

void ImageLoader::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  rep_->ring_->StartEpoch(epoch, first_batch, consumed_samples);
}

LoaderPosition ImageLoader::position() const { return rep_->ring_->position(); }
bool ImageLoader::Next(Batch* batch) { return rep_->ring_->Next(batch); }
bool ImageLoader::TryNext(Batch* batch) { return rep_->ring_->TryNext(batch); }
void ImageLoader::Release(const Batch& batch) { rep_->ring_->Release(batch); }
Status ImageLoader::status() const { return rep_->ring_->status(); }
SampleRing& ImageLoader::ring() { return *rep_->ring_; }

LoaderStats ImageLoader::stats() const {
  LoaderStats s = rep_->ring_->stats();
  std::lock_guard<std::mutex> cache_lock(rep_->cache_mu_);
  s.cache_hits = rep_->stats_cache_hits_;
  s.cache_bytes = rep_->cache_used_;
  return s;
}

Status ImageLoader::Rep::Read(int64_t sample, std::vector<uint8_t>* bytes) {
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

Status ImageLoader::Rep::Locate(int64_t sample, std::vector<uint8_t>* buffer, Encoded* out) {
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

bool ImageLoader::Rep::MakeImage(const SampleJob& job, std::string* error) {
  thread_local std::vector<uint8_t> bytes;
  thread_local DecodedRegion region;
  const std::vector<int64_t>& order = *job.order;
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t pos = job.position;
  StageTimes* t = job.times;
  SplitMix rng{(options_.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(job.epoch) << 40) ^
               static_cast<uint64_t>(job.place)};
  uint8_t* dst = job.slot + image_bytes_ * static_cast<size_t>(job.index_in_batch);
  // A bad sample is replaced by the next sample of the permutation.
  for (int64_t attempt = 0; attempt < std::min<int64_t>(n, 64); ++attempt) {
    int64_t sample = order[static_cast<size_t>((pos + attempt) % n)];
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
      if (options_.normalize.enabled) {
        thread_local std::vector<uint8_t> pixels;
        pixels.resize(static_cast<size_t>(options_.out_w) * options_.out_h * 3);
        ResizeInto(view, box, options_.out_w, options_.out_h, flip, options_.layout, pixels.data());
        NormalizeInto(pixels.data(), options_.out_w * options_.out_h, options_.layout,
                      options_.normalize, reinterpret_cast<float*>(dst));
      } else {
        ResizeInto(view, box, options_.out_w, options_.out_h, flip, options_.layout, dst);
      }
      *job.label = folder_.labels[static_cast<size_t>(sample)];
      *job.sample = sample;
      t->augment_s += Seconds() - t2;
      return true;
    }
    if (!Skip(folder_.files[static_cast<size_t>(sample)], s.message(), error)) return false;
  }
  *error = "no decodable image among " + std::to_string(std::min<int64_t>(n, 64)) +
           " consecutive samples of " + options_.root;
  return false;
}

bool ImageLoader::Rep::Skip(const std::string& path, const std::string& reason,
                            std::string* error) {
  if (options_.on_bad_sample == BadSamplePolicy::kFail) {
    *error = "bad sample " + path + ": " + reason + ": " + options_.bad_sample_fix;
    return false;
  }
  ring_->CountSkipped();
  std::lock_guard<std::mutex> lock(bad_mu_);
  if (std::find(bad_named_.begin(), bad_named_.end(), path) == bad_named_.end()) {
    bad_named_.push_back(path);
    std::fprintf(stderr, "fullburn: skipping %s: %s\n", path.c_str(), reason.c_str());
  }
  return true;
}

}  // namespace fullburn
