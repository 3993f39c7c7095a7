// One CUDA graph of a whole training step (train component only). Built on
// at::cuda::CUDAGraph when libtorch has CUDA (FULLBURN_TORCH_CUDA); in a CPU
// libtorch build Supported() is false and Capture() says so.
//
// Contract: the training thread owns it. The captured body must read its
// inputs from tensors it keeps (the caller copies each step's batch into
// them before Replay()) and must not read anything back to the host: the
// graph replays the same kernels on the same addresses.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fullburn/status.h"

namespace fullburn {

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  // Why this process cannot capture (empty when it can).
  static std::string Unsupported();
  // Captures one call of `body` on a side stream (a capture cannot use the
  // legacy default stream). Nothing runs: Replay() does. The caller runs the
  // body eagerly a few times first, so first-use work (cuBLAS workspaces,
  // autograd's and the optimizer's allocations) stays out of the graph.
  Status Capture(const std::function<void()>& body);
  // Launches the captured step on the current stream; no host sync.
  void Replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Timestamps of a step's phases taken on the device (CUDA events with
// timing), so a timed step waits once, at its end, instead of synchronizing
// the device after every phase. Marks go on the current stream.
class PhaseEvents {
 public:
  // Null unless `device` is CUDA and this libtorch has CUDA.
  static std::unique_ptr<PhaseEvents> ForDevice(const torch::Device& device);
  virtual ~PhaseEvents() = default;
  // Starts a step's timeline.
  virtual void Start() = 0;
  // The span since the previous mark belongs to `phase` ("" belongs to none:
  // the device idled while the host waited for data, say).
  virtual void Mark(const char* phase) = 0;
  // Waits for the last mark; seconds per phase, summed over the step.
  virtual std::map<std::string, double> Collect() = 0;
};

}  // namespace fullburn
