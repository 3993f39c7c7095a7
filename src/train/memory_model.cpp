// The memory model and its probe (docs/memory.md).
#include "memory_model.h"

#include <algorithm>
#include <cstdlib>

#ifdef FULLBURN_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "fullburn/cpu_memory_budget.h"
#include "fullburn/env.h"
#include "trainer_impl.h"

namespace fullburn {

std::string ActivationMode(const std::string& shard, const std::string& checkpoint, int world) {
  return world > 1 && shard == "full" && checkpoint == "none" ? "blocks" : checkpoint;
}

bool MemoryModel::CanPredictFused(const std::string& shard, const std::string& checkpoint) const {
  return fused_activations.count(ActivationMode(shard, checkpoint, world)) > 0;
}

MemoryParts MemoryModel::Predict(int64_t batch, const std::string& shard,
                                 const std::string& checkpoint, bool fused_loss) const {
  MemoryParts m;
  const bool sharded = world > 1 && shard != "none";
  const bool full = sharded && shard == "full";
  // Stage 3: the rank's own parameters (1/N within one) and one gather.
  m.weights = full ? weight_bytes / world + largest_grad_bytes + std::max<int64_t>(0, gather_bytes)
                   : weight_bytes;
  // Sharded, a rank keeps its owners' share: 1/N, within one parameter.
  m.optimizer = sharded ? state_bytes / world + largest_state_bytes : state_bytes;
  if (state_on_host) m.optimizer = 0;
  const bool grads_sharded = sharded && (shard == "gradients" || full);
  if (accumulate > 1 && (world == 1 || grads_sharded)) {
    // Micro-batches after the first run with every gradient alive (one
    // process's, or stage 2's unsent no-sync ones).
    m.gradients = grad_bytes;
  } else if (world == 1) {
    // One process sets gradients to none after each step: they are made
    // during backward as activations are freed, inside the probed step
    // (probed with gradients set to none).
    m.gradients = 0;
  } else if (grads_sharded) {
    // Between steps no gradient is kept; at the peak (backward's start, all
    // activations alive) the first buckets are filling. The rank's own
    // gradients come later, as activations are freed (with several ranks
    // the probe accumulates in place: its line is activations alone).
    m.gradients = std::min(grad_bytes, 2 * bucket_bytes);
  } else {
    m.gradients = grad_bytes;  // the buckets, kept between steps
  }
  // The update: the rank's gradients all made, the activations freed. With
  // the state on the host, the update and its temporaries are there too.
  const int64_t grads_kept =
      grads_sharded ? std::min(grad_bytes, grad_bytes / world + largest_grad_bytes) : grad_bytes;
  m.update = grads_kept + (state_on_host ? 0
                           : sharded     ? update_temp_share_bytes
                                         : update_temp_bytes);
  // Stages 1 and 2 then broadcast the updated weights from their owners, a
  // few buckets at a time (DataParallel::BroadcastFromOwners: two in flight
  // and the next one flattened), with the gradients still held.
  if (sharded && !full)
    m.update = std::max(m.update, grads_kept + std::min(grad_bytes, 3 * bucket_bytes));
  const auto& fits = fused_loss ? fused_activations : activations;
  auto fit = fits.find(ActivationMode(shard, checkpoint, world));
  if (fit != fits.end()) m.activations = static_cast<int64_t>(std::max(0.0, fit->second.At(batch)));
  return m;
}

int64_t MemoryModel::LargestBatch(int64_t limit, const std::string& shard,
                                  const std::string& checkpoint, int64_t max_batch,
                                  bool fused_loss) const {
  auto fits = [&](int64_t b) { return Predict(b, shard, checkpoint, fused_loss).total() <= limit; };
  if (max_batch < 1 || !fits(1)) return 0;
  int64_t lo = 1, hi = max_batch;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

std::vector<std::string> MemoryModel::ShardSettings() const {
  if (world < 2) return {"none"};
  if (gather_bytes < 0) return {"none", "optimizer", "gradients"};
  return {"none", "optimizer", "gradients", "full"};
}

MemoryModel MemoryModelFor(const std::vector<torch::Tensor>& params, const Optimizer& optimizer,
                           int world, double bucket_mb, bool gated) {
  MemoryModel m;
  m.world = std::max(1, world);
  m.bucket_bytes = static_cast<int64_t>(bucket_mb * 1e6);
  const int64_t slots = static_cast<int64_t>(optimizer.StateSlots().size());
  std::vector<int64_t> trainable;
  for (const torch::Tensor& p : params) {
    int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    m.weight_bytes += bytes;
    if (!p.requires_grad()) continue;
    trainable.push_back(bytes);
    m.grad_bytes += bytes;
    m.largest_grad_bytes = std::max(m.largest_grad_bytes, bytes);
    m.state_bytes += slots * bytes;  // the state takes the parameter's dtype
    m.largest_state_bytes = std::max(m.largest_state_bytes, slots * bytes);
  }
  const OptimizerOptions& o = optimizer.options();
  m.update_temp_bytes = Optimizer::UpdateTemporaryBytes(o, trainable, gated);
  // A share: the parameters in update order up to 1/N of the bytes (the
  // owners' split is by bytes too), never more than the whole.
  std::vector<int64_t> share;
  int64_t held = 0;
  for (int64_t bytes : trainable) {
    if (held >= m.grad_bytes / m.world) break;
    share.push_back(bytes);
    held += bytes;
  }
  m.update_temp_share_bytes =
      std::min(m.update_temp_bytes, Optimizer::UpdateTemporaryBytes(o, share, gated));
  return m;
}

namespace {
#ifdef FULLBURN_TORCH_CUDA
c10::DeviceIndex CudaIndex(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
// The caching allocator's counters at one moment: bytes allocated to
// tensors (max_memory_allocated's) and reserved from the driver (tensors and
// cache, max_memory_reserved's: more than the tensors by what it rounds and
// what its blocks leave unused between them). By `auto` and index 0
// (StatType::AGGREGATE, all pools), so the code stays the same where torch
// 2.x moved the stat types. Zeros before CUDA's lazy initialization, when
// the allocator refuses the device and holds nothing yet.
struct CudaAllocatorBytes {
  int64_t allocated = 0, allocated_peak = 0, reserved = 0, reserved_peak = 0;
};
CudaAllocatorBytes ReadCudaAllocator(const torch::Device& device) {
  CudaAllocatorBytes b;
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
    b.allocated = stats.allocated_bytes[0].current;
    b.allocated_peak = stats.allocated_bytes[0].peak;
    b.reserved = stats.reserved_bytes[0].current;
    b.reserved_peak = stats.reserved_bytes[0].peak;
  } catch (const c10::Error&) {
  }
  return b;
}
int64_t CudaAllocatedBytes(const torch::Device& device, bool peak) {
  CudaAllocatorBytes b = ReadCudaAllocator(device);
  return peak ? b.allocated_peak : b.allocated;
}
// The driver's free bytes on a CUDA device; -1 where unknown.
int64_t CudaDriverFreeBytes(const torch::Device& device) {
  size_t free = 0, total = 0;
  c10::cuda::CUDAGuard guard(CudaIndex(device));
  return cudaMemGetInfo(&free, &total) == cudaSuccess ? static_cast<int64_t>(free) : -1;
}
#endif
}  // namespace

void ResetDevicePeak(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef FULLBURN_TORCH_CUDA
    c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device));
#endif
    return;
  }
  ResetCpuPeakBytes();
}

