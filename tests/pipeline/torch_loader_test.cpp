// TorchLoader on the CPU: its batches are the core loader's batches,
// normalized exactly as torchvision's ToTensor + Normalize would.
#include <gtest/gtest.h>

#include <filesystem>

#include "fullburn/torch_loader.h"

namespace fullburn {
namespace {

std::string Dataset() {
  // One folder per test: CTest runs tests as parallel processes.
  std::string dir = ::testing::TempDir() + "/fb_torch_loader_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  SyntheticImagesOptions o;
  o.classes = 3;
  o.per_class = 8;
  o.width = 64;
  o.height = 48;
  EXPECT_TRUE(MakeSyntheticImages(dir, o).ok());
  return dir;
}

TorchLoaderOptions Options(const std::string& dir) {
  TorchLoaderOptions o;
  o.loader.root = dir;
  o.loader.batch_size = 4;
  o.loader.threads = 2;
  o.loader.out_w = o.loader.out_h = 32;
  o.loader.seed = 3;
  return o;
}

TEST(TorchLoader, NormalizedBatchesMatchTheCoreLoader) {
  std::string dir = Dataset();
  auto t = TorchLoader::Open(Options(dir));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FALSE((*t)->uses_cuda());
  auto core = ImageLoader::Open(Options(dir).loader);
  ASSERT_TRUE(core.ok());
  (*t)->StartEpoch(0);
  (*core)->StartEpoch(0);
  DeviceBatch d;
  Batch b;
  int n = 0;
  while ((*t)->Next(&d)) {
    ASSERT_TRUE((*core)->Next(&b));
    ASSERT_EQ(d.images.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
    EXPECT_EQ(d.images.dtype(), torch::kFloat);
    EXPECT_EQ(d.labels.dtype(), torch::kLong);
    EXPECT_EQ(d.index, b.index);
    // The reference: uint8 NHWC -> (x / 255 - mean) / std, computed by hand.
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    auto acc = d.images.accessor<float, 4>();
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(d.labels[i].item<int64_t>(), b.labels[i]);
      for (int y = 0; y < 32; y += 7)
        for (int x = 0; x < 32; x += 5)
          for (int c = 0; c < 3; ++c) {
            float px = b.images[((i * 32 + y) * 32 + x) * 3 + c];
            ASSERT_NEAR(acc[i][c][y][x], (px / 255.0f - mean[c]) / sd[c], 1e-5);
          }
    }
    (*core)->Release(b);
    ++n;
  }
  EXPECT_EQ(n, 6);
  EXPECT_TRUE((*t)->status().ok());
  EXPECT_EQ((*t)->position().next_batch, 6);
}

TEST(TorchLoader, ChannelsLastAndBfloat16) {
  TorchLoaderOptions o = Options(Dataset());
  o.channels_last = true;
  o.dtype = torch::kBFloat16;
  auto t = TorchLoader::Open(o);
  ASSERT_TRUE(t.ok());
  (*t)->StartEpoch(0);
  DeviceBatch d;
  ASSERT_TRUE((*t)->Next(&d));
  EXPECT_EQ(d.images.dtype(), torch::kBFloat16);
  EXPECT_TRUE(d.images.is_contiguous(torch::MemoryFormat::ChannelsLast));
}

TEST(TorchLoader, ResumeAndCudaRequestOnACpuBuild) {
  TorchLoaderOptions o = Options(Dataset());
  auto whole = TorchLoader::Open(o);
  (*whole)->StartEpoch(2);
  std::vector<torch::Tensor> all;
  DeviceBatch d;
  while ((*whole)->Next(&d)) all.push_back(d.images);
  auto resumed = TorchLoader::Open(o);
  (*resumed)->StartEpoch(2, 4);
  ASSERT_TRUE((*resumed)->Next(&d));
  EXPECT_TRUE(torch::equal(d.images, all[4]));
  if (!torch::cuda::is_available()) {
    o.device = torch::Device(torch::kCUDA, 0);
    auto cuda = TorchLoader::Open(o);
    ASSERT_FALSE(cuda.ok());
    EXPECT_NE(cuda.status().message().find("no usable CUDA device"), std::string::npos);
  }
}

// The GPU tier (skipped without CUDA; run by bench/gpu_session owed): the
// batches made on the device equal the CPU reference's, and a batch the
// caller keeps on the device is still intact after two more epochs (its
// pinned slot was refilled only after its copy was done).
TEST(TorchLoader, CudaBatchesEqualTheCpuOnesAndKeptOnesStayIntact) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::string dir = Dataset();
  for (bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "bf16, channels-last" : "float");
    TorchLoaderOptions o = Options(dir);
    o.channels_last = channels_last;
    o.dtype = channels_last ? torch::kBFloat16 : torch::kFloat;
    auto host = TorchLoader::Open(o);
    o.device = torch::Device(torch::kCUDA, 0);
    auto cuda = TorchLoader::Open(o);
    ASSERT_TRUE(host.ok() && cuda.ok()) << cuda.status().message();
    EXPECT_TRUE((*cuda)->uses_cuda());
    std::vector<DeviceBatch> kept;
    std::vector<torch::Tensor> reference;
    (*host)->StartEpoch(0);
    (*cuda)->StartEpoch(0);
    DeviceBatch h, d;
    while ((*cuda)->Next(&d)) {
      ASSERT_TRUE((*host)->Next(&h));
      ASSERT_TRUE(d.images.is_cuda());
      EXPECT_EQ(d.images.dtype(), o.dtype);
      EXPECT_EQ(d.images.sizes(), h.images.sizes());
      if (channels_last) EXPECT_TRUE(d.images.is_contiguous(torch::MemoryFormat::ChannelsLast));
      // Normalized on the device in float32 (then cast), on the host the same:
      // equal up to float32 rounding, one bf16 step after the cast.
      torch::Tensor diff = (d.images.cpu().to(torch::kFloat) - h.images.to(torch::kFloat)).abs();
      EXPECT_LT(diff.max().item<float>(), channels_last ? 0.02f : 1e-5f);
      EXPECT_TRUE(torch::equal(d.labels.cpu(), h.labels));
      kept.push_back(d);
      reference.push_back(d.images.cpu().clone());
    }
    EXPECT_FALSE((*host)->Next(&h));
    EXPECT_EQ(kept.size(), 6u);
    ASSERT_TRUE((*cuda)->status().ok()) << (*cuda)->status().message();
    for (int epoch = 1; epoch <= 2; ++epoch) {
      (*cuda)->StartEpoch(epoch);
      while ((*cuda)->Next(&d)) {
      }
    }
    for (size_t k = 0; k < kept.size(); ++k)
      EXPECT_TRUE(torch::equal(kept[k].images.cpu(), reference[k])) << "batch " << k << " changed";
  }
}

}  // namespace
}  // namespace fullburn
