// `fullburn train`: setup, the step loop, records, checkpoints, evaluation.
#include "trainer.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

}  // namespace

int PendingStopSignal() { return g_signal.load(); }

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

Status Trainer::OpenStoreAndResume() {
  std::string path = opt_.store_path.empty() ? RunStore::DefaultPath() : opt_.store_path;
  if (opt_.store_path.empty()) std::filesystem::create_directories(StoreDir(path));
  auto store = RunStore::Open(path);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  nlohmann::json base;
  if (!opt_.resume.empty()) {
    std::vector<std::string> candidates;
    if (std::filesystem::is_regular_file(opt_.resume)) {
      candidates.push_back(opt_.resume);
    } else {
      auto run = store_->GetRun(opt_.resume);
      if (!run.ok())
        return Status::NotFound("--resume " + opt_.resume + ": no such checkpoint file, and " +
                                run.status().message());
      auto cks = store_->LoadCheckpoints(run->id);
      if (!cks.ok()) return cks.status();
      for (auto it = cks->rbegin(); it != cks->rend(); ++it) candidates.push_back(it->path);
      if (candidates.empty())
        return Status::NotFound(
            "run " + std::to_string(run->id) +
            " has no checkpoints to resume from: it ended before its first one");
    }
    for (size_t i = 0; i < candidates.size(); ++i) {
      const std::string& c = candidates[i];
      auto state = ReadCheckpointFile(c);
      if (!state.ok()) {
        // A file named by hand has no earlier one to fall back on.
        if (candidates.size() == 1) return state.status();
        std::fprintf(stderr, "fullburn: %s; %s\n", state.status().message().c_str(),
                     i + 1 < candidates.size() ? "trying the one before it"
                                               : "it was the run's oldest checkpoint");
        continue;
      }
      resume_ = Resume{c, std::move(*state), {}};
      resume_->meta = nlohmann::json::parse(resume_->state.state_json, nullptr, false);
      break;
    }
    if (!resume_)
      return Status::Corruption(
          "no usable checkpoint to resume from (each was refused above): resume from a run whose "
          "checkpoints are intact, or start afresh");
    if (!resume_->meta.is_object() || !resume_->meta.contains("config"))
      return Status::Corruption("checkpoint " + resume_->path +
                                " has no training state: it was not written by fullburn train");
    base = resume_->meta["config"];
  }
  if (opt_.config) {
    cfg_ = *opt_.config;
  } else {
    auto cfg = Config::Load(opt_.config_path, opt_.overrides, /*read_environment=*/!resume_,
                            resume_ ? &base : nullptr);
    if (!cfg.ok()) {
      exit_code = kExitUsage;
      return cfg.status();
    }
    cfg_ = *cfg;
  }
  return Status::Ok();
}

Status Trainer::CheckCudaGraphs() {
  exit_code = kExitUsage;
  if (std::string why = CudaGraph::Unsupported(); !why.empty())
    return Status::InvalidArgument("train.cuda_graphs needs CUDA, but " + why +
                                   ": set train.cuda_graphs = false");
  if (!ctx_.device.is_cuda())
    return Status::InvalidArgument("train.cuda_graphs needs train.device = cuda, not " +
                                   ctx_.device.str() + ": set train.cuda_graphs = false");
  if (rank_.world_size > 1)
    return Status::InvalidArgument(
        "train.cuda_graphs works on one rank only (Gloo's all-reduce cannot be captured in a "
        "graph): set train.cuda_graphs = false for data-parallel runs");
  exit_code = 0;
  // Cast weights cached by autocast would be freed after the capture while
  // the graph still reads them; without the cache each forward casts anew.
  at::autocast::set_autocast_cache_enabled(false);
  return Status::Ok();
}

