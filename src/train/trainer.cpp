// `fullburn train`: the store and --resume, ranks, the run's start and end
// (trainer_impl.h lists where the rest is).
#include "trainer_impl.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "fullburn/cpu_memory_budget.h"
#include "fullburn/diagnose.h"
#include "fullburn/run_traces.h"

namespace fullburn {
namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

}  // namespace

int PendingStopSignal() { return g_signal.load(); }

Status Trainer::OpenStoreAndResume() {
  std::string path = opt_.store_path.empty() ? RunStore::DefaultPath() : opt_.store_path;
  if (opt_.store_path.empty()) std::filesystem::create_directories(StoreLayout(path).folder());
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
      auto state = ReadCheckpointWithShards(c);  // a sharded run's parts beside it
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
    // Checkpoints from before model.pad_vocab hold the unpadded table.
    if (base.contains("model") && base["model"].is_object() && !base["model"].contains("pad_vocab"))
      base["model"]["pad_vocab"] = 1;
  }
  if (opt_.config) {
    cfg_ = *opt_.config;
  } else {
    auto cfg = Config::Load(opt_.config_path, opt_.overrides, /*read_environment=*/!resume_,
                            resume_ ? &base : nullptr);
    if (!cfg.ok()) {
      return cfg.status();
    }
    cfg_ = *cfg;
  }
  set_ = ReadSettings(cfg_);
  // What a program hands over through the C++ API takes the place of the
  // built-in models and sources, and the run's config says so.
  if (opt_.model) (void)SetOption("model.name", "custom", "C++ API (TrainerOptions::model)");
  if (opt_.train_data)
    (void)SetOption("data.source", "tensors", "C++ API (TrainerOptions::train_data)");
  else if (opt_.dataset)
    (void)SetOption("data.source", "dataset", "C++ API (TrainerOptions::dataset)");
  return Status::Ok();
}

Status Trainer::SetOption(const std::string& key, const std::string& value,
                          const std::string& origin) {
  Status s = cfg_.Set(key, value, origin);
  set_ = ReadSettings(cfg_);
  return s;
}

std::string Trainer::ModelLabel() const {
  return opt_.model && !opt_.model_name.empty() ? opt_.model_name : set_.model.name;
}

Status Trainer::ConnectRanks() {
  if (rank_.world_size <= 1) return Status::Ok();
  DistOptions o = set_.dist;
  // Ranks must train the same job; what describes a rank's machine may differ.
  o.config_hash = std::to_string(std::hash<std::string>{}(JobIdentity(set_)));
  auto dp = DataParallel::Connect(rank_, o, model_.ctx().device);
  if (!dp.ok()) {
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
    StartRecording();  // with this rank's batch-size trials
    return OpenCheckpoints();
  }
  run_.name = opt_.name.empty() ? ModelLabel() + " on " + set_.data.source : opt_.name;
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
  config["resolved"] = {{"device", model_.ctx().device.str()},
                        {"threads", torch::get_num_threads()},
                        {"ranks_per_node", rank_.local_world_size},
                        {"data_path", spec_.path},
                        {"val_path", RunEvaluation::HeldOutPath(set_, DatasetsDir())}};
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
  StartRecording();
  return OpenCheckpoints();
}

void Trainer::Finish(const std::string& status, int code) {
  finished_ = true;
  FlushSteps(true);
  if (checkpoints_) checkpoints_->Wait();
  if (records_) {
    Recorder& recorder = records_->recorder();
    recorder.StopSampling();
    if (recorder.forwarding()) SendForwarded(true);
    if (dp_ && rank_.rank == 0) ApplyForwarded(true);
    (void)recorder.Finish();  // what could not be stored is said; the run's outcome stands
  }
  // Ranks sharing rank 0's store write their last steps themselves: wait for
  // every rank's, so the summary and diagnosis rank 0 prints next see them
  // all (before, a 2-rank run of 30 steps could print 54 of its 60 records).
  // Only after every step ran: ranks stopped by a signal may have stopped at
  // different steps, and one of them may still be in a gradient all-reduce.
  if (dp_ && status == "finished" && code == 0) (void)dp_->AnyRank(false);
  live_.reset();
  std::string said;
  SpillFile* spill = records_ ? records_->spill() : nullptr;
  if (run_.id > 0 && rank_.rank == 0) {
    // Into the spill if the store refuses it: a finished run never reads as interrupted.
    said = FinishRunOrKeep(store_.get(), spill, run_.id, Env::Default()->UnixSeconds(), code, status);
  } else if (spill && !spill->empty()) {
    int64_t imported = 0;
    std::string path = spill->path();
    said = spill->DrainInto(store_.get(), &imported).ok()
               ? fmt::format("the {} records kept in {} while the store refused writes are stored\n", imported, path)
               : fmt::format("{} records the store refused are kept in {}: fullburn runs import {}\n",
                             spill->written(), path, path);
  }
  for (size_t at = 0, nl; (nl = said.find('\n', at)) != std::string::npos; at = nl + 1)
    std::fprintf(stderr, "fullburn: %s%s\n", rank_.world_size > 1 ? fmt::format("rank {}: ", rank_.rank).c_str() : "",
                 said.substr(at, nl - at).c_str());
}

