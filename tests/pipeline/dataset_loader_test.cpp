// DatasetLoader on the CPU: a program's own Dataset through the slot ring,
// against what its Get() gives: order, shards, resume, augmentation seeds,
// shapes, and the errors a Dataset can raise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>

#include "fullburn/torch_loader.h"

namespace fullburn {
namespace {

// Sample i: input [2, 3] holding i (plus noise drawn from the seed when
// `augment`), target the class i % 5; Get(throw_at) throws.
class Numbers : public Dataset {
 public:
  explicit Numbers(int64_t n, bool augment = false, int64_t throw_at = -1)
      : n_(n), augment_(augment), throw_at_(throw_at) {}
  int64_t size() const override { return n_; }
  Sample Get(int64_t index, uint64_t seed) override {
    if (index == throw_at_) throw std::runtime_error("cannot read record " + std::to_string(index));
    torch::Tensor x = torch::full({2, 3}, static_cast<float>(index));
    if (augment_) {
      auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
      x.add_(torch::rand({2, 3}, gen));
    }
    return {x, torch::tensor(index % 5)};
  }

 private:
  int64_t n_;
  bool augment_;
  int64_t throw_at_;
};

// Get's calls after the first `open_after` wait until the test opens the
// gate (at most 10 s).
class Gated : public Dataset {
 public:
  Gated(int64_t n, int open_after) : n_(n), open_after_(open_after) {}
  int64_t size() const override { return n_; }
  Sample Get(int64_t index, uint64_t) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (++calls_ > open_after_ &&
        !cv_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; }))
      timed_out_ = true;
    return {torch::full({2, 3}, static_cast<float>(index)), torch::tensor(index % 5)};
  }
  void OpenGate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // A Get gave up waiting for the gate: someone waited on it for 10 s.
  bool timed_out() {
    std::lock_guard<std::mutex> lock(mu_);
    return timed_out_;
  }

 private:
  int64_t n_;
  int open_after_, calls_ = 0;
  bool open_ = false, timed_out_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
};

DatasetLoaderOptions Options(int threads, int batch = 4) {
  DatasetLoaderOptions o;
  o.batch_size = batch;
  o.threads = threads;
  o.seed = 11;
  return o;
}

std::vector<TensorBatch> Epoch(DatasetLoader& l, int epoch, int64_t first_batch = 0) {
  l.StartEpoch(epoch, first_batch);
  std::vector<TensorBatch> out;
  TensorBatch b;
  while (l.Next(&b)) out.push_back(b);
  EXPECT_TRUE(l.status().ok()) << l.status().message();
  return out;
}

// The dataset index each sample of a batch came from (input = index + [0, 1)).
std::vector<int64_t> Indices(const std::vector<TensorBatch>& batches) {
  std::vector<int64_t> out;
  for (const TensorBatch& b : batches)
    for (int64_t i = 0; i < b.inputs.size(0); ++i)
      out.push_back(static_cast<int64_t>(b.inputs[i][0][0].item<float>()));
  return out;
}

TEST(DatasetLoader, BatchesHoldWhatGetGaveEachSampleOncePerEpoch) {
  auto l = DatasetLoader::Open(std::make_shared<Numbers>(26), Options(3));
  ASSERT_TRUE(l.ok()) << l.status().message();
  std::vector<TensorBatch> batches = Epoch(**l, 0);
  ASSERT_EQ(batches.size(), 6u);  // 26 / 4, the short remainder dropped
  for (const TensorBatch& b : batches) {
    EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{4, 2, 3}));
    EXPECT_EQ(b.inputs.scalar_type(), torch::kFloat);
    EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{4}));
    EXPECT_EQ(b.targets.scalar_type(), torch::kLong);  // a class index: int64
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(torch::equal(b.inputs[i], torch::full({2, 3}, b.inputs[i][0][0].item<float>())));
      EXPECT_EQ(b.targets[i].item<int64_t>(), b.inputs[i][0][0].item<int64_t>() % 5);
    }
  }
  std::vector<int64_t> seen = Indices(batches);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 24u);  // no sample twice
  EXPECT_NE(Indices(Epoch(**l, 1)), seen);                             // a new order each epoch
  LoaderStats s = (*l)->stats();
  EXPECT_EQ(s.samples, 48);
  EXPECT_GT(s.stages.dataset_s, 0);
}

