// One rank of a small data-parallel job, for tests/dist/ddp_test.cpp: an MLP
// trained with plain SGD on a deterministic global batch, each rank taking
// its shard; the final parameters are written to OUT.<rank> as raw floats.
//
//   fullburn_ddp_worker --steps N --out PREFIX [--accumulate K] [--bucket-mb X]
//       [--no-overlap] [--compress fp16] [--skip-on-rank R --skip-step S]
//       [--die-rank R --die-step S] [--timeout S] [--single] [--zero-in-place]
// --single trains the whole global batch in one process, without c10d: the
// reference. --zero-in-place clears gradients with DataParallel::ZeroGradients
// (else they are set to none, as torch 2.x's zero_grad). Prints
// "stats buckets=B in_backward=I after=A copies=C views=V" (V: parameters
// whose .grad is a view of its bucket at the end).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "fullburn/dist_torch.h"

namespace {

constexpr int kGlobalBatch = 24;  // divisible by 1, 2, 3 ranks and 2 micro-batches

double Arg(int argc, char** argv, const char* name, double fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return fallback;
}
std::string StrArg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
bool Flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "worker: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  int steps = static_cast<int>(Arg(argc, argv, "--steps", 5));
  int accumulate = static_cast<int>(Arg(argc, argv, "--accumulate", 1));
  std::string out = StrArg(argc, argv, "--out", "params");
  bool single = Flag(argc, argv, "--single");
  bool zero_in_place = Flag(argc, argv, "--zero-in-place");
  int skip_rank = static_cast<int>(Arg(argc, argv, "--skip-on-rank", -1));
  int skip_step = static_cast<int>(Arg(argc, argv, "--skip-step", -1));
  int die_rank = static_cast<int>(Arg(argc, argv, "--die-rank", -1));
  int die_step = static_cast<int>(Arg(argc, argv, "--die-step", -1));
  bool shard_grads = Flag(argc, argv, "--shard-grads");  // ZeRO stage 2

  fullburn::RankInfo me;
  std::unique_ptr<fullburn::DataParallel> dp;
  if (!single) {
    auto info = fullburn::RankFromEnvironment(fullburn::EnvironmentMap());
    if (!info.ok()) return Fail(info.status().message());
    if (!info->has_value()) return Fail("no RANK/WORLD_SIZE: start me with fullburn launch");
    me = **info;
    fullburn::DistOptions o;
    o.bucket_mb = Arg(argc, argv, "--bucket-mb", 0.004);
    o.first_bucket_mb = o.bucket_mb / 2;
    o.overlap = !Flag(argc, argv, "--no-overlap");
    o.compress = StrArg(argc, argv, "--compress", "none");
    o.timeout_s = Arg(argc, argv, "--timeout", 30);
    o.config_hash = StrArg(argc, argv, "--config-hash", "same");
    auto c = fullburn::DataParallel::Connect(me, o, torch::kCPU);
    if (!c.ok()) return Fail(c.status().message());
    dp = std::move(*c);
  }
  // Each rank starts from different weights: the broadcast must fix that.
  torch::manual_seed(1 + me.rank);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 4));
  std::vector<torch::Tensor> params = model->parameters();
  if (dp) {
    if (auto s = dp->Broadcast(params); !s.ok()) return Fail(s.message());
    if (auto s = dp->Attach(params); !s.ok()) return Fail(s.message());
  }
  std::vector<int> owner(params.size(), me.rank);  // unsharded: every rank updates everything
  if (dp && shard_grads) {
    owner = fullburn::DataParallel::ShardOwners(params, me.world_size);
    if (auto s = dp->ShardGradients(params, owner); !s.ok()) return Fail(s.message());
  }
  int world = single ? 1 : me.world_size;
  int shard = kGlobalBatch / world, micro = shard / accumulate;
  for (int step = 0; step < steps; ++step) {
    if (me.rank == die_rank && step == die_step) ::_exit(9);
    torch::manual_seed(1000 + step);  // the same global batch on every rank
    torch::Tensor x = torch::randn({kGlobalBatch, 16}), y = torch::randn({kGlobalBatch, 4});
    if (dp && zero_in_place)
      dp->ZeroGradients();
    else
      for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
    for (int k = 0; k < accumulate; ++k) {
      int64_t from = static_cast<int64_t>(me.rank) * shard + k * micro;
      if (dp) dp->SetSync(k == accumulate - 1);
      torch::Tensor loss =
          torch::mse_loss(model->forward(x.narrow(0, from, micro)), y.narrow(0, from, micro));
      (loss / accumulate).backward();
    }
    if (dp) {
      if (auto s = dp->FinishGradients(); !s.ok()) return Fail(s.message());
    }
    bool skip = step == skip_step && (single || me.rank == skip_rank);
    if (dp) {
      auto any = dp->AnyRank(skip);
      if (!any.ok()) return Fail(any.status().message());
      skip = *any;
    }
    if (skip) continue;  // as the loss scaler does on inf/NaN
    torch::NoGradGuard no_grad;
    int64_t held = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].grad();
      if (owner[i] != me.rank) {
        if (g.defined()) return Fail("a gradient this rank does not own was kept");
        continue;
      }
      params[i].sub_(0.1 * g);
      held += g.numel();
    }
    if (step == 0) std::printf("held %lld\n", static_cast<long long>(held));
    if (dp && shard_grads)
      if (auto s = dp->BroadcastFromOwners(params, owner); !s.ok()) return Fail(s.message());
  }
  std::ofstream f(out + "." + std::to_string(me.rank), std::ios::binary);
  for (const torch::Tensor& p : params) {
    torch::Tensor c = p.detach().contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  }
  if (dp) {
    // A .grad that is a bucket slot shares storage with the other gradients.
    int views = 0;
    for (const torch::Tensor& p : params)
      for (const torch::Tensor& q : params)
        if (&p != &q && p.grad().defined() && q.grad().defined() &&
            p.grad().is_alias_of(q.grad())) {
          ++views;
          break;
        }
    std::printf("stats buckets=%lld in_backward=%lld after=%lld copies=%lld views=%d\n",
                static_cast<long long>(dp->stats().buckets),
                static_cast<long long>(dp->stats().started_in_backward),
                static_cast<long long>(dp->stats().started_after),
                static_cast<long long>(dp->stats().grad_copies), views);
  }
  return 0;
}
