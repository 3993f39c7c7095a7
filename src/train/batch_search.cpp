// train.batch_size = auto: the largest micro-batch that fits, then the
// fastest of those that fit.
#include <fmt/format.h>

#include <cmath>

#include "fullburn/cpu_memory_budget.h"
#include "memory_model.h"
#include "trainer_impl.h"

namespace fullburn {

void FreeDeviceCache(const torch::Device& device) {
  // libtorch's CUDA caching allocator already frees its cached blocks and
  // retries before it reports an out-of-memory; what is left to free is ours:
  // the failed trial's tensors, released as the exception unwinds.
  if (device.is_cuda()) torch::cuda::synchronize();
}

TrainBatch SampleBatch(const StepContext& ctx, const TrainBatch& probe, int64_t batch) {
  torch::Tensor idx =
      torch::randint(probe.inputs.size(0), {batch},
                     torch::TensorOptions().dtype(torch::kLong).device(probe.inputs.device()));
  TrainBatch b;
  b.inputs = probe.inputs.index_select(0, idx);
  if (ctx.channels_last && b.inputs.dim() == 4)
    b.inputs = b.inputs.contiguous(torch::MemoryFormat::ChannelsLast);
  b.targets = probe.targets.index_select(0, idx);
  b.samples = batch;
  return b;
}

namespace {

constexpr const char* kCannotTrainAtOne = "cannot train at batch 1";
constexpr const char* kOutOfMemory = "out of memory";

struct Trial {
  StepContext* ctx;
  const TrainBatch& probe;
  const BatchSearchOptions& o;

  BatchTrial Run(int64_t batch) {
    BatchTrial t;
    t.batch = batch;
    ResetDevicePeak(ctx->device);
    try {
      TrainBatch b = SampleBatch(*ctx, probe, batch);
      std::vector<std::pair<std::string, torch::Tensor>> params;
      for (auto& p : ctx->model->named_parameters()) params.emplace_back(p.key(), p.value());
      Optimizer optim(params, o.optimizer);  // its state counts against memory too
      if (!o.owned.empty()) optim.SetOwned(o.owned);
      LossScaler scaler(LossScalerOptions{});
      double start = 0, elapsed = 0;
      int timed = 0;
      for (int k = 0; k <= o.steps || elapsed < o.min_seconds; ++k) {
        if (k == 1) {
          if (ctx->device.is_cuda()) torch::cuda::synchronize();
          start = MonoNow();
        }
        ForwardBackward(*ctx, b, 1, scaler, false, nullptr);
        if (o.shape) o.shape->AfterBackward();
        optim.Step(1e-6);
        if (o.shape) o.shape->AfterUpdate();
        EndStep(optim);
        if (k >= 1) {
          ++timed;
          // On CUDA reading the clock means a sync, so it is read only from
          // the last fixed step on.
          if (k >= o.steps) {
            if (ctx->device.is_cuda()) torch::cuda::synchronize();
            elapsed = MonoNow() - start;
          }
        }
      }
      t.samples_per_s = static_cast<double>(batch) * timed / elapsed;
      t.fits = true;
    } catch (const std::exception& e) {
      if (o.shape) o.shape->EndStep();
      if (IsOutOfMemory(e)) {
        t.error = kOutOfMemory;
      } else if (batch == 1) {
        // BatchNorm cannot train on one sample whose feature map ends at 1x1
        // (small images): not a memory limit, so the search goes on at 2.
        std::string what = e.what();
        t.error = std::string(kCannotTrainAtOne) + " (" + what.substr(0, what.find('\n')) + ")";
      } else {
        throw;
      }
    }
    for (auto& p : ctx->model->parameters()) p.mutable_grad() = torch::Tensor();
    FreeDeviceCache(ctx->device);
    // The training device's: on CUDA the caching allocator's (the host's
    // counting allocator saw only a few bytes there, as an H200 run showed).
    t.peak_bytes = DevicePeakBytes(ctx->device) - DeviceBytesInUse(ctx->device);
    return t;
  }

