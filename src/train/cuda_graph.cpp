// CudaGraph over at::cuda::CUDAGraph (libtorch 1.13 and 2.x share the calls
// used here: capture_begin with the default pool, capture_end, replay).
#include "cuda_graph.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef FULLBURN_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace fullburn {

#ifdef FULLBURN_TORCH_CUDA

struct CudaGraph::Impl {
  at::cuda::CUDAGraph graph;
  bool captured = false;
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

std::string CudaGraph::Unsupported() {
  return torch::cuda::is_available() ? "" : "no CUDA device is visible";
}

Status CudaGraph::Capture(const std::function<void()>& body) {
  try {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    c10::cuda::getCurrentCUDAStream().synchronize();  // the eager steps are done
    {
      c10::cuda::CUDAStreamGuard guard(side);
      impl_->graph.capture_begin();
      body();
      impl_->graph.capture_end();
    }
    impl_->captured = true;
    return Status::Ok();
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Status::Internal("CUDA graph capture of the training step failed (" +
                            what.substr(0, what.find('\n')) +
                            "): set train.cuda_graphs = false to train eagerly");
  }
}

void CudaGraph::Replay() { impl_->graph.replay(); }

namespace {

class CudaPhaseEvents : public PhaseEvents {
 public:
  void Start() override {
    used_ = 0;
    phases_.clear();
    Record();
  }
  void Mark(const char* phase) override {
    phases_.emplace_back(phase);
    Record();
  }
  std::map<std::string, double> Collect() override {
    std::map<std::string, double> out;
    if (used_ == 0) return out;
    events_[used_ - 1]->synchronize();
    for (size_t i = 0; i < phases_.size(); ++i)
      if (!phases_[i].empty())
        out[phases_[i]] += events_[i]->elapsed_time(*events_[i + 1]) / 1000.0;
    return out;
  }

 private:
  void Record() {
    // Kept from step to step: creating events is not free.
    if (used_ == events_.size())
      events_.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    events_[used_++]->record();
  }
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events_;
  size_t used_ = 0;
  std::vector<std::string> phases_;
};

}  // namespace

std::unique_ptr<PhaseEvents> PhaseEvents::ForDevice(const torch::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaPhaseEvents>();
}

#else  // a CPU libtorch

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;

std::string CudaGraph::Unsupported() {
  return "this fullburn was built against libtorch " TORCH_VERSION " without CUDA";
}

Status CudaGraph::Capture(const std::function<void()>&) {
  return Status::InvalidArgument("train.cuda_graphs needs CUDA: " + Unsupported());
}

void CudaGraph::Replay() {}

std::unique_ptr<PhaseEvents> PhaseEvents::ForDevice(const torch::Device&) { return nullptr; }

#endif

}  // namespace fullburn