// On CPU a batch's memory is the caller's (no copy after the workers) and
// comes back to the loader once the caller drops it.
TEST(DatasetLoader, ABatchTheCallerKeepsIsNeverWrittenAgainAndDroppedOnesAreReused) {
  auto l = DatasetLoader::Open(std::make_shared<Numbers>(200), Options(2));
  ASSERT_TRUE(l.ok()) << l.status().message();
  auto consistent = [](const TensorBatch& b) {
    for (int64_t i = 0; i < b.inputs.size(0); ++i) {
      float v = b.inputs[i][0][0].item<float>();
      if (!torch::equal(b.inputs[i], torch::full({2, 3}, v)) ||
          b.targets[i].item<int64_t>() != static_cast<int64_t>(v) % 5)
        return false;
    }
    return true;
  };
  // 50 batches kept: more than the ring's slots and the loader's spare memory.
  std::vector<TensorBatch> kept = Epoch(**l, 0);
  ASSERT_EQ(kept.size(), 50u);
  std::vector<torch::Tensor> copies;
  for (const TensorBatch& b : kept) copies.push_back(b.inputs.clone());
  std::set<const void*> kept_memory;
  for (const TensorBatch& b : kept) kept_memory.insert(b.inputs.data_ptr());
  EXPECT_EQ(kept_memory.size(), 50u);  // each batch its own memory
  Epoch(**l, 1);                       // made while epoch 0's batches are held
  for (size_t k = 0; k < kept.size(); ++k) {
    EXPECT_TRUE(torch::equal(kept[k].inputs, copies[k])) << "batch " << k << " was overwritten";
    EXPECT_TRUE(consistent(kept[k]));
  }
  kept.clear();  // dropped: their memory goes back to the loader
  // Each batch dropped as the next comes: the loader cycles through a few
  // blocks of memory (its slots and spares), not one new block per batch.
  (*l)->StartEpoch(2);
  TensorBatch b;
  std::set<const void*> used;
  int batches = 0;
  while ((*l)->Next(&b)) {
    EXPECT_TRUE(consistent(b));
    used.insert(b.inputs.data_ptr());
    ++batches;
  }
  EXPECT_EQ(batches, 50);
  EXPECT_LE(used.size(), 26u);  // 9 slots + 16 spares + the one held
}

// Next() returns its batch as soon as that batch is ready: the step on it
// overlaps the making of the next, and a data wait is the wait for this batch.
TEST(DatasetLoader, NextHandsOutItsBatchWithoutWaitingForTheNext) {
  // Open reads sample 0 (call 1), batch 0 is calls 2-5; batch 1 waits for the gate.
  auto data = std::make_shared<Gated>(16, /*open_after=*/5);
  auto l = DatasetLoader::Open(data, Options(1));
  ASSERT_TRUE(l.ok()) << l.status().message();
  (*l)->StartEpoch(0);
  TensorBatch b;
  bool got = (*l)->Next(&b);
  // Had Next waited for batch 1, the gate (opened only now) would have held
  // it until the gate's 10 s timeout: a fact, not a duration a busy machine
  // stretches.
  const bool waited = data->timed_out();
  data->OpenGate();
  ASSERT_TRUE(got) << (*l)->status().message();
  EXPECT_FALSE(waited) << "Next waited for the batch after its own";
  int batches = 1;
  while ((*l)->Next(&b)) ++batches;
  EXPECT_EQ(batches, 4);
  EXPECT_TRUE((*l)->status().ok()) << (*l)->status().message();
}

