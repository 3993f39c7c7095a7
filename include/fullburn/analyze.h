// Analyze: reads PyTorch profiler traces (Kineto's Chrome-trace JSON, one
// file per rank, `.json` or `.json.gz`) and says where each rank's GPU time
// went: HTA's temporal and idle-time breakdowns, what the host was doing
// while the GPU waited, kernels, launches, copies, communication,
// stragglers, and findings in diagnose's vocabulary (docs/analyze.md).
//
// Contract
// - Reads only the files it is given; no clocks, no store, no libtorch.
//   Everything returned is owned by the caller. No shared state: calls from
//   several threads at once are safe.
// - Expected failures (a missing file, not JSON, a truncated gzip, a file
//   cut off inside its events, no events at all) come back as a Status
//   whose one-line message names the file, the problem and the fix. A trace
//   that can be analysed only in part (CPU only, no ProfilerStep markers,
//   events with negative durations, ranks of different runs) is analysed,
//   and the report's notes say what was left out or could not be measured:
//   never a silent wrong number.
// - Memory: the text is read and parsed in blocks of about 1 MB (a gzip
//   stream inflated block by block), never whole and never as a DOM. What
//   is kept grows with the GPU ops and launch calls (about 50 and 40 bytes
//   each, ~200 bytes per op while analysing), a few marker spans per step
//   and interned names, not with the text: 17 MB for a 35 MB ResNet-50
//   trace, 190 MB for a synthetic 1 GB trace of 924,000 kernels.
// - Times are microseconds, Kineto's unit. Where HTA defines a number it is
//   computed as HTA computes it (docs/analyze.md lists the definitions and
//   the few places fullburn differs).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/status.h"

namespace fullburn {

struct AnalyzeOptions {
  // Only this rank in the report (the others are still read, to compare
  // ranks). Unset: every rank.
  std::optional<int> rank;
  // ProfilerStep#first..#last (inclusive). Unset: HTA's default window,
  // every step but the last (whose GPU work the profiler may cut short).
  std::optional<int64_t> first_step, last_step;
  // HTA's consecutive_kernel_delay: a gap shorter than this between two
  // kernels of a stream, with the second already launched, is kernel wait.
  double kernel_wait_us = 30;
  size_t top_kernels = 10;
};

// HTA's kernel classes, by name: ^nccl or ncclKernel communication;
// ^Memcpy, ^Memset, ^dma memory; the rest computation.
enum class KernelClass { kComputation, kCommunication, kMemory };
const char* KernelClassName(KernelClass c);
KernelClass ClassifyKernel(const std::string& name);

// HTA's temporal breakdown over the kernel span (last GPU op end - first
// start, every stream of the rank): idle = span - merged busy time of all
// ops; compute = merged time of computation kernels; the rest non-compute.
struct TemporalBreakdown {
  double span_us = 0;
  double idle_us = 0;
  double compute_us = 0;
  double non_compute_us = 0;
};

// GPU idle time split by what the host was doing (fullburn's addition to
// HTA's host wait). A gap whose next op was launched before the gap began is
// `queued`: the host was not the holdup (launch latency, a wait between
// streams). Any other gap is cut in this order: inside a data-loader span
// (enumerate(DataLoader)...__next__); after a synchronization call or a
// blocking copy that the gap began in (the host waited for the GPU, so it
// could not queue work ahead); inside Optimizer.step; outside every
// ProfilerStep (the loop's own Python between steps); else other (the host
// launching the next kernels, Python between ops).
struct HostCauses {
  double queued_us = 0;
  double data_loader_us = 0;
  double sync_us = 0;
  double blocking_copy_us = 0;
  double optimizer_us = 0;
  double between_steps_us = 0;
  double other_us = 0;
  double collective_us = 0;  // in a collective the host runs itself (Gloo's gloo:<op>)
  double Total() const {
    return queued_us + data_loader_us + sync_us + blocking_copy_us + optimizer_us +
           between_steps_us + other_us + collective_us;
  }
};

// HTA's idle-time breakdown of one stream: the gap before each op (from the
// previous op's end on that stream) is host wait when the op's launch call
// started after the previous op ended, kernel wait when shorter than
// kernel_wait_us, else other. host_causes splits the host wait.
struct StreamIdle {
  int64_t device = 0;
  int64_t stream = 0;
  int64_t ops = 0;
  double host_wait_us = 0;
  double kernel_wait_us = 0;
  double other_us = 0;
  HostCauses host_causes;
};

struct ClassTime {
  KernelClass cls = KernelClass::kComputation;
  int64_t count = 0;
  double total_us = 0;   // sum of durations
  double merged_us = 0;  // overlaps between streams counted once
};

struct KernelStat {
  std::string name;
  KernelClass cls = KernelClass::kComputation;
  int64_t count = 0;
  double total_us = 0, mean_us = 0, min_us = 0, max_us = 0;
};

// HTA's CUDA launch statistics: launch calls (cudaLaunchKernel and kin,
// cudaMemcpyAsync, cudaMemsetAsync) matched to their GPU op by correlation.
struct LaunchStats {
  int64_t launches = 0;
  double cpu_median_us = 0, cpu_mean_us = 0;
  double gpu_median_us = 0;
  double delay_median_us = 0, delay_p95_us = 0;  // GPU start - launch call's end
  double shorter_than_launch = 0;  // share of ops whose GPU time < their launch call's
  int64_t cpu_over_50us = 0;       // HTA's runtime_cutoff
  int64_t delay_over_100us = 0;    // HTA's launch_delay_cutoff
};

// Memory copies of one direction (HtoD, DtoH, DtoD, ...).
struct CopyStats {
  std::string direction;
  int64_t count = 0;
  double bytes = 0;
  double us = 0;
  int64_t pageable = 0;  // from or to pageable memory (Kineto's "Pageable" in the name)
  double pageable_bytes = 0;
  int64_t synchronous = 0;  // launched by cudaMemcpy (not ...Async): the host waits
  double GBps() const { return us > 0 ? bytes / us / 1e3 : 0; }
};

// Communication kernels against computation kernels of the same rank.
struct CommStats {
  int64_t kernels = 0;
  double comm_us = 0;     // merged
  double overlap_us = 0;  // of comm_us, while a computation kernel ran
  // Collectives the host ran itself (Gloo), merged within the steps: what
  // ranks are compared by when no rank ran communication kernels.
  int64_t host_collectives = 0;
  double host_collective_us = 0;
  double Exposed() const { return comm_us - overlap_us; }
};

struct StepSpan {
  int64_t number = 0;
  double start_us = 0, dur_us = 0;
};

// The host's side, measured whether or not the trace has GPU events.
struct HostSummary {
  double window_us = 0;       // the host time analysed (Σ steps, else first to last event)
  double data_loader_us = 0;  // in data-loader spans (union)
  double optimizer_us = 0;    // in Optimizer.step spans (union)
  double sync_us = 0;         // in synchronization calls
  int64_t data_loader_spans = 0;
  std::string data_loader_name;               // the most frequent data-loader span's name
  std::map<std::string, int64_t> syncs;       // "cudaStreamSynchronize in aten::item" -> count
  std::map<std::string, int64_t> sync_sites;  // "train.py(54)" -> count, where stacks were recorded
};

// The math a GEMM, convolution or attention kernel ran, read from its name
// (cuBLAS, cuDNN, CUTLASS, nvjet, xmma, flash and memory-efficient attention,
// Triton templates; the rules are in docs/analyze.md, "Matmul math"). A name
// that says nothing of its math is kUnknown, never guessed.
enum class KernelMath { kNotGemm, kBf16, kFp16, kTf32, kFp8, kFp4, kInt8, kFp32Simt, kFp64, kUnknown };
KernelMath ClassifyKernelMath(std::string_view kernel_name);
const char* KernelMathName(KernelMath m);  // "bf16 tensor cores"
const char* KernelMathKey(KernelMath m);   // "bf16_tc" (JSON)

struct RankReport {
  std::string path;
  int rank = 0;
  int world_size = 1;
  bool rank_from_trace = false;  // distributedInfo named it (else the files' order)
  std::string backend;           // distributedInfo.backend
  std::string device_name;       // deviceProperties[0].name
  double abs_start_us = 0;       // first event, on the trace's clock (to tell runs apart)
  double abs_end_us = 0;
  bool absolute_clock = false;  // timestamps are Unix time (comparable across files)
  int64_t events = 0;           // trace events read
  bool has_gpu = false;
  std::vector<StepSpan> steps;  // the steps analysed
  std::string window;           // which part of the trace was analysed, in words
  int64_t gpu_ops = 0;          // kept for the GPU analyses

