// The training runtime's pieces, on CPU: loss scaler, autocast guard,
// accumulation, optimizers against torch::optim, schedule, checkpoints, the
// memory budget and the batch-size search.
#include "fullburn/cpu_memory_budget.h"
#include "fullburn/train.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../../src/train/memory_model.h"
#include "../../src/train/sharded_params.h"
#include "../../src/train/trainer_impl.h"
#include "fullburn/dist_torch.h"
#include "process.h"
#include "replay_env.h"

namespace fullburn {
namespace {

std::shared_ptr<Model> Mlp(int64_t in = 12, int64_t classes = 5) {
  ModelSpec s;
  s.name = "mlp";
  s.in_features = in;
  s.hidden = 16;
  s.num_classes = classes;
  torch::manual_seed(0);
  return MakeModel(s).value();
}

TEST(LossScaler, GrowsAfterIntervalBacksOffAndSkipsOnInf) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler s(o);
  torch::Tensor w = torch::ones({4}, torch::requires_grad());
  auto set_grad = [&](float v) { w.mutable_grad() = torch::full({4}, v); };
  set_grad(2048);
  EXPECT_FALSE(s.UnscaleAndCheck({w}).item<bool>());
  EXPECT_TRUE(torch::allclose(w.grad(), torch::full({4}, 2.0f)));  // unscaled before any clipping
  EXPECT_FALSE(s.Update(false));
  EXPECT_FALSE(s.Update(false));
  EXPECT_DOUBLE_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.Update(false));  // third finite step in a row: grow
  EXPECT_DOUBLE_EQ(s.scale(), 2048);
  set_grad(1);
  w.mutable_grad()[2] = INFINITY;  // injected overflow
  EXPECT_TRUE(s.UnscaleAndCheck({w}).item<bool>());
  EXPECT_TRUE(s.Update(true));  // skip the step
  EXPECT_DOUBLE_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  w.mutable_grad()[2] = NAN;
  EXPECT_TRUE(s.UnscaleAndCheck({w}).item<bool>());
  LossScaler off(LossScalerOptions{});
  EXPECT_TRUE(off.Scale(torch::ones({})).equal(torch::ones({})));
}

// optim.foreach's unscale and check (multi-tensor ops) against the loop over
// parameters: the same unscaled gradients and the same verdict, finite or not.
TEST(LossScaler, ForeachUnscaleAndCheckEqualsTheLoop) {
  for (bool enabled : {true, false}) {
    for (float bad : {0.0f, INFINITY, -INFINITY, NAN}) {
      LossScalerOptions o;
      o.enabled = enabled;
      o.init_scale = 512;
      LossScaler s(o);
      torch::manual_seed(3);
      std::vector<torch::Tensor> loop, multi;
      for (auto shape : {std::vector<int64_t>{4, 3}, {7}, {2, 2, 2}}) {
        torch::Tensor g = torch::randn(shape) * 1000;
        for (auto* set : {&loop, &multi}) {
          set->push_back(torch::zeros(shape, torch::requires_grad()));
          set->back().mutable_grad() = g.clone();
        }
      }
      torch::Tensor no_grad = torch::zeros({3}, torch::requires_grad());  // skipped by both
      loop.push_back(no_grad);
      multi.push_back(no_grad);
      if (bad != 0) {
        loop[1].mutable_grad()[5] = bad;
        multi[1].mutable_grad()[5] = bad;
      }
      bool want = s.UnscaleAndCheck(loop).item<bool>();
      EXPECT_EQ(want, bad != 0);
      EXPECT_EQ(s.UnscaleAndCheck(multi, /*foreach=*/true).item<bool>(), want) << bad;
      for (size_t i = 0; i + 1 < loop.size(); ++i)
        EXPECT_TRUE(loop[i].grad().equal(multi[i].grad()) ||
                    (bad != 0 && i == 1 && loop[i].grad().isnan().any().item<bool>()))
            << "parameter " << i << " enabled " << enabled;
    }
  }
  LossScaler off(LossScalerOptions{});
  EXPECT_FALSE(off.UnscaleAndCheck({torch::zeros({2})}, true).item<bool>());  // no gradients
}

TEST(AutocastGuard, EnablesAndRestoresStateAndCache) {
  ASSERT_FALSE(at::autocast::is_cpu_enabled());
  torch::ScalarType before = at::autocast::get_autocast_cpu_dtype();
  torch::Tensor a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    AutocastGuard g(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard off(torch::kCPU, std::nullopt);  // fp32: changes nothing
      EXPECT_TRUE(at::autocast::is_cpu_enabled());
    }
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
  }
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(at::autocast::get_autocast_cpu_dtype(), before);
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