Status Trainer::Setup() {
  // Device and threads.
  std::string dev = cfg_.Str("train.device");
  if (dev == "auto") dev = torch::cuda::is_available() ? "cuda" : "cpu";
  try {
    ctx_.device = torch::Device(dev);
  } catch (const c10::Error&) {
    exit_code = kExitUsage;
    return Status::InvalidArgument("train.device = " + dev +
                                   " is not a device: use auto, cpu, cuda or cuda:N");
  }
  if (ctx_.device.is_cuda() && !torch::cuda::is_available())
    return Status::InvalidArgument("train.device = " + dev + " but this libtorch sees no GPU (" +
                                   TorchDescription() + "): use train.device=cpu");
  auto ranks = RankFromEnvironment(EnvironmentMap());
  if (!ranks.ok()) return ranks.status();
  if (ranks->has_value()) rank_ = **ranks;
  // One GPU per local rank, unless the config names one.
  if (ctx_.device.is_cuda() && rank_.world_size > 1 && !ctx_.device.has_index())
    ctx_.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                  rank_.local_rank % torch::cuda::device_count()));
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  int threads = static_cast<int>(cfg_.Int("train.threads"));
  if (threads == 0)
    threads =
        std::max(1, cores - (cfg_.Str("data.source") == "images" && ctx_.device.is_cpu() ? 1 : 0));
  torch::set_num_threads(threads);
  if (cfg_.Bool("train.keep_host_memory")) KeepHostMemory();
  torch::manual_seed(static_cast<uint64_t>(cfg_.Int("train.seed")));

  const std::string& precision = cfg_.Str("train.precision");
  if (precision == "bf16") ctx_.autocast = torch::kBFloat16;
  if (precision == "fp16") {
    if (!ctx_.device.is_cuda())
      return Status::InvalidArgument(
          "train.precision = fp16 needs a CUDA device (CPU autocast has no fp16 "
          "in libtorch 1.13): use bf16 on CPU");
    ctx_.autocast = torch::kHalf;
  }
  if (cfg_.Bool("train.cuda_graphs"))
    if (Status s = CheckCudaGraphs(); !s.ok()) return s;
  ctx_.events = PhaseEvents::ForDevice(ctx_.device);
  if (ctx_.device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(cfg_.Bool("train.tf32"));
    at::globalContext().setAllowTF32CuDNN(cfg_.Bool("train.tf32"));
    at::globalContext().setBenchmarkCuDNN(cfg_.Bool("train.cudnn_benchmark"));
  }
  if (int64_t mb = cfg_.Int("train.memory_budget_mb"); mb > 0) {
    if (ctx_.device.is_cuda())
      std::fprintf(stderr,
                   "fullburn: train.memory_budget_mb applies to CPU training only; ignored on %s\n",
                   dev.c_str());
    else
      SetCpuMemoryBudget(mb << 20);
  }

  // Model and data must agree before anything runs.
  const std::string& model = cfg_.Str("model.name");
  const std::string& source = cfg_.Str("data.source");
  bool ok = (model == "gpt") == (source == "tokens") &&
            !(model == "lstm" && source != "synthetic");
  if (!ok) {
    exit_code = kExitUsage;
    return Status::InvalidArgument(
        "model.name = " + model + " does not train on data.source = " + source +
        ": resnet* and mlp take images or synthetic, lstm takes synthetic, gpt takes tokens");
  }
  ctx_.per_position = source == "tokens";
  ctx_.channels_last = cfg_.Bool("model.channels_last") && model.rfind("resnet", 0) == 0;

  spec_.path = cfg_.Str("data.path");
  std::string data_dir = DatasetsDir();
  if (spec_.path.empty() && source == "images") {
    auto p = DefaultImages(data_dir, static_cast<int>(cfg_.Int("data.classes")), false);
    if (!p.ok()) return p.status();
    spec_.path = *p;
  } else if (spec_.path.empty() && source == "tokens") {
    auto p = DefaultTokens(data_dir, static_cast<int>(cfg_.Int("data.vocab")));
    if (!p.ok()) return p.status();
    spec_.path = *p;
  }
  // A held-out folder named by hand is checked now, not after the training.
  if (std::string val = cfg_.Str("data.val_path");
      !val.empty() && source == "images" && !std::filesystem::is_directory(val)) {
    exit_code = kExitUsage;
    return Status::NotFound("data.val_path = " + val +
                            " is not a folder: give the held-out image folder, or leave "
                            "data.val_path empty to train without evaluation");
  }
  spec_.seed = static_cast<uint64_t>(cfg_.Int("train.seed"));
  spec_.device = ctx_.device;
  spec_.channels_last = ctx_.channels_last;
  if (Status s = ConnectRanks(); !s.ok()) return s;

  accumulate_ = cfg_.Int("train.accumulate");
  OptimizerOptions oo;
  oo.name = cfg_.Str("optim.name");
  oo.momentum = cfg_.Float("optim.momentum");
  oo.nesterov = cfg_.Bool("optim.nesterov");
  oo.weight_decay = cfg_.Float("optim.weight_decay");
  oo.beta1 = cfg_.Float("optim.beta1");
  oo.beta2 = cfg_.Float("optim.beta2");
  oo.eps = cfg_.Float("optim.eps");
  oo.trust = cfg_.Float("optim.trust");
  if (cfg_.IsAuto("train.batch_size")) {
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
      cfg_.Set("train.batch_size", std::to_string(batch_), "batch-size search, every rank");
    }
    pending_events_.push_back({0, "batch_size_chosen", chosen.dump()});
  } else {
    batch_ = cfg_.Int("train.batch_size");
  }
  spec_.batch_size = static_cast<int>(batch_);
  auto src = OpenSource(cfg_, spec_);
  if (!src.ok()) return src.status();
  source_ = std::move(*src);
  if (!ctx_.model)
    if (Status s = BuildModel(*source_); !s.ok()) return s;

  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : ctx_.model->named_parameters()) params.emplace_back(p.key(), p.value());
  optim_ = std::make_unique<Optimizer>(params, oo);

  LossScalerOptions so;
  so.enabled = precision == "fp16";
  so.init_scale = cfg_.Float("amp.init_scale");
  so.growth_factor = cfg_.Float("amp.growth_factor");
  so.backoff_factor = cfg_.Float("amp.backoff_factor");
  so.growth_interval = cfg_.Int("amp.growth_interval");
  scaler_ = std::make_unique<LossScaler>(so);

  int64_t per_epoch = std::max<int64_t>(1, source_->batches_per_epoch() / accumulate_);
  total_steps_ =
      cfg_.Int("train.steps") > 0 ? cfg_.Int("train.steps") : per_epoch * cfg_.Int("train.epochs");
  schedule_.peak = cfg_.Float("optim.lr");
  if (cfg_.Bool("optim.scale_lr"))
    schedule_.peak *= static_cast<double>(batch_ * accumulate_ * rank_.world_size) /
                      static_cast<double>(cfg_.Int("optim.base_batch"));
  schedule_.min_lr = cfg_.Float("optim.min_lr");
  schedule_.warmup = std::min(cfg_.Int("optim.warmup_steps"), total_steps_);
  schedule_.total = total_steps_;
  schedule_.cosine = cfg_.Str("optim.schedule") == "cosine";
  return Status::Ok();
}

