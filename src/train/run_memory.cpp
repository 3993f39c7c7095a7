// RunMemory (run_memory.h): the memory model applied to one run (docs/memory.md).
#include "run_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fullburn/report.h"  // FormatBytes

namespace fullburn {
namespace {

nlohmann::json PartsJson(const MemoryParts& m) {
  return {{"weights", m.weights},         {"gradients", m.gradients}, {"optimizer", m.optimizer},
          {"activations", m.activations}, {"update", m.update},       {"total", m.total()}};
}

// A change of setting and what it costs, cheapest first: the optimizer's
// shard sends what data parallel sends; the gradients' adds waits in
// backward; checkpointing recomputes forward (about a third more compute).
// model.fused_loss recomputes the output layer's product in backward:
// cheaper than checkpointing, which recomputes every block.
struct Setting {
  std::string shard, checkpoint;
  bool fused = false;  // model.fused_loss = true, where the run has it off
  std::string Describe(const std::string& cur_shard, const std::string& cur_ckpt) const {
    std::string out;
    auto add = [&](const std::string& part) { out += (out.empty() ? "" : " and ") + part; };
    if (shard != cur_shard) add("dist.shard = " + shard);
    if (checkpoint != cur_ckpt) add("model.checkpoint = " + checkpoint);
    if (fused) add("model.fused_loss = true");
    return out;
  }
  MemoryParts Predict(const MemoryModel& m, int64_t batch) const {
    return m.Predict(batch, shard, checkpoint, fused);
  }
  int64_t LargestBatch(const MemoryModel& m, int64_t limit) const {
    return m.LargestBatch(limit, shard, checkpoint, 1 << 20, fused);
  }
};

// model.fused_loss: the samples of one loss chunk, where the loss's logits
// stop growing (0: the model's loss is not chunked).
int64_t LossKnee(const Model& model, const TrainBatch& probe) {
  int64_t rows = model.LossChunkRows();
  int64_t positions = probe.targets.dim() >= 2 ? probe.targets.size(1) : 1;
  return rows > 0 ? (rows + positions - 1) / positions : 0;
}

nlohmann::json FitJson(const ActivationFit& fit) {
  return {{"fixed", fit.fixed},
          {"per_sample", fit.per_sample},
          {"knee", fit.knee},
          {"per_sample_above", fit.per_sample_above}};
}

// The probed checkpoint modes, the run's own first.
std::vector<std::string> Modes(const MemoryModel& m, const std::string& current) {
  std::vector<std::string> out = {current};
  for (const auto& [mode, fit] : m.activations)
    if (mode != current) out.push_back(mode);
  return out;
}

// The table's rows: every shard setting with every probed mode, then the
// shard settings model.fused_loss was probed for.
std::vector<Setting> TableSettings(const MemoryModel& m, const std::string& ckpt) {
  std::vector<Setting> out;
  for (const std::string& s : m.ShardSettings())
    for (const std::string& c : Modes(m, ckpt)) out.push_back({s, c});
  for (const std::string& s : m.ShardSettings())
    if (m.CanPredictFused(s, ckpt)) out.push_back({s, ckpt, true});
  return out;
}

}  // namespace

bool RunMemory::Wanted(const TrainSettings& settings, bool batch_searched) {
  return settings.train.memory_report || batch_searched || settings.train.batch_size.automatic;
}

std::string RunMemory::WholeModelShortfall(const StepContext& ctx) {
  const int64_t free = DeviceBytesFree(ctx.device);
  if (free < 0) return "";
  int64_t weights = 0;
  for (const torch::Tensor& p : ctx.model->parameters())
    weights += p.numel() * static_cast<int64_t>(p.element_size());
  const int64_t need = ctx.device.is_cuda() ? 2 * weights : weights;
  if (need <= free) return "";
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  return fmt::format(
      "{} {:.1f} MiB, {:.1f} MiB free on {}",
      ctx.device.is_cuda() ? "weights and gradients" : "gradients beside the weights", mib(need),
      mib(free), ctx.device.str());
}

// Fits the activations of the model's checkpoint mode and, for a model with
// blocks, of checkpointing each block. Sync is off: no rank waits for this
// one's gradients.
Status RunMemory::Probe(int64_t batch) {
  TrainBatch probe;
  if (Status s = b_.input->DrawProbe(&probe); !s.ok()) return s;
  // Half and all of `batch`: the run's own micro-batch at start, so the line
  // is read where it is used; after an out-of-memory a quarter of it.
  int64_t small = std::max<int64_t>(1, batch / 2), large = std::max(small + 1, batch);
  model_ = ProbedModel(*b_.optimizer, probe, small, large);
  return Status::Ok();
}

MemoryModel RunMemory::ProbedModel(const Optimizer& optimizer, const TrainBatch& probe,
                                   int64_t small, int64_t large) {
  if (b_.dp) b_.dp->SetSync(false);
  MemoryModel m =
      MemoryModelFor(b_.ctx->model->parameters(), optimizer, b_.world, b_.settings->dist.bucket_mb,
                     b_.ctx->device.is_cuda() && b_.settings->train.cuda_graphs);
  m.accumulate = b_.accumulate;
  m.state_on_host = b_.ctx->device.is_cuda() && b_.settings->dist.offload == "optimizer";
  std::vector<std::vector<torch::Tensor>> blocks;  // (the run's own gather set again)
  if (b_.ctx->model->SetParameterGather(b_.sharding->gather(), &blocks)) {
    // model.checkpoint = every_K: stage 3 gathers K blocks at a time (the
    // table's rows for other modes reuse it: over-counted for fewer blocks).
    BlockSplit split = SplitByBlocks(*b_.ctx->model, blocks,
                                     std::max(1, CheckpointSegment(b_.settings->model.checkpoint)));
    m.gather_bytes =
        TensorBytes(split.outside) +
        (b_.settings->dist.prefetch ? split.largest_pair_bytes : split.largest_block_bytes);
  }
  CountOther(m);
  m.probed_small = small;
  m.probed_large = large;
  const int64_t knee = LossKnee(*b_.ctx->model, probe);
  const std::string current = b_.settings->model.checkpoint;
  m.activations[current] = ProbeActivations(b_.ctx, probe, small, large, b_.dp != nullptr, knee);
  if (current != "blocks" && b_.ctx->model->SetCheckpointing("blocks")) {
    try {
      m.activations["blocks"] =
          ProbeActivations(b_.ctx, probe, small, large, b_.dp != nullptr, knee);
    } catch (...) {
      b_.ctx->model->SetCheckpointing(current);
      throw;
    }
    b_.ctx->model->SetCheckpointing(current);
  }
  if (knee == 0) ProbeFusedLoss(probe, small, large, &m);
  return m;
}

// What model.fused_loss would hold, for a model with a loss to fuse that the
// run does not fuse (LossChunkRows() == 0: off, by Model's contract, so off
// is what is put back), in the line Predict reads for the run's setting.
// Advice only: where it runs out of memory, the advice goes without it.
void RunMemory::ProbeFusedLoss(const TrainBatch& probe, int64_t small, int64_t large,
                               MemoryModel* m) {
  const std::string current = b_.settings->model.checkpoint;
  const std::string mode = ActivationMode(b_.settings->dist.shard, current, b_.world);
  if (!b_.ctx->model->SetFusedLoss(true)) return;
  const bool switched = mode != current && b_.ctx->model->SetCheckpointing(mode);
  auto restore = [&] {
    b_.ctx->model->SetFusedLoss(false);
    if (switched) b_.ctx->model->SetCheckpointing(current);
  };
  try {
    if (mode == current || switched)
      m->fused_activations[mode] = ProbeActivations(b_.ctx, probe, small, large, b_.dp != nullptr,
                                                    LossKnee(*b_.ctx->model, probe));
  } catch (const std::exception& e) {
    restore();
    if (!IsOutOfMemory(e)) throw;
    FreeDeviceCache(b_.ctx->device);
    return;
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

// What the run holds besides the training state (the data source's
// buffers, the evaluation set): not the model's, but within the same limit.
void RunMemory::CountOther(const MemoryModel& m) {
  // (A resumed run's optimizer state is the model's, already in use.)
  // dist.shard = full: only the rank's own parameters are whole here.
  const ShardedParameters* own = b_.sharding->parameters();
  const int64_t weights = own ? own->held_bytes() : m.weight_bytes;
  const int64_t state = m.state_on_host || !b_.optimizer ? 0 : b_.optimizer->StateBytes();
  other_bytes_ = DeviceBytesInUse(b_.ctx->device) - weights - state -
                 (RunSharding::BucketsHeld(*b_.settings, b_.dp != nullptr) ? m.grad_bytes : 0);
}

int64_t RunMemory::Budget() const {
  // The batch-size search's 10% headroom, less what the run holds besides.
  return DeviceMemoryLimit(b_.ctx->device) * 9 / 10 - std::max<int64_t>(0, other_bytes_);
}

void RunMemory::StartCount() {
  if (!model_) return;
  ReleaseDeviceCache(b_.ctx->device);
  CountOther(*model_);
  ResetDevicePeak(b_.ctx->device);
}

nlohmann::json RunMemory::Json(bool measured) const {
  const std::string shard = b_.settings->dist.shard, ckpt = b_.settings->model.checkpoint;
  const int64_t limit = DeviceMemoryLimit(b_.ctx->device);
  nlohmann::json j{{"rank", b_.rank},
                   {"world", b_.world},
                   {"batch", b_.batch},
                   {"shard", shard},
                   {"checkpoint", ckpt},
                   {"limit_bytes", limit},
                   {"per_sample_bytes", model_->activations.at(ckpt).per_sample},
                   {"predicted", PartsJson(model_->Predict(b_.batch, shard, ckpt))}};
  if (measured) {
    j["measured_peak_bytes"] = DevicePeakBytes(b_.ctx->device) - other_bytes_;
    // On CUDA, what the allocator took from the driver for it: the gap is
    // fragmentation, which the model has no term for (docs/memory.md).
    if (int64_t reserved = DeviceReservedPeakBytes(b_.ctx->device); reserved >= 0)
      j["measured_reserved_peak_bytes"] = reserved - other_bytes_;
  }
  j["probed_at"] = {model_->probed_small, model_->probed_large};
  for (const auto& [mode, fit] : model_->activations) j["activation_fit"][mode] = FitJson(fit);
  for (const auto& [mode, fit] : model_->fused_activations)
    j["fused_loss_fit"][mode] = FitJson(fit);
  nlohmann::json settings = nlohmann::json::array();
  for (const Setting& o : TableSettings(*model_, ckpt)) {
    nlohmann::json one{{"shard", o.shard},
                       {"checkpoint", o.checkpoint},
                       {"bytes", o.Predict(*model_, b_.batch).total()}};
    if (o.fused) one["fused_loss"] = true;
    if (limit > 0) one["largest_batch"] = o.LargestBatch(*model_, Budget());
    settings.push_back(one);
  }
  j["settings"] = settings;
  return j;
}

std::optional<nlohmann::json> RunMemory::MeasuredEvent() const {
  if (!model_) return std::nullopt;
  nlohmann::json j = Json(true);
  if (b_.rank == 0 && !b_.quiet) {
    std::string reserved;
    if (j.contains("measured_reserved_peak_bytes"))
      reserved = " (" + FormatBytes(j["measured_reserved_peak_bytes"].get<int64_t>()) +
                 " reserved from the driver)";
    std::fprintf(stderr, "fullburn: memory per rank: predicted %s, measured peak %s%s\n",
                 FormatBytes(j["predicted"]["total"].get<int64_t>()).c_str(),
                 FormatBytes(j["measured_peak_bytes"].get<int64_t>()).c_str(), reserved.c_str());
  }
  return j;
}

void RunMemory::PrintTable() {
  if (!model_ || b_.rank != 0) return;
  const int64_t limit = DeviceMemoryLimit(b_.ctx->device);
  if (limit <= 0) return;
  const std::string shard = b_.settings->dist.shard, ckpt = b_.settings->model.checkpoint;
  std::fprintf(stderr,
               "fullburn: the largest micro-batch by memory setting (memory model: %s limit, 10%% "
               "headroom, %s held besides the model):\n",
               FormatBytes(limit).c_str(), FormatBytes(std::max<int64_t>(0, other_bytes_)).c_str());
  for (const Setting& o : TableSettings(*model_, ckpt)) {
    std::string label = o.Describe(shard, ckpt);
    std::fprintf(stderr, "  %-48s %lld\n", label.empty() ? "as configured" : label.c_str(),
                 static_cast<long long>(o.LargestBatch(*model_, Budget())));
  }
}

std::string RunMemory::OutOfMemoryAdvice(nlohmann::json* event) {
  const std::string shard = b_.settings->dist.shard, ckpt = b_.settings->model.checkpoint;
  if (!model_ || !model_->activations.count(ckpt)) {
    // dist.shard = full: a probe now would gather on this rank alone.
    if (b_.sharding->parameters()) return "";
    try {
      if (b_.ctx->device.is_cuda()) FreeDeviceCache(b_.ctx->device);
      if (Status s = Probe(std::max<int64_t>(2, b_.batch / 4)); !s.ok()) return "";
    } catch (const std::exception&) {
      return "";  // even a quarter of the batch does not fit: the plain advice
    }
  }
  const int64_t limit = DeviceMemoryLimit(b_.ctx->device);
  MemoryParts now = model_->Predict(b_.batch, shard, ckpt);
  std::string advice = fmt::format(
      " (memory model: {} per rank, weights {}, gradients {}, optimizer {}, activations {}{}{})",
      FormatBytes(now.total()), FormatBytes(now.weights), FormatBytes(now.gradients),
      FormatBytes(now.optimizer), FormatBytes(now.activations),
      now.update > now.gradients + now.activations
          ? ", at the peak the update's " + FormatBytes(now.update) + " in their place"
          : "",
      limit > 0 ? ", limit " + FormatBytes(limit) : "");
  // The cheapest change that fits at this micro-batch, with 10% headroom.
  // Stage 3 last: it costs the recompute of checkpointing and more
  // communication than the others.
  std::vector<Setting> order;
  bool full_offered = false;
  for (const std::string& s : model_->ShardSettings()) {
    full_offered = full_offered || s == "full";
    if (s != shard && s != "full") order.push_back({s, ckpt});
  }
  // The fused loss recomputes the output layer's product, less than
  // checkpointing's every block: at this shard setting, then the others.
  if (model_->CanPredictFused(shard, ckpt)) order.push_back({shard, ckpt, true});
  for (const std::string& s : model_->ShardSettings())
    if (s != shard && s != "full" && model_->CanPredictFused(s, ckpt))
      order.push_back({s, ckpt, true});
  for (const auto& [c, fit] : model_->activations)
    if (c != ckpt) {
      order.push_back({shard, c});
      for (const std::string& s : model_->ShardSettings())
        if (s != shard && s != "full") order.push_back({s, c});
    }
  if (full_offered && shard != "full") {
    order.push_back({"full", ckpt});
    if (model_->CanPredictFused("full", ckpt)) order.push_back({"full", ckpt, true});
  }
  // With a known limit the first (cheapest) that fits; without one the
  // smallest, if it saves at least a tenth.
  std::string fix;
  int64_t fix_bytes = 0;
  for (const Setting& o : order) {
    int64_t bytes = o.Predict(*model_, b_.batch).total();
    bool better = limit > 0 ? fix.empty() && bytes <= Budget()
                            : bytes < now.total() * 9 / 10 && (fix.empty() || bytes < fix_bytes);
    if (!better) continue;
    fix = o.Describe(shard, ckpt);
    fix_bytes = bytes;
  }
  MemoryModel accumulating = *model_;  // the advice raises train.accumulate
  accumulating.accumulate = std::max<int64_t>(2, b_.accumulate);
  int64_t smaller = limit > 0 ? accumulating.LargestBatch(Budget(), shard, ckpt, b_.batch - 1) : 0;
  std::string out = advice + ": ";
  if (!fix.empty())
    out += fmt::format("{} {} ({} per rank), or ", fix, limit > 0 ? "fits" : "needs least",
                       FormatBytes(fix_bytes));
  if (smaller > 0) {
    // A divisor of the effective batch keeps it exactly, if one is near.
    const int64_t effective = b_.batch * b_.accumulate;
    int64_t micro = smaller;
    for (int64_t k = smaller; k * 2 > smaller; --k)
      if (effective % k == 0) {
        micro = k;
        break;
      }
    smaller = micro;
    int64_t acc = (effective + micro - 1) / micro;
    out += fmt::format("train.batch_size = {} with train.accumulate = {} {} the effective batch",
                       micro, acc, effective % micro == 0 ? "keeps" : "about keeps");
  } else {
    out +=
        "lower train.batch_size (or use auto) and raise train.accumulate to keep the effective "
        "batch";
  }
  nlohmann::json j = Json(false);
  j["oom"] = true;
  j["fix"] = fix;
  j["fix_bytes"] = fix_bytes;
  if (smaller > 0) j["fits_batch"] = smaller;
  *event = std::move(j);
  return out;
}

Status RunMemory::ProbeIfWanted() {
  if (!Wanted(*b_.settings, b_.batch_searched)) return Status::Ok();
  // The report is advice: a probe that does not fit (the run holds more than
  // the search's trials did, or, sharded, every gradient and for stage 3
  // every weight whole) is read at a quarter of the micro-batch, and left out
  // when that does not fit either; training goes on.
  std::string first_oom;
  for (int64_t size : {b_.batch, b_.batch >= 4 ? b_.batch / 4 : int64_t{0}}) {
    if (size == 0) break;
    try {
      if (Status r = Probe(size); !r.ok()) {
        return r;
      }
      first_oom.clear();
      break;
    } catch (const std::exception& e) {
      if (!IsOutOfMemory(e)) {
        std::string what = e.what();
        return Status::Internal("memory probe failed: " + what.substr(0, what.find('\n')));
      }
      model_.reset();
      FreeDeviceCache(b_.ctx->device);
      if (first_oom.empty()) first_oom = DescribeOutOfMemory(e);
    }
  }
  if (!first_oom.empty())
    std::fprintf(stderr,
                 "fullburn: rank %d: no memory report: probing the micro-batch ran out of "
                 "memory (%s); the steps may too\n",
                 b_.rank, first_oom.c_str());
  if (b_.batch_searched) PrintTable();
  return Status::Ok();
}

}  // namespace fullburn