TEST(DatasetLoader, AugmentationIsTheSameWhateverTheThreadCountAndAfterAResume) {
  auto data = std::make_shared<Numbers>(40, /*augment=*/true);
  auto one = DatasetLoader::Open(data, Options(1));
  auto four = DatasetLoader::Open(data, Options(4));
  std::vector<TensorBatch> a = Epoch(**one, 2), b = Epoch(**four, 2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::equal(a[k].inputs, b[k].inputs)) << k;
  // The noise differs between epochs: the seed is the sample's place in its epoch.
  EXPECT_FALSE(torch::equal(Epoch(**one, 3)[0].inputs, a[0].inputs));

  auto resumed = DatasetLoader::Open(data, Options(2));
  std::vector<TensorBatch> rest = Epoch(**resumed, 2, /*first_batch=*/6);
  ASSERT_EQ(rest.size(), a.size() - 6);
  for (size_t k = 0; k < rest.size(); ++k)
    EXPECT_TRUE(torch::equal(rest[k].inputs, a[k + 6].inputs));

  // Resumed by 2 ranks after the first 12 samples: each sample still gets
  // the noise it got in one process (the seed is its place in the epoch).
  std::map<int64_t, torch::Tensor> alone;
  for (const TensorBatch& b : a)
    for (int64_t i = 0; i < b.inputs.size(0); ++i)
      alone[static_cast<int64_t>(b.inputs[i][0][0].item<float>())] = b.inputs[i];
  int compared = 0;
  for (int rank = 0; rank < 2; ++rank) {
    DatasetLoaderOptions o = Options(2);
    o.rank = rank;
    o.world_size = 2;
    auto l = DatasetLoader::Open(data, o);
    (*l)->StartEpoch(2, 0, /*consumed_samples=*/12);
    TensorBatch b;
    while ((*l)->Next(&b))
      for (int64_t i = 0; i < b.inputs.size(0); ++i, ++compared)
        EXPECT_TRUE(torch::equal(b.inputs[i],
                                 alone[static_cast<int64_t>(b.inputs[i][0][0].item<float>())]));
  }
  EXPECT_EQ(compared, 24);  // of the other 28: 14 a rank, 3 whole batches of 4
}

TEST(DatasetLoader, RanksShareTheEpochAndEvaluationReadsEverySampleOnce) {
  std::vector<int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    DatasetLoaderOptions o = Options(2, 5);
    o.rank = rank;
    o.world_size = 3;
    o.keep_last = true;
    auto l = DatasetLoader::Open(std::make_shared<Numbers>(31), o);
    ASSERT_TRUE(l.ok()) << l.status().message();
    std::vector<TensorBatch> batches = Epoch(**l, 0);
    EXPECT_EQ(batches.back().inputs.size(0), rank == 0 ? 1 : 5);  // 11, 10, 10 samples
    for (int64_t i : Indices(batches)) all.push_back(i);
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(31);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all, expected);
}

TEST(DatasetLoader, TensorTargetsAndChannelsLast) {
  struct Images : Dataset {
    int64_t size() const override { return 8; }
    Sample Get(int64_t index, uint64_t) override {
      return {torch::full({3, 4, 4}, static_cast<double>(index), torch::kDouble),
              torch::arange(6, torch::kInt).add(static_cast<int>(index))};
    }
  };
  DatasetLoaderOptions o = Options(2);
  o.channels_last = true;
  auto l = DatasetLoader::Open(std::make_shared<Images>(), o);
  ASSERT_TRUE(l.ok()) << l.status().message();
  std::vector<TensorBatch> batches = Epoch(**l, 0);
  ASSERT_EQ(batches.size(), 2u);
  const TensorBatch& b = batches[0];
  EXPECT_EQ(b.inputs.scalar_type(), torch::kDouble);  // the dataset's dtype
  EXPECT_TRUE(b.inputs.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{4, 6}));  // one per position, int64
  EXPECT_EQ(b.targets.scalar_type(), torch::kLong);
  int64_t first = b.inputs[0][0][0][0].item<int64_t>();
  EXPECT_TRUE(torch::equal(b.targets[0], torch::arange(6, torch::kLong).add(first)));
}