TEST(Accumulation, KMicroBatchesEqualOneBatchKTimesAsLarge) {
  StepContext ctx;
  ctx.model = Mlp();
  torch::manual_seed(3);
  TrainBatch whole{torch::randn({8, 12}), torch::randint(0, 5, {8}, torch::kLong), 8};
  LossScaler scaler(LossScalerOptions{});
  ForwardBackward(ctx, whole, 1, scaler, false, nullptr);
  std::vector<torch::Tensor> expected;
  for (auto& p : ctx.model->parameters()) {
    expected.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  for (int k = 0; k < 4; ++k) {
    TrainBatch part{whole.inputs.slice(0, 2 * k, 2 * k + 2),
                    whole.targets.slice(0, 2 * k, 2 * k + 2), 2};
    ForwardBackward(ctx, part, 4, scaler, false, nullptr);
  }
  auto params = ctx.model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << i;
}

// Our optimizers against libtorch's own on the same gradients.
void CompareWithTorch(const std::string& name, torch::optim::Optimizer* reference,
                      OptimizerOptions o) {
  torch::manual_seed(1);
  torch::Tensor w0 = torch::randn({3, 4});
  torch::Tensor ours = w0.clone().requires_grad_(),
                theirs = reference->param_groups()[0].params()[0];
  {
    torch::NoGradGuard g;
    theirs.copy_(w0);
  }
  o.name = name;
  Optimizer opt({{"w", ours}}, o);
  for (int step = 0; step < 4; ++step) {
    torch::Tensor g = torch::randn({3, 4});
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    opt.Step(0.1);
    reference->step();
  }
  EXPECT_TRUE(torch::allclose(ours, theirs, 1e-5, 1e-6)) << name << "\n" << ours << theirs;
}

TEST(Optimizer, SgdAndAdamWMatchLibtorch) {
  OptimizerOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  o.nesterov = true;
  torch::Tensor p1 = torch::zeros({3, 4}, torch::requires_grad());
  torch::optim::SGD sgd(
      {p1}, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
  CompareWithTorch("sgd", &sgd, o);
  torch::Tensor p2 = torch::zeros({3, 4}, torch::requires_grad());
  torch::optim::AdamW adamw({p2}, torch::optim::AdamWOptions(0.1).weight_decay(0.01));
  CompareWithTorch("adamw", &adamw, o);
}

// optim.foreach: the multi-tensor update equals the per-parameter loop (up
// to rounding: m + (1-b1)(g-m) there, b1 m + (1-b1) g here), with state
// created on the first step, a parameter without a gradient left alone, and
// a rank's unowned parameters skipped.
TEST(Optimizer, ForeachIsOnByDefaultOnlyOnCuda) {
  EXPECT_TRUE(ForeachFor("auto", true));
  EXPECT_FALSE(ForeachFor("auto", false));
  EXPECT_TRUE(ForeachFor("true", false));
  EXPECT_FALSE(ForeachFor("false", true));
}

// An optimizer the update tests compare paths of, with weight decay.
struct UpdateCase {
  std::string name;
  double momentum;
  bool nesterov;
  std::string Label() const {
    return name + " momentum " + std::to_string(momentum) + (nesterov ? " nesterov" : "");
  }
  OptimizerOptions Options() const {
    OptimizerOptions o;
    o.name = name;
    o.momentum = momentum;
    o.nesterov = nesterov;
    o.weight_decay = 0.05;
    return o;
  }
};

TEST(Optimizer, ForeachUpdateEqualsThePerParameterLoop) {
  for (const UpdateCase& c : {UpdateCase{"adamw", 0.9, false}, UpdateCase{"sgd", 0.9, true},
                              UpdateCase{"sgd", 0.9, false}, UpdateCase{"sgd", 0, false}}) {
    SCOPED_TRACE(c.Label());
    OptimizerOptions o = c.Options();
    torch::manual_seed(2);
    std::vector<torch::Tensor> start = {torch::randn({5, 3}), torch::randn({7}), torch::randn({2, 2, 3}),
                                        torch::randn({4})};
    // `offload_at`: the step before which dist.offload moves the state to
    // host copies (-1: never), as a resumed run's existing state moves.
    auto run = [&](bool foreach, int offload_at = -1, bool async = false,
                   int64_t group_bytes = OptimizerOptions().foreach_group_bytes) {
      o.foreach = foreach;
      o.foreach_group_bytes = group_bytes;
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (size_t i = 0; i < start.size(); ++i)
        named.emplace_back("p" + std::to_string(i), start[i].clone().requires_grad_());
      Optimizer opt(named, o);
      opt.SetOwned({true, true, false, true});  // the third is another rank's
      torch::manual_seed(3);
      for (int step = 0; step < 5; ++step) {
        if (step == offload_at) opt.SetOffload();
        for (size_t i = 0; i < named.size(); ++i)
          named[i].second.mutable_grad() =
              i == 1 && step == 2 ? torch::Tensor() : torch::randn(start[i].sizes());  // no grad once
        if (async) {
          // The next step's gradients are set while the update runs.
          opt.StepAsync(0.05);
          if (step == 1) opt.WaitFor({named[3].second, named[0].second});
        } else {
          opt.Step(0.05);
        }
      }
      opt.WaitForUpdate();
      EXPECT_EQ(opt.offloaded(), offload_at >= 0);
      return named;
    };
    auto loop = run(false), multi = run(true);
    for (size_t i = 0; i < loop.size(); ++i)
      EXPECT_TRUE(torch::allclose(multi[i].second, loop[i].second, 1e-6, 1e-7))
          << loop[i].first << "\n" << multi[i].second - loop[i].second;
    EXPECT_TRUE(torch::equal(multi[2].second, start[2])) << "an unowned parameter moved";
    EXPECT_FALSE(torch::equal(multi[0].second, start[0]));
    // In groups of 40 bytes ({p0} and {p1, p3}; {p0} and {p3} at the step
    // without p1's gradient): the same elementwise arithmetic, so bit-equal.
    auto grouped = run(true, -1, false, 40);
    for (size_t i = 0; i < loop.size(); ++i)
      EXPECT_TRUE(torch::equal(grouped[i].second, multi[i].second)) << "grouped: " << loop[i].first;
    // dist.offload = optimizer: the same update on the host copies, from the
    // start or with state already made.
    for (int at : {0, 2, 10}) {  // 10: from the start, the update on its own thread
      auto offloaded = at == 10 ? run(false, 0, true) : run(false, at);
      for (size_t i = 0; i < loop.size(); ++i)
        EXPECT_TRUE(torch::allclose(offloaded[i].second, loop[i].second, 1e-6, 1e-7))
            << "offloaded at step " << at << ": " << loop[i].first;
      EXPECT_TRUE(torch::equal(offloaded[2].second, start[2])) << "an unowned parameter moved";
    }
  }
}

// optim.fused = true (torch's _fused_adamw_ and _fused_sgd_ on CUDA): the
// same AdamW and SGD as the multi-tensor path within rounding, over groups,
// a parameter without a gradient at one step, and weight decay. Where they
// cannot run FusedUpdateUnused says why.
TEST(Optimizer, FusedUpdateEqualsTheMultiTensorUpdate) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  int ran = 0;
  for (const UpdateCase& c : {UpdateCase{"adamw", 0, false}, UpdateCase{"sgd", 0.9, true},
                              UpdateCase{"sgd", 0.9, false}, UpdateCase{"sgd", 0, false}}) {
    SCOPED_TRACE(c.Label());
    OptimizerOptions o = c.Options();
    o.foreach = true;
    o.foreach_group_bytes = 40;
    if (const char* why = FusedUpdateUnused(o, cuda)) {
      std::printf("not run: %s\n", why);
      continue;
    }
    ++ran;
    torch::manual_seed(2);
    std::vector<torch::Tensor> start = {torch::randn({5, 3}, cuda), torch::randn({7}, cuda),
                                        torch::randn({300}, cuda)};
    auto run = [&](bool fused) {
      o.fused = fused;
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (size_t i = 0; i < start.size(); ++i)
        named.emplace_back("p" + std::to_string(i), start[i].clone().requires_grad_());
      Optimizer opt(named, o);
      torch::manual_seed(3);
      for (int step = 0; step < 5; ++step) {
        for (size_t i = 0; i < named.size(); ++i)
          named[i].second.mutable_grad() =
              i == 1 && step == 2 ? torch::Tensor() : torch::randn(start[i].sizes(), cuda);
        opt.Step(0.05);
      }
      return named;
    };
    auto multi = run(false), fused = run(true);
    for (size_t i = 0; i < multi.size(); ++i) {
      EXPECT_TRUE(torch::allclose(fused[i].second, multi[i].second, 1e-5, 1e-6))
          << multi[i].first << "\n"
          << (fused[i].second - multi[i].second).abs().max();
      EXPECT_FALSE(torch::equal(fused[i].second, start[i])) << multi[i].first << " did not move";
    }
  }
  if (ran == 0) GTEST_SKIP() << "this libtorch has neither fused update";
}

TEST(Optimizer, FusedUpdateSaysWhyItCannotRun) {
  OptimizerOptions o;
  o.name = "lars";
  EXPECT_STREQ(FusedUpdateUnused(o, torch::Device(torch::kCUDA)),
               "LARS has no fused update (AdamW and SGD have)");
  for (const char* name : {"adamw", "sgd"}) {
    o.name = name;
    const bool built =
        o.name == "adamw"
            ? TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
            : TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3);
    const char* cpu = FusedUpdateUnused(o, torch::kCPU);
    ASSERT_NE(cpu, nullptr) << name;
    if (built) {
      EXPECT_STREQ(cpu, "it runs on CUDA devices only");
      EXPECT_EQ(FusedUpdateUnused(o, torch::Device(torch::kCUDA)), nullptr) << name;
    } else {
      EXPECT_NE(std::string(cpu).find(std::string("has no _fused_") + name + "_ ("),
                std::string::npos)
          << cpu;
    }
  }
}

