// `fullburn train`: the memory model applied to the run (docs/memory.md):
// train.memory_report's probe and `memory` event, the batch search's table
// of the largest micro-batch by setting, and the advice after an
// out-of-memory.
#include <fmt/format.h>

#include <cmath>

#include "memory_model.h"
#include "trainer_impl.h"

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

bool Trainer::MemoryReportWanted() const {
  return set_.train.memory_report || batch_searched_ || set_.train.batch_size.automatic;
}

// Empty when the weights and a gradient for each fit on the device next to
// what it holds (or its memory is unknown), else how much is missing. On the
// CPU the weights are in that memory already.
std::string Trainer::WholeModelShortfall() const {
  const int64_t free = DeviceBytesFree(ctx_.device);
  if (free < 0) return "";
  int64_t weights = 0;
  for (const torch::Tensor& p : ctx_.model->parameters())
    weights += p.numel() * static_cast<int64_t>(p.element_size());
  const int64_t need = ctx_.device.is_cuda() ? 2 * weights : weights;
  if (need <= free) return "";
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  return fmt::format(
      "{} {:.1f} MiB, {:.1f} MiB free on {}",
      ctx_.device.is_cuda() ? "weights and gradients" : "gradients beside the weights", mib(need),
      mib(free), ctx_.device.str());
}

// Fits the activations of the model's checkpoint mode and, for a model with
// blocks, of checkpointing each block. Sync is off: no rank waits for this
// one's gradients.
Status Trainer::ProbeMemory(int64_t batch) {
  TrainBatch probe;
  if (Status s = input_.DrawProbe(&probe); !s.ok()) return s;
  // Half and all of `batch`: the run's own micro-batch at start, so the line
  // is read where it is used; after an out-of-memory a quarter of it.
  int64_t small = std::max<int64_t>(1, batch / 2), large = std::max(small + 1, batch);
  memory_ = ProbedModel(*optim_, probe, small, large);
  return Status::Ok();
}

MemoryModel Trainer::ProbedModel(const Optimizer& optimizer, const TrainBatch& probe, int64_t small,
                                 int64_t large) {
  if (dp_) dp_->SetSync(false);
  MemoryModel m = MemoryModelFor(ctx_.model->parameters(), optimizer, rank_.world_size,
                                 set_.dist.bucket_mb,
                                 ctx_.device.is_cuda() && set_.train.cuda_graphs);
  m.accumulate = accumulate_;
  m.state_on_host = ctx_.device.is_cuda() && set_.dist.offload == "optimizer";
  std::vector<std::vector<torch::Tensor>> blocks;  // (the run's own gather set again)
  if (ctx_.model->SetParameterGather(sharding_.gather(), &blocks)) {
    // model.checkpoint = every_K: stage 3 gathers K blocks at a time (the
    // table's rows for other modes reuse it: over-counted for fewer blocks).
    BlockSplit split = SplitByBlocks(*ctx_.model, blocks,
                                     std::max(1, CheckpointSegment(set_.model.checkpoint)));
    m.gather_bytes =
        TensorBytes(split.outside) +
        (set_.dist.prefetch ? split.largest_pair_bytes : split.largest_block_bytes);
  }
  CountOtherMemory(m);
  m.probed_small = small;
  m.probed_large = large;
  const int64_t knee = LossKnee(*ctx_.model, probe);
  const std::string current = set_.model.checkpoint;
  m.activations[current] = ProbeActivations(&ctx_, probe, small, large, dp_ != nullptr, knee);
  if (current != "blocks" && ctx_.model->SetCheckpointing("blocks")) {
    try {
      m.activations["blocks"] = ProbeActivations(&ctx_, probe, small, large, dp_ != nullptr, knee);
    } catch (...) {
      ctx_.model->SetCheckpointing(current);
      throw;
    }
    ctx_.model->SetCheckpointing(current);
  }
  if (knee == 0) ProbeFusedLoss(probe, small, large, &m);
  return m;
}

