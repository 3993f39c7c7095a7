#include "fullburn/torch_loader.h"

#include "device_stager.h"

namespace fullburn {

Result<std::unique_ptr<TorchLoader>> TorchLoader::Open(const TorchLoaderOptions& options) {
  std::unique_ptr<TorchLoader> t(new TorchLoader());
  t->options_ = options;
  if (options.device.is_cuda() && !torch::cuda::is_available())
    return Status::Unavailable("device " + options.device.str() +
                               " requested but this libtorch has no usable CUDA device: use cpu");
  const int h = options.loader.out_h, w = options.loader.out_w;
  t->stager_ = std::make_unique<DeviceStager>(options.device, [h, w](const Batch& b) {
    // Labels first: they are in pageable memory, and tiny.
    return std::vector<DeviceStager::Part>{
        {torch::from_blob(const_cast<int32_t*>(b.labels), {b.size}, torch::kInt32), torch::kLong,
         /*in_slot=*/false},
        {torch::from_blob(const_cast<uint8_t*>(b.images), {b.size, h, w, 3}, torch::kUInt8),
         torch::kUInt8}};
  });
  LoaderOptions core = options.loader;
  core.layout = Layout::kNHWC;  // the device permutes; NHWC keeps each pixel's bytes together
  core.allocate_images = t->stager_->Allocator();
  Result<std::unique_ptr<ImageLoader>> loader = ImageLoader::Open(core);
  if (!loader.ok()) return loader.status();
  t->core_ = std::move(*loader);
  t->stager_->Attach(&t->core_->ring());
  auto stats = torch::TensorOptions().dtype(torch::kFloat).device(options.device);
  t->mean_ =
      torch::tensor({options.mean[0], options.mean[1], options.mean[2]}, stats).view({1, 3, 1, 1});
  t->std_ =
      torch::tensor({options.std[0], options.std[1], options.std[2]}, stats).view({1, 3, 1, 1});
  return t;
}

// core_ goes first (its workers stop writing slots), then stager_ (it waits
// for copies in flight, which read the slots, and frees the pinned memory).
TorchLoader::~TorchLoader() = default;

bool TorchLoader::uses_cuda() const { return stager_->cuda(); }

LoaderPosition TorchLoader::position() const {
  LoaderPosition p = core_->position();
  p.next_batch = stager_->handed();  // batches issued but not handed out are not consumed
  return p;
}

void TorchLoader::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  stager_->StartEpoch(epoch, first_batch, consumed_samples);
}

bool TorchLoader::Next(DeviceBatch* out) {
  Batch core;
  std::vector<torch::Tensor> parts;  // labels, images (uint8 NHWC)
  if (!stager_->Next(&core, &parts)) return false;
  // (x / 255 - mean) / std, NHWC -> NCHW, on the device (or the host for CPU).
  torch::Tensor x = parts[1].permute({0, 3, 1, 2}).to(torch::kFloat).div_(255.0f);
  x = x.sub_(mean_).div_(std_);
  auto format =
      options_.channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  out->images = x.to(options_.dtype).contiguous(format);
  out->labels = parts[0];
  out->index = core.index;
  out->epoch = core.epoch;
  stager_->Done();  // the normalized tensor is a new allocation
  return true;
}

}  // namespace fullburn