// The memory model's update term: what each update path holds at once
// besides parameters, gradients and state.
TEST(Optimizer, UpdateTemporariesByPath) {
  std::vector<int64_t> bytes = {600, 100, 300, 50};
  OptimizerOptions adamw;
  adamw.name = "adamw";
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, false), 600);  // one denominator
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, true), 3 * 600);
  adamw.foreach = true;
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, false), 1050);  // the whole list
  adamw.foreach_group_bytes = 400;                                        // {600}, {100, 300}, {50}
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, false), 600);
  adamw.foreach_group_bytes = 350;
  bytes[0] = 10;  // {10, 100, 300} closes at 410 bytes, then {50}
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, false), 410);
  adamw.fused = true;  // one kernel, in place
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, false), 0);
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(adamw, bytes, true), 3 * 300);  // the graph's own
  OptimizerOptions sgd;  // momentum 0.9, no decay, not Nesterov: no temporary
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(sgd, bytes, false), 0);
  sgd.weight_decay = 0.1;
  sgd.nesterov = true;
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(sgd, bytes, false), 2 * 300);
  sgd.foreach = true;
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(sgd, bytes, false), 2 * 460);
  EXPECT_EQ(Optimizer::UpdateTemporaryBytes(sgd, {}, false), 0);
}

TEST(Optimizer, LarsScalesEachLayersStepByItsTrustRatio) {
  OptimizerOptions o;
  o.name = "lars";
  o.momentum = 0;
  o.trust = 0.01;
  torch::Tensor w = torch::full({2, 2}, 3.0).requires_grad_();  // |w| = 6
  w.mutable_grad() = torch::full({2, 2}, 0.5);                  // |g| = 1
  Optimizer opt({{"w", w}}, o);
  opt.Step(1.0);
  // step = lr * trust * |w| / |g| * g = 0.01 * 6 * 0.5 = 0.03 per element
  EXPECT_TRUE(torch::allclose(w, torch::full({2, 2}, 3.0 - 0.03)));
}

