// The trainer: `fullburn train` end to end, and the same runtime for a
// program's own network and data (train component, links libtorch).
//
// Contract
// - RunTraining owns everything it starts (the loader's workers, the
//   telemetry sampler and NVML's PCIe reader, the checkpoint and record
//   writers, dist.offload's update, the rendezvous watchdog) and joins it
//   before it returns. One call at a time per process: while it runs,
//   SIGINT/SIGTERM stop the loop at a step's end; the caller's handlers are
//   back when it returns.
// - Every failure comes back as the exit code with one line on stderr naming
//   the problem and the fix, never as an exception: 2 for input the user must
//   change, found before the first step (the config, a path that does not
//   exist, data that does not fit the model or is damaged, a corrupt
//   checkpoint to resume); 1 for a run that failed once training began (bad
//   data met on the way too) or a failure of the machine (I/O, memory); 130
//   for a run a signal stopped (checkpointed first). The run is stored as
//   failed or finished accordingly.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/config.h"
#include "fullburn/models.h"
#include "fullburn/torch_loader.h"

namespace fullburn {

// "libtorch 1.13.1, CPU only" or "libtorch 2.x, CUDA with N device(s)".
std::string TorchDescription();

// Samples a program holds in memory (C++ API): `inputs` [N, ...] and
// `targets` [N] of class indices, or [N, T] of one per position (a language
// model's next tokens). Moved to the training device whole; each epoch reads
// them in a new order (train.seed), every rank its share, as with the other
// sources. The run's config says data.source = tensors.
struct TensorData {
  torch::Tensor inputs, targets;
};

struct TrainerOptions {
  std::string config_path;             // TOML file; empty: none
  std::vector<std::string> overrides;  // key=value
  std::optional<Config> config;        // C++ API: a built config instead of the two above
  bool print_config = false;           // print the effective config and stop
  std::string store_path;              // empty: the default store
  std::string name;
  std::string resume;                 // a run id / "last" or a checkpoint file
  std::optional<int64_t> parent_run;  // the tuning this run is a trial of
  bool quiet = false;
  std::vector<std::string> command;  // argv, stored with the run
  // C++ API only: a network of the program's own instead of model.name (the
  // run's config then says model.name = custom, and model_name names it in
  // the run's name), and data of its own instead of data.source: samples in
  // memory (train_data: data.source = tensors) or made on demand on the
  // loader's threads (dataset, a torch_loader.h Dataset: data.source =
  // dataset, read with data.threads and data.prefetch); val_data and
  // val_dataset are held out, for eval.*. A run trained so resumes from its
  // program, which hands the same network and data over again with `resume`.
  std::shared_ptr<Model> model;
  std::string model_name;
  std::optional<TensorData> train_data, val_data;
  std::shared_ptr<Dataset> dataset, val_dataset;
};

// Runs `fullburn train` end to end: data, model, the loop, telemetry, the run
// store, checkpoints, the final evaluation. Returns the process exit code
// (0 on success) after printing any error as one line.
int RunTraining(const TrainerOptions& options);

// Process-wide (glibc mallopt): freed host memory stays in the process for
// reuse instead of going back to the OS (train.keep_host_memory). No-op
// elsewhere. Irreversible for the process.
void KeepHostMemory();

}  // namespace fullburn