namespace {
// Tensor bytes on the device: the peak since the last reset, or now.
int64_t DeviceAllocated(const torch::Device& device, bool peak) {
  if (!device.is_cuda()) return peak ? CpuPeakBytes() : CpuBytesInUse();
#ifdef FULLBURN_TORCH_CUDA
  return CudaAllocatedBytes(device, peak);
#else
  return 0;
#endif
}
}  // namespace

int64_t DevicePeakBytes(const torch::Device& device) { return DeviceAllocated(device, true); }
int64_t DeviceBytesInUse(const torch::Device& device) { return DeviceAllocated(device, false); }

int64_t DeviceMemoryLimit(const torch::Device& device) {
  if (!device.is_cuda()) return CpuMemoryBudget();
#ifdef FULLBURN_TORCH_CUDA
  // Not the card's total: the CUDA context, other libraries and other
  // processes hold part of it (a second rank on the same GPU, another job).
  // The allocator read first: what another thread takes in between then
  // lowers the sum rather than counting twice.
  const int64_t reserved = ReadCudaAllocator(device).reserved;
  const int64_t free = CudaDriverFreeBytes(device);
  if (free >= 0) return free + reserved;
#endif
  return 0;
}

int64_t DeviceReservedPeakBytes(const torch::Device& device) {
#ifdef FULLBURN_TORCH_CUDA
  if (device.is_cuda()) return ReadCudaAllocator(device).reserved_peak;
#else
  (void)device;
#endif
  return -1;
}