TEST(LrSchedule, WarmsUpThenFollowsTheCosine) {
  LrSchedule s{1.0, 0.1, 10, 110, true};
  EXPECT_DOUBLE_EQ(s.At(1), 0.1);
  EXPECT_DOUBLE_EQ(s.At(10), 1.0);
  EXPECT_NEAR(s.At(60), 0.55, 1e-12);  // half way: the mean of peak and min
  EXPECT_NEAR(s.At(110), 0.1, 1e-12);
  s.cosine = false;
  EXPECT_DOUBLE_EQ(s.At(100), 1.0);
}

CheckpointState SampleState() {
  CheckpointState s;
  s.tensors = {{"model.w", torch::arange(12, torch::kFloat).reshape({3, 4})},
               {"model.n", torch::tensor({int64_t{7}})},
               {"rng.cpu", torch::ones({5}, torch::kByte)},
               {"half", torch::ones({2}, torch::kBFloat16)}};
  s.state_json = R"({"step": 5})";
  return s;
}

TEST(Checkpoint, RoundTripsAsSafetensors) {
  std::string dir = testing::FreshTestDir("fb_ckpt");
  std::string path = dir + "/a.safetensors";
  int64_t bytes = 0;
  ASSERT_TRUE(WriteCheckpointFile(path, SampleState(), &bytes).ok());
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(path)), bytes);
  auto back = ReadCheckpointFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->state_json, R"({"step": 5})");
  std::map<std::string, torch::Tensor> m(back->tensors.begin(), back->tensors.end());
  EXPECT_TRUE(m["model.w"].equal(SampleState().tensors[0].second));
  EXPECT_EQ(m["model.n"].item<int64_t>(), 7);
  EXPECT_EQ(m["half"].scalar_type(), torch::kBFloat16);
  // The safetensors layout: 8-byte little-endian header length, JSON header.
  std::ifstream in(path, std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  std::string header(hlen, ' ');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["model.w"]["dtype"], "F32");
  EXPECT_EQ(j["model.w"]["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(hlen % 8, 0u);
}

TEST(Checkpoint, TruncatedOrFlippedFilesAreRefused) {
  std::string dir = testing::FreshTestDir("fb_ckpt_bad");
  std::string path = dir + "/a.safetensors";
  ASSERT_TRUE(WriteCheckpointFile(path, SampleState(), nullptr).ok());
  auto size = std::filesystem::file_size(path);
  std::filesystem::copy_file(path, dir + "/b.safetensors");
  std::filesystem::resize_file(path, size - 3);
  auto t = ReadCheckpointFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is unusable"), std::string::npos) << t.status().message();
  {
    std::fstream f(dir + "/b.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 10));
    f.put('\x55');
  }
  auto c = ReadCheckpointFile(dir + "/b.safetensors");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("checksum mismatch"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(ReadCheckpointFile(dir + "/none").status().code(), Status::Code::kNotFound);
}

TEST(Checkpoint, AsyncWriterKeepsTheNewestK) {
  std::string dir = testing::FreshTestDir("fb_ckpt_keep");
  std::vector<CheckpointWriter::Written> done;
  std::mutex mu;
  {
    CheckpointWriter w(dir, 2, true, [&](const CheckpointWriter::Written& x) {
      std::lock_guard<std::mutex> lock(mu);
      done.push_back(x);
    });
    for (int step : {10, 20, 30}) {
      CheckpointState s = SampleState();
      torch::Tensor live = s.tensors[0].second;
      w.Save(step, s);
      live.add_(100);  // the loop goes on changing its tensors: the snapshot must not see it
    }
  }
  ASSERT_EQ(done.size(), 3u);
  for (auto& d : done) EXPECT_TRUE(d.status.ok());
  auto files = ListCheckpoints(dir);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].find("step-00000030"), std::string::npos);
  auto back = ReadCheckpointFile(files[0]);
  ASSERT_TRUE(back.ok());
  std::map<std::string, torch::Tensor> m(back->tensors.begin(), back->tensors.end());
  EXPECT_TRUE(m["model.w"].equal(SampleState().tensors[0].second));
}

// A part as a rank writes it: its identity in the file's metadata.
void WritePart(const std::string& main, const ShardIdentity& id, int rank) {
  CheckpointState s = SampleState();
  s.state_json = nlohmann::json{
      {"step", id.step}, {"rank", rank}, {"world", id.world}, {"run_id", id.run_id}}.dump();
  ASSERT_TRUE(WriteCheckpointFile(OptimizerShardPath(main, rank, id.world), s, nullptr).ok());
}

// Rank 0's wait before a sharded step's file: every part there (and only
// parts of this checkpoint count), a rank's failure marker, a cancelled run
// and a timeout each end it, the last three removing the step's parts.
TEST(Checkpoint, RankZeroWritesAStepOnlyOnceEveryPartOfItLanded) {
  std::string dir = testing::FreshTestDir("fb_ckpt_parts");
  std::string main = CheckpointPath(dir, 4);
  ShardIdentity id;
  id.step = 4;
  id.run_id = 9;
  id.world = 3;
  std::atomic<bool> cancel{false};
  WritePart(main, id, 0);
  WritePart(main, id, 2);
  ShardIdentity stale = id;
  stale.run_id = 8;  // another run's part under the same name
  WritePart(main, stale, 1);
  // Rank 1's part comes while rank 0 waits.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    WritePart(main, id, 1);
  });
  Status s = WaitForOptimizerShards(main, id, cancel, 60);
  late.join();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(std::filesystem::exists(OptimizerShardPath(main, 1, 3)));

  // Only the stale part of rank 1: the wait goes on until cancelled.
  std::string main6 = CheckpointPath(dir, 6);
  id.step = 6;
  stale.step = 6;
  WritePart(main6, id, 0);
  WritePart(main6, id, 2);
  WritePart(main6, stale, 1);
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel = true;
  });
  s = WaitForOptimizerShards(main6, id, cancel, 60);
  stop.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the run stopped before every rank's part was written"),
            std::string::npos)
      << s.message();
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(main6, r, 3)));

  // A rank's failure marker: the error names the rank and its reason.
  cancel = false;
  std::string main8 = CheckpointPath(dir, 8);
  id.step = 8;
  WritePart(main8, id, 0);
  ShardIdentity one = id;
  one.rank = 1;
  MarkOptimizerShardFailed(OptimizerShardPath(main8, 1, 3), one, "No space left on device");
  s = WaitForOptimizerShards(main8, id, cancel, 60);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checkpoint at step 8 not written: rank 1 could not write its part "
                             "(No space left on device)"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(main8, 0, 3)));
  EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(main8, 1, 3) + ".failed"));

  // A part that never comes (a checkpoint.dir the ranks do not share).
  std::string main10 = CheckpointPath(dir, 10);
  id.step = 10;
  WritePart(main10, id, 0);
  WritePart(main10, id, 1);
  s = WaitForOptimizerShards(main10, id, cancel, 0.05);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 2's part"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("one checkpoint.dir they share"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(main10, 0, 3)));
}

