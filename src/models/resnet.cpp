// ResNet-18/50 in torchvision's layout (module names, strides on the 3x3 conv
// of bottlenecks as in torchvision >= 0.4, He init, zero-free BN init), with a
// width multiplier for small CPU runs.
#include <algorithm>

#include "models_internal.h"

namespace fullburn {
namespace {

namespace nn = torch::nn;

nn::Conv2d Conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

struct BlockImpl : nn::Module {
  BlockImpl(int64_t in, int64_t planes, int64_t stride, bool bottleneck) : bottleneck(bottleneck) {
    int64_t expansion = bottleneck ? 4 : 1;
    if (bottleneck) {
      conv1 = register_module("conv1", Conv(in, planes, 1, 1, 0));
      bn1 = register_module("bn1", nn::BatchNorm2d(planes));
      conv2 = register_module("conv2", Conv(planes, planes, 3, stride, 1));
      bn2 = register_module("bn2", nn::BatchNorm2d(planes));
      conv3 = register_module("conv3", Conv(planes, planes * 4, 1, 1, 0));
      bn3 = register_module("bn3", nn::BatchNorm2d(planes * 4));
    } else {
      conv1 = register_module("conv1", Conv(in, planes, 3, stride, 1));
      bn1 = register_module("bn1", nn::BatchNorm2d(planes));
      conv2 = register_module("conv2", Conv(planes, planes, 3, 1, 1));
      bn2 = register_module("bn2", nn::BatchNorm2d(planes));
    }
    if (stride != 1 || in != planes * expansion) {
      downsample = register_module(
          "downsample", nn::Sequential(Conv(in, planes * expansion, 1, stride, 0),
                                       nn::BatchNorm2d(planes * expansion)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample ? downsample->forward(x) : x;
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    if (bottleneck) out = bn3(conv3(torch::relu(out)));
    return torch::relu(out + identity);
  }
  bool bottleneck;
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Block);

class ResNet : public Model {
 public:
  ResNet(const std::vector<int>& blocks, bool bottleneck, double width, int64_t classes) {
    auto ch = [width](int64_t c) { return std::max<int64_t>(1, static_cast<int64_t>(c * width)); };
    int64_t in = ch(64);
    conv1_ = register_module("conv1", Conv(3, in, 7, 2, 3));
    bn1_ = register_module("bn1", nn::BatchNorm2d(in));
    const int64_t planes[] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      nn::Sequential layer;
      for (int b = 0; b < blocks[stage]; ++b) {
        int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        layer->push_back(Block(in, ch(planes[stage]), stride, bottleneck));
        in = ch(planes[stage]) * (bottleneck ? 4 : 1);
      }
      layers_.push_back(register_module("layer" + std::to_string(stage + 1), layer));
    }
    fc_ = register_module("fc", FastLinear(in, classes));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<nn::Conv2d>())
        nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
      if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
  }
  bool SetCheckpointing(const std::string& mode) override {
    int segment = CheckpointSegment(mode);  // stages per recomputed segment
    if (segment < 0) return false;
    segment_ = static_cast<size_t>(segment);
    return true;
  }
  bool SetParameterGather(std::shared_ptr<ParameterGather> gather,
                          std::vector<std::vector<torch::Tensor>>* blocks) override {
    gather_ = std::move(gather);
    blocks->clear();
    std::vector<torch::Tensor> inside;
    for (nn::Sequential& l : layers_) {
      blocks->push_back(l->parameters());
      inside.insert(inside.end(), blocks->back().begin(), blocks->back().end());
    }
    outside_stages_ = ParametersOutside(*this, inside);
    return true;
  }
  torch::Tensor forward(torch::Tensor x) override {
    if (gather_) gather_->Gather(outside_stages_);  // the stem and fc, held for the step
    x = torch::relu(bn1_(conv1_(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    // Gathered stages are recomputed in backward: their weights are gone by then.
    const bool frees = gather_ && !gather_->keeps_parameters();
    const size_t segment = frees ? std::max<size_t>(segment_, 1) : segment_;
    if (segment == 0 || (!is_training() && !frees)) {
      for (auto& layer : layers_) {
        if (gather_) gather_->Gather(layer->parameters());  // dist.offload's update
        x = layer->forward(x);
      }
    } else {
      // Segments of `segment` stages, each keeping only its input; BatchNorm's
      // statistics are put back after the recompute.
      for (size_t first = 0; first < layers_.size(); first += segment) {
        std::vector<nn::Sequential> seg(layers_.begin() + first,
                                        layers_.begin() + std::min(layers_.size(), first + segment));
        std::vector<torch::Tensor> params, buffers;
        for (nn::Sequential& l : seg) {
          for (const torch::Tensor& p : l->parameters()) params.push_back(p);
          for (const torch::Tensor& b : l->buffers()) buffers.push_back(b);
        }
        x = CheckpointForward(
            [seg](const torch::Tensor& in) mutable {
              torch::Tensor y = in;
              for (nn::Sequential& l : seg) y = l->forward(y);
              return y;
            },
            x, params, buffers, gather_);
      }
    }
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_(x);
  }

 private:
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  std::vector<nn::Sequential> layers_;
  size_t segment_ = 0;  // stages per recomputed segment; 0: none
  FastLinear fc_{nullptr};
  std::shared_ptr<ParameterGather> gather_;  // dist.shard = full
  std::vector<torch::Tensor> outside_stages_;
};

}  // namespace

std::shared_ptr<Model> MakeResNet(const ModelSpec& s) {
  std::shared_ptr<ResNet> m =
      s.name == "resnet50"
          ? std::make_shared<ResNet>(std::vector<int>{3, 4, 6, 3}, true, s.width, s.num_classes)
          : std::make_shared<ResNet>(std::vector<int>{2, 2, 2, 2}, false, s.width, s.num_classes);
  m->SetCheckpointing(s.checkpoint);
  return m;
}

}  // namespace fullburn