// The order of operations; each step is a method or a part of its own.
Status Trainer::Run() {
  if (Status s = OpenStoreAndResume(); !s.ok()) return s;
  if (opt_.print_config) {
    std::fputs(cfg_.ToToml().c_str(), stdout);
    return Status::Ok();
  }
  if (Status s = SetupCatching(); !s.ok()) return s;
  if (resume_)
    if (Status r = Restore(); !r.ok()) return r;
  if (Status r = SetupMemoryAndSharding(); !r.ok()) return r;
  if (Status b = BeginRun(); !b.ok()) return b;
  if (rank_.rank == 0) PrintStart();
  started_ = true;
  Status s = Loop();
  if (!s.ok() && checkpoints_) checkpoints_->CancelParts();  // a rank may be gone: its part will not come
  // A failed step leaves the weights suspect: the last good checkpoint stands.
  if (s.ok() && (set_.checkpoint.at_end || interrupted_)) s = Checkpoint(true);
  nlohmann::json eval;
  if (s.ok() && !interrupted_ && set_.eval.at_end) s = Evaluate(&eval);
  Finish(s.ok() ? "finished" : "failed", TrainingExitCode(s, interrupted_, started_));
  if (!s.ok()) return s;
  if (!opt_.quiet && rank_.rank == 0) PrintSummary(eval);
  return Status::Ok();
}

// Setup, with an exception that escaped it as a Status: an out-of-memory
// names what to make smaller.
Status Trainer::SetupCatching() {
  Status s;
  try {
    s = Setup();
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    // Several ranks that hold everything whole can share it instead.
    const std::string share =
        dp_ && set_.dist.shard != "full"
            ? fmt::format(
                  "dist.shard = full gives each of the {} ranks a share of the weights, "
                  "gradients and optimizer state (docs/memory.md); or ",
                  rank_.world_size)
            : "";
    if (IsOutOfMemory(e))
      s = Status::ResourceExhausted(fmt::format(
          "the model, its optimizer state and the data held in memory do not fit ({}): {}use a "
          "smaller model (model.width, model.hidden, model.layers) or less data in memory{}",
          DescribeOutOfMemory(e), share,
          model_.ctx().device.is_cuda()   ? ", or a GPU with more memory"
          : CpuMemoryBudget() > 0 ? ", or raise train.memory_budget_mb"
                                  : ""));
    else
      s = Status::Internal("setting up training failed: " + what);
  }
  return s;
}

Status Trainer::SetupMemoryAndSharding() {
  // dist.shard = full probes first: a probe step with most parameters
  // released would count what it gathers as activations. Every rank probes
  // (the gathers are collectives).
  const bool probe_first = set_.dist.shard == "full";
  AttachMemory();
  if (probe_first)
    if (Status r = memory_.ProbeIfWanted(); !r.ok()) return r;
  if (Status r = sharding_.Setup(set_,
                                 {&model_.optimizer(), model_.ctx().model.get(), dp_.get(), model_.ctx().device,
                                  model_.ctx().channels_last, rank_.rank, opt_.quiet},
                                 share_to_device_);
      !r.ok()) {
    return r;
  }
  if (!probe_first)
    if (Status r = memory_.ProbeIfWanted(); !r.ok()) return r;
  return Status::Ok();
}

void Trainer::AttachMemory() {
  RunMemory::Borrowed b;
  b.settings = &set_;
  b.ctx = &model_.ctx();
  b.optimizer = &model_.optimizer();
  b.dp = dp_.get();
  b.sharding = &sharding_;
  b.input = &input_;
  b.rank = rank_.rank;
  b.world = rank_.world_size;
  b.quiet = opt_.quiet;
  b.batch = batch_;
  b.accumulate = accumulate_;
  b.batch_searched = batch_searched_;
  memory_.Attach(b);
}