// A part that landed after its step failed (no step file will name it) is
// removed when a later checkpoint is written; parts beside a step file, and
// those of a step not yet written, stay.
TEST(Checkpoint, PartsOfAStepThatFailedGoWithTheNextCheckpoint) {
  std::string dir = testing::FreshTestDir("fb_ckpt_orphans");
  ShardIdentity id;
  id.run_id = 3;
  id.world = 2;
  for (int64_t step : {2, 3, 9}) {
    id.step = step;
    for (int r = 0; r < 2; ++r) WritePart(CheckpointPath(dir, step), id, r);
  }
  ASSERT_TRUE(WriteCheckpointFile(CheckpointPath(dir, 2), SampleState(), nullptr).ok());
  std::ofstream(OptimizerShardPath(CheckpointPath(dir, 3), 1, 2) + ".failed") << "{}";
  {
    CheckpointWriter w(dir, 10, true, nullptr);
    w.Save(5, SampleState());
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::filesystem::exists(OptimizerShardPath(CheckpointPath(dir, 2), r, 2)));
    EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(CheckpointPath(dir, 3), r, 2)));
    EXPECT_TRUE(std::filesystem::exists(OptimizerShardPath(CheckpointPath(dir, 9), r, 2)));
  }
  EXPECT_FALSE(std::filesystem::exists(OptimizerShardPath(CheckpointPath(dir, 3), 1, 2) + ".failed"));
  EXPECT_TRUE(std::filesystem::exists(CheckpointPath(dir, 5)));
}

// The writer's path and pre-write hook: a hook's error is the Save's outcome
// and no file is written; keep < 0 rotates nothing.
TEST(Checkpoint, WriterHookCanHoldBackAFile) {
  std::string dir = testing::FreshTestDir("fb_ckpt_hook");
  std::vector<Status> outcomes;
  {
    CheckpointWriter w(dir, -1, true,
                       [&](const CheckpointWriter::Written& x) { outcomes.push_back(x.status); });
    w.SetPath([&](int64_t step) { return dir + "/part-" + std::to_string(step) + ".safetensors"; });
    w.SetBeforeWrite([](int64_t step) {
      return step == 2 ? Status::IoError("held back") : Status::Ok();
    });
    for (int step : {1, 2, 3, 4}) w.Save(step, SampleState());
  }
  ASSERT_EQ(outcomes.size(), 4u);
  EXPECT_TRUE(outcomes[0].ok());
  EXPECT_EQ(outcomes[1].message(), "held back");
  EXPECT_TRUE(std::filesystem::exists(dir + "/part-1.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/part-2.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/part-3.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/part-4.safetensors"));
}

#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
TEST(HostMemory, FreedBlocksStayInTheProcessForReuse) {
  // 8 MiB: above glibc's default mmap threshold, so without KeepHostMemory a
  // free unmaps it (and the next step faults it in again).
  // Compared with the moment the block is held, not with before the malloc:
  // other threads of earlier tests may take from the heap's free pool in
  // between (it failed so on a 16-core GPU machine).
  KeepHostMemory();
  size_t mapped_before = mallinfo2().hblkhd;
  void* block = std::malloc(8 << 20);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 8 << 20);
  struct mallinfo2 held = mallinfo2();
  EXPECT_LT(held.hblkhd, mapped_before + (8 << 20)) << "the block was mapped apart from the heap";
  std::free(block);
  EXPECT_GE(mallinfo2().fordblks, held.fordblks + (8 << 20)) << "the freed block went back to the OS";
}
#endif