  TemporalBreakdown temporal;
  HostCauses idle_causes;  // temporal.idle_us, by what the host was doing
  std::vector<StreamIdle> streams;
  std::vector<ClassTime> classes;
  std::vector<KernelStat> top_kernels;
  // GPU time of the matmul, convolution and attention kernels, by the math
  // their names say (not kNotGemm); the fp32 SIMT share is the precision finding's.
  std::map<KernelMath, double> gemm_math_us;
  LaunchStats launches;
  std::vector<CopyStats> copies;
  CommStats comm;
  HostSummary host;
  std::vector<Finding> findings;   // this rank's alone
  std::vector<std::string> notes;  // limits, things left out
};

// Across ranks: in a collective every rank waits for the last to arrive, so
// the rank with the least time in communication kernels (in Gloo's host-side
// collectives when no rank ran such kernels) is the straggler and the others'
// extra communication time is what waiting for it cost.
struct CrossRank {
  bool compared = false;
  std::string basis;  // "communication kernels" or "Gloo collectives on the host"
  int straggler = -1;
  double straggler_comm_us = 0;
  std::map<int, double> waited_us;  // rank -> its comm time beyond the straggler's
  std::string note;                 // why ranks were not compared, when they were not
};

struct TraceReport {
  std::vector<RankReport> ranks;
  CrossRank cross;
  bool mixed_runs = false;        // the files come from different runs
  std::vector<Finding> findings;  // the job's: per cause the worst rank's, plus cross-rank
  std::vector<std::string> notes;
  std::vector<std::string> errors;  // files that could not be read (one line each)
};

// One trace file as rank `rank` (used when the trace has no distributedInfo).
// Cross-rank fields are left empty.
Result<RankReport> AnalyzeTraceFile(const std::string& path, int rank,
                                    const AnalyzeOptions& options);

// Files and folders (every *.json and *.json.gz in a folder, by name). Files
// that cannot be read are listed in `errors` and the rest analysed; an
// error Status only when nothing could be.
Result<TraceReport> AnalyzeTraces(const std::vector<std::string>& paths,
                                  const AnalyzeOptions& options);

// Findings of one rank, sorted by share lost; `healthy` when none costs 5%.
std::vector<Finding> RankFindings(const RankReport& rank);

std::string RenderTraceReport(const TraceReport& report);
nlohmann::json TraceReportJson(const TraceReport& report);

}  // namespace fullburn
