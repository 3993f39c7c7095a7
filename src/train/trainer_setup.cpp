// `fullburn train`'s setup: device and threads, data, the micro-batch
// (configured or searched), model, optimizer, loss scaler and schedule.
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <malloc.h>

#include <filesystem>
#include <thread>

#include "fullburn/cpu_memory_budget.h"
#include "trainer_impl.h"

namespace fullburn {

// (train.keep_host_memory) glibc returns a freed block past its thresholds
// to the OS (munmap, or trimming the heap top), so every step's gradients
// and activations are faulted in again page by page: a third to a half of a
// CPU backward in our measurement (docs/benchmarks.md). Keeping freed memory
// in the process, as jemalloc and tcmalloc do, makes a steady training loop
// fault-free. Blocks past 32 MiB (glibc's ceiling for the threshold) are
// still mapped each time.
void KeepHostMemory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

namespace {

void ThrowIfFailed(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}

// Data parallel's batch-size trials step as this rank will in the run, each
// rank alone (DataParallel::SetLocal: a rank out of memory in a trial leaves
// no other waiting in a collective), so a trial holds what the run's rank
// holds: the buckets the gradients live in; sharded, the rank's share of
// the optimizer state, of the gradients (stage 2: a bucket exists only
// while backward fills it) and of the weights (stage 3: the others'
// allocated block by block as the run gathers them), and stage 1's
// broadcast buffers after the update. What the trials do not measure is the
// time the collectives take.
class RankTrialShape : public TrialShape {
 public:
  // `owners`: DataParallel::ShardOwners of `trainable`.
  RankTrialShape(DataParallel* dp, Model* model, std::string shard, bool prefetch,
                 std::vector<torch::Tensor> trainable, std::vector<int> owners)
      : dp_(dp),
        model_(model),
        shard_(std::move(shard)),
        prefetch_(prefetch),
        trainable_(std::move(trainable)),
        owners_(std::move(owners)) {}

  void Begin() override {
    if (shard_ == "gradients" || shard_ == "full")
      ThrowIfFailed(dp_->ShardGradients(trainable_, owners_));  // the run lays them out alike
    if (shard_ == "full") {
      auto gather = std::make_shared<ShardedParameters>(dp_, trainable_, owners_);
      std::vector<std::vector<torch::Tensor>> blocks;
      if (model_->SetParameterGather(gather, &blocks)) {  // (BuildModel refused one without)
        gather->SetBlocks(blocks, prefetch_);
        gather->ReleaseAll();
        gather_ = gather;
      }
    }
    dp_->SetLocal(true);
    dp_->SetSync(true);
  }
  void AfterBackward() override { ThrowIfFailed(dp_->FinishGradients()); }
  void AfterUpdate() override {
    if (shard_ == "optimizer" || shard_ == "gradients")
      ThrowIfFailed(dp_->BroadcastFromOwners(trainable_, owners_));
  }
  void EndStep() override {
    dp_->ResetStep();  // allocates nothing: safe after an out-of-memory
    if (gather_) gather_->ReleaseAll();
  }
  void End() override {
    if (gather_) {
      gather_->ReleaseAll();
      std::vector<std::vector<torch::Tensor>> blocks;
      model_->SetParameterGather(nullptr, &blocks);
      gather_.reset();
    }
    dp_->SetLocal(false);
    dp_->SetSync(false);
  }

