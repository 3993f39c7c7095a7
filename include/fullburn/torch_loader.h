// TorchLoader: the input pipeline for any libtorch training loop (training half).
//
// Contract
// - Wraps ImageLoader (pipeline.h) and yields batches already on the target
//   device: images normalized ((x / 255 - mean) / std), NCHW (or channels-last
//   memory format), in the requested dtype; labels int64.
// - On CUDA the uint8 batch slots are pinned host memory. The copy of a slot to
//   the device runs on a side stream with its own event; the consumer's stream
//   waits on that event (the host does not), and the slot returns to the
//   loader only once the event has completed, so a slot is never refilled
//   while its copy is in flight. Normalization runs on the device, after the
//   copy: 1 byte a pixel crosses PCIe, not 4.
// - On CPU the same steps run on the host.
// - One consumer thread calls StartEpoch/Next; the returned tensors are the
//   caller's (a later Next never writes into them).
// - Errors: Open returns a Status; a loader error ends Next() with false and
//   status() says why.
#pragma once

#include <torch/torch.h>

#include <array>
#include <deque>
#include <memory>

#include "fullburn/pipeline.h"

namespace fullburn {

struct TorchLoaderOptions {
  LoaderOptions loader;
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat;
  bool channels_last = false;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // ImageNet's, as torchvision
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};

struct DeviceBatch {
  torch::Tensor images;  // [B, 3, H, W] on the device
  torch::Tensor labels;  // [B] int64 on the device
  int64_t index = -1;
  int epoch = 0;
};

class TorchLoader {
 public:
  static Result<std::unique_ptr<TorchLoader>> Open(const TorchLoaderOptions& options);
  ~TorchLoader();

  // As ImageLoader::StartEpoch.
  void StartEpoch(int epoch, int64_t first_batch = 0, int64_t consumed_samples = 0);
  bool Next(DeviceBatch* out);
  Status status() const { return core_->status(); }
  LoaderStats stats() const { return core_->stats(); }
  LoaderPosition position() const;
  int64_t batches_per_epoch() const { return core_->batches_per_epoch(); }
  int64_t num_classes() const { return static_cast<int64_t>(core_->folder().classes.size()); }
  bool uses_cuda() const { return cuda_; }

 private:
  struct InFlight;
  TorchLoader() = default;
  bool Issue();  // takes a ready core batch and starts its copy
  void ReleaseCompleted(bool wait_for_one);

  TorchLoaderOptions options_;
  std::unique_ptr<ImageLoader> core_;
  bool cuda_ = false;
  std::vector<torch::Tensor> pinned_;  // keeps slot memory alive
  std::unique_ptr<c10::Stream> side_;  // the copy stream (CUDA)
  torch::Tensor mean_, std_;
  std::deque<std::unique_ptr<InFlight>> issued_;   // copies started, not yet handed out
  std::deque<std::unique_ptr<InFlight>> copying_;  // handed out, slot not yet released
  int64_t handed_ = 0;
};

// The name the training runtime and users' loops use.
using Loader = TorchLoader;

}  // namespace fullburn