TEST(MemoryBudget, AllocationsPastTheBudgetFailAsOutOfMemory) {
  SetCpuMemoryBudget(64 << 20);
  torch::Tensor ok = torch::empty({8 << 20}, torch::kByte);
  EXPECT_GE(CpuBytesInUse(), 8 << 20);
  try {
    torch::Tensor too_big = torch::empty({128 << 20}, torch::kByte);
    ADD_FAILURE() << "allocation past the budget succeeded";
  } catch (const std::exception& e) {
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what();
  }
  SetCpuMemoryBudget(0);
  torch::Tensor fine = torch::empty({128 << 20}, torch::kByte);  // no budget: fine
  EXPECT_EQ(fine.numel(), 128 << 20);
}

// The memory model's arithmetic: each part by setting, and the largest
// micro-batch under a limit.
TEST(MemoryModel, PartsBySettingAndTheLargestBatchUnderALimit) {
  MemoryModel m;
  m.weight_bytes = m.grad_bytes = 4000;
  m.largest_grad_bytes = 1000;
  m.state_bytes = 8000;
  m.largest_state_bytes = 2000;
  m.bucket_bytes = 100;
  m.world = 4;
  m.activations["none"] = {500, 100};
  m.activations["blocks"] = {500, 30};
  MemoryParts none = m.Predict(10, "none", "none");
  EXPECT_EQ(none.weights, 4000);
  EXPECT_EQ(none.gradients, 4000);  // data parallel keeps the buckets
  EXPECT_EQ(none.optimizer, 8000);
  EXPECT_EQ(none.activations, 1500);
  MemoryParts opt = m.Predict(10, "optimizer", "none");
  EXPECT_EQ(opt.optimizer, 8000 / 4 + 2000);
  EXPECT_EQ(opt.gradients, 4000);
  MemoryParts grads = m.Predict(10, "gradients", "blocks");
  EXPECT_EQ(grads.gradients, 2 * 100);  // the buckets filling at backward's start
  EXPECT_EQ(grads.activations, 800);
  // 17500 at batch 10 as configured; a limit of 18000 allows 15.
  EXPECT_EQ(none.total(), 17500);
  EXPECT_EQ(m.LargestBatch(18000, "none", "none", 1000), 15);
  EXPECT_EQ(m.LargestBatch(18000, "none", "none", 12), 12);  // capped
  EXPECT_EQ(m.LargestBatch(16000, "none", "none", 1000), 0);  // not even one sample
  EXPECT_EQ(m.LargestBatch(18000, "gradients", "blocks", 1000),
            (18000 - 4000 - 200 - 4000 - 500) / 30);
  m.world = 1;  // one process: gradients are made inside the probed step
  EXPECT_EQ(m.Predict(10, "gradients", "none").gradients, 0);
  EXPECT_EQ(m.Predict(10, "gradients", "none").optimizer, 8000);
  EXPECT_EQ(m.ShardSettings(), std::vector<std::string>{"none"});
}

TEST(BatchSearch, FindsTheLargestBatchUnderABudgetAndRecovers) {
  StepContext ctx;
  ModelSpec s;
  s.name = "mlp";
  s.in_features = 3 * 16 * 16;
  s.hidden = 256;
  s.num_classes = 10;
  torch::manual_seed(0);
  ctx.model = MakeModel(s).value();
  torch::Tensor before = ctx.model->parameters()[0].clone();
  TrainBatch probe{torch::randn({8, 3, 16, 16}), torch::randint(0, 10, {8}, torch::kLong), 8};
  BatchSearchOptions o;
  o.max_batch = 1 << 14;
  o.steps = 1;
  SetCpuMemoryBudget(CpuBytesInUse() + (8 << 20));
  std::vector<BatchTrial> trials;
  auto chosen = SearchBatchSize(&ctx, probe, o, [&](const BatchTrial& t) { trials.push_back(t); });
  ASSERT_TRUE(chosen.ok()) << chosen.status().message();
  int64_t largest_fit = 0, smallest_fail = 1 << 30;
  for (const BatchTrial& t : trials) {
    if (t.fits)
      largest_fit = std::max(largest_fit, t.batch);
    else
      smallest_fail = std::min(smallest_fail, t.batch);
  }
  ASSERT_LT(largest_fit, smallest_fail);  // fits and failures do not interleave
  EXPECT_LE(smallest_fail - largest_fit, std::max<int64_t>(1, largest_fit / 16));
  EXPECT_GT(largest_fit, 64);  // the budget leaves room for real batches
  // The search recovered from its out-of-memory trials: training goes on at
  // the chosen size within the same budget, and the weights are untouched.
  EXPECT_TRUE(ctx.model->parameters()[0].equal(before));
  LossScaler scaler(LossScalerOptions{});
  TrainBatch b{torch::randn({*chosen, 3, 16, 16}), torch::randint(0, 10, {*chosen}, torch::kLong),
               *chosen};
  EXPECT_NO_THROW(ForwardBackward(ctx, b, 1, scaler, false, nullptr));
  SetCpuMemoryBudget(0);
}

