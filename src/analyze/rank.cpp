// One rank's trace: the window HTA analyses, then the breakdowns. The order
// of the steps follows HTA (hta/common/trace.py, breakdown_analysis.py):
// choose the window, keep the GPU ops launched inside it, then measure.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "internal.h"
#include "intervals.h"

namespace fullburn {

const char* KernelClassName(KernelClass c) {
  switch (c) {
    case KernelClass::kCommunication:
      return "communication";
    case KernelClass::kMemory:
      return "memory";
    default:
      return "computation";
  }
}

KernelClass ClassifyKernel(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("nccl") || name.find("ncclKernel") != std::string::npos)
    return KernelClass::kCommunication;
  if (starts("Memcpy") || starts("Memset") || starts("dma")) return KernelClass::kMemory;
  return KernelClass::kComputation;
}

namespace analyze {
namespace {

constexpr int64_t kNone = INT64_MIN;
// A sync call is taken to have started a gap when the gap began inside it or
// within this long after it returned (CPU and GPU clocks agree to a few µs).
constexpr int64_t kSyncSlackUs = 20;

// A kept GPU op: the trace's own record (not copied), its launch, its class.
struct Op {
  const GpuOp* op = nullptr;
  const HostCall* launch = nullptr;
  KernelClass cls = KernelClass::kComputation;
  const GpuOp& g() const { return *op; }
  int64_t start() const { return op->start(); }
  int64_t end() const { return op->end(); }
};

struct Window {
  bool filter = false;  // keep only GPU ops whose launch is inside
  int64_t lo = kNone;   // host events with lo <= start < hi
  int64_t hi = INT64_MAX;
  std::vector<StepSpan> steps;
};

bool Inside(const Window& w, int64_t t) { return t >= w.lo && t < w.hi; }

// Links GPU ops and launch calls that carry no correlation through their
// flow events, matched on (pid, tid, ts) as HTA matches flows.
int64_t ResolveFlows(RawTrace* t) {
  if (t->flows.empty()) return 0;
  using Key = std::tuple<uint32_t, uint32_t, double>;
  std::map<Key, int64_t> starts, ends;
  for (const FlowEnd& f : t->flows) (f.start ? starts : ends)[Key(f.pid, f.tid, f.ts)] = f.id;
  int64_t linked = 0;
  for (GpuOp& op : t->gpu) {
    if (op.correlation != kNoCorrelation) continue;
    auto it = ends.find(Key(op.pid, op.tid, op.ts));
    if (it != ends.end()) {
      op.correlation = it->second;
      ++linked;
    }
  }
  for (HostCall& c : t->calls) {
    if (c.correlation != kNoCorrelation) continue;
    auto it = starts.find(Key(c.pid, c.tid, c.ts));
    if (it != starts.end()) c.correlation = it->second;
  }
  t->flows.clear();
  t->flows.shrink_to_fit();
  return linked;
}

std::string StepRange(const std::vector<StepSpan>& steps) {
  if (steps.empty()) return "no step";
  if (steps.size() == 1) return fmt::format("ProfilerStep#{}", steps[0].number);
  return fmt::format("ProfilerStep#{}-#{}", steps.front().number, steps.back().number);
}

// HTA's window: with two or more ProfilerStep#N, host events from the last
// step's start on are dropped, and GPU ops whose launch was dropped with
// them. The last step's start is the latest of every ProfilerStep event's,
// the GPU-timeline copies (gpu_user_annotation) included, as in HTA.
Result<Window> ChooseWindow(const RawTrace& t, const AnalyzeOptions& o, RankReport* r) {
  std::vector<StepSpan> host_steps;
  std::map<int64_t, int64_t> latest_start;  // step -> latest start of its events
  for (const Span& s : t.spans) {
    if (s.kind != SpanKind::kStep && s.kind != SpanKind::kGpuStepAnnotation) continue;
    auto it = latest_start.find(s.step);
    if (it == latest_start.end() || it->second < s.start()) latest_start[s.step] = s.start();
    if (s.kind == SpanKind::kStep)
      host_steps.push_back(
          {s.step, static_cast<double>(s.start()), static_cast<double>(s.end() - s.start())});
  }
  std::sort(host_steps.begin(), host_steps.end(),
            [](const StepSpan& a, const StepSpan& b) { return a.start_us < b.start_us; });
  Window w;
  if (o.first_step || o.last_step) {
    int64_t a = o.first_step.value_or(INT64_MIN), b = o.last_step.value_or(INT64_MAX);
    for (const StepSpan& s : host_steps)
      if (s.number >= a && s.number <= b) w.steps.push_back(s);
    if (w.steps.empty())
      return Status::InvalidArgument(
          fmt::format("{}: --steps {}-{}: the trace has {}", t.path, o.first_step.value_or(0),
                      o.last_step ? std::to_string(*o.last_step) : "", StepRange(host_steps)));
    w.filter = true;
    w.lo = static_cast<int64_t>(w.steps.front().start_us);
    w.hi = INT64_MIN;
    for (const StepSpan& s : w.steps)
      w.hi = std::max(w.hi, static_cast<int64_t>(s.start_us + s.dur_us));
    r->window = StepRange(w.steps) + " (asked)";
    if (w.steps.back().number == host_steps.back().number)
      r->notes.push_back(
          "the last recorded step is included: the profiler may have cut its GPU "
          "work short (HTA leaves it out)");
    return w;
  }
  if (latest_start.size() >= 2) {
    w.filter = true;
    w.hi = INT64_MIN;
    for (const auto& [step, start] : latest_start) w.hi = std::max(w.hi, start);
    int64_t last = latest_start.rbegin()->first;
    for (const StepSpan& s : host_steps)
      if (s.start_us < w.hi && s.number != last) w.steps.push_back(s);
    r->window = fmt::format("{}; the last, #{}, left out as HTA does", StepRange(w.steps), last);
    return w;
  }
  w.steps = host_steps;
  if (latest_start.empty()) {
    r->window = "the whole trace";
    r->notes.push_back(
        "no ProfilerStep markers (a profiler without a schedule, or prof.step() never "
        "called): the whole trace is analysed, step by step figures are not available");
  } else {
    r->window =
        fmt::format("the whole trace (one step, ProfilerStep#{})", latest_start.begin()->first);
    r->notes.push_back("one ProfilerStep only: the whole trace is analysed (HTA does the same)");
  }
  return w;
}

// The launch calls inside the window, by correlation.
std::vector<std::pair<int64_t, const HostCall*>> CallIndex(const RawTrace& t, const Window& w) {
  std::vector<std::pair<int64_t, const HostCall*>> index;
  for (const HostCall& c : t.calls)
    if (c.correlation != kNoCorrelation && Inside(w, c.start()))
      index.push_back({c.correlation, &c});
  std::stable_sort(index.begin(), index.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return index;
}

const HostCall* FindCall(const std::vector<std::pair<int64_t, const HostCall*>>& index,
                         int64_t corr) {
  if (corr == kNoCorrelation) return nullptr;
  auto it = std::lower_bound(index.begin(), index.end(), corr,
                             [](const auto& e, int64_t v) { return e.first < v; });
  return it != index.end() && it->first == corr ? it->second : nullptr;
}

std::vector<Op> KeepOps(const RawTrace& t, const Window& w, RankReport* r) {
  auto index = CallIndex(t, w);
  std::vector<KernelClass> cls_of(t.strings.size());
  std::vector<bool> classified(t.strings.size());
  std::vector<Op> ops;
  int64_t unlaunched = 0;
  for (const GpuOp& g : t.gpu) {
    const HostCall* launch = FindCall(index, g.correlation);
    if (w.filter && !launch) continue;
    if (!launch) ++unlaunched;
    if (!classified[g.name]) {
      cls_of[g.name] = ClassifyKernel(t.strings.Get(g.name));
      classified[g.name] = true;
    }
    ops.push_back({&g, launch, cls_of[g.name]});
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const Op& a, const Op& b) { return a.start() < b.start(); });
  if (w.filter && ops.size() < t.gpu.size())
    r->notes.push_back(
        fmt::format("{} of {} GPU ops left out: launched outside the window (or "
                    "no launch call in the trace), as HTA leaves them out",
                    t.gpu.size() - ops.size(), t.gpu.size()));
  if (unlaunched > 0)
    r->notes.push_back(
        fmt::format("{} GPU ops have no launch call in the trace: their gaps "
                    "cannot be told host wait",
                    unlaunched));
  return ops;
}

std::vector<Interval> OpIntervals(const std::vector<Op>& ops, bool (*keep)(const Op&)) {
  std::vector<Interval> v;
  for (const Op& op : ops)
    if (!keep || keep(op)) v.push_back({op.start(), op.end()});
  return Merge(std::move(v));
}

std::vector<Interval> SpanIntervals(const RawTrace& t, const Window& w, SpanKind kind) {
  std::vector<Interval> v;
  for (const Span& s : t.spans)
    if (s.kind == kind && Inside(w, s.start())) v.push_back({s.start(), s.end()});
  return Merge(std::move(v));
}

bool IsSynchronousCopyCall(const std::string& name) {
  return (name.rfind("cudaMemcpy", 0) == 0 || name.rfind("cuMemcpy", 0) == 0) &&
         name.find("Async") == std::string::npos;
}

// What the host was doing, as disjoint lists in priority order.
struct HostTimeline {
  std::vector<Interval> data_loader, optimizer, between_steps;
  std::vector<Interval> sync, blocking_copy;  // calls that make the host wait for the GPU
  std::vector<Interval> collective;           // Gloo's collectives, run by the host