// What model.fused_loss would hold, for a model with a loss to fuse that the
// run does not fuse (LossChunkRows() == 0: off, by Model's contract, so off
// is what is put back), in the line Predict reads for the run's setting.
// Advice only: where it runs out of memory, the advice goes without it.
void Trainer::ProbeFusedLoss(const TrainBatch& probe, int64_t small, int64_t large,
                             MemoryModel* m) {
  const std::string current = set_.model.checkpoint;
  const std::string mode = ActivationMode(set_.dist.shard, current, rank_.world_size);
  if (!ctx_.model->SetFusedLoss(true)) return;
  const bool switched = mode != current && ctx_.model->SetCheckpointing(mode);
  auto restore = [&] {
    ctx_.model->SetFusedLoss(false);
    if (switched) ctx_.model->SetCheckpointing(current);
  };
  try {
    if (mode == current || switched)
      m->fused_activations[mode] = ProbeActivations(&ctx_, probe, small, large, dp_ != nullptr,
                                                    LossKnee(*ctx_.model, probe));
  } catch (const std::exception& e) {
    restore();
    if (!IsOutOfMemory(e)) throw;
    FreeDeviceCache(ctx_.device);
    return;
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

// What the run holds besides the training state (the data source's
// buffers, the evaluation set): not the model's, but within the same limit.
void Trainer::CountOtherMemory(const MemoryModel& m) {
  // (A resumed run's optimizer state is the model's, already in use.)
  // dist.shard = full: only the rank's own parameters are whole here.
  const ShardedParameters* own = sharding_.parameters();
  const int64_t weights = own ? own->held_bytes() : m.weight_bytes;
  const int64_t state = m.state_on_host || !optim_ ? 0 : optim_->StateBytes();
  memory_other_ =
      DeviceBytesInUse(ctx_.device) - weights - state - (RunSharding::BucketsHeld(set_, dp_ != nullptr) ? m.grad_bytes : 0);
}

int64_t Trainer::ModelBudget() const {
  // The batch-size search's 10% headroom, less what the run holds besides.
  return DeviceMemoryLimit(ctx_.device) * 9 / 10 - std::max<int64_t>(0, memory_other_);
}

void Trainer::StartMemoryCount() {
  if (!memory_) return;
  ReleaseDeviceCache(ctx_.device);
  CountOtherMemory(*memory_);
  ResetDevicePeak(ctx_.device);
}

nlohmann::json Trainer::MemoryJson(bool measured) const {
  const std::string shard = set_.dist.shard, ckpt = set_.model.checkpoint;
  const int64_t limit = DeviceMemoryLimit(ctx_.device);
  nlohmann::json j{{"rank", rank_.rank},
                   {"world", rank_.world_size},
                   {"batch", batch_},
                   {"shard", shard},
                   {"checkpoint", ckpt},
                   {"limit_bytes", limit},
                   {"per_sample_bytes", memory_->activations.at(ckpt).per_sample},
                   {"predicted", PartsJson(memory_->Predict(batch_, shard, ckpt))}};
  if (measured) {
    j["measured_peak_bytes"] = DevicePeakBytes(ctx_.device) - memory_other_;
    // On CUDA, what the allocator took from the driver for it: the gap is
    // fragmentation, which the model has no term for (docs/memory.md).
    if (int64_t reserved = DeviceReservedPeakBytes(ctx_.device); reserved >= 0)
      j["measured_reserved_peak_bytes"] = reserved - memory_other_;
  }
  j["probed_at"] = {memory_->probed_small, memory_->probed_large};
  for (const auto& [mode, fit] : memory_->activations) j["activation_fit"][mode] = FitJson(fit);
  for (const auto& [mode, fit] : memory_->fused_activations)
    j["fused_loss_fit"][mode] = FitJson(fit);
  nlohmann::json settings = nlohmann::json::array();
  for (const Setting& o : TableSettings(*memory_, ckpt)) {
    nlohmann::json one{{"shard", o.shard},
                       {"checkpoint", o.checkpoint},
                       {"bytes", o.Predict(*memory_, batch_).total()}};
    if (o.fused) one["fused_loss"] = true;
    if (limit > 0) one["largest_batch"] = o.LargestBatch(*memory_, ModelBudget());
    settings.push_back(one);
  }
  j["settings"] = settings;
  return j;
}

void Trainer::RecordMemory() {
  if (!memory_) return;
  nlohmann::json j = MemoryJson(true);
  RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "memory", j.dump()});
  if (rank_.rank == 0 && !opt_.quiet) {
    std::string reserved;
    if (j.contains("measured_reserved_peak_bytes"))
      reserved = " (" + FormatBytes(j["measured_reserved_peak_bytes"].get<int64_t>()) +
                 " reserved from the driver)";
    std::fprintf(stderr, "fullburn: memory per rank: predicted %s, measured peak %s%s\n",
                 FormatBytes(j["predicted"]["total"].get<int64_t>()).c_str(),
                 FormatBytes(j["measured_peak_bytes"].get<int64_t>()).c_str(), reserved.c_str());
  }
}

void Trainer::PrintBatchTable() {
  if (!memory_ || rank_.rank != 0) return;
  const int64_t limit = DeviceMemoryLimit(ctx_.device);
  if (limit <= 0) return;
  const std::string shard = set_.dist.shard, ckpt = set_.model.checkpoint;
  std::fprintf(stderr,
               "fullburn: the largest micro-batch by memory setting (memory model: %s limit, 10%% "
               "headroom, %s held besides the model):\n",
               FormatBytes(limit).c_str(),
               FormatBytes(std::max<int64_t>(0, memory_other_)).c_str());
  for (const Setting& o : TableSettings(*memory_, ckpt)) {
    std::string label = o.Describe(shard, ckpt);
    std::fprintf(stderr, "  %-48s %lld\n", label.empty() ? "as configured" : label.c_str(),
                 static_cast<long long>(o.LargestBatch(*memory_, ModelBudget())));
  }
}

