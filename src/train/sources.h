// Where the trainer's batches come from: an image folder or pack (through
// TorchLoader), token shards, in-memory synthetic tensors, or a program's
// own tensors (C++ API). Internal to the train component.
#pragma once

#include <optional>

#include "fullburn/config.h"
#include "fullburn/pipeline.h"
#include "fullburn/torch_loader.h"
#include "fullburn/trainer.h"
#include "fullburn/train_settings.h"

namespace fullburn {

struct TrainBatch {
  torch::Tensor inputs, targets;  // on the training device
  int64_t samples = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t batches_per_epoch() const = 0;
  // Deterministic in (seed, epoch, batch): a resumed run sees the same
  // batches. `consumed_samples`: the first samples of the epoch that every
  // rank together already read (a resumed run's position, whatever its world
  // size and batch were); this rank reads its share of the rest.
  virtual void StartEpoch(int epoch, int64_t consumed_samples) = 0;
  // False at the end of the epoch or on an error (status()).
  virtual bool Next(TrainBatch* b) = 0;
  virtual Status status() const { return Status::Ok(); }
  virtual std::optional<LoaderStats> loader_stats() const { return std::nullopt; }
  virtual int64_t num_classes() const = 0;
  // Flattened input size (for an MLP), 0 when not meaningful.
  virtual int64_t in_features() const = 0;
  // "sequence": targets per position (language model); else one per sample.
  virtual bool per_position_targets() const { return false; }
};

struct SourceSpec {
  std::string path;  // resolved (defaults created by the caller)
  bool train = true;
  int batch_size = 64;
  uint64_t seed = 0;
  torch::Device device = torch::kCPU;
  bool channels_last = false;
  int rank = 0, world_size = 1;
  int loader_cpu_budget = 0;            // most loader threads (LoaderOptions::cpu_budget)
  const TensorData* tensors = nullptr;  // data.source = tensors: the program's, not owned
  std::shared_ptr<Dataset> dataset;     // data.source = dataset: the program's
};

// Why `data` cannot be trained on ("" when it can): empty, inputs and targets
// of different lengths, targets that are not class indices.
std::string CheckTensorData(const TensorData& data);
// A Dataset's sample 0 as a batch of one (targets as the loader stores them),
// or why Get(0) could not give it: what CheckTensorData and
// CheckTensorsFitModel judge a program's dataset by.
Result<TensorData> FirstSampleAsBatch(Dataset& dataset, uint64_t seed);
// Why the built-in model.name cannot take `data` ("" when it can): the kind
// of input it reads, and for token models data.vocab and data.seq_len.
std::string CheckTensorsFitModel(const TrainSettings& settings, const TensorData& data);

Result<std::unique_ptr<BatchSource>> OpenSource(const TrainSettings& settings,
                                                const SourceSpec& spec);

// The defaults used when data.path is empty: a synthetic JPEG folder (train
// and val splits) or token file under `dir`, created on first use.
// Where DefaultImages keeps a split (nothing is created).
std::string DefaultImagesPath(const std::string& dir, int classes, bool val);
Result<std::string> DefaultImages(const std::string& dir, int classes, bool val);
Result<std::string> DefaultTokens(const std::string& dir, int vocab);

}  // namespace fullburn