 private:
  DataParallel* dp_;
  Model* model_;
  const std::string shard_;
  const bool prefetch_;
  const std::vector<torch::Tensor> trainable_;
  const std::vector<int> owners_;
  std::shared_ptr<ShardedParameters> gather_;
};

}  // namespace

Status Trainer::CheckCudaGraphs() {
  if (std::string why = CudaGraph::Unsupported(); !why.empty())
    return Status::InvalidArgument("train.cuda_graphs needs CUDA, but " + why +
                                   ": set train.cuda_graphs = false");
  if (!model_.ctx().device.is_cuda())
    return Status::InvalidArgument("train.cuda_graphs needs train.device = cuda, not " +
                                   model_.ctx().device.str() + ": set train.cuda_graphs = false");
  if (rank_.world_size > 1)
    return Status::InvalidArgument(
        "train.cuda_graphs works on one rank only (Gloo's all-reduce cannot be captured in a "
        "graph): set train.cuda_graphs = false for data-parallel runs");
  // Cast weights cached by autocast would be freed after the capture while
  // the graph still reads them; without the cache each forward casts anew.
  at::autocast::set_autocast_cache_enabled(false);
  return Status::Ok();
}

// Device, threads, precision and the CUDA switches, from the config.
Status Trainer::SetupDevice() {
  std::string dev = set_.train.device;
  if (dev == "auto") dev = torch::cuda::is_available() ? "cuda" : "cpu";
  try {
    model_.ctx().device = torch::Device(dev);
  } catch (const c10::Error&) {
    return Status::InvalidArgument("train.device = " + dev +
                                   " is not a device: use auto, cpu, cuda or cuda:N");
  }
  if (model_.ctx().device.is_cuda() && !torch::cuda::is_available())
    return Status::InvalidArgument("train.device = " + dev + " but this libtorch sees no GPU (" +
                                   TorchDescription() + "): use train.device=cpu");
  auto ranks = RankFromEnvironment(EnvironmentMap());
  if (!ranks.ok()) return ranks.status();
  if (ranks->has_value()) rank_ = **ranks;
  // One GPU per local rank, unless the config names one.
  if (model_.ctx().device.is_cuda() && rank_.world_size > 1 && !model_.ctx().device.has_index())
    model_.ctx().device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                  rank_.local_rank % torch::cuda::device_count()));
  // Every CPU of this rank's share, the loader's too: its threads sleep
  // whenever it keeps ahead, and a core held back for it sat idle (the demo
  // on 2 cores ran 1.35-1.56x faster on 2 threads than on 1).
  int cpus = RankCpus(ReadCpuView(Env::Default()), rank_.local_world_size);
  int threads = static_cast<int>(set_.train.threads);
  torch::set_num_threads(threads > 0 ? threads : cpus);
  spec_.loader_cpu_budget = std::max(1, cpus - 1);
  if (set_.train.keep_host_memory) KeepHostMemory();
  torch::manual_seed(static_cast<uint64_t>(set_.train.seed));

  const std::string& precision = set_.train.precision;
  if (precision == "bf16") model_.ctx().autocast = torch::kBFloat16;
  if (precision == "fp16") {
    if (!model_.ctx().device.is_cuda())
      return Status::InvalidArgument(
          "train.precision = fp16 needs a CUDA device (CPU autocast has no fp16 "
          "in libtorch 1.13): use bf16 on CPU");
    model_.ctx().autocast = torch::kHalf;
  }
  if (set_.train.cuda_graphs)
    if (Status s = CheckCudaGraphs(); !s.ok()) return s;
  model_.ctx().events = PhaseEvents::ForDevice(model_.ctx().device);
  if (model_.ctx().device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(set_.train.tf32);
    at::globalContext().setAllowTF32CuDNN(set_.train.tf32);
    at::globalContext().setBenchmarkCuDNN(set_.train.cudnn_benchmark);
  }
  if (int64_t mb = set_.train.memory_budget_mb; mb > 0) {
    if (model_.ctx().device.is_cuda())
      std::fprintf(stderr,
                   "fullburn: train.memory_budget_mb applies to CPU training only; ignored on %s\n",
                   dev.c_str());
    else
      SetCpuMemoryBudget(mb << 20);
  }
  // Counting from before the model is built, so the measured peak includes
  // the weights.
  if (RunMemory::Wanted(set_, batch_searched_) && !model_.ctx().device.is_cuda()) ResetCpuPeakBytes();
  return Status::Ok();
}