Status Trainer::BuildModel(const BatchSource& source) {
  if (opt_.model) {
    ctx_.model = opt_.model;
  } else {
    ModelSpec ms;
    ms.name = cfg_.Str("model.name");
    ms.num_classes = source.num_classes();
    ms.width = cfg_.Float("model.width");
    ms.in_features = source.in_features();
    ms.vocab = cfg_.Int("data.vocab");
    ms.seq_len = cfg_.Int("data.seq_len");
    ms.hidden = cfg_.Int("model.hidden");
    ms.layers = cfg_.Int("model.layers");
    ms.heads = cfg_.Int("model.heads");
    ms.dropout = cfg_.Float("model.dropout");
    auto m = MakeModel(ms);
    if (!m.ok()) {
      exit_code = kExitUsage;
      return m.status();
    }
    ctx_.model = *m;
  }
  ctx_.model->to(ctx_.device);
  if (ctx_.channels_last)
    for (auto& p : ctx_.model->parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
  if (dp_) {
    // Every rank starts from rank 0's weights. The buckets are allocated now,
    // so a batch-size search counts their memory; its trials do not sync.
    std::vector<torch::Tensor> state = ctx_.model->parameters();
    for (const torch::Tensor& b : ctx_.model->buffers()) state.push_back(b);
    if (Status s = dp_->Broadcast(state); !s.ok()) return s;
    if (Status s = dp_->Attach(ctx_.model->parameters()); !s.ok()) return s;
    dp_->SetSync(false);
  }
  return Status::Ok();
}

// Probes the data with a small batch for shapes and real values, builds the
// model, and searches; the real source is opened afterwards at the chosen size.
Status Trainer::SearchBatch(const OptimizerOptions& oo) {
  SourceSpec probe_spec = spec_;
  probe_spec.batch_size = 8;
  auto probe_src = OpenSource(cfg_, probe_spec);
  if (!probe_src.ok()) return probe_src.status();
  (*probe_src)->StartEpoch(0, 0);
  TrainBatch probe;
  if (!(*probe_src)->Next(&probe)) return (*probe_src)->status();
  if (Status s = BuildModel(**probe_src); !s.ok()) return s;
  BatchSearchOptions bo;
  bo.max_batch = std::min(cfg_.Int("train.max_batch_size"), (*probe_src)->batches_per_epoch() * 8);
  bo.optimizer = oo;
  // The probe source stays open through the search: what it holds (an
  // in-memory dataset, loader buffers) is held while training too.
  std::fprintf(
      stderr,
      "fullburn: searching for the largest micro-batch that fits (train.batch_size = auto)\n");
  std::vector<BatchTrial> trials;
  auto chosen = SearchBatchSize(&ctx_, probe, bo, [&](const BatchTrial& t) {
    trials.push_back(t);
    if (t.fits)
      std::fprintf(stderr, "  batch %-6lld fits   %8.1f samples/s\n",
                   static_cast<long long>(t.batch), t.samples_per_s);
    else
      std::fprintf(stderr, "  batch %-6lld %s\n", static_cast<long long>(t.batch), t.error.c_str());
  });
  probe_src->reset();
  if (!chosen.ok()) {
    exit_code = kExitFailed;
    return chosen.status();
  }
  batch_ = *chosen;
  cfg_.Set("train.batch_size", std::to_string(batch_), "batch-size search");
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

Status Trainer::ConnectRanks() {
  if (rank_.world_size <= 1) return Status::Ok();
  DistOptions o;
  o.backend = cfg_.Str("dist.backend");
  o.timeout_s = cfg_.Float("dist.timeout_s");
  o.bucket_mb = cfg_.Float("dist.bucket_mb");
  o.first_bucket_mb = cfg_.Float("dist.first_bucket_mb");
  o.overlap = cfg_.Bool("dist.overlap");
  o.compress = cfg_.Str("dist.compress");
  // Ranks must train the same job; what describes a rank's machine may differ.
  nlohmann::json job = cfg_.ToJson();
  for (const char* key : {"train.memory_budget_mb", "train.threads", "train.device", "data.threads",
                          "data.prefetch", "data.cache_mb"}) {
    std::string k = key;
    size_t dot = k.find('.');
    if (job.contains(k.substr(0, dot))) job[k.substr(0, dot)].erase(k.substr(dot + 1));
  }
  o.config_hash = std::to_string(std::hash<std::string>{}(job.dump()));
  auto dp = DataParallel::Connect(rank_, o, ctx_.device);
  if (!dp.ok()) {
    exit_code = kExitFailed;
    return dp.status();
  }
  dp_ = std::move(*dp);
  spec_.rank = rank_.rank;
  spec_.world_size = rank_.world_size;
  if (rank_.rank == 0)
    std::fprintf(
        stderr,
        "fullburn: %d ranks (%s, %s backend), gradients in %zu-MB buckets during backward\n",
        rank_.world_size, rank_.launcher.c_str(), dp_->backend().c_str(),
        static_cast<size_t>(o.bucket_mb));
  return Status::Ok();
}

// Ranks after 0 record into rank 0's run: its id and clock come through the rendezvous store.
Status Trainer::JoinRun() {
  Result<std::string> shared = dp_->ShareFromRankZero("run", "");
  if (!shared.ok()) return shared.status();
  long long id = 0;
  double start = 0;
  if (std::sscanf(shared->c_str(), "%lld %lf", &id, &start) != 2)
    return Status::Internal("bad run id from rank 0");
  run_.id = id;
  run_.start_time = start;
  return Status::Ok();
}

// The GPUs of every node the run samples, named in the run: rank 0's, and
// those of each other node's first rank tagged with that rank (its samples
// are rankR.gpuN.*). Every rank takes part in the gather; only node samplers
// open NVML.
Status Trainer::GatherGpus() {
  if (rank_.rank == 0 || rank_.local_rank == 0) {
    auto gpus = GpuSource::Open();
    if (gpus.ok()) gpus_ = std::move(*gpus);
  }
  nlohmann::json mine = nlohmann::json::array();
  if (gpus_)
    for (const GpuInfo& i : gpus_->gpus()) {
      nlohmann::json g{{"index", i.index}, {"name", i.name}, {"uuid", i.uuid}};
      if (rank_.rank > 0) g["rank"] = rank_.rank;
      mine.push_back(std::move(g));
    }
  if (!dp_) {
    run_.gpus_json = mine.dump();
    return Status::Ok();
  }
  Result<std::vector<std::string>> all = dp_->GatherToRankZero("gpus", mine.dump());
  if (!all.ok()) return all.status();
  nlohmann::json merged = nlohmann::json::array();
  for (const std::string& part : *all) {
    nlohmann::json list = nlohmann::json::parse(part, nullptr, false);
    if (list.is_array())
      for (nlohmann::json& g : list) merged.push_back(std::move(g));
  }
  run_.gpus_json = merged.dump();
  return Status::Ok();
}

Status Trainer::BeginRun() {
  if (Status s = GatherGpus(); !s.ok()) return s;
  if (rank_.rank > 0) {
    if (Status s = JoinRun(); !s.ok()) return s;
    DecideForwarding();
    if (Status s = GatherSenders(); !s.ok()) return s;
    for (const RunEvent& e : pending_events_) RecordEvent(e);  // this rank's batch-size trials
    pending_events_.clear();
    StartSampler();
    return OpenCheckpoints();
  }
  run_.name =
      opt_.name.empty() ? cfg_.Str("model.name") + " on " + cfg_.Str("data.source") : opt_.name;
  run_.command =
      opt_.command.empty() ? std::vector<std::string>{"fullburn", "train"} : opt_.command;
  run_.cwd = std::filesystem::current_path().string();
  run_.start_time = Env::Default()->UnixSeconds();
  run_.recorder_pid = static_cast<int>(::getpid());
  run_.interval_s = 1.0;
  run_.parent_id = opt_.parent_run;
  nlohmann::json config = cfg_.ToJson();
  if (resume_) config["resumed_from"] = resume_->path;
  // What "auto" and the empty defaults became on this machine (the tuner reads
  // the device, and packs the data it was given).
  config["resolved"] = {{"device", ctx_.device.str()},
                        {"threads", torch::get_num_threads()},
                        {"data_path", spec_.path},
                        {"val_path", ResolvedValPath()}};
  run_.config_json = config.dump();
  auto id = store_->BeginRun(run_);
  if (!id.ok()) return id.status();
  run_.id = *id;
  if (dp_) {
    Result<std::string> shared =
        dp_->ShareFromRankZero("run", fmt::format("{} {:.6f}", run_.id, run_.start_time));
    if (!shared.ok()) return shared.status();
    if (Status s = GatherSenders(); !s.ok()) return s;
  }
  if (const char* events = std::getenv(kEventsEnvVar); events && *events) {
    events_out_.reset(std::fopen(events, "a"));
    if (!events_out_)
      std::fprintf(stderr, "fullburn: cannot append step events to %s (%s): not sent\n", events,
                   kEventsEnvVar);
  }
  for (const RunEvent& e : pending_events_) RecordEvent(e);
  pending_events_.clear();

  StartSampler();
  return OpenCheckpoints();
}

// Rank 0 samples its node's host and GPUs and its own process tree. The
// first rank of every other node (local rank 0) does the same for its node,
// stored as rankR.host.* and rankR.gpuN.*; every other rank samples only its
// own process tree (rankR.proc.*). So no host is counted twice, and each
// rank's CPU and memory can be told apart.
void Trainer::StartSampler() {
  bool samples_node = rank_.rank == 0 || rank_.local_rank == 0;
  SamplerOptions so;
  so.interval_s = 1.0;
  so.root_pid = static_cast<int>(::getpid());
  so.host = samples_node;
  so.rank = rank_.rank;
  sampler_ = std::make_unique<Sampler>(Env::Default(), samples_node ? gpus_.get() : nullptr, so);
  if (!forward_)
    sample_writer_ = std::make_unique<BatchWriter>(store_.get(), run_.id, run_.start_time);
  sampler_->Start([this](const fullburn::Snapshot& s) {
    if (sample_writer_) sample_writer_->Add(s);
    std::lock_guard<std::mutex> lock(latest_mu_);
    latest_ = s;
    if (forward_)
      for (const auto& [name, value] : Flatten(s))
        forward_samples_.push_back({name, s.unix_time - run_.start_time, value});
  });
}

Status Trainer::OpenCheckpoints() {
  std::string dir = cfg_.Str("checkpoint.dir");
  if (dir.empty()) dir = StoreDir(store_->path()) + "/checkpoints/run-" + std::to_string(run_.id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create checkpoint.dir " + dir + ": " + ec.message());
  RunStore* store = store_.get();
  int64_t run_id = run_.id;
  double start = run_.start_time;
  ckpt_ = std::make_unique<CheckpointWriter>(
      dir, static_cast<int>(cfg_.Int("checkpoint.keep")), cfg_.Bool("checkpoint.async"),
      [store, run_id, start](const CheckpointWriter::Written& w) {
        if (!w.status.ok()) {
          std::fprintf(stderr, "\nfullburn: %s\n", w.status.message().c_str());
          return;
        }
        store->AddCheckpoint(run_id, {w.step, Env::Default()->UnixSeconds() - start, w.path,
                                      w.bytes, w.stall_s, w.write_s});
      });
  mono_start_ = MonoNow();
  last_ckpt_time_ = mono_start_;
  if (!opt_.quiet && rank_.rank == 0) live_ = std::make_unique<LiveStatus>(STDERR_FILENO);
  return Status::Ok();
}

void Trainer::Finish(const std::string& status, int code) {
  FlushSteps(true);
  if (ckpt_) ckpt_->Wait();
  if (sampler_) sampler_->Stop();
  if (sample_writer_) sample_writer_->Flush();
  if (forward_) SendForwarded(true);
  if (dp_ && rank_.rank == 0) ApplyForwarded(true);
  live_.reset();
  if (run_.id > 0 && rank_.rank == 0)
    store_->FinishRun(run_.id, Env::Default()->UnixSeconds(), code, status);
}

Status Trainer::Run() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (Status s = OpenStoreAndResume(); !s.ok()) return s;
  if (opt_.print_config) {
    std::fputs(cfg_.ToToml().c_str(), stdout);
    return Status::Ok();
  }
  Status s;
  try {
    s = Setup();
  } catch (const std::exception& e) {
    exit_code = kExitFailed;
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    if (IsOutOfMemory(e))
      s = Status::ResourceExhausted(fmt::format(
          "the model, its optimizer state and the data held in memory do not fit ({}): use a "
          "smaller model (model.width, model.hidden, model.layers) or less data in memory{}",
          what,
          ctx_.device.is_cuda() ? ", or a GPU with more memory"
                                : ", or raise train.memory_budget_mb"));
    else
      s = Status::Internal("setting up training failed: " + what);
  }
  if (!s.ok()) {
    if (exit_code == 0) exit_code = kExitUsage;
    return s;
  }
  if (resume_)
    if (Status r = Restore(); !r.ok()) {
      exit_code = kExitUsage;
      return r;
    }
  if (Status b = BeginRun(); !b.ok()) {
    exit_code = kExitFailed;
    return b;
  }
  if (rank_.rank == 0)
    std::fprintf(
        stderr,
        "fullburn: run %lld: %s, %lld parameters, micro-batch %lld x %lld, %lld steps on %s (%s)\n",
        static_cast<long long>(run_.id), cfg_.Str("model.name").c_str(),
        static_cast<long long>(ParameterCount(*ctx_.model)), static_cast<long long>(batch_),
        static_cast<long long>(accumulate_), static_cast<long long>(total_steps_),
        ctx_.device.str().c_str(), cfg_.Str("train.precision").c_str());
  s = Loop();
  // A failed step leaves the weights suspect: the last good checkpoint stands.
  if (s.ok() && (cfg_.Bool("checkpoint.at_end") || exit_code == kExitInterrupted)) Checkpoint(true);
  nlohmann::json eval;
  if (s.ok() && exit_code == 0 && rank_.rank == 0) eval = Evaluate();
  Finish(s.ok() ? "finished" : "failed",
         s.ok() ? exit_code : (exit_code ? exit_code : kExitFailed));
  if (!s.ok()) return s;
  if (!opt_.quiet && rank_.rank == 0) {
    auto steps = store_->LoadSteps(run_.id);
    if (steps.ok() && !steps->empty()) std::fputs(RenderStepsSummary(*steps).c_str(), stderr);
    if (Result<RunData> stored = store_->LoadRun(std::to_string(run_.id)); stored.ok())
      std::fputs(RenderFindings(Diagnose(*stored)).c_str(), stderr);
    if (!eval.empty())
      std::fprintf(stderr, "  held-out: loss %.4f, accuracy %.1f%% (%g samples)\n",
                   eval["val_loss"].get<double>(), 100 * eval["val_accuracy"].get<double>(),
                   eval["val_samples"].get<double>());
    if (skipped_)
      std::fprintf(stderr, "  loss scaler: %lld steps skipped\n", static_cast<long long>(skipped_));
    auto cks = store_->LoadCheckpoints(run_.id);
    if (cks.ok() && !cks->empty())
      std::fprintf(stderr, "  checkpoint: %s (loop blocked %.1f ms)\n", cks->back().path.c_str(),
                   cks->back().stall_s * 1e3);
    std::fprintf(stderr,
                 "fullburn: stored as run %lld in %s (fullburn runs show %lld; runs export %lld "
                 "--table steps)\n",
                 static_cast<long long>(run_.id), store_->path().c_str(),
                 static_cast<long long>(run_.id), static_cast<long long>(run_.id));
  }
  return Status::Ok();
}

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  std::string what = e.what();
  return what.find("out of memory") != std::string::npos ||
         what.find("memory budget exceeded") != std::string::npos;
}

int RunTraining(const TrainerOptions& options) {
  Trainer t(options);
  Status s = t.Run();
  if (!s.ok()) {
    std::fprintf(stderr, "fullburn: %s\n", s.message().c_str());
    return t.exit_code ? t.exit_code : 1;
  }
  return t.exit_code;
}

}  // namespace fullburn
