// StepContext: the model and what one training step needs beside it (the
// device, autocast's dtype, the phase events), as the trainer built them
// from the config (train component only).
//
// Contract
// - A plain value of shared pointers: the trainer owns the one it built;
//   the parts it lends it to (the memory model's probes, the batch search)
//   use it on the training thread only, during the call it is lent for.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>

#include "cuda_graph.h"
#include "fullburn/models.h"

namespace fullburn {

// The model plus what one step needs, built from the config.
struct StepContext {
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;  // bf16 / fp16, none for fp32
  // CUDA: timed steps' phases from device events; null on CPU (clocks).
  std::shared_ptr<PhaseEvents> events;
  std::shared_ptr<Model> model;
  bool per_position = false;
  bool channels_last = false;
};

}  // namespace fullburn