// The model and its data must agree, and the data must exist, before
// anything runs; the default datasets are made here on first use.
Status Trainer::SetupData() {
  const std::string& model = set_.model.name;
  const std::string& source = set_.data.source;
  if (Status s = CheckProgramParts(); !s.ok()) {
    return s;
  }
  // A program's own network takes whatever it was given; a program's own
  // tensors were checked against the built-in model above.
  bool ok =
      model == "custom" || source == "tensors" ||
      ((model == "gpt") == (source == "tokens") && !(model == "lstm" && source != "synthetic"));
  if (!ok) {
    return Status::InvalidArgument(
        "model.name = " + model + " does not train on data.source = " + source +
        ": resnet* and mlp take images or synthetic, lstm takes synthetic, gpt takes tokens");
  }
  model_.ctx().per_position = source == "tokens" || (program_first_ && program_first_->targets.dim() > 1);
  model_.ctx().channels_last =
      set_.model.channels_last && (model.rfind("resnet", 0) == 0 || model == "custom");

  spec_.path = set_.data.path;
  std::string data_dir = DatasetsDir();
  if (spec_.path.empty() && source == "images") {
    auto p = DefaultImages(data_dir, static_cast<int>(set_.data.classes), false);
    if (!p.ok()) return p.status();
    spec_.path = *p;
  } else if (spec_.path.empty() && source == "tokens") {
    auto p = DefaultTokens(data_dir, static_cast<int>(set_.data.vocab));
    if (!p.ok()) return p.status();
    spec_.path = *p;
  }
  // A held-out folder named by hand is checked now, not after the training.
  if (std::string val = set_.data.val_path;
      !val.empty() && (source == "images" || source == "tokens")) {
    bool usable =
        source == "images" ? std::filesystem::exists(val) : std::filesystem::is_regular_file(val);
    if (!usable) {
      return Status::NotFound(
          "data.val_path = " + val + " is not " +
          (source == "images" ? "an image folder or pack" : "a token file") +
          ": give the held-out data, or leave data.val_path empty to train without evaluation");
    }
  }
  if (opt_.train_data) spec_.tensors = &*opt_.train_data;
  spec_.dataset = opt_.dataset;
  spec_.seed = static_cast<uint64_t>(set_.train.seed);
  spec_.device = model_.ctx().device;
  spec_.channels_last = model_.ctx().channels_last;
  return Status::Ok();
}

Status Trainer::CheckProgramParts() {
  const std::string& model = set_.model.name;
  const std::string& source = set_.data.source;
  // A resumed run's config comes from its checkpoint: the program that
  // trained it must hand its parts over again.
  auto missing = [&](const std::string& setting, const std::string& what) {
    return Status::InvalidArgument(
        resume_ ? "this run was trained by a program through the C++ API (" + setting +
                      "): resume it from that program (TrainerOptions::resume)"
                : setting + " names " + what);
  };
  if (model == "custom" && !opt_.model)
    return missing("model.name = custom",
                   "a network a program hands over through the C++ API (TrainerOptions::model): "
                   "choose resnet18, resnet50, mlp, lstm or gpt");
  if (source == "tensors" && !opt_.train_data)
    return missing("data.source = tensors",
                   "the samples a program hands over through the C++ API "
                   "(TrainerOptions::train_data): choose images, tokens or synthetic");
  if (source == "dataset" && !opt_.dataset)
    return missing("data.source = dataset",
                   "a Dataset a program hands over through the C++ API (TrainerOptions::dataset): "
                   "choose images, tokens or synthetic");
  if (opt_.train_data && opt_.dataset)
    return Status::InvalidArgument(
        "TrainerOptions has both train_data and a dataset: hand over one of them");
  if ((opt_.val_data && !opt_.train_data) || (opt_.val_dataset && !opt_.dataset))
    return Status::InvalidArgument(std::string("TrainerOptions::") +
                                   (opt_.val_data ? "val_data" : "val_dataset") +
                                   " is held out from the program's own samples: hand over " +
                                   (opt_.val_data ? "train_data" : "dataset") +
                                   " too, or name held-out files with data.val_path");
  for (const auto* part : {&opt_.train_data, &opt_.val_data}) {
    if (!*part) continue;
    if (std::string why = CheckTensorData(**part); !why.empty())
      return Status::InvalidArgument((part == &opt_.val_data ? "held-out data: " : "") + why);
  }
  if (opt_.train_data) program_first_ = opt_.train_data;
  if (opt_.dataset) {
    auto first = FirstSampleAsBatch(*opt_.dataset, static_cast<uint64_t>(set_.train.seed));
    if (!first.ok()) return first.status();
    const torch::Tensor& target = first->targets;
    if (target.is_floating_point() || target.is_complex() || target.scalar_type() == torch::kBool)
      return Status::InvalidArgument(std::string("dataset sample 0 has a target of ") +
                                     c10::toString(target.scalar_type()) +
                                     ": give class indices as integers (torch::kLong)");
    program_first_ = *first;
  }
  if (!program_first_ || model == "custom") return Status::Ok();
  if (std::string why = CheckTensorsFitModel(set_, *program_first_); !why.empty())
    return Status::InvalidArgument(why);
  return Status::Ok();
}

