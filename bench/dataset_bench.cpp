// A program's own Dataset through fullburn's DatasetLoader next to libtorch's
// own torch::data::DataLoader, on the same Dataset, threads and batch:
// samples/s of batches handed to a consumer that only takes them. The Python
// row (PyTorch's DataLoader on the same per-sample work) comes from
// bench/dataset_vs_torch, which runs this too.
//
// The sample: a stored 3x64x64 uint8 record, made into a float image the way
// training augments one: a random 56x56 crop, a random flip, scaled and
// normalized (torch ops, as a Python __getitem__ would run them).
//
// usage: fullburn-bench-dataset [--threads N] [--batch B] [--batches K] [--repeats R] [--json]
//                               [--only fullburn|libtorch]
#include <fmt/format.h>
#include <torch/data.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <nlohmann/json.hpp>

#include "fullburn/torch_loader.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The records and the work of one sample, shared by both loaders.
struct Records {
  torch::Tensor images = torch::randint(
      256, {4096, 3, 64, 64}, torch::make_generator<at::CPUGeneratorImpl>(1), torch::kUInt8);
  torch::Tensor labels =
      torch::randint(10, {4096}, torch::make_generator<at::CPUGeneratorImpl>(2), torch::kLong);
  torch::Tensor mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1});
  torch::Tensor std = torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1});
  fullburn::Sample Make(int64_t index, uint64_t seed) const {
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
    int64_t top = torch::randint(9, {1}, gen).item<int64_t>();
    int64_t left = torch::randint(9, {1}, gen).item<int64_t>();
    bool flip = torch::rand({1}, gen).item<float>() < 0.5f;
    torch::Tensor x = images[index].narrow(1, top, 56).narrow(2, left, 56).to(torch::kFloat);
    if (flip) x = x.flip({2});
    x = x.div_(255).sub_(mean).div_(std);
    return {x, labels[index]};
  }
};

class FullburnSet : public fullburn::Dataset {
 public:
  explicit FullburnSet(const Records* r) : r_(r) {}
  int64_t size() const override { return r_->images.size(0); }
  fullburn::Sample Get(int64_t index, uint64_t seed) override { return r_->Make(index, seed); }

 private:
  const Records* r_;
};

class LibtorchSet : public torch::data::datasets::Dataset<LibtorchSet> {
 public:
  explicit LibtorchSet(const Records* r) : r_(r) {}
  torch::data::Example<> get(size_t index) override {
    // Seeded by index like fullburn's seed per place; the work per sample is the same.
    fullburn::Sample s = r_->Make(static_cast<int64_t>(index), index * 7919 + 1);
    return {s.input, s.target};
  }
  torch::optional<size_t> size() const override { return r_->images.size(0); }

 private:
  const Records* r_;
};

double FullburnRate(const Records& r, int threads, int batch, int batches) {
  fullburn::DatasetLoaderOptions o;
  o.batch_size = batch;
  o.threads = threads;
  o.prefetch = 0;  // tuned
  auto opened = fullburn::DatasetLoader::Open(std::make_shared<FullburnSet>(&r), o);
  if (!opened.ok()) {
    fmt::print(stderr, "fullburn-bench-dataset: {}\n", opened.status().message());
    std::exit(1);
  }
  std::unique_ptr<fullburn::DatasetLoader> loader = std::move(opened.value());
  int epoch = 0;
  loader->StartEpoch(epoch);
  fullburn::TensorBatch b;
  auto next = [&] {  // across epochs, as a training loop would
    while (!loader->Next(&b)) loader->StartEpoch(++epoch);
  };
  for (int i = 0; i < 3; ++i) next();  // warm-up: threads started, slots allocated
  double t0 = Now();
  for (int i = 0; i < batches; ++i) next();
  return batches * batch / (Now() - t0);
}

double LibtorchRate(const Records& r, int threads, int batch, int batches) {
  auto data = LibtorchSet(&r).map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(data), torch::data::DataLoaderOptions().batch_size(batch).workers(threads));
  auto it = loader->begin();
  auto next = [&] {  // across epochs, as a training loop would
    if (++it == loader->end()) it = loader->begin();
  };
  for (int i = 0; i < 3; ++i) next();
  double t0 = Now();
  for (int i = 0; i < batches; ++i) next();
  return batches * batch / (Now() - t0);
}

// Get alone on one thread: what one core can make, the ceiling per core.
double GetAlone(const Records& r, int samples) {
  double t0 = Now();
  for (int i = 0; i < samples; ++i) r.Make(i, static_cast<uint64_t>(i));
  return samples / (Now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, batch = 64, batches = 200, repeats = 3;
  bool json = false;
  std::string only;  // "fullburn" or "libtorch": that row alone (for a profiler)
  for (int i = 1; i < argc; ++i) {
    auto value = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::max(1, value());
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::max(1, value());
    else if (!std::strcmp(argv[i], "--batches"))
      batches = std::max(1, value());
    else if (!std::strcmp(argv[i], "--repeats"))
      repeats = std::max(1, value());
    else if (!std::strcmp(argv[i], "--json"))
      json = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
  }
  torch::set_num_threads(1);  // every row: one intra-op thread per thread, as PyTorch's workers
  Records records;
  std::vector<double> fb, lt, alone;
  for (int k = 0; k < repeats; ++k) {
    if (only != "libtorch") fb.push_back(FullburnRate(records, threads, batch, batches));
    if (only != "fullburn") lt.push_back(LibtorchRate(records, threads, batch, batches));
    alone.push_back(GetAlone(records, batch * 10));
  }
  nlohmann::json out = {{"threads", threads}, {"batch", batch}, {"batches", batches},
                        {"repeats", repeats}, {"fullburn", fb}, {"libtorch", lt},
                        {"get_alone", alone}};
  if (json) {
    std::puts(out.dump().c_str());
    return 0;
  }
  fmt::print("{} threads, batch {}, {} timed batches, median of {}\n", threads, batch, batches,
             repeats);
  fmt::print("fullburn DatasetLoader     {:8.0f} samples/s\n", Median(fb));
  fmt::print("libtorch data::DataLoader  {:8.0f} samples/s\n", Median(lt));
  fmt::print("Get alone, one thread      {:8.0f} samples/s\n", Median(alone));
  fmt::print("fullburn / libtorch: {:.2f}x\n", Median(fb) / Median(lt));
  return 0;
}