  void EndStep(Optimizer& optim) {
    if (o.shape)
      o.shape->EndStep();
    else
      optim.ZeroGrad();
  }
};

// Under a CPU budget, what was live before the search besides the weights
// (data held in memory) may be what filled it: then the model is not the
// one to shrink.
Status NoFitStatus(const StepContext& ctx) {
  int64_t budget = CpuMemoryBudget(), in_use = CpuBytesInUse(), weights = 0;
  for (const torch::Tensor& p : ctx.model->parameters())
    if (p.device().is_cpu()) weights += static_cast<int64_t>(p.numel() * p.element_size());
  if (!ctx.device.is_cuda() && budget > 0 && (in_use - weights) * 2 > budget)
    return Status::ResourceExhausted(fmt::format(
        "batch 1 does not fit: {} MiB of the {} MiB train.memory_budget_mb were in use before the "
        "batch-size search (the weights and the data held in memory): raise train.memory_budget_mb "
        "or hold less in memory (data.cache_mb, a smaller in-memory dataset)",
        in_use >> 20, budget >> 20));
  // The search's copy of the weights waits in host memory: on a CPU that is
  // the budget the trials run in, and a run with a fixed size holds no copy.
  const std::string copy =
      !ctx.device.is_cuda() && budget > 0 && weights > 0
          ? fmt::format(
                ", or set train.batch_size by hand (the search holds a copy of the "
                "weights, {:.1f} MiB, in the same train.memory_budget_mb; a fixed size "
                "does not)",
                static_cast<double>(weights) / (1 << 20))
          : "";
  return Status::ResourceExhausted(
      "the model does not fit in memory even at batch 1: use a smaller model (model.width, "
      "model.hidden, model.layers), bf16, or a device with more memory" +
      copy);
}

}  // namespace

Result<int64_t> SearchBatchSize(StepContext* ctx, const TrainBatch& probe,
                                const BatchSearchOptions& o,
                                const std::function<void(const BatchTrial&)>& report) {
  // Trials train for real; the weights (and BatchNorm statistics) they change
  // are put back afterwards so the search leaves no trace in the run. The
  // copies wait in host memory: on a GPU a device copy would take the
  // weights' bytes from every trial (on a CPU run this is a clone).
  const Status no_fit = NoFitStatus(*ctx);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;
  try {
    torch::NoGradGuard g;
    auto host_copy = [](const torch::Tensor& t) {
      return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    };
    for (auto& p : ctx->model->parameters()) saved.emplace_back(p, host_copy(p));
    for (auto& b : ctx->model->buffers()) saved.emplace_back(b, host_copy(b));
  } catch (const std::exception& e) {
    if (IsOutOfMemory(e)) return no_fit;
    throw;
  }
  auto restore = [&] {
    if (o.shape) o.shape->End();
    torch::NoGradGuard g;
    for (auto& [live, copy] : saved) {
      if (live.numel() != copy.numel())  // released by stage 3's trials
        live.set_data(torch::empty_like(copy, copy.options().device(live.device())));
      live.copy_(copy);
    }
  };
  Trial trial{ctx, probe, o};
  std::vector<BatchTrial> fits;
  int64_t last_fit = 0, first_fail = 0;
  auto run = [&](int64_t batch) {
    BatchTrial t = trial.Run(batch);
    report(t);
    if (t.error.rfind(kCannotTrainAtOne, 0) == 0) return true;  // try 2
    if (t.fits) {
      fits.push_back(t);
      last_fit = std::max(last_fit, batch);
    } else if (first_fail == 0 || batch < first_fail) {
      first_fail = batch;
    }
    return t.fits;
  };
  try {
    if (o.shape) o.shape->Begin();
    for (int64_t b = 1;; b *= 2) {
      int64_t size = std::min(b, o.max_batch);
      if (!run(size) || size == o.max_batch) break;
    }
    // Bisect to within 1/16 of the limit: closer is not worth the trials.
    while (first_fail > 0 && first_fail - last_fit > std::max<int64_t>(1, last_fit / 16))
      run(last_fit + (first_fail - last_fit) / 2);
  } catch (const std::exception& e) {
    restore();
    std::string what = e.what();
    return Status::Internal("batch-size search failed: " + what.substr(0, what.find('\n')));
  }
  restore();
  if (fits.empty()) return no_fit;
  return PickSearchedBatch(fits, first_fail);
}

int64_t PickSearchedBatch(const std::vector<BatchTrial>& fits, int64_t first_fail) {
  int64_t last_fit = 0;
  for (const BatchTrial& t : fits) last_fit = std::max(last_fit, t.batch);
  // The run holds more than a trial (its data source, evaluation, the
  // allocator's fragmentation), so sizes within 10% of a memory limit are
  // left out; the smallest size always stays eligible.
  int64_t cap = first_fail > 0 ? last_fit * 9 / 10 : last_fit;
  const BatchTrial* best = &fits.front();
  for (const BatchTrial& t : fits)
    if (t.batch <= cap && t.samples_per_s > best->samples_per_s) best = &t;
  return best->batch;
}

}  // namespace fullburn