std::string Trainer::OutOfMemoryAdvice() {
  const std::string shard = set_.dist.shard, ckpt = set_.model.checkpoint;
  if (!memory_ || !memory_->activations.count(ckpt)) {
    // dist.shard = full: a probe now would gather on this rank alone.
    if (sharding_.parameters()) return "";
    try {
      if (ctx_.device.is_cuda()) FreeDeviceCache(ctx_.device);
      if (Status s = ProbeMemory(std::max<int64_t>(2, batch_ / 4)); !s.ok()) return "";
    } catch (const std::exception&) {
      return "";  // even a quarter of the batch does not fit: the plain advice
    }
  }
  const int64_t limit = DeviceMemoryLimit(ctx_.device);
  MemoryParts now = memory_->Predict(batch_, shard, ckpt);
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
  for (const std::string& s : memory_->ShardSettings()) {
    full_offered = full_offered || s == "full";
    if (s != shard && s != "full") order.push_back({s, ckpt});
  }
  // The fused loss recomputes the output layer's product, less than
  // checkpointing's every block: at this shard setting, then the others.
  if (memory_->CanPredictFused(shard, ckpt)) order.push_back({shard, ckpt, true});
  for (const std::string& s : memory_->ShardSettings())
    if (s != shard && s != "full" && memory_->CanPredictFused(s, ckpt))
      order.push_back({s, ckpt, true});
  for (const auto& [c, fit] : memory_->activations)
    if (c != ckpt) {
      order.push_back({shard, c});
      for (const std::string& s : memory_->ShardSettings())
        if (s != shard && s != "full") order.push_back({s, c});
    }
  if (full_offered && shard != "full") {
    order.push_back({"full", ckpt});
    if (memory_->CanPredictFused("full", ckpt)) order.push_back({"full", ckpt, true});
  }
  // With a known limit the first (cheapest) that fits; without one the
  // smallest, if it saves at least a tenth.
  std::string fix;
  int64_t fix_bytes = 0;
  for (const Setting& o : order) {
    int64_t bytes = o.Predict(*memory_, batch_).total();
    bool better = limit > 0 ? fix.empty() && bytes <= ModelBudget()
                            : bytes < now.total() * 9 / 10 && (fix.empty() || bytes < fix_bytes);
    if (!better) continue;
    fix = o.Describe(shard, ckpt);
    fix_bytes = bytes;
  }
  MemoryModel accumulating = *memory_;  // the advice raises train.accumulate
  accumulating.accumulate = std::max<int64_t>(2, accumulate_);
  int64_t smaller =
      limit > 0 ? accumulating.LargestBatch(ModelBudget(), shard, ckpt, batch_ - 1) : 0;
  std::string out = advice + ": ";
  if (!fix.empty())
    out += fmt::format("{} {} ({} per rank), or ", fix, limit > 0 ? "fits" : "needs least",
                       FormatBytes(fix_bytes));
  if (smaller > 0) {
    // A divisor of the effective batch keeps it exactly, if one is near.
    const int64_t effective = batch_ * accumulate_;
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
  nlohmann::json j = MemoryJson(false);
  j["oom"] = true;
  j["fix"] = fix;
  j["fix_bytes"] = fix_bytes;
  if (smaller > 0) j["fits_batch"] = smaller;
  RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "memory", j.dump()});
  return out;
}

Status Trainer::ProbeMemoryIfWanted() {
  if (!MemoryReportWanted()) return Status::Ok();
  // The report is advice: a probe that does not fit (the run holds more than
  // the search's trials did, or, sharded, every gradient and for stage 3
  // every weight whole) is read at a quarter of the micro-batch, and left out
  // when that does not fit either; training goes on.
  std::string first_oom;
  for (int64_t size : {batch_, batch_ >= 4 ? batch_ / 4 : int64_t{0}}) {
    if (size == 0) break;
    try {
      if (Status r = ProbeMemory(size); !r.ok()) {
        return r;
      }
      first_oom.clear();
      break;
    } catch (const std::exception& e) {
      if (!IsOutOfMemory(e)) {
        std::string what = e.what();
        return Status::Internal("memory probe failed: " + what.substr(0, what.find('\n')));
      }
      memory_.reset();
      FreeDeviceCache(ctx_.device);
      if (first_oom.empty()) first_oom = DescribeOutOfMemory(e);
    }
  }
  if (!first_oom.empty())
    std::fprintf(stderr,
                 "fullburn: rank %d: no memory report: probing the micro-batch ran out of "
                 "memory (%s); the steps may too\n",
                 rank_.rank, first_oom.c_str());
  if (batch_searched_) PrintBatchTable();
  return Status::Ok();
}

}  // namespace fullburn
