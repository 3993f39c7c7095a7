// Internal to analyze: one trace file as read, kept compact (only what the
// analyses use), and the reader that fills it.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fullburn/status.h"

namespace fullburn::analyze {

// Names are interned: a kernel's name is stored once, each event holds its id.
class StringTable {
 public:
  uint32_t Intern(std::string_view s);
  const std::string& Get(uint32_t id) const { return strings_[id]; }
  size_t size() const { return strings_.size(); }

 private:
  std::deque<std::string> strings_;  // a deque: the map's keys point into it
  std::unordered_map<std::string_view, uint32_t> index_;
};

// Kineto's timestamps are microseconds, integers in older traces and floats
// with nanosecond digits in newer ones. HTA rounds a float start up and a
// float end down; on integers this changes nothing, so it applies to every
// event. An event shorter than the rounding ends where it starts.
inline int64_t StartUs(double ts) { return static_cast<int64_t>(std::ceil(ts)); }
inline int64_t EndUs(double ts, double dur) {
  int64_t s = StartUs(ts), e = static_cast<int64_t>(std::floor(ts + dur));
  return e < s ? s : e;
}

constexpr int64_t kNoCorrelation = INT64_MIN;

enum class GpuKind : uint8_t { kKernel, kMemcpy, kMemset };

// A kernel, copy or memset: an event with args.stream (HTA's test).
struct GpuOp {
  double ts = 0, dur = 0;
  int64_t correlation = kNoCorrelation;
  int64_t bytes = -1;
  int32_t stream = 0;
  int32_t device = 0;
  uint32_t name = 0;
  uint32_t pid = 0, tid = 0;  // for flows: the op's place on the timeline
  GpuKind kind = GpuKind::kKernel;
  int64_t start() const { return StartUs(ts); }
  int64_t end() const { return EndUs(ts, dur); }
};

// A host event with a correlation id or a CUDA runtime/driver call.
struct HostCall {
  double ts = 0, dur = 0;
  int64_t correlation = kNoCorrelation;
  uint32_t name = 0;
  uint32_t pid = 0, tid = 0;
  int64_t start() const { return StartUs(ts); }
  int64_t end() const { return EndUs(ts, dur); }
};

// Host spans the analyses name: steps, data loading, optimizer steps,
// synchronizations and the ops that cause them.
enum class SpanKind : uint8_t {
  kStep,
  kGpuStepAnnotation,
  kDataLoader,
  kOptimizer,
  kSync,
  kSyncOp,
  kHostCollective,  // a collective on the host: Gloo's "gloo:all_reduce" and the like
  kPythonFrame      // torch 2.x's with_stack: a python_function event, "file.py(12): fn"
};
struct Span {
  double ts = 0, dur = 0;
  uint32_t name = 0;
  uint32_t tid = 0;
  uint32_t stack = UINT32_MAX;  // interned "Call stack" of a sync op, when recorded
  int64_t step = -1;            // ProfilerStep#N
  SpanKind kind = SpanKind::kStep;
  int64_t start() const { return StartUs(ts); }
  int64_t end() const { return EndUs(ts, dur); }
};

// One end of a CPU-to-GPU flow (ac2g; older async_cpu_to_gpu, and Kineto
// 1.x's "async"/"launch"): id is the correlation.
struct FlowEnd {
  double ts = 0;
  int64_t id = 0;
  uint32_t pid = 0, tid = 0;
  bool start = false;
};

struct RawTrace {
  std::string path;
  StringTable strings;
  std::vector<GpuOp> gpu;
  std::vector<HostCall> calls;
  std::vector<Span> spans;
  std::vector<FlowEnd> flows;
  bool keep_flows = true;  // until a GPU op carries its own correlation
  // distributedInfo and deviceProperties, when present.
  int rank = -1, world_size = -1;
  std::string backend;
  std::string device_name;
  double base_time_ns = 0;
  // Counts for the notes.
  int64_t events = 0;
  int64_t negative_durations = 0;
  int64_t absurd_times = 0;  // ts or dur past kMaxTraceUs
  int64_t host_events = 0;
  double host_min_ts = INFINITY, host_max_end = -INFINITY;
  double min_ts = INFINITY, max_end = -INFINITY;
};

// Times are kept as doubles and cut to whole microseconds for the
// intervals: past 2^53 us (285 years) that cut is no longer exact, and past
// 2^63 it is undefined. No profiler's clock gets there.
constexpr double kMaxTraceUs = 9007199254740992.0;

// Reads a .json or .json.gz trace (gzip recognized by its magic bytes, not
// the name). Accepts Kineto's object form ({"traceEvents": [...], ...}) and
// the legacy profiler's bare array of events (Debian's torch 1.13).
Result<RawTrace> ReadTrace(const std::string& path);

}  // namespace fullburn::analyze