// The micro-batch: as configured, or searched (and agreed over the ranks).
Status Trainer::ChooseBatch(const OptimizerOptions& oo) {
  if (!set_.train.batch_size.automatic) {
    batch_ = set_.train.batch_size.value;
    return Status::Ok();
  }
  batch_searched_ = true;
  if (Status s = SearchBatch(oo); !s.ok()) return s;
  nlohmann::json chosen = {{"batch", batch_}};
  if (dp_) {  // every rank takes the smallest size that fits everywhere
    Result<int64_t> common = dp_->MinOverRanks(batch_);
    if (!common.ok()) return common.status();
    chosen = {{"batch", *common}, {"searched", batch_}, {"rank", rank_.rank}};
    if (*common != batch_)
      std::fprintf(stderr, "fullburn: micro-batch %lld, the smallest any rank found\n",
                   static_cast<long long>(*common));
    batch_ = *common;
    SetOption("train.batch_size", std::to_string(batch_), "batch-size search, every rank");
  }
  pending_events_.push_back({0, "batch_size_chosen", chosen.dump()});
  return Status::Ok();
}

Status Trainer::Setup() {
  if (Status s = SetupDevice(); !s.ok()) return s;
  if (Status s = SetupProfile(); !s.ok()) return s;
  if (Status s = SetupData(); !s.ok()) return s;
  if (Status s = ConnectRanks(); !s.ok()) return s;
  if (Status s = RunSharding::Refused(set_, dp_ != nullptr); !s.ok()) return s;
  accumulate_ = set_.train.accumulate;
  const OptimizerOptions oo = RunModel::UpdateOptions(set_, model_.ctx().device, rank_.rank == 0);
  if (Status s = ChooseBatch(oo); !s.ok()) return s;
  spec_.batch_size = static_cast<int>(batch_);
  auto src = OpenSource(set_, spec_);
  if (!src.ok()) return src.status();
  input_.Open(std::move(*src), batch_ * rank_.world_size);
  if (!model_.built())  // the batch-size search built it already
    if (Status s = BuildModel(input_.source()); !s.ok()) return s;
  total_steps_ = set_.train.steps > 0 ? set_.train.steps
                                      : input_.StepsPerEpoch(accumulate_) * set_.train.epochs;
  model_.SetupUpdate(set_, oo, total_steps_, batch_ * accumulate_ * rank_.world_size);
  if (Status s = SetupEval(); !s.ok()) return s;
  if (set_.checkpoint.keep_best && !evaluation_.enabled()) {
    return Status::InvalidArgument(
        "checkpoint.keep_best needs evaluations: set eval.every_steps or eval.every_epochs, with "
        "held-out data (data.val_path)");
  }
  return Status::Ok();
}

Status Trainer::BuildModel(const BatchSource& source) {
  if (Status s = model_.Build(set_, source, opt_.model, rank_.rank == 0); !s.ok()) return s;
  std::vector<std::vector<torch::Tensor>> blocks;  // (a null gather only names them)
  if (dp_ && set_.dist.shard == "full" &&
      !model_.ctx().model->SetParameterGather(nullptr, &blocks)) {
    return RunSharding::NoBlocksToGather(set_.model.name);
  }
  // The batch-size search and the memory probe start from the whole model
  // on the device (the search's trials then release the others' share);
  // without them, stage 3 never needs it there.
  const bool full = dp_ && set_.dist.shard == "full";
  if (full && RunMemory::Wanted(set_, batch_searched_))
    if (Status s = ProbeOrShare(); !s.ok()) return s;
  share_to_device_ = full && !RunMemory::Wanted(set_, batch_searched_);
  if (!share_to_device_) {
    model_.ctx().model->to(model_.ctx().device);
    if (model_.ctx().channels_last)
      for (auto& p : model_.ctx().model->parameters())
        if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
  }
  if (dp_) {
    // Every rank starts from rank 0's weights (stage 3 without a probe: as
    // the sharding part moves them). Unsharded gradients' buckets are allocated
    // now (the run holds them for good); sharded ones exist only while
    // backward reduces them.
    // (Stage 3 from the host attaches in RunSharding::Setup, once on the device.)
    if (!share_to_device_) {
      std::vector<torch::Tensor> state = model_.ctx().model->parameters();
      for (const torch::Tensor& b : model_.ctx().model->buffers()) state.push_back(b);
      if (Status s = dp_->Broadcast(state); !s.ok()) return s;
      if (Status s = dp_->Attach(model_.ctx().model->parameters(), RunSharding::BucketsHeld(set_, true)); !s.ok()) return s;
    }
    dp_->SetSync(false);
  }
  return Status::Ok();
}

