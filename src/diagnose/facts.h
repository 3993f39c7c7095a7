// Internal to diagnose: what the rules read, gathered once from a run, and
// the thresholds they compare it with (docs/diagnosis.md gives the sources).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/gpu_peaks.h"
#include "fullburn/percent.h"

namespace fullburn::diagnose {

constexpr double kDataWaitShare = 0.10;  // of step time: the input pipeline is a bottleneck
constexpr double kH2dShare = 0.10;       // of step time: copies to the device are a bottleneck
constexpr double kCommShare = 0.10;      // of step time: communication not hidden behind backward
constexpr double kLoopShare = 0.10;   // of step time: the loop's own work outside the step's phases
constexpr double kCpuSaturated = 80;  // host.cpu_util %, all cores
constexpr double kCpuThrottled = 25;  // host.cpu_throttled %: kubernetes-mixin's CPUThrottlingHigh
constexpr double kLauncherBusy = 80;  // proc.cpu_util %, one core: the launching thread is busy
constexpr double kIoWait = 10;        // host.cpu_iowait %
constexpr double kGpuLowUtil = 50;    // gpuN.util %, median
constexpr double kGpuBusy = 80;       // gpuN.util %, median: healthy
constexpr double kGpuIdle = 10;       // gpuN.util %: a sample of an idle GPU
constexpr double kGpuUnused = 5;      // gpuN.util %: never above this over a run, not used
constexpr double kPcieBusy = 12e9;    // bytes/s host-to-device: about half a Gen4 x16 link
constexpr double kMemHeadroom = 0.5;  // peak GPU memory / total below this: the batch can grow
constexpr double kMemNearFull = 0.95;    // peak GPU memory / total above this: near OOM
constexpr double kHostMemLow = 0.05;     // host available / total below this
constexpr double kSwapShare = 0.10;      // share of samples swapping
constexpr double kThrottleShare = 0.05;  // share of samples throttled
constexpr double kUnevenUtil = 20;       // points between the busiest and the idlest GPU
constexpr double kUnevenRanks = 0.10;    // spread of per-rank work time / the slowest rank's
constexpr double kIdleGapSteps = 5;    // a gap between steps longer than this many median steps...
constexpr double kIdleGapMin_s = 1.0;  // ...and this many seconds is an idle phase
constexpr double kIdleShare = 0.10;    // of wall time idle outside steps
constexpr double kMinShare = 0.05;     // smaller losses are not reported as problems
// cpu_threads judges a wrapped job only when its processes keep at least this
// much of a core busy (proc.cpu_util %): below it the loop waits, not computes.
constexpr double kCpuThreadsMinBusy = 70;
// fullburn.ImageLoader's images/s per core over torch's DataLoader's on the
// same cores (bench/python_loader_vs_torch, docs/benchmarks.md): what the
// swap is said to gain.
constexpr double kPythonLoaderSpeedup = 3.3;  // 3.33x synthetic JPEGs, 4.40x photographs
constexpr double kStallSteps = 3;             // a step whose work is this many medians is a stall
constexpr int kStallWarmupSteps = 3;  // each rank's first steps (allocator, autotuning, compile)
constexpr int kStallMinSteps = 10;    // steps needed for a median to judge against
// Used well, not just busy (GPM readings, FLOP counts; docs/diagnosis.md).
// DCGM's guidance: SM activity >= 0.8 is necessary for good use, < 0.5
// likely means the GPU is used ineffectively.
constexpr double kSmActiveLow = 50;  // gpuN.sm_active %, median
constexpr double kSmActiveGood = 80;
// Tensor pipes this idle while the SMs are busy: fp32 math. The lent H100's
// fp32 matmul loop read 0% (docs/benchmarks.md, "Monitoring").
constexpr double kTensorIdle = 10;  // gpuN.tensor_active %, median
// fp32 FLOPs (outside TF32) of the counted step's matmuls and convolutions
// at or above this share: the model trains in fp32.
constexpr double kFp32FlopShare = 0.5;
// kMfuLow (causes.h): MFU under it, with the GPU busy, is used inefficiently.
// Eager bf16 GPT-2 124M ran at ~13% MFU on an A100 where torch.compile,
// flash attention and fused AdamW reached ~43% (build-nanogpt); llm.c
// reaches ~38% on an H100.
constexpr double kCheckpointTarget = 0.02;  // the share of wall time a checkpoint period aims at
constexpr double kSlowWrite = 500e6;        // bytes/s: below this a save waited on its disk

struct GpuFacts {
  int index = 0;
  int rank = 0;                 // 0: rank 0's node; R: sampled by rank R on its node (rankR.gpuN.*)
  double util = NAN;            // median %
  double util_max = NAN;        // highest sample of the whole run, %
  double mem_peak_share = NAN;  // peak used / total
  double pcie_rx = NAN;         // median bytes/s, host to device
  // GPM medians, % (NaN: not read; Hopper and newer)
  double sm_active = NAN, tensor_active = NAN, sm_occupancy = NAN, fp32_active = NAN;
  std::string Name() const;     // "GPU 1", or "GPU 1 of rank 4's node"
};

struct RankFacts {
  int rank = 0;
  double work_s = NAN;  // median step time outside communication
  // Median forward time, where timed: the one phase with no communication
  // in it (gradients all-reduced during backward put a fast rank's wait for
  // a slow one inside its backward, where work_s cannot tell it apart).
  double forward_s = NAN;
  double data_wait_share = NAN;  // of step time
  double proc_cpu = NAN;         // median % of one core of the rank's process tree
};

// A stretch of the run its store does not hold (a spill still does: a
// store_gap event); no rule reads it as idle, start-up or end.
struct CutSpan {
  double from = 0, to = 0;  // seconds into the run
  std::string clock;        // the time of day it begins, "20:22:51"
  std::string why, spill;
};

// The evaluations the step hooks (or the job's markers) timed: how many,
// how often, how long and with how many model calls each, and the script's
// own command-line options about them ("--eval-interval 20").
struct EvaluationFacts {
  int count = 0;
  double seconds = 0;
  int period = 0;       // steps between evaluations, when regular; 0: not
  int model_calls = 0;  // median per evaluation (the batches), 0: unknown
  std::string options;  // "--eval-interval 20 --eval-iters 40", "" when none seen
  std::string script;
};

struct IdleSpan {
  double start = 0, end = 0;
  std::string what;    // start-up, evaluation, checkpoint, end, between steps
  double saves_s = 0;  // checkpoint saves inside it: checkpoint_stall's, not idle_phases'
  double cut_s = 0;    // of it, what the store does not hold (CutSpan): not idle either
  double inner_s = 0;  // of it, evaluations counted as spans of their own
  double Seconds() const { return end - start - saves_s - cut_s - inner_s; }
};

// The time checkpoints blocked the training loop, on the lowest rank (the
// one that writes): a wrapped job's torch.save calls (the automatic markers'
// "checkpoint" events) or Markers.phase("checkpoint"), fullburn train's
// snapshots (stall_s). Saves after the same step are one checkpoint; saves
// on a background thread block nothing and are left out.
struct CheckpointFacts {
  struct Save {
    double start = 0, end = 0;  // seconds into the run
    double blocked_s = 0;       // the saves' time (<= end - start)
    int64_t bytes = -1;         // -1: unknown
    int64_t after_step = 0;
  };
  std::vector<Save> saves;
  double blocked_s = 0;
  int64_t period = 0;         // > 0: a checkpoint every `period` steps
  std::string source;         // "torch.save" (the automatic markers), "phase", "trainer"
  std::string path;           // the last one's
  bool trainer_async = true;  // fullburn train's checkpoint.async
  // Saves on another thread ([start, end]): they block nothing, yet compete
  // with the loop for the GIL and the cores.
  std::vector<std::pair<double, double>> background;
};

// Steps whose work (step time minus data wait, which the input rules judge)
// took kStallSteps medians or more: a synchronous save, logging or
// evaluation inside the loop, garbage collection. Judged on the lowest
// rank's steps after its warm-up; in data-parallel training every rank
// waits for a stalled one.
struct StallFacts {
  int judged = 0;                   // steps judged
  int stalls = 0;                   // of them, stalled
  double median_s = NAN;            // median work per step
  double longest_s = 0;             // the longest stalled step's work
  double excess_s = 0;              // over the stalls: work beyond the median
  int64_t period = 0;               // > 0: the stalls recur every `period` steps
  std::vector<int64_t> first;       // the first stalled step numbers (up to 4)
  std::string phase;                // the step phase that grew most ("backward"), or ""
  int beside_background_saves = 0;  // stalls that overlapped a save on another thread
};

struct Facts {
  bool trainer = false;        // a fullburn train run (knobs are config keys), else a wrapped job
  bool attached = false;       // fullburn attach: a job started elsewhere, no step markers possible
  std::vector<GpuFacts> gpus;  // the job's GPUs
  std::vector<std::string> other_gpus;  // sampled, but no process of the job ran there
  double gpu_util = NAN;                // mean over GPUs of the median
  double mem_peak_share = NAN;          // max over GPUs
  double pcie_rx = NAN;                 // max over GPUs of the median
  // GPM over the job's GPUs: the mean of each one's median (NaN: none read).
  double sm_active = NAN, tensor_active = NAN, sm_occupancy = NAN, fp32_active = NAN;
  // The job's GPU model (rank 0's first GPU) and its row of the peak table.
  std::string gpu_model;
  const GpuPeak* peak = nullptr;
  // The step hooks' count of one step's FLOPs (a "flops" event) and the
  // MFU it gives; mfu.why says why there is none.
  struct FlopFacts {
    double flops = NAN;
    double fp32_simt_flops = 0;  // fp32 matmuls and convolutions outside TF32
    std::string device;          // where they ran: "cuda", "cpu"
    bool tf32_matmul = false, tf32_cudnn = false;
  };
  std::optional<FlopFacts> flop_count;
  Mfu mfu;
  // Host readings: the worst node's (every node's first rank samples its
  // host), with the rank that sampled it; -1 when there was no reading.
  double cpu = NAN, iowait = NAN, proc_cpu = NAN;
  int cpu_rank = -1, iowait_rank = -1;
  // In a container with a CPU quota, `cpu` is the job's CPU as a share of the
  // quota when that is higher than the host's (a 4-CPU pod on a 64-CPU host
  // is saturated at 6% host CPU); throttled is the median % of CFS periods.
  double cpu_quota = NAN, cpu_throttled = NAN;
  bool cpu_of_quota = false;
  double swap_share = 0, host_avail_min_share = NAN;
  double power_share = 0, thermal_share = 0;
  bool have_steps = false;      // steps with their data wait timed
  int64_t step_records = 0;     // steps recorded, timed or not
  double data_wait_share = NAN, h2d_share = NAN, comm_share = NAN;  // of timed step time
  int64_t batch = 0;                                                // median samples per step
  // Step time outside every measured phase (data wait, copy, forward,
  // backward, optimizer, communication): the loop's own work between steps.
  // Over the steps whose forward was timed; NaN: none was.
  double loop_share = NAN;
  double loop_median_s = NAN, phased_step_median_s = NAN;  // per step
  double loop_mean_s = NAN, phased_step_mean_s = NAN;      // loop_share is mean / mean
  // No DataLoader fed those steps (a get_batch() loop): the batches are made
  // in the loop's own work, untimed.
  bool loop_makes_batches = false;
  std::vector<RankFacts> ranks;
  std::vector<IdleSpan> idle;  // from steps, or from GPU samples without steps
  EvaluationFacts evaluations;
  std::vector<CutSpan> cuts;   // stretches the store refused (to the run's end when it holds no end)
  StallFacts stalls;
  CheckpointFacts checkpoints;
  // The uncaught Python exception a wrapped job's process raised first
  // (python/fullburn_autosteps/exceptions.py's "exception" event); type empty: none.
  struct Failure {
    std::string type, message, where;  // where: "train.py:42"
    int rank = 0;
    int ranks = 0;          // ranks that raised one
    int64_t last_step = 0;  // that rank's last step before it (0: none)
    double t = NAN;         // seconds into the run
    // An out-of-memory's record (python/fullburn_layers.py): the layer
    // (with --layers) or the module type that ran, its pass, and the CUDA
    // allocator's bytes (NAN: not read, e.g. no CUDA).
    bool oom_recorded = false;
    std::string oom_layer, oom_module_type, oom_pass;
    double oom_allocated = NAN, oom_reserved = NAN, oom_total = NAN;
    std::string oom_alloc_conf;
  } failure;
  // fullburn train's memory model (its `memory` events, docs/memory.md): an
  // out-of-memory in a step with the setting that would fit, or a micro-batch
  // the search held down for memory that another setting would raise.
  struct MemoryModelFacts {
    bool oom = false;
    bool search_limited = false;  // a batch-size trial ran out of memory
    // The search took the memory model's largest for the run's own setting
    // (dist.shard gradients/full: its trials hold more than a rank will).
    bool chosen_by_model = false;
    int rank = 0;
    int64_t batch = 0, total = 0, limit = 0;
    int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0;
    std::string fix;  // "dist.shard = gradients", "model.checkpoint = blocks", or ""
    int64_t fix_bytes = 0;
    int64_t fits_batch = 0;  // oom: the largest micro-batch that fits as configured
    int64_t fix_batch = 0;   // search: the largest micro-batch with `fix`
  };
  std::optional<MemoryModelFacts> memory_model;
  std::optional<int> exit_code;
  double wall_s = 0;
  bool running = false;      // no end recorded: still going, or its recorder was killed
  bool interrupted = false;  // the latter (the store found the recorder gone)
  bool killed = false;       // exit code 137: SIGKILL, the kernel's OOM killer's signal
  std::string precision;
  std::string device;     // where fullburn train ran ("cpu", "cuda:0"), from the run's config
  int train_threads = 0;  // its intra-op threads (0: not recorded)
  int cores = 0;          // host.cpuN series
  // The job's processes on rank 0's node: they split its cores, so per-process
  // advice (threads, workers) counts RankCores(), not cores.
  int ranks_per_node = 1;
  int RankCores() const { return cores > 0 ? std::max(1, cores / ranks_per_node) : 0; }
  int data_threads = -1;  // data.threads of a fullburn train run (0: tuned)
  // A wrapped job's torch DataLoader as python/fullburn_markers.py saw it (its
  // "dataloader" event); -1: not reported.
  int loader_workers = -1, loader_pin_memory = -1;
  std::string loader_dataset;  // the DataLoader's dataset class, when the markers told
  // Where the job's code made it ("train.py:47", "ShapesData.train_dataloader")
  // and the framework involved ("lightning", "transformers", "accelerate",
  // "timm"; empty: none), from python/fullburn_autosteps/frameworks.py.
  std::string loader_created_at, loader_created_in, loader_framework;
  // The script's command-line option that set num_workers ("--workers"), and the script's name.
  std::string loader_workers_flag, loader_script;
  bool python_loader = false;  // a wrapped job fed by fullburn.ImageLoader (its loader events)
  // The job's GPUs were sampled, and none ever ran a kernel worth the name.
  bool GpuUnused() const;
};

Facts Gather(const RunData& run);
// Whether a rule before named `id`: rules read each other's findings by id.
inline bool Named(const std::vector<Finding>& out, CauseId id) {
  return std::any_of(out.begin(), out.end(), [id](const Finding& x) { return x.cause == id; });
}
// The GPU part of Gather: gpus, other_gpus, gpu_util, mem_peak_share, pcie_rx, throttling.
void GatherGpus(const RunData& run, Facts* f);
double Median(std::vector<double> v);
// " on rank R's node" for readings another node's first rank sampled; "" for rank 0's.
std::string NodeNote(int rank);
// "host CPU median 93%", or the job's share of its container's CPU quota.
std::string CpuReading(const Facts& f);

void InputRules(const Facts& f, std::vector<Finding>* out);
// GPM medians, the GPU's peaks, the FLOP count and MFU (efficiency.cpp);
// after the GPUs and the ranks per node are known.
void GatherEfficiency(const RunData& run, Facts* f);
// A busy GPU computing in fp32 where it has tensor cores.
void PrecisionRule(const Facts& f, std::vector<Finding>* out);
// After PrecisionRule (fp32 explains a low MFU first): busy, yet little of the peak used.
void LowMfuRule(const Facts& f, std::vector<Finding>* out);
void TransferRules(const Facts& f, std::vector<Finding>* out);
// First, since the others read an idle GPU as a symptom of something else.
void GpuUseRule(const Facts& f, std::vector<Finding>* out);
// Before InputRules: a loop busy between steps explains an idle GPU better
// than a small batch does.
void LoopRule(const Facts& f, std::vector<Finding>* out);
void MemoryRules(const Facts& f, std::vector<Finding>* out);
void ThrottleRules(const Facts& f, std::vector<Finding>* out);
void IdleRules(const Facts& f, std::vector<Finding>* out);
void RankRules(const Facts& f, std::vector<Finding>* out);
void StallRule(const Facts& f, std::vector<Finding>* out);
void CheckpointRule(const Facts& f, std::vector<Finding>* out);
// After GatherSteps (the lowest rank, its steps); before the stalls and the idle spans.
void GatherCheckpoints(const RunData& run, Facts* f);
// The seconds of checkpoint saves inside [start, end] (by their times), and
// of those that came after step `step` (0: before the first).
double SavesWithin(const CheckpointFacts& c, double start, double end);
double SavesAfter(const CheckpointFacts& c, int64_t step);
// A "checkpoint" event with a duration: a save the checkpoint facts count.
bool IsTimedSave(const RunEvent& e);
// The length most gaps between these (sorted) step numbers share, when at
// least 75% of them do and it is >= min_period; else 0.
int64_t Period(const std::vector<int64_t>& at, int64_t min_period);
// A failed job's uncaught exception, named with the fix for its kind; none
// without an "exception" event.
std::optional<Finding> FailureFinding(const Facts& f);
// The record is cut: which stretch the store lacks, why, and the import that mends it.
std::optional<Finding> CutFinding(const Facts& f);

}  // namespace fullburn::diagnose
