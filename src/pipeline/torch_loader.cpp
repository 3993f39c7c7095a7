#include "fullburn/torch_loader.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <thread>

namespace fullburn {

// A core batch on its way to the device.
struct TorchLoader::InFlight {
  Batch core;
  torch::Tensor images;  // uint8 NHWC on the device (or a view of the slot on CPU)
  torch::Tensor labels;
  std::unique_ptr<c10::Event> copied;  // CUDA only
};

namespace {

// Blocks the host until a batch's copy to the device has completed (CUDA).
void WaitCopied(const c10::Event* copied) {
  while (copied && !copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace

Result<std::unique_ptr<TorchLoader>> TorchLoader::Open(const TorchLoaderOptions& options) {
  std::unique_ptr<TorchLoader> t(new TorchLoader());
  t->options_ = options;
  t->cuda_ = options.device.is_cuda();
  if (t->cuda_ && !torch::cuda::is_available())
    return Status::Unavailable("device " + options.device.str() +
                               " requested but this libtorch has no usable CUDA device: use cpu");
  LoaderOptions core = options.loader;
  core.layout = Layout::kNHWC;  // the device permutes; NHWC keeps each pixel's bytes together
  if (t->cuda_) {
    TorchLoader* self = t.get();
    core.allocate_images = [self](size_t bytes) {
      torch::Tensor pinned =
          torch::empty({static_cast<int64_t>(bytes)},
                       torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
      self->pinned_.push_back(pinned);
      return pinned.data_ptr<uint8_t>();
    };
  }
  Result<std::unique_ptr<ImageLoader>> loader = ImageLoader::Open(core);
  if (!loader.ok()) return loader.status();
  t->core_ = std::move(*loader);
  auto stats = torch::TensorOptions().dtype(torch::kFloat).device(options.device);
  t->mean_ =
      torch::tensor({options.mean[0], options.mean[1], options.mean[2]}, stats).view({1, 3, 1, 1});
  t->std_ =
      torch::tensor({options.std[0], options.std[1], options.std[2]}, stats).view({1, 3, 1, 1});
  return t;
}

TorchLoader::~TorchLoader() {
  // In-flight copies read pinned slots: let them finish before the memory goes.
  for (auto& f : issued_) WaitCopied(f->copied.get());
  for (auto& f : copying_) WaitCopied(f->copied.get());
  issued_.clear();
  copying_.clear();
  core_.reset();
}

LoaderPosition TorchLoader::position() const {
  LoaderPosition p = core_->position();
  p.next_batch = handed_;  // batches issued but not handed out are not consumed
  return p;
}

void TorchLoader::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  ReleaseCompleted(false);
  while (!copying_.empty()) ReleaseCompleted(true);
  for (auto& f : issued_) {
    WaitCopied(f->copied.get());
    core_->Release(f->core);
  }
  issued_.clear();
  handed_ = first_batch;
  core_->StartEpoch(epoch, first_batch, consumed_samples);
}

void TorchLoader::ReleaseCompleted(bool wait_for_one) {
  while (!copying_.empty()) {
    InFlight& f = *copying_.front();
    if (f.copied && !f.copied->query()) {
      if (!wait_for_one) return;
      WaitCopied(f.copied.get());
    }
    core_->Release(f.core);
    copying_.pop_front();
    wait_for_one = false;
  }
}

bool TorchLoader::Issue() {
  auto f = std::make_unique<InFlight>();
  // Block only when nothing is issued yet; otherwise take what is ready.
  bool got = issued_.empty() ? core_->Next(&f->core) : core_->TryNext(&f->core);
  if (!got) return false;
  const LoaderOptions& o = options_.loader;
  torch::Tensor host = torch::from_blob(const_cast<uint8_t*>(f->core.images),
                                        {f->core.size, o.out_h, o.out_w, 3}, torch::kUInt8);
  torch::Tensor labels =
      torch::from_blob(const_cast<int32_t*>(f->core.labels), {f->core.size}, torch::kInt32);
  if (cuda_) {
    if (!side_) {
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      side_ = std::make_unique<c10::Stream>(impl.getStreamFromGlobalPool(options_.device));
    }
    c10::StreamGuard guard(*side_);
    // Labels first: from pageable memory the copy is synchronous, and it is tiny.
    f->labels = labels.to(options_.device, torch::kLong);
    f->images = host.to(options_.device, /*non_blocking=*/true);  // pinned: asynchronous
    f->copied = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
    f->copied->record(*side_);
  } else {
    f->images = host;
    f->labels = labels.to(torch::kLong);
  }
  issued_.push_back(std::move(f));
  return true;
}

bool TorchLoader::Next(DeviceBatch* out) {
  ReleaseCompleted(false);
  if (issued_.empty() && !Issue()) return false;
  std::unique_ptr<InFlight> f = std::move(issued_.front());
  issued_.pop_front();
  if (f->copied) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    f->copied->block(
        impl.getStream(options_.device));  // the compute stream waits, the host does not
  }
  // (x / 255 - mean) / std, NHWC -> NCHW, on the device (or the host for CPU).
  torch::Tensor x = f->images.permute({0, 3, 1, 2}).to(torch::kFloat).div_(255.0f);
  x = x.sub_(mean_).div_(std_);
  auto format =
      options_.channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  out->images = x.to(options_.dtype).contiguous(format);
  out->labels = f->labels;
  out->index = f->core.index;
  out->epoch = f->core.epoch;
  ++handed_;
  if (cuda_) {
    copying_.push_back(std::move(f));  // released once the copy has completed
  } else {
    core_->Release(f->core);  // the normalized tensor is a new allocation
  }
  // Start the next copy now, so it overlaps the caller's step.
  if (issued_.empty()) Issue();
  return true;
}

}  // namespace fullburn