  // Cuts the gap [a, b), ended by an op launched at `launch` (kNone when
  // unknown), among the causes (HostCauses' comment).
  void Explain(int64_t a, int64_t b, int64_t launch, HostCauses* c) const {
    double len = static_cast<double>(b - a);
    if (launch != kNone && launch <= a) {
      c->queued_us += len;
      return;
    }
    double dl = static_cast<double>(OverlapWith(data_loader, a, b));
    c->data_loader_us += dl;
    // Before syncs: a Gloo collective on CUDA tensors waits for the GPU (and
    // for the other ranks) inside itself.
    if (Covers(collective, a, kSyncSlackUs)) {
      c->collective_us += len - dl;
      return;
    }
    if (Covers(sync, a, kSyncSlackUs)) {
      c->sync_us += len - dl;
      return;
    }
    if (Covers(blocking_copy, a, kSyncSlackUs)) {
      c->blocking_copy_us += len - dl;
      return;
    }
    double opt = static_cast<double>(OverlapWith(optimizer, a, b));
    double between = static_cast<double>(OverlapWith(between_steps, a, b));
    c->optimizer_us += opt;
    c->between_steps_us += between;
    c->other_us += len - dl - opt - between;
  }
};

// The trace's time outside the window's ProfilerStep spans.
std::vector<Interval> OutsideSteps(const RawTrace& t, const Window& w) {
  std::vector<Interval> steps;
  for (const StepSpan& s : w.steps)
    steps.push_back(
        {static_cast<int64_t>(s.start_us), static_cast<int64_t>(s.start_us + s.dur_us)});
  int64_t lo = static_cast<int64_t>(std::floor(t.min_ts));
  int64_t hi = static_cast<int64_t>(std::ceil(t.max_end)) + 1;
  return Complement(Merge(steps), lo, hi);
}

HostTimeline BuildTimeline(const RawTrace& t, const Window& w, const std::vector<Op>& ops) {
  HostTimeline h;
  h.data_loader = SpanIntervals(t, w, SpanKind::kDataLoader);
  h.optimizer = Subtract(SpanIntervals(t, w, SpanKind::kOptimizer), h.data_loader);
  if (!w.steps.empty())
    h.between_steps = Subtract(Subtract(OutsideSteps(t, w), h.data_loader), h.optimizer);
  h.sync = SpanIntervals(t, w, SpanKind::kSync);
  h.collective = SpanIntervals(t, w, SpanKind::kHostCollective);
  std::vector<Interval> copies;
  for (const Op& op : ops) {
    if (op.g().kind != GpuKind::kMemcpy || !op.launch) continue;
    const std::string& call = t.strings.Get(op.launch->name);
    if (IsSynchronousCopyCall(call) ||
        t.strings.Get(op.g().name).find("Pageable") != std::string::npos)
      copies.push_back({op.launch->start(), op.launch->end()});
  }
  h.blocking_copy = Merge(std::move(copies));
  return h;
}

void Temporal(const std::vector<Op>& ops, const HostTimeline& h, RankReport* r) {
  std::vector<Interval> busy = OpIntervals(ops, nullptr);
  if (busy.empty()) return;
  TemporalBreakdown& tb = r->temporal;
  tb.span_us = static_cast<double>(busy.back().end - busy.front().start);
  tb.idle_us = tb.span_us - static_cast<double>(TotalLength(busy));
  tb.compute_us = static_cast<double>(TotalLength(
      OpIntervals(ops, [](const Op& op) { return op.cls == KernelClass::kComputation; })));
  tb.non_compute_us = tb.span_us - tb.compute_us - tb.idle_us;
  // The ops that end each gap start at its end; the earliest launch of theirs
  // says whether the host was late.
  size_t next = 0;
  for (const Interval& gap : Gaps(busy)) {
    while (next < ops.size() && ops[next].start() < gap.end) ++next;
    int64_t launch = kNone;
    for (size_t i = next; i < ops.size() && ops[i].start() == gap.end; ++i)
      if (ops[i].launch && (launch == kNone || ops[i].launch->start() < launch))
        launch = ops[i].launch->start();
    h.Explain(gap.start, gap.end, launch, &r->idle_causes);
  }
}

void StreamBreakdown(const std::vector<Op>& ops, const HostTimeline& h, double kernel_wait_us,
                     RankReport* r) {
  std::map<std::pair<int64_t, int64_t>, std::vector<const Op*>> by_stream;
  for (const Op& op : ops) by_stream[{op.g().device, op.g().stream}].push_back(&op);
  for (const auto& [key, list] : by_stream) {
    StreamIdle s;
    s.device = key.first;
    s.stream = key.second;
    s.ops = static_cast<int64_t>(list.size());
    int64_t out_of_order = 0;
    for (size_t i = 1; i < list.size(); ++i) {
      int64_t prev_end = list[i - 1]->end(), start = list[i]->start();
      double gap = static_cast<double>(start - prev_end);
      if (gap < 0) {
        ++out_of_order;
        gap = 0;
      }
      if (list[i]->launch && list[i]->launch->start() > prev_end) {
        s.host_wait_us += gap;
        if (gap > 0) h.Explain(prev_end, start, kNone, &s.host_causes);
      } else if (gap < kernel_wait_us) {
        s.kernel_wait_us += gap;
      } else {
        s.other_us += gap;
      }
    }
    if (out_of_order > 0)
      r->notes.push_back(fmt::format(
          "{} ops on device {} stream {} start before the previous one ends (timestamps out of "
          "order or overlapping): their gaps count as 0 (HTA would count them negative)",
          out_of_order, s.device, s.stream));
    r->streams.push_back(s);
  }
}

void Kernels(const RawTrace& t, const std::vector<Op>& ops, size_t top, RankReport* r) {
  for (KernelClass c :
       {KernelClass::kComputation, KernelClass::kCommunication, KernelClass::kMemory}) {
    ClassTime ct;
    ct.cls = c;
    std::vector<Interval> v;
    for (const Op& op : ops) {
      if (op.cls != c) continue;
      ct.count++;
      ct.total_us += static_cast<double>(op.end() - op.start());
      v.push_back({op.start(), op.end()});
    }
    ct.merged_us = static_cast<double>(TotalLength(Merge(std::move(v))));
    if (ct.count > 0) r->classes.push_back(ct);
  }
  std::map<uint32_t, KernelStat> by_name;
  for (const Op& op : ops) {
    KernelStat& k = by_name[op.g().name];
    double d = static_cast<double>(op.end() - op.start());
    if (k.count == 0) {
      k.cls = op.cls;
      k.min_us = k.max_us = d;
    }
    k.count++;
    k.total_us += d;
    k.min_us = std::min(k.min_us, d);
    k.max_us = std::max(k.max_us, d);
  }
  for (const auto& [name, k] : by_name)
    if (k.cls == KernelClass::kComputation)
      if (KernelMath m = ClassifyKernelMath(t.strings.Get(name)); m != KernelMath::kNotGemm)
        r->gemm_math_us[m] += k.total_us;
  std::vector<std::pair<uint32_t, KernelStat>> list(by_name.begin(), by_name.end());
  std::sort(list.begin(), list.end(),
            [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  for (size_t i = 0; i < list.size() && i < top; ++i) {
    KernelStat k = list[i].second;
    k.name = t.strings.Get(list[i].first);
    k.mean_us = k.total_us / static_cast<double>(k.count);
    r->top_kernels.push_back(k);
  }
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

bool IsLaunchCall(const std::string& name) {
  return name == "cudaLaunchKernel" || name == "cudaLaunchKernelExC" || name == "cuLaunchKernel" ||
         name == "cuLaunchKernelEx" || name == "cudaMemcpyAsync" || name == "cudaMemsetAsync";
}

void Launches(const RawTrace& t, const std::vector<Op>& ops, RankReport* r) {
  std::vector<double> cpu, gpu, delay;
  int64_t shorter = 0;
  LaunchStats& ls = r->launches;
  for (const Op& op : ops) {
    if (!op.launch || !IsLaunchCall(t.strings.Get(op.launch->name))) continue;
    double c = static_cast<double>(op.launch->end() - op.launch->start());
    double g = static_cast<double>(op.end() - op.start());
    double d = static_cast<double>(op.start() - op.launch->end());
    cpu.push_back(c);
    gpu.push_back(g);
    delay.push_back(d);
    if (g < c) ++shorter;
    if (c > 50) ls.cpu_over_50us++;
    if (d > 100) ls.delay_over_100us++;
  }
  ls.launches = static_cast<int64_t>(cpu.size());
  if (cpu.empty()) return;
  double sum = 0;
  for (double c : cpu) sum += c;
  ls.cpu_mean_us = sum / static_cast<double>(cpu.size());
  ls.cpu_median_us = Quantile(cpu, 0.5);
  ls.gpu_median_us = Quantile(gpu, 0.5);
  ls.delay_median_us = Quantile(delay, 0.5);
  ls.delay_p95_us = Quantile(delay, 0.95);
  ls.shorter_than_launch = static_cast<double>(shorter) / static_cast<double>(cpu.size());
}

// "HtoD" from "Memcpy HtoD (Pageable -> Device)".
std::string CopyDirection(const std::string& name) {
  if (name.rfind("Memcpy ", 0) != 0) return "other";
  size_t end = name.find(' ', 7);
  return name.substr(7, end == std::string::npos ? std::string::npos : end - 7);
}

void Copies(const RawTrace& t, const std::vector<Op>& ops, RankReport* r) {
  std::map<std::string, CopyStats> by_dir;
  for (const Op& op : ops) {
    if (op.g().kind != GpuKind::kMemcpy) continue;
    const std::string& name = t.strings.Get(op.g().name);
    CopyStats& c = by_dir[CopyDirection(name)];
    c.count++;
    c.us += op.g().dur;
    double bytes = op.g().bytes > 0 ? static_cast<double>(op.g().bytes) : 0;
    c.bytes += bytes;
    if (name.find("Pageable") != std::string::npos) {
      c.pageable++;
      c.pageable_bytes += bytes;
    }
    if (op.launch && IsSynchronousCopyCall(t.strings.Get(op.launch->name))) c.synchronous++;
  }
  for (auto& [dir, c] : by_dir) {
    c.direction = dir;
    r->copies.push_back(c);
  }
}

void Communication(const std::vector<Op>& ops, RankReport* r) {
  std::vector<Interval> comm =
      OpIntervals(ops, [](const Op& op) { return op.cls == KernelClass::kCommunication; });
  if (comm.empty()) return;
  std::vector<Interval> compute =
      OpIntervals(ops, [](const Op& op) { return op.cls == KernelClass::kComputation; });
  for (const Op& op : ops) r->comm.kernels += op.cls == KernelClass::kCommunication;
  r->comm.comm_us = static_cast<double>(TotalLength(comm));
  r->comm.overlap_us = static_cast<double>(OverlapLength(comm, compute));
}

// The first frame of a "Call stack" outside Python's and torch's own files.
std::string UserFrame(const std::string& stack) {
  size_t pos = 0;
  while (pos < stack.size()) {
    size_t end = stack.find(';', pos);
    std::string frame = stack.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    bool library = frame.find("site-packages") != std::string::npos ||
                   frame.find("dist-packages") != std::string::npos ||
                   frame.find("/lib/python") != std::string::npos ||
                   frame.find("torch/") != std::string::npos;
    if (!library && !frame.empty()) {
      size_t colon = frame.find("): ");
      return colon == std::string::npos ? frame : frame.substr(0, colon + 1);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

// torch 2.x records stacks as python_function events around the ops: the
// latest-starting one that encloses `op` and lies in the user's code.
std::string InnermostUserFrame(const std::vector<const Span*>& frames, const Span& op,
                               const RawTrace& t) {
  auto it = std::upper_bound(frames.begin(), frames.end(), op.ts,
                             [](double ts, const Span* f) { return ts < f->ts; });
  for (int back = 0; it != frames.begin() && back < 4096; ++back) {
    --it;
    if ((*it)->ts + (*it)->dur < op.ts + op.dur) continue;  // ended before: not enclosing
    const std::string& name = t.strings.Get((*it)->name);
    if (!UserFrame(name).empty()) return name;
  }
  return "";
}

void Host(const RawTrace& t, const Window& w, const HostTimeline& h, RankReport* r) {
  HostSummary& hs = r->host;
  if (!w.steps.empty()) {
    for (const StepSpan& s : w.steps) hs.window_us += s.dur_us;
  } else if (t.host_events > 0) {
    double lo = std::max(t.host_min_ts, static_cast<double>(w.lo));
    double hi = std::min(t.host_max_end, static_cast<double>(w.hi));
    hs.window_us = std::max(0.0, hi - lo);
  }
  // Shares of the steps' time: the spans clipped to the steps (a DataLoader
  // span begun before the first step, or a synchronize after the loop, once
  // made shares over 100% on real torch 2.11 traces).
  const std::vector<Interval> outside =
      w.steps.empty() ? std::vector<Interval>{} : OutsideSteps(t, w);
  auto in_steps = [&](std::vector<Interval> v) { return Subtract(Merge(std::move(v)), outside); };
  hs.data_loader_us = static_cast<double>(TotalLength(in_steps(h.data_loader)));
  hs.optimizer_us =
      static_cast<double>(TotalLength(in_steps(SpanIntervals(t, w, SpanKind::kOptimizer))));
  hs.sync_us = static_cast<double>(TotalLength(in_steps(h.sync)));
  r->comm.host_collective_us =
      static_cast<double>(TotalLength(in_steps(SpanIntervals(t, w, SpanKind::kHostCollective))));
  std::map<uint32_t, int64_t> loader_names;
  std::map<uint32_t, std::vector<const Span*>> ops_by_tid, frames_by_tid;
  for (const Span& s : t.spans) {
    if (s.kind == SpanKind::kDataLoader && Inside(w, s.start())) {
      hs.data_loader_spans++;
      loader_names[s.name]++;
    }
    if (s.kind == SpanKind::kSyncOp) ops_by_tid[s.tid].push_back(&s);
    if (s.kind == SpanKind::kPythonFrame) frames_by_tid[s.tid].push_back(&s);
    if (s.kind == SpanKind::kHostCollective && Inside(w, s.start())) r->comm.host_collectives++;
  }
  int64_t most = 0;
  for (const auto& [name, n] : loader_names)
    if (n > most) {
      most = n;
      hs.data_loader_name = t.strings.Get(name);
    }
  for (auto* by_tid : {&ops_by_tid, &frames_by_tid})
    for (auto& [tid, list] : *by_tid)
      std::sort(list.begin(), list.end(),
                [](const Span* a, const Span* b) { return a->ts < b->ts; });
  for (const Span& s : t.spans) {
    if (s.kind != SpanKind::kSync || !Inside(w, s.start())) continue;
    std::string label = t.strings.Get(s.name);
    const auto& list = ops_by_tid[s.tid];
    auto it = std::upper_bound(list.begin(), list.end(), s.ts,
                               [](double ts, const Span* op) { return ts < op->ts; });
    for (int back = 0; it != list.begin() && back < 64; ++back) {
      --it;
      if ((*it)->ts + (*it)->dur < s.ts + s.dur) continue;  // ended before: not enclosing
      label += " in " + t.strings.Get((*it)->name);
      std::string frame = (*it)->stack != UINT32_MAX
                              ? UserFrame(t.strings.Get((*it)->stack))
                              : InnermostUserFrame(frames_by_tid[s.tid], **it, t);
      if (!frame.empty()) hs.sync_sites[frame]++;
      break;
    }
    hs.syncs[label]++;
  }
}

void Notes(const RawTrace& t, int64_t linked, RankReport* r) {
  if (t.negative_durations > 0)
    r->notes.push_back(
        fmt::format("{} events with a negative duration left out (a clock "
                    "problem in the profiler)",
                    t.negative_durations));
  if (t.absurd_times > 0)
    r->notes.push_back(
        fmt::format("{} events with a time or duration beyond 2^53 us left out (no "
                    "profiler's clock; a damaged trace?)",
                    t.absurd_times));
  if (linked > 0)
    r->notes.push_back(
        fmt::format("{} GPU ops matched to their launch through flow events "
                    "(no correlation in their args)",
                    linked));
  if (!r->has_gpu)
    r->notes.push_back(
        "no GPU events: a CPU-only trace (no CUDA activity recorded); only the host side is "
        "analysed. Record ProfilerActivity.CUDA on a GPU machine for the GPU breakdowns");
  else if (r->gpu_ops == 0)
    r->notes.push_back("no GPU op launched inside the window: GPU breakdowns are empty");
}

}  // namespace

Result<RankReport> AnalyzeRaw(RawTrace& t, int rank, const AnalyzeOptions& o) {
  RankReport r;
  r.path = t.path;
  r.rank = t.rank >= 0 ? t.rank : rank;
  r.rank_from_trace = t.rank >= 0;
  r.world_size = t.world_size > 0 ? t.world_size : 1;
  r.backend = t.backend;
  r.device_name = t.device_name;
  r.events = t.events;
  r.has_gpu = !t.gpu.empty();
  if (t.events == 0 || (t.gpu.empty() && t.host_events == 0))
    return Status::InvalidArgument(t.path +
                                   ": no trace events with a duration: nothing to analyse "
                                   "(was the profiler stopped before any step?)");
  // Unix time in µs is above 1e14 (1973): only then can files be compared.
  double base_us = t.base_time_ns / 1e3;
  r.absolute_clock = t.min_ts > 1e14 || base_us > 1e14;
  double shift = t.min_ts > 1e14 ? 0 : base_us;
  r.abs_start_us = t.min_ts + shift;
  r.abs_end_us = t.max_end + shift;

  int64_t linked = ResolveFlows(&t);
  Result<Window> w = ChooseWindow(t, o, &r);
  if (!w.ok()) return w.status();
  r.steps = w->steps;
  std::vector<Op> ops = KeepOps(t, *w, &r);
  r.gpu_ops = static_cast<int64_t>(ops.size());
  HostTimeline h = BuildTimeline(t, *w, ops);
  Temporal(ops, h, &r);
  StreamBreakdown(ops, h, o.kernel_wait_us, &r);
  Kernels(t, ops, o.top_kernels, &r);
  Launches(t, ops, &r);
  Copies(t, ops, &r);
  Communication(ops, &r);
  Host(t, *w, h, &r);
  Notes(t, linked, &r);
  return r;
}

}  // namespace analyze
}  // namespace fullburn