TEST(BatchSearch, KeepsTheFastestSizeAndLeavesRoomOnlyBelowAMemoryLimit) {
  auto fit = [](int64_t batch, double samples_per_s) {
    BatchTrial t;
    t.batch = batch;
    t.fits = true;
    t.samples_per_s = samples_per_s;
    return t;
  };
  std::vector<BatchTrial> fits = {fit(8, 100), fit(16, 180), fit(32, 250), fit(64, 300)};
  // Stopped by max_batch: no memory limit was found, so 64 counts.
  EXPECT_EQ(PickSearchedBatch(fits, 0), 64);
  // 128 ran out of memory: 64 is at the limit, so the run gets 32.
  EXPECT_EQ(PickSearchedBatch(fits, 128), 32);
  // A slower larger size is not chosen for being larger.
  fits[3].samples_per_s = 200;
  EXPECT_EQ(PickSearchedBatch(fits, 0), 32);
  // Only the smallest fits: it is chosen even at the limit.
  EXPECT_EQ(PickSearchedBatch({fit(2, 10)}, 3), 2);
}

TEST(BatchSearch, AModelThatDoesNotFitAtBatchOneIsAClearError) {
  StepContext ctx;
  ctx.model = Mlp(1000, 10);
  TrainBatch probe{torch::randn({8, 1000}), torch::randint(0, 10, {8}, torch::kLong), 8};
  SetCpuMemoryBudget(CpuBytesInUse() + 1024);
  auto r = SearchBatchSize(&ctx, probe, BatchSearchOptions{}, [](const BatchTrial&) {});
  SetCpuMemoryBudget(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not fit in memory even at batch 1"), std::string::npos);
}

// The budget is mostly taken before the search starts (data held in memory):
// the message says so instead of blaming the model.
TEST(BatchSearch, ABudgetFilledBeforeTheSearchIsNamedAsSuch) {
  StepContext ctx;
  ctx.model = Mlp(1000, 10);
  TrainBatch probe{torch::randn({8, 1000}), torch::randint(0, 10, {8}, torch::kLong), 8};
  SetCpuMemoryBudget(0);  // installs the counting allocator before the data is made
  torch::Tensor dataset =
      torch::empty({6 << 20}, torch::kByte);  // 6 MiB, far more than the weights
  SetCpuMemoryBudget(CpuBytesInUse() + 4096);
  auto r = SearchBatchSize(&ctx, probe, BatchSearchOptions{}, [](const BatchTrial&) {});
  SetCpuMemoryBudget(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("were in use before the batch-size search"),
            std::string::npos)
      << r.status().message();
}

// Rank `rank` of 2, a thread of this test, over Gloo on loopback `port`.
Result<std::unique_ptr<DataParallel>> ConnectThreadRank(int rank, const std::string& port,
                                                        DistOptions options) {
  RankInfo info;
  info.rank = rank;
  info.world_size = 2;
  info.local_world_size = 2;
  info.master_port = std::stoi(port);
  options.backend = "gloo";
  return DataParallel::Connect(info, options, torch::kCPU);
}

// dist.shard = full from host memory: two ranks (threads here) built
// different weights; after PlaceOnDevice each holds only the parameters it
// owns, with rank 0's values, and a gather fills the rest with rank 0's
// too. The chunk of 256 bytes sends the parameters in several broadcasts.
TEST(ShardedParameters, PlacingFromTheHostKeepsOnlyTheRanksShareWithRankZerosValues) {
  const std::string port = testing::FreeLoopbackPort();
  ASSERT_FALSE(port.empty());
  const std::vector<std::vector<int64_t>> shapes = {{8, 4}, {4}, {16, 8}, {8}, {3, 3, 2, 2}, {5}};
  auto values = [&](int rank) {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < shapes.size(); ++i) {
      torch::Tensor t = torch::arange(c10::multiply_integers(shapes[i]), torch::kFloat)
                            .reshape(shapes[i])
                            .add(static_cast<double>(1000 * rank + 100 * i));
      out.push_back(t.requires_grad_());
    }
    return out;
  };
  const std::vector<torch::Tensor> expected = values(0);
  std::string errors[2];
  auto run_rank = [&](int rank) {
    std::string& error = errors[rank];
    DistOptions options;
    options.timeout_s = 60;
    auto dp = ConnectThreadRank(rank, port, options);
    if (!dp.ok()) {
      error = dp.status().message();
      return;
    }
    std::vector<torch::Tensor> params = values(rank);
    std::vector<int> owner = DataParallel::ShardOwners(params, 2);
    ShardedParameters sharded(dp->get(), params, owner);
    if (Status s = sharded.PlaceOnDevice(torch::kCPU, 256, false); !s.ok()) {
      error = s.message();
      return;
    }
    std::ostringstream why;
    // Until released, the others' parameters keep their shape (for the
    // gradient hooks) over one element.
    for (size_t i = 0; i < params.size(); ++i)
      if (owner[i] != rank && params[i].sizes() != expected[i].sizes())
        why << "placeholder " << i << " lost its shape; ";
    const int64_t placed = sharded.held_bytes();
    sharded.ReleaseAll();
    if (sharded.held_bytes() != placed) why << "held_bytes counted the placeholders; ";
    int64_t held = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owner[i] != rank) {
        if (params[i].numel() != 0)
          why << "parameter " << i << " kept by a rank that does not own it; ";
        continue;
      }
      held += params[i].numel();
      if (!params[i].equal(expected[i])) why << "parameter " << i << " is not rank 0's; ";
    }
    if (held == 0) why << "this rank owns nothing; ";
    try {
      sharded.Gather(params);
      for (size_t i = 0; i < params.size(); ++i)
        if (!params[i].equal(expected[i]))
          why << "gathered parameter " << i << " is not rank 0's; ";
      if (!params[2].requires_grad()) why << "the parameter lost requires_grad; ";
    } catch (const std::exception& e) {
      why << "gather failed: " << e.what();
    }
    error = why.str();
  };
  std::thread other(run_rank, 1);
  run_rank(0);
  other.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// The batch-size search's local steps (DataParallel::SetLocal): rank 0
