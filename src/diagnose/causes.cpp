// The cause catalog (causes.h): one entry per cause. The fix texts are what
// the rules used to spell out beside their logic; the sources of each
// threshold are in facts.h and docs/diagnosis.md.
#include "fullburn/causes.h"

#include <fmt/format.h>

#include "fullburn/status.h"

namespace fullburn {
namespace {

constexpr double kNever = NAN;

// Indexed by Framework: PyTorch, Lightning, HF Trainer, accelerate, fullburn train.
std::vector<Cause> Build() {
  using C = CauseId;
  const CauseScope run = CauseScope::kRun, fleet = CauseScope::kFleet;
  return {
      {C::kInputCpu, "input_cpu", "Input-bound: the CPU cannot prepare batches fast enough",
       "data wait >= 10% of step time (or GPU utilization < 50% without steps) with the host "
       "CPU >= 80% busy",
       {"decode and augment less on the CPU: pack the images once at the size you train at "
        "(fullburn pack SRC DST --max-side 256; read by python/fullburn_pack.py's PackDataset "
        "in place of ImageFolder), augment on the GPU (DALI, torchvision v2 on tensors), more "
        "cores",
        nullptr, nullptr, nullptr,
        "decode less: fullburn pack SRC DST --format raw --max-side 256 (decoding disappears), "
        "smaller source images, or more cores for the loader"},
       "the input pipeline needs more CPU: a pack (`fullburn pack`), GPU augmentation, or a "
       "higher CPU limit",
       "pack", kNever, run, true},
      {C::kInputIo, "input_io", "Input-bound: waiting on storage",
       "data wait >= 10% of step time with CPU iowait >= 10%",
       {"copy the data to local SSD or RAM (/dev/shm), pack small files into large shards "
        "(fullburn pack SRC DST, read by python/fullburn_pack.py's PackDataset in place of "
        "ImageFolder; or WebDataset), DataLoader(prefetch_factor=4)",
        nullptr, nullptr, nullptr,
        "read from local SSD or RAM: data.cache_mb = the dataset size, or pack it once "
        "(fullburn pack SRC DST --format raw) for sequential reads"},
       "storage-bound: local SSD or /dev/shm, shards (`fullburn pack`), prefetch", "cache",
       kNever, run, true},
      {C::kInputWorkers, "input_workers", "Input-bound with idle cores: too few loader workers",
       "data wait >= 10% of step time with the host CPU < 80% busy; from a trace, the GPU idle "
       "while the host was in the DataLoader",
       {"DataLoader(num_workers={workers}, persistent_workers=True, pin_memory=True); or "
        "fullburn train's loader",
        nullptr, nullptr, nullptr,
        "data.threads {threads} (or 0: tuned while running); data.prefetch = 0 (tuned) absorbs "
        "bursts"},
       "more DataLoader workers (num_workers = cores - 1, persistent_workers, pin_memory), or "
       "fullburn.ImageLoader",
       "loader_threads", 0.05, run, true},
      {C::kH2dCopy, "h2d_copy", "Host-to-device copies take a large share of each step",
       "copies to the device >= 10% of step time (or PCIe >= 12 GB/s with GPU utilization < 50% "
       "without steps)",
       {"{pin_memory} and .to(device, non_blocking=True); send uint8 and normalize on the GPU; "
        "copy the next batch while this one computes",
        nullptr, nullptr, nullptr,
        "keep the inputs small on the wire: uint8 images normalized on the device, "
        "data.image_size; the loader pins and copies ahead (data.prefetch = 0 tunes it)"},
       "pinned memory and non_blocking copies, uint8 on the wire", "prefetch", 0.05, run, true},
      {C::kSmallBatch, "small_batch", "GPU underused: small batches or launch overhead",
       "data wait < 10% of step time yet GPU utilization < 50%; from a trace, the GPU idle "
       "while the host launched work",
       {"raise the batch size{batch}; fewer, larger kernels: torch.compile(mode=\"reduce-overhead\") "
        "(CUDA graphs)",
        nullptr, nullptr, nullptr,
        "train.batch_size = auto (the largest that fits, fastest measured){batch}; "
        "train.cuda_graphs = true (the whole step replayed from one CUDA graph)"},
       "a larger batch (`train.batch_size = auto`) or CUDA graphs", "batch", 0.05, run, false},
      {C::kMemoryHeadroom, "memory_headroom", "GPU memory headroom: the batch can grow",
       "peak GPU memory < 50% of total",
       {"raise the batch size{batch}", nullptr, nullptr, nullptr,
        "train.batch_size = auto{batch}"},
       "", "batch", kNever, run, false},
      {C::kMemoryPressure, "memory_pressure", "GPU memory near full: out-of-memory risk",
       "peak GPU memory > 95% of total; host swapping in >= 10% of samples or < 5% available",
       {"smaller batch with gradient accumulation, bf16 autocast, activation checkpointing",
        nullptr, nullptr, nullptr,
        "lower train.batch_size and raise train.accumulate, or train.precision = bf16"},
       "smaller micro-batches with accumulation, bf16", "", kNever, run, false},
      {C::kThrottlePower, "throttle_power", "Clocks held down by the power limit",
       "power-capped in >= 5% of samples",
       {"check the enforced power limit (nvidia-smi -q -d POWER) and the supply"},
       "power-capped: check the enforced power limit and the supply", "", kNever, run, false},
      {C::kThrottleThermal, "throttle_thermal", "Clocks held down by temperature",
       "thermally throttled in >= 5% of samples",
       {"improve cooling: airflow, fan curve, ambient temperature"},
       "thermal throttling: the node's cooling", "", kNever, run, false},
      {C::kIdlePhases, "idle_phases", "The device idles between phases",
       ">= 10% of the run outside training steps: start-up, evaluation, checkpoints, the end",
       {"evaluation: evaluate less often, on a subset, or with a larger batch",
        nullptr, nullptr, nullptr,
        "evaluation: evaluate less often (raise eval.every_steps or eval.every_epochs) or on "
        "fewer samples (eval.max_samples)"},
       "idle between phases (start-up, evaluation, checkpoints): less often, asynchronous "
       "checkpoints",
       "", kNever, run, false},
      {C::kUnevenRanks, "uneven_ranks", "Straggler: one rank is slowest, the others wait for it",
       "ranks' median step work >= 10% apart (or GPUs >= 20 points apart in utilization)",
       {"look at rank {rank}'s input: its DataLoader workers, its shard (DistributedSampler "
        "gives equal ones), its host's CPU and disk",
        nullptr, nullptr, nullptr,
        "look at rank {rank}'s input: its host's CPU and disk, other jobs there; every rank the "
        "same data.threads"},
       "a straggler rank: its input, clocks, PCIe and neighbours; equal shards", "", 0.10, run,
       false},
      {C::kCommunication, "communication", "Communication not hidden behind backward",
       "gradient communication >= 10% of step time beyond waiting for stragglers",
       {"DDP(bucket_cap_mb=...), bf16 compression hook, no_sync() with gradient accumulation; "
        "check the interconnect (NCCL_DEBUG=INFO)",
        nullptr, nullptr, nullptr,
        "overlap more: smaller first buckets, bf16 gradient compression, raise train.accumulate "
        "(one reduction per effective batch); check the interconnect (NCCL_DEBUG=INFO)"},
       "overlap gradient buckets, compress, accumulate more per reduction", "", 0.10, run, false},
      {C::kStepStalls, "step_stalls", "Some steps stall",
       "steps whose work is >= 3x the median step's, >= 5% of the run",
       {"irregular stalls: Python's garbage collector (gc.freeze() once the model and data are "
        "set up), other processes competing for the host's CPUs"},
       "what the loop does every K steps (a blocking save, garbage collection)", "", kNever, run,
       false},
      {C::kCheckpointStall, "checkpoint_stall", "Checkpoints hold up the training loop",
       "checkpoint saves blocked the loop >= 5% of the run",
       {"save {less_often}, or take the write off the loop: "
        "torch.distributed.checkpoint.async_save (PyTorch >= 2.4), or copy the state_dict to "
        "CPU and torch.save it on a background thread",
        nullptr, nullptr, nullptr,
        "{every} (the writes are already in the background; the loop waits for the snapshot)"},
       "save less often, or asynchronously", "", kNever, run, false},
      {C::kJobFailed, "job_failed", "The job failed",
       "an uncaught exception (its type, where it was raised, after which step)",
       {"the traceback is in the job's output; the findings below describe the run up to the "
        "failure"},
       "", "", kNever, run, false},
      {C::kRecordCut, "record_cut", "Part of the run was not recorded",
       "a stretch the store lacks: records it refused (a full disk, a read-only or deleted "
       "file, a lock held too long), kept in a spill file, or steps the job's markers could "
       "not write (their file system full); the stretch, and why",
       {"once the store has room: fullburn runs import {spill}, then diagnose again"}, "", "",
       kNever, run, false},
      {C::kLoopOverhead, "loop_overhead", "The training loop's own work between steps",
       ">= 10% of step time outside fetching, forward, backward and the optimizer step",
       {"do per-step bookkeeping every N steps: log, print and compute metrics every 50 steps, "
        "keep running sums as tensors (loss.detach()) and read them (.item()) only then, since "
        "on a GPU each read waits for the device; move slow calls (a synchronous logger, plots, "
        "file writes) to a thread or to the epoch's end; the finding's where names the call "
        "(fullburn run samples the job's stacks where py-spy is installed: pip install py-spy)"},
       "log and read `.item()` every N steps, not every step", "", 0.05, run, false},
      {C::kGpuUnused, "gpu_unused", "The job did not use the GPU",
       "GPU utilization never above 5% over the run",
       {"if it should train on the GPU: move the model and each batch there "
        "(model.to(\"cuda\"), batch.to(\"cuda\", non_blocking=True)) and check "
        "torch.cuda.is_available() and CUDA_VISIBLE_DEVICES in the job's environment; a job "
        "meant for the CPU needs no GPU findings",
        nullptr, nullptr, nullptr,
        "check train.device and that this libtorch sees the GPU (fullburn version)"},
       "the job runs on the CPU: move the model and batches to the GPU", "", kNever, run, false},
      {C::kHostSync, "host_sync", "Host syncs: the GPU idles after the host waited for it",
       "from a trace: GPU idle >= 5% of the kernel span in gaps that began in a synchronization",
       {"read CUDA values on the host only every N steps (.item(), .cpu(), print of a tensor, an "
        "`if` on a tensor each wait for the GPU): keep running sums as tensors; "
        "torch.cuda.set_sync_debug_mode(\"warn\") names every call that synchronizes"},
       "", "", 0.05, run, false},
      {C::kCpuThreads, "cpu_threads", "Training on the CPU with cores idle",
       "no GPU sampled, little data wait, the job's processes using fewer cores than it may",
       {"torch.set_num_threads({cores}) (or OMP_NUM_THREADS={cores}) before training; if it ran "
        "on a GPU, NVML did not see it (fullburn version names the driver)",
        nullptr, nullptr, nullptr, "train.threads = 0 (this rank's share of the CPUs) or {cores}"},
       "torch.set_num_threads(cores)", "threads", kNever, run, false},
      {C::kPrecision, "precision", "Matmuls in fp32 on a tensor-core GPU",
       "no autocast seen and fp32 parameters with TF32 off; or tensor activity < 10% while SM "
       "activity >= 50%; or fp32 GEMM kernels >= 5% of a trace's kernel span",
       {"torch.autocast(\"cuda\", dtype={dtype}) around the forward and the loss{scaler}",
        "Trainer(precision=\"{lightning}\")", "TrainingArguments({hf}=True)",
        "Accelerator(mixed_precision=\"{short}\")", "train.precision = {short}"},
       "mixed precision (bf16 autocast) or TF32: its tensor cores sat idle", "precision", 0.05,
       run, false},
      {C::kLowMfu, "low_mfu", "GPU busy but used inefficiently: low model FLOPs utilization",
       "GPU busy (utilization >= 80%) with MFU < 20%, or SM occupancy < 25%",
       {"{batch}compile the model: model = torch.compile(model) (fused kernels); with many short "
        "kernels, CUDA graphs: torch.compile(model, mode=\"reduce-overhead\")",
        "{batch}compile the LightningModule: model = torch.compile(model) before trainer.fit(model)",
        "{batch}TrainingArguments(torch_compile=True)",
        "{batch}Accelerator(dynamo_backend=\"inductor\")",
        "{batch}train.cuda_graphs = true (the whole step replayed from one CUDA graph)"},
       "busy but at low MFU: a larger batch, torch.compile, mixed precision", "batch", kNever, run,
       false},
      {C::kHealthy, "healthy", "No bottleneck found", "no cause costs >= 5% of the time",
       {"compute-bound: if the model runs in fp32, torch.autocast(dtype=torch.bfloat16) uses "
        "tensor cores",
        nullptr, nullptr, nullptr, "compute-bound: nothing to fix in the input or memory"},
       "none needed: busy while held", "", 0.05, run, false},
      {C::kIdleHeld, "idle_held", "A job holds the GPU and runs nothing",
       "held (a compute process on it) with utilization < 5%",
       {"end the job or release the GPU"},
       "a job holds the GPU and runs nothing: end it or release the GPU (an idle notebook, a "
       "hung job, a job waiting for input: `py-spy dump --pid PID`)",
       "", kNever, fleet, false},
      {C::kNotHeld, "not_held", "Free capacity", "no process on the GPU",
       {"schedule work on it"},
       "free capacity: nothing ran on it (scheduling, or fewer jobs than GPUs)", "", kNever, fleet,
       false},
      {C::kUndiagnosed, "undiagnosed", "Held and partly busy, not diagnosed",
       "held, busy some of the time, no fullburn diagnosis of its job",
       {"run the job under fullburn run"},
       "held and partly busy, no diagnosis: run the job under `fullburn run` (or `fullburn "
       "attach PID`) on a node that runs `fullburn serve`, to name the cause",
       "", kNever, fleet, false},
      {C::kUnreported, "unreported", "No held state reported", "no fullburn_gpu_held series",
       {"scrape fullburn serve on this node"},
       "no held state: scrape `fullburn serve` on this node", "", kNever, fleet, false},
  };
}

// Where each cause's time goes in the job's code: the input pipeline's in
// the workers (or the main process's data wait with num_workers=0), the
// loop's own in what no measured phase covers, the CPU's compute in the
// forward and backward, the idle phases' in what they are.
std::vector<std::pair<CauseId, const char*>> StackPhases() {
  using C = CauseId;
  return {{C::kInputCpu, "workers,data_wait"},   {C::kInputIo, "workers,data_wait"},
          {C::kInputWorkers, "data_wait,workers"}, {C::kLoopOverhead, "other"},
          {C::kHostSync, "other,forward"},        {C::kCpuThreads, "forward,backward"},
          {C::kSmallBatch, "forward"},            {C::kPrecision, "forward"},
          {C::kLowMfu, "forward"},                {C::kIdlePhases, "evaluation,checkpoint,startup"},
          {C::kStepStalls, "evaluation,checkpoint"}, {C::kCheckpointStall, "checkpoint"}};
}

}  // namespace

const std::vector<Cause>& Causes() {
  static const std::vector<Cause> causes = [] {
    std::vector<Cause> c = Build();
    for (size_t i = 0; i < c.size(); ++i)  // CauseOf indexes by id
      FB_CHECK(static_cast<size_t>(c[i].id) == i);
    for (auto [id, phases] : StackPhases()) c[static_cast<size_t>(id)].stack_phases = phases;
    return c;
  }();
  return causes;
}

const Cause& CauseOf(CauseId id) { return Causes()[static_cast<size_t>(id)]; }

const Cause* FindCause(std::string_view name) {
  for (const Cause& c : Causes())
    if (name == c.name) return &c;
  return nullptr;
}

const char* FixFor(CauseId id, Framework f) {
  const Cause& c = CauseOf(id);
  const char* own = c.fix[static_cast<int>(f)];
  return own ? own : c.fix[0];
}

const char* SettingIn(FrameworkSetting s, Framework f) {
  static const char* const table[][kFrameworkCount] = {
      // kLoaderArgs: {args} the DataLoader's, {made} where the job made it
      {"",
       "in Lightning: give the DataLoader that your LightningDataModule's (or "
       "LightningModule's) train_dataloader() returns {args}{made}",
       "in the Trainer's terms: TrainingArguments(dataloader_num_workers={workers}, "
       "dataloader_persistent_workers=True, dataloader_pin_memory=True, "
       "dataloader_prefetch_factor=4): the Trainer builds its DataLoader from them{made}",
       "with accelerate: give the DataLoader you pass to accelerator.prepare() {args}{made}",
       "data.threads, data.prefetch"},
      // kEvaluationSchedule
      {"",
       "in Lightning: Trainer(val_check_interval=..., check_val_every_n_epoch=..., "
       "limit_val_batches=...), a larger batch in val_dataloader()",
       "in the Trainer's terms: TrainingArguments(eval_steps=..., per_device_eval_batch_size=...), "
       "or a smaller eval_dataset",
       "", "eval.every_steps, eval.every_epochs, eval.max_samples"},
      // kCheckpointSchedule
      {"",
       "in Lightning: ModelCheckpoint(every_n_train_steps=...), or "
       "Trainer(plugins=[AsyncCheckpointIO()])",
       "in the Trainer's terms: TrainingArguments(save_steps=..., save_total_limit=...)", "",
       "checkpoint.every_steps, checkpoint.async"},
  };
  return table[static_cast<int>(s)][static_cast<int>(f)];
}

Framework FrameworkFrom(std::string_view hooks_framework, bool trainer) {
  if (trainer) return Framework::kFullburnTrain;
  if (hooks_framework == "lightning") return Framework::kLightning;
  if (hooks_framework == "transformers") return Framework::kTransformers;
  if (hooks_framework == "accelerate") return Framework::kAccelerate;
  return Framework::kPytorch;
}

const char* FrameworkName(Framework f) {
  static const char* const names[kFrameworkCount] = {"PyTorch", "Lightning", "HF Trainer",
                                                     "accelerate", "fullburn train"};
  return names[static_cast<int>(f)];
}

std::string RenderCauses(bool markdown) {
  std::string out;
  if (markdown)
    out =
        "| cause | named by | title | evidence | fleet's wording | tune's knob | trace threshold "
        "|\n|---|---|---|---|---|---|---|\n";
  for (const Cause& c : Causes()) {
    std::string trace =
        std::isnan(c.trace_share) ? "-" : fmt::format("{:.0f}%", c.trace_share * 100);
    const char* by = c.scope == CauseScope::kFleet ? "fleet" : "diagnose";
    if (markdown)
      out += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", c.name, by, c.title,
                         c.evidence, *c.fleet ? c.fleet : "-",
                         *c.tune_knob ? fmt::format("`{}`", c.tune_knob) : "-", trace);
    else
      out += fmt::format("{:<17} {:<8} {}\n", c.name, by, c.title);
  }
  return out;
}

}  // namespace fullburn