// The run's first line: what trains, at which micro-batch, how long, where.
void Trainer::PrintStart() const {
  std::fprintf(
      stderr,
      "fullburn: run %lld: %s, %lld parameters, micro-batch %lld x %lld, %lld steps on %s (%s)\n",
      static_cast<long long>(run_.id), ModelLabel().c_str(),
      static_cast<long long>(sharding_.parameters() ? sharding_.parameters()->total_numel()
                                                    : ParameterCount(*model_.ctx().model)),
      static_cast<long long>(batch_), static_cast<long long>(accumulate_),
      static_cast<long long>(total_steps_), model_.ctx().device.str().c_str(),
      set_.train.precision.c_str());
}

// After a run that finished: the steps' summary, the findings (and the
// profiler trace's), the held-out result, the best and last checkpoints.
void Trainer::PrintSummary(const nlohmann::json& eval) const {
  auto steps = store_->LoadSteps(run_.id);
  if (steps.ok() && !steps->empty()) std::fputs(RenderStepsSummary(*steps).c_str(), stderr);
  if (Result<RunData> stored = store_->LoadRun(std::to_string(run_.id)); stored.ok()) {
    std::fputs(RenderFindings(Diagnose(*stored)).c_str(), stderr);
    RunTraces traces = AnalyzeRunTraces(*stored);  // profile.steps
    if (!traces.error.empty())
      std::fprintf(stderr, "  the profiler trace could not be analysed: %s\n",
                   traces.error.c_str());
    else if (!traces.paths.empty())
      std::fprintf(stderr, "  from the profiler trace of steps %s (fullburn analyze %s):\n%s",
                   traces.steps.c_str(), traces.paths.front().c_str(),
                   RenderFindings(traces.findings, traces.findings.size()).c_str());
  }
  if (!eval.empty()) std::fprintf(stderr, "  %s\n", EvaluationLine(eval).c_str());
  if (const RunEvaluation::Best& best = evaluation_.best();
      !best.checkpoint.empty() && std::filesystem::exists(best.checkpoint))
    std::fprintf(stderr, "  best held-out loss %.4f: %s\n", best.val_loss,
                 best.checkpoint.c_str());
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

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  std::string what = e.what();
  return what.find("out of memory") != std::string::npos ||
         what.find("memory budget exceeded") != std::string::npos ||
         what.find("can't allocate memory") != std::string::npos;  // CPU allocator
}

std::string DescribeOutOfMemory(const std::exception& e) {
  std::string what = e.what();
  // The CPU allocator's "[enforce fail at alloc_cpu.cpp:75] ... you tried to
  // allocate N bytes. Error code 12 ..." says one useful thing: N.
  const std::string tried = "tried to allocate ";
  if (size_t at = what.find(tried); at != std::string::npos) {
    const char* number = what.c_str() + at + tried.size();
    char* end = nullptr;
    double bytes = std::strtod(number, &end);
    if (end != number && std::strncmp(end, " bytes", 6) == 0)
      return "one allocation of " + FormatBytes(bytes) + " failed";
  }
  return what.substr(0, what.find('\n'));
}

int TrainingExitCode(const Status& s, bool interrupted, bool started) {
  if (s.ok()) return interrupted ? kExitInterrupted : 0;
  if (started) return kExitFailed;  // a run that trained and failed, bad data met on the way too
  switch (s.code()) {
    // Found before the first step, and what the user gave must change: the
    // config, a path, the data, the checkpoint to resume.
    case Status::Code::kInvalidArgument:
    case Status::Code::kNotFound:
    case Status::Code::kCorruption:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

// An exception no step, evaluation or setup caught (a directory that cannot
// be made, an out-of-memory restoring a checkpoint) still ends as a Status
// and a run stored as failed, never as std::terminate.
Status Trainer::RunCatchingEverything() {
  try {
    return Run();
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    Status s = IsOutOfMemory(e) ? Status::ResourceExhausted("out of memory: " + what)
                                : Status::Internal("training failed: " + what);
    try {
      if (run_.id > 0 && !finished_) Finish("failed", TrainingExitCode(s, false, started_));
    } catch (const std::exception&) {  // the store is what failed: the message says enough
    }
    return s;
  }
}

int RunTraining(const TrainerOptions& options) {
  // A stop asked for by SIGINT/SIGTERM ends the loop at a step's end; the
  // caller's handlers are back once training returns.
  g_signal = 0;
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int code;
  {
    Trainer t(options);
    Status s = t.RunCatchingEverything();
    if (!s.ok()) std::fprintf(stderr, "fullburn: %s\n", s.message().c_str());
    code = TrainingExitCode(s, t.interrupted(), t.started());
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return code;
}

}  // namespace fullburn
