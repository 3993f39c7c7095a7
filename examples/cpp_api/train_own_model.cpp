// train_own_model: a program with a network and samples of its own, trained
// by fullburn's runtime through its C++ API (fullburn/train.h). What
// `fullburn train` does for its built-in models it does here too: the step
// loop with its time breakdown, mixed precision, accumulation, the
// batch-size search, checkpoints and resume, the run in the store with its
// telemetry and diagnosis, and data parallelism under `fullburn launch`.
//
//   train_own_model [-q] [--dataset] [--resume RUN|PATH] [key=value ...]   (docs/config.md)
//
// The task: 16x16 grey images with one bright square in one of the four
// quadrants; the class is the quadrant. The samples are tensors made up
// front and held in memory (TrainerOptions::train_data), or with --dataset
// made one by one, with random noise as augmentation, by a Dataset on the
// loader's worker threads (TrainerOptions::dataset: data.threads,
// data.prefetch), the way a program reads records from its own files.
#include <fullburn/train.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// The program's own network: any torch::nn::Module that maps a batch of
// inputs to class logits, derived from fullburn::Model.
class QuadrantNet : public fullburn::Model {
 public:
  QuadrantNet()
      : conv1_(register_module("conv1",
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)))),
        conv2_(register_module("conv2",
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        head_(register_module("head", torch::nn::Linear(16, 4))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(conv1_->forward(x)), 2);
    x = torch::relu(conv2_->forward(x));
    return head_->forward(x.amax({2, 3}));  // the brightest response anywhere
  }

 private:
  torch::nn::Conv2d conv1_, conv2_;
  torch::nn::Linear head_;
};

// The program's own samples, as tensors: inputs [N, 1, 16, 16], targets [N].
fullburn::TensorData MakeQuadrants(int64_t n, uint64_t seed) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor images = torch::rand({n, 1, 16, 16}, gen).mul_(0.3);
  torch::Tensor classes = torch::randint(4, {n}, gen, torch::kLong);
  torch::Tensor corner = torch::randint(0, 5, {n, 2}, gen, torch::kLong);
  auto c = classes.accessor<int64_t, 1>();
  auto at = corner.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t top = (c[i] / 2) * 8 + at[i][0], left = (c[i] % 2) * 8 + at[i][1];
    images[i].narrow(1, top, 3).narrow(2, left, 3).add_(0.7);
  }
  return {images, classes};
}

// The same samples made on demand: Get runs on fullburn's loader threads,
// several at once, so it only reads shared state. `seed` comes from the
// sample's place in the epoch: the same noise whatever the thread count,
// and after a resume.
class Quadrants : public fullburn::Dataset {
 public:
  Quadrants(int64_t n, uint64_t seed) : data_(MakeQuadrants(n, seed)) {}
  int64_t size() const override { return data_.inputs.size(0); }
  fullburn::Sample Get(int64_t index, uint64_t seed) override {
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
    torch::Tensor noisy = data_.inputs[index] + torch::randn({1, 16, 16}, gen).mul_(0.05);
    return {noisy, data_.targets[index]};
  }

 private:
  fullburn::TensorData data_;
};

}  // namespace

int main(int argc, char** argv) {
  fullburn::TrainerOptions o;
  o.model = std::make_shared<QuadrantNet>();
  o.model_name = "QuadrantNet";
  bool dataset = false;
  for (int i = 1; i < argc; ++i) dataset |= std::strcmp(argv[i], "--dataset") == 0;
  if (dataset) {
    o.dataset = std::make_shared<Quadrants>(4096, 1);
    o.val_dataset = std::make_shared<Quadrants>(512, 2);
  } else {
    o.train_data = MakeQuadrants(4096, 1);
    o.val_data = MakeQuadrants(512, 2);
  }
  o.command.assign(argv, argv + argc);
  if (const char* store = std::getenv("FULLBURN_STORE")) o.store_path = store;
  // This program's defaults; the command line's key=value come after them.
  o.overrides = {"train.batch_size=64", "train.epochs=2", "optim.lr=0.05"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--resume") == 0 && i + 1 < argc)
      o.resume = argv[++i];
    else if (std::strcmp(argv[i], "-q") == 0)
      o.quiet = true;  // no progress line or summary, as fullburn train -q
    else if (std::strcmp(argv[i], "--dataset") != 0)
      o.overrides.push_back(argv[i]);
  }
  return fullburn::RunTraining(o);
}