// runs a stage 3 step (gather, backward into sharded buckets, the update's
// broadcast) and then one that fails in the middle of backward, while rank 1
// is in no collective at all; with a 10 s timeout a collective that sent
// anything would fail. The good step holds what the run's rank would: only
// its own gradients after it (sums: nothing was averaged), the others'
// parameters gathered as zeros while used, nothing once reset. After
// ResetStep both ranks take a real step together, which averages.
TEST(DataParallel, LocalStepsWaitForNoRankAndHoldTheRanksShare) {
  const std::string port = testing::FreeLoopbackPort();
  ASSERT_FALSE(port.empty());
  const std::vector<std::vector<int64_t>> shapes = {{8, 4}, {4}, {16, 8}, {8}, {6, 6}, {5}};
  std::string errors[2];
  std::atomic<bool> local_done{false};
  auto run_rank = [&](int rank) {
    std::ostringstream why;
    DistOptions options;
    options.timeout_s = 10;
    options.bucket_mb = 0.0002;  // 200 bytes: several buckets, reduced as backward goes
    options.first_bucket_mb = 0.0002;
    auto dp = ConnectThreadRank(rank, port, options);
    if (!dp.ok()) {
      errors[rank] = dp.status().message();
      return;
    }
    std::vector<torch::Tensor> params, weights;
    for (size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(torch::full(shapes[i], 1.0 + static_cast<double>(i)).requires_grad_());
      weights.push_back(torch::full(shapes[i], 2.0 + static_cast<double>(i)));
    }
    std::vector<int> owner = DataParallel::ShardOwners(params, 2);
    DataParallel& d = **dp;
    auto check = [](const Status& s) {
      if (!s.ok()) throw std::runtime_error(s.message());
    };
    auto loss_of = [&](double scale) {
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < params.size(); ++i)
        loss = loss + (params[i] * weights[i] * scale).sum();
      return loss;
    };
    try {
      check(d.Attach(params, false));
      check(d.ShardGradients(params, owner));
      d.SetSync(true);
      if (rank == 0) {
        std::vector<torch::Tensor> saved;
        for (const torch::Tensor& p : params) saved.push_back(p.detach().clone());
        ShardedParameters sharded(&d, params, owner);
        sharded.ReleaseAll();
        d.SetLocal(true);
        sharded.Gather(params);  // every parameter: the others' as zeros
        for (size_t i = 0; i < params.size(); ++i)
          if (owner[i] != 0 && params[i].abs().sum().item<double>() != 0)
            why << "parameter " << i << " of rank 1 gathered with values; ";
        loss_of(1).backward();
        check(d.FinishGradients());
        for (size_t i = 0; i < params.size(); ++i) {
          const torch::Tensor& g = params[i].grad();
          if (owner[i] != 0 && g.defined()) why << "kept rank 1's gradient " << i << "; ";
          if (owner[i] == 0 && (!g.defined() || !g.equal(weights[i])))
            why << "gradient " << i << " is not this rank's own sum; ";
        }
        if (d.stats().started_in_backward == 0) why << "no bucket was filled during backward; ";
        check(d.BroadcastFromOwners(params, owner));
        sharded.ReleaseAll();
        d.ResetStep();
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].grad().defined()) why << "gradient " << i << " left after ResetStep; ";
          if (owner[i] != 0 && params[i].numel() != 0) why << "parameter " << i << " held; ";
        }
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].numel() == 0) params[i].set_data(torch::empty_like(saved[i]));
          params[i].copy_(saved[i]);
        }
      }
      if (rank == 0) {
        // A step that fails half-way through backward (buckets filled,
        // some started), as an out-of-memory would.
        auto hook = params[2].register_hook([](const torch::Tensor&) -> torch::Tensor {
          throw std::runtime_error("injected failure");
        });
        try {
          loss_of(1).backward();
          why << "the injected failure did not stop backward; ";
        } catch (const std::exception&) {
        }
        params[2].remove_hook(hook);
        d.ResetStep();
        d.SetLocal(false);
        if (d.stats().started_in_backward != 0 || d.stats().grad_copies != 0)
          why << "the local steps stayed in the run's statistics; ";
        local_done = true;
      } else {
        while (!local_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      // A real step on both ranks: each keeps its own gradients, the mean.
      loss_of(1.0 + rank).backward();
      check(d.FinishGradients());
      for (size_t i = 0; i < params.size(); ++i)
        if (owner[i] == rank && !params[i].grad().allclose(weights[i] * 1.5))
          why << "gradient " << i << " after the local steps is not the mean; ";
    } catch (const std::exception& e) {
      why << "failed: " << e.what();
      local_done = true;
    }
    errors[rank] = why.str();
  };
  std::thread other(run_rank, 1);
  run_rank(0);
  other.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace fullburn