void ReleaseDeviceCache(const torch::Device& device) {
#ifdef FULLBURN_TORCH_CUDA
  if (!device.is_cuda()) return;
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

int64_t DeviceBytesFree(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef FULLBURN_TORCH_CUDA
    // The allocator's cache is free for this process's tensors too.
    const CudaAllocatorBytes held = ReadCudaAllocator(device);
    const int64_t free = CudaDriverFreeBytes(device);
    if (free >= 0) return free + held.reserved - held.allocated;
#endif
    return -1;
  }
  if (CpuMemoryBudget() <= 0) return -1;
  return std::max<int64_t>(0, CpuMemoryBudget() - DeviceBytesInUse(device));
}

int64_t HostBytesAvailable(const torch::Device& device) {
  if (!device.is_cuda() && CpuMemoryBudget() > 0)
    return std::max<int64_t>(0, CpuMemoryBudget() - DeviceBytesInUse(device));
  Result<std::string> meminfo = Env::Default()->ReadFile("/proc/meminfo");
  if (!meminfo.ok()) return -1;
  size_t at = meminfo->find("MemAvailable:");
  if (at == std::string::npos) return -1;
  return std::strtoll(meminfo->c_str() + at + 13, nullptr, 10) * 1024;  // kB
}

int64_t ProbeStepBytes(StepContext* ctx, const TrainBatch& probe, int64_t batch,
                       bool grads_in_place) {
  torch::Tensor rng;  // before the sample draw, which advances it too
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  TrainBatch b = SampleBatch(*ctx, probe, batch);
  // The probe leaves no trace: gradients, BatchNorm statistics and the CPU
  // generator (dropout, sampling) are put back.
  std::vector<torch::Tensor> params = ctx->model->parameters();
  std::vector<torch::Tensor> saved_grads, buffers = ctx->model->buffers(), saved_buffers;
  for (torch::Tensor& p : params) {
    saved_grads.push_back(p.grad());
    // In place: zeros allocated before `before`, so only activations and
    // temporaries are counted (data parallel's buckets hold gradients for good).
    p.mutable_grad() = grads_in_place && p.requires_grad() ? torch::zeros_like(p) : torch::Tensor();
  }
  for (const torch::Tensor& t : buffers) saved_buffers.push_back(t.clone());
  auto restore = [&] {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = saved_grads[i];
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved_buffers[i]);
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  };
  if (ctx->device.is_cuda()) FreeDeviceCache(ctx->device);
  int64_t before = DeviceBytesInUse(ctx->device);
  ResetDevicePeak(ctx->device);
  try {
    LossScaler scaler(LossScalerOptions{});
    ForwardBackward(*ctx, b, 1, scaler, false, nullptr);
  } catch (...) {
    restore();
    throw;
  }
  if (ctx->device.is_cuda()) FreeDeviceCache(ctx->device);
  int64_t peak = DevicePeakBytes(ctx->device) - before;
  restore();
  return peak;
}

ActivationFit ProbeActivations(StepContext* ctx, const TrainBatch& probe, int64_t small,
                               int64_t large, bool grads_in_place, int64_t knee) {
  // Each size twice, the smaller reading kept: the first pass of a shape
  // may allocate what later ones reuse (oneDNN's and cuDNN's workspaces).
  auto measure = [&](int64_t batch) {
    int64_t a = ProbeStepBytes(ctx, probe, batch, grads_in_place);
    return static_cast<double>(std::min(a, ProbeStepBytes(ctx, probe, batch, grads_in_place)));
  };
  auto line = [](int64_t b0, double p0, int64_t b1, double p1) {
    ActivationFit fit;
    fit.per_sample = std::max(0.0, (p1 - p0) / static_cast<double>(b1 - b0));
    fit.fixed = p0 - fit.per_sample * static_cast<double>(b0);
    return fit;
  };
  if (knee > small && knee < large) {  // both sides of the bend
    double p_small = measure(small), p_knee = measure(knee), p_large = measure(large);
    ActivationFit fit = line(small, p_small, knee, p_knee);
    fit.knee = knee;
    fit.per_sample_above = std::max(0.0, (p_large - p_knee) / static_cast<double>(large - knee));
    return fit;
  }
  // With both sizes past the knee the line is the slope above it: below
  // `small` it over-predicts by at most one chunk (the safe side).
  ActivationFit fit = line(small, measure(small), large, measure(large));
  if (knee >= large && 2 * knee <= 8 * large) {
    try {
      double p_above = measure(2 * knee);
      fit.per_sample_above = std::max(0.0, (p_above - fit.At(knee)) / static_cast<double>(knee));
      fit.knee = knee;
    } catch (const std::exception& e) {
      if (!IsOutOfMemory(e)) throw;
      FreeDeviceCache(ctx->device);  // the line goes on: it over-predicts above the knee
    }
  }
  return fit;
}

}  // namespace fullburn