// dist.shard = full is for a model whose share fits where the whole does
// not; the probe and the search need it whole (weights and every gradient),
// so where that cannot fit the run starts from each rank's share without the
// report, and a search, which cannot, is refused. The ranks agree (the probe
// is collective).
Status Trainer::ProbeOrShare() {
  std::string shortfall = RunMemory::WholeModelShortfall(model_.ctx());
  Result<bool> any = dp_->AnyRank(!shortfall.empty());
  if (!any.ok()) return any.status();
  if (!*any) return Status::Ok();
  if (shortfall.empty()) shortfall = "on another rank";
  if (set_.train.batch_size.automatic) {
    return Status::InvalidArgument(
        "train.batch_size = auto with dist.shard = full searches with the model whole on each "
        "device, and it does not fit (" +
        shortfall + "): set train.batch_size to a number (each rank then starts from its share)");
  }
  if (rank_.rank == 0)
    std::fprintf(stderr,
                 "fullburn: dist.shard = full: no memory report: the probe needs the model whole "
                 "on each device, and it does not fit (%s); each rank starts from its share\n",
                 shortfall.c_str());
  return SetOption("train.memory_report", "false", "the whole model does not fit for the probe");
}

// Probes the data with a small batch for shapes and real values, builds the
// model, and searches; the real source is opened afterwards at the chosen size.
Status Trainer::SearchBatch(const OptimizerOptions& oo) {
  SourceSpec probe_spec = spec_;
  probe_spec.batch_size = 8;
  auto probe_src = OpenSource(set_, probe_spec);
  if (!probe_src.ok()) return probe_src.status();
  (*probe_src)->StartEpoch(0, 0);
  TrainBatch probe;
  if (!(*probe_src)->Next(&probe)) return (*probe_src)->status();
  if (Status s = BuildModel(**probe_src); !s.ok()) return s;
  BatchSearchOptions bo;
  bo.max_batch = std::min(set_.train.max_batch_size, (*probe_src)->batches_per_epoch() * 8);
  bo.optimizer = oo;
  if (dp_) {
    std::vector<torch::Tensor> trainable;  // the optimizer's parameters, in its order
    for (const torch::Tensor& p : model_.ctx().model->parameters())
      if (p.requires_grad()) trainable.push_back(p);
    std::vector<int> owners = DataParallel::ShardOwners(trainable, dp_->world_size());
    // A trial holds the optimizer state this rank will: its owners' share.
    if (set_.dist.shard != "none")
      for (int owner : owners) bo.owned.push_back(owner == dp_->rank());
    bo.shape = std::make_shared<RankTrialShape>(dp_.get(), model_.ctx().model.get(), set_.dist.shard,
                                                set_.dist.prefetch, trainable, owners);
  }
  // The probe source stays open through the search: what it holds (an
  // in-memory dataset, loader buffers) is held while training too.
  std::fprintf(
      stderr,
      "fullburn: searching for the largest micro-batch that fits (train.batch_size = auto)\n");
  std::vector<BatchTrial> trials;
  auto chosen = SearchBatchSize(&model_.ctx(), probe, bo, [&](const BatchTrial& t) {
    trials.push_back(t);
    if (t.fits)
      std::fprintf(stderr, "  batch %-6lld fits   %8.1f samples/s\n",
                   static_cast<long long>(t.batch), t.samples_per_s);
    else
      std::fprintf(stderr, "  batch %-6lld %s\n", static_cast<long long>(t.batch), t.error.c_str());
  });
  probe_src->reset();
  if (!chosen.ok()) {
    return chosen.status();
  }
  batch_ = *chosen;
  SetOption("train.batch_size", std::to_string(batch_), "batch-size search");
  for (const BatchTrial& t : trials) {
    nlohmann::json trial = {{"batch", t.batch},
                            {"fits", t.fits},
                            {"samples_per_s", t.samples_per_s},
                            {"peak_bytes", t.peak_bytes},
                            {"error", t.error}};
    if (rank_.world_size > 1) trial["rank"] = rank_.rank;  // each rank searches its own device
    pending_events_.push_back({0, "batch_size_trial", trial.dump()});
  }
  std::fprintf(stderr, "fullburn: micro-batch %lld (best measured throughput of those that fit)\n",
               static_cast<long long>(batch_));
  return Status::Ok();
}

}  // namespace fullburn