TEST(DatasetLoader, WhatADatasetGetsWrongIsOneLineNamingTheSample) {
  auto throws = DatasetLoader::Open(std::make_shared<Numbers>(30, false, 17), Options(3));
  ASSERT_TRUE(throws.ok());
  (*throws)->StartEpoch(0);
  TensorBatch b;
  while ((*throws)->Next(&b)) {
  }
  EXPECT_EQ((*throws)->status().message(), "dataset sample 17: cannot read record 17");

  struct Ragged : Numbers {
    Ragged() : Numbers(12) {}
    Sample Get(int64_t index, uint64_t seed) override {
      Sample s = Numbers::Get(index, seed);
      if (index == 5) s.input = torch::zeros({2, 4});
      return s;
    }
  };
  auto ragged = DatasetLoader::Open(std::make_shared<Ragged>(), Options(1));
  ASSERT_TRUE(ragged.ok());
  (*ragged)->StartEpoch(0);
  while ((*ragged)->Next(&b)) {
  }
  EXPECT_NE((*ragged)->status().message().find(
                "dataset sample 5 has an input of shape [2, 4], sample 0 [2, 3]: the samples of a "
                "batch need one shape"),
            std::string::npos)
      << (*ragged)->status().message();

  auto empty = DatasetLoader::Open(std::make_shared<Numbers>(0), Options(1));
  EXPECT_EQ(empty.status().message(), "the dataset is empty (Dataset::size() is 0)");
  auto first = DatasetLoader::Open(std::make_shared<Numbers>(10, false, 0), Options(1));
  EXPECT_EQ(first.status().message(), "dataset sample 0: cannot read record 0");
  auto small = DatasetLoader::Open(std::make_shared<Numbers>(3), Options(1));
  EXPECT_NE(small.status().message().find("fewer than one batch of 4"), std::string::npos);
}

// The GPU tier (skipped without CUDA; run by bench/gpu_session owed): the
// same batches on the device as on the CPU, for the same seed, and a batch
// the caller keeps on the device is intact after two more epochs.
TEST(DatasetLoader, CudaBatchesEqualTheCpuOnesAndKeptOnesStayIntact) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto dataset = std::make_shared<Numbers>(40, /*augment=*/true);
  DatasetLoaderOptions o = Options(2);
  auto host = DatasetLoader::Open(dataset, o);
  o.device = torch::Device(torch::kCUDA, 0);
  auto cuda = DatasetLoader::Open(dataset, o);
  ASSERT_TRUE(host.ok() && cuda.ok()) << cuda.status().message();
  EXPECT_TRUE((*cuda)->uses_cuda());
  std::vector<TensorBatch> on_host = Epoch(**host, 0), on_device = Epoch(**cuda, 0);
  ASSERT_EQ(on_device.size(), 10u);
  ASSERT_EQ(on_host.size(), on_device.size());
  std::vector<torch::Tensor> reference;
  for (size_t k = 0; k < on_device.size(); ++k) {
    ASSERT_TRUE(on_device[k].inputs.is_cuda() && on_device[k].targets.is_cuda());
    EXPECT_TRUE(torch::equal(on_device[k].inputs.cpu(), on_host[k].inputs)) << "batch " << k;
    EXPECT_TRUE(torch::equal(on_device[k].targets.cpu(), on_host[k].targets)) << "batch " << k;
    reference.push_back(on_device[k].inputs.cpu().clone());
  }
  Epoch(**cuda, 1);
  Epoch(**cuda, 2);
  for (size_t k = 0; k < on_device.size(); ++k)
    EXPECT_TRUE(torch::equal(on_device[k].inputs.cpu(), reference[k]))
        << "batch " << k << " changed";
}

}  // namespace
}  // namespace fullburn
