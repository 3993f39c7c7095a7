// Gradients as views of the communication buckets, in one process: a world
// of one rank over a real TCPStore and Gloo group on loopback.
#include <gtest/gtest.h>
#include <unistd.h>

#include "fullburn/dist_torch.h"

namespace fullburn {
namespace {

std::unique_ptr<DataParallel> Alone() {
  RankInfo me;
  me.rank = 0;
  me.world_size = 1;
  me.master_addr = "127.0.0.1";
  me.master_port = 30500 + ::getpid() % 2000;
  DistOptions o;
  o.timeout_s = 10;
  auto dp = DataParallel::Connect(me, o, torch::kCPU);
  EXPECT_TRUE(dp.ok()) << dp.status().message();
  return dp.ok() ? std::move(*dp) : nullptr;
}

TEST(BucketView, ChannelsLastGradientsLiveInTheBucketWithTheParametersStrides) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)),
                              torch::nn::ReLU(), torch::nn::Flatten(),
                              torch::nn::Linear(8 * 6 * 6, 2));
  for (auto& p : model->parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
  torch::Tensor x = torch::randn({4, 3, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast);
  torch::Tensor y = torch::randn({4, 2});
  auto loss = [&] { return torch::mse_loss(model->forward(x), y); };
  std::vector<torch::Tensor> params = model->parameters();
  // The reference: plain autograd gradients.
  loss().backward();
  std::vector<torch::Tensor> expected;
  for (auto& p : params) {
    expected.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  auto dp = Alone();
  ASSERT_TRUE(dp);
  ASSERT_TRUE(dp->Attach(params).ok());
  for (int step = 0; step < 3; ++step) {
    loss().backward();
    ASSERT_TRUE(dp->FinishGradients().ok());
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].grad();
      EXPECT_TRUE(torch::allclose(g, expected[i], 1e-6, 1e-7))
          << "parameter " << i << " step " << step;
      EXPECT_EQ(g.strides(), params[i].strides()) << "parameter " << i;
      EXPECT_TRUE(g.is_alias_of(params[0].grad())) << "parameter " << i << " is not in the bucket";
    }
    dp->ZeroGradients();
    for (auto& p : params) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0);
  }
  // Copied into the bucket at the first backward only; after that autograd
  // accumulated in place.
  EXPECT_EQ(dp->stats().grad_copies, static_cast<int64_t>(params.size()));
}

}  // namespace
}  // namespace fullburn
