// TorchLoader: the input pipeline for any libtorch training loop (training half),
// and DatasetLoader: the same pipeline for a program's own Dataset.
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

class DeviceStager;

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
  bool uses_cuda() const;

 private:
  TorchLoader() = default;

  TorchLoaderOptions options_;
  std::unique_ptr<DeviceStager> stager_;  // src/pipeline/device_stager.h; owns the slots' memory
  std::unique_ptr<ImageLoader> core_;     // after stager_: destroyed first
  torch::Tensor mean_, std_;
};

// The name the training runtime and users' loops use.
using Loader = TorchLoader;

// ---- A program's own dataset --------------------------------------------------

// One sample: `input` of one shape and dtype for every sample of a dataset;
// `target` a class index (an integer scalar) or a tensor of one shape for
// every sample (one target per position, say).
struct Sample {
  torch::Tensor input, target;
};

// A map-style dataset of a program's own (C++ API), made on DatasetLoader's
// worker threads: what torch.utils.data.Dataset is to a DataLoader, without
// processes, pickling or collation copies.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Sample `index` (0 <= index < size()). Called on the loader's worker
  // threads, several at once, so it must be thread-safe. `seed` is for random
  // augmentation: a function of the loader's seed, the epoch and the sample's
  // place in it only, so the batches are the same whatever the thread count,
  // and after a resume. An exception stops the loader: status() names the
  // index and says what was thrown.
  virtual Sample Get(int64_t index, uint64_t seed) = 0;
};

struct DatasetLoaderOptions {
  // As LoaderOptions: threads and prefetch 0 are tuned while running within
  // cpu_budget (0: this rank's CPUs - 1); rank/world_size shard each epoch
  // (padded to equal shares); keep_last reads every sample once (evaluation).
  int batch_size = 64, threads = 0, cpu_budget = 0, prefetch = 0;
  uint64_t seed = 0;
  int rank = 0, world_size = 1;
  bool keep_last = false;
  torch::Device device = torch::kCPU;
  bool channels_last = false;  // 3-D inputs (C, H, W): batches in channels-last memory format
};

struct TensorBatch {
  torch::Tensor inputs;   // [B, <input shape>] on the device, the input dtype
  torch::Tensor targets;  // [B] int64 for class indices, else [B, <target shape>]
  int64_t index = -1;
  int epoch = 0;
};

// Batches of a Dataset on the device: workers call Get() in the epoch's order
// and write each sample straight into its place in a batch slot of the ring
// (pipeline.h); on CUDA the slots are pinned and copied ahead on a side
// stream, as TorchLoader's. The returned tensors are the caller's. One
// consumer thread calls StartEpoch/Next.
class DatasetLoader {
 public:
  // Reads sample 0 for the shapes every sample must have; a dataset that is
  // empty, or whose sample 0 cannot be made, is an error here.
  static Result<std::unique_ptr<DatasetLoader>> Open(std::shared_ptr<Dataset> dataset,
                                                     const DatasetLoaderOptions& options);
  ~DatasetLoader();

  // As ImageLoader::StartEpoch.
  void StartEpoch(int epoch, int64_t first_batch = 0, int64_t consumed_samples = 0);
  bool Next(TensorBatch* out);
  Status status() const { return ring_->status(); }
  LoaderStats stats() const { return ring_->stats(); }
  LoaderPosition position() const;
  int64_t batches_per_epoch() const { return ring_->batches_per_epoch(); }
  const Sample& first() const { return first_; }  // sample 0, on the host
  bool uses_cuda() const;

 private:
  DatasetLoader() = default;
  bool Make(const SampleJob& job, std::string* error);

  std::shared_ptr<Dataset> dataset_;
  DatasetLoaderOptions options_;
  Sample first_;  // the shapes and dtypes; its target as stored (int64 for class indices)
  size_t input_bytes_ = 0, target_bytes_ = 0, targets_at_ = 0;  // per sample; the targets' offset
  class MemoryPool;                       // CPU: batch memory handed over and recycled
  std::shared_ptr<MemoryPool> memory_;    // before ring_: outlives the slots
  std::unique_ptr<DeviceStager> stager_;  // owns the slots' memory
  std::unique_ptr<SampleRing> ring_;      // after stager_: destroyed first
};

}  // namespace fullburn
