// fullburn analyze: synthetic traces whose answers follow from how they are
// built (every expected number is worked out in the comments), real traces
// checked against a brute-force reference written here (a microsecond
// bitmap, not the library's interval code), bad inputs, and the command.
#include "fullburn/analyze.h"

#include "../../src/analyze/source.h"  // the gzip reader with each inflater

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace fullburn {
namespace {

using nlohmann::json;
using analyze::Inflater;
using analyze::OpenSource;
namespace fs = std::filesystem;

const std::string kFixtures = ANALYZE_FIXTURES;
const std::string kWorkers0 = kFixtures + "/resnet50_v100_num_workers_0.pt.trace.json.gz";
const std::string kWorkers4 = kFixtures + "/resnet50_v100_num_workers_4.pt.trace.json.gz";
const std::string kCpuTrace = kFixtures + "/torch113_cpu_dataloader.json";
const char* const kLoaderName = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__";

std::string TempPath(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(testing::TempDir()) / ("fb_analyze_" + std::string(info->name()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
}

std::string ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string out;
  char buf[1 << 16];
  int n;
  while (f && (n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, n);
  if (f) gzclose(f);
  return out;
}

// A Kineto-shaped trace, event by event: the host is pid 100, tid 100; the
// GPU is pid 0 with a tid per stream; launches and GPU ops share a
// correlation id unless told otherwise.
class TraceBuilder {
 public:
  TraceBuilder() { doc_ = {{"schemaVersion", 1}, {"traceEvents", json::array()}}; }
  TraceBuilder& Rank(int rank, int world) {
    doc_["distributedInfo"] = {{"backend", "nccl"}, {"rank", rank}, {"world_size", world}};
    return *this;
  }
  void Add(json e) { doc_["traceEvents"].push_back(std::move(e)); }
  void Host(const std::string& name, double ts, double dur,
            const std::string& cat = "user_annotation") {
    Add({{"ph", "X"},
         {"cat", cat},
         {"name", name},
         {"pid", 100},
         {"tid", 100},
         {"ts", ts},
         {"dur", dur},
         {"args", json::object()}});
  }
  void Step(int n, double ts, double dur) { Host("ProfilerStep#" + std::to_string(n), ts, dur); }
  void Loader(double ts, double dur) { Host(kLoaderName, ts, dur); }
  // A launch call and its GPU op; returns the correlation id.
  int64_t Op(const std::string& name, double launch_ts, double gpu_ts, double dur, int stream = 7,
             const std::string& call = "cudaLaunchKernel", double call_dur = 5,
             const std::string& cat = "kernel", int64_t bytes = -1) {
    int64_t c = next_++;
    json call_args = {{"correlation", c}};
    json op_args = {{"device", 0}, {"stream", stream}, {"correlation", c}};
    if (bytes >= 0) op_args["bytes"] = bytes;
    if (!with_correlation_) {
      call_args.erase("correlation");
      op_args.erase("correlation");
      Add({{"ph", "s"},
           {"cat", flow_cat_},
           {"name", flow_cat_},
           {"id", c},
           {"pid", 100},
           {"tid", 100},
           {"ts", launch_ts}});
      Add({{"ph", "f"},
           {"cat", flow_cat_},
           {"name", flow_cat_},
           {"id", c},
           {"pid", 0},
           {"tid", stream},
           {"ts", gpu_ts},
           {"bp", "e"}});
    }
    Add({{"ph", "X"},
         {"cat", "cuda_runtime"},
         {"name", call},
         {"pid", 100},
         {"tid", 100},
         {"ts", launch_ts},
         {"dur", call_dur},
         {"args", call_args}});
    Add({{"ph", "X"},
         {"cat", cat},
         {"name", name},
         {"pid", 0},
         {"tid", stream},
         {"ts", gpu_ts},
         {"dur", dur},
         {"args", op_args}});
    return c;
  }
  int64_t Kernel(double launch_ts, double gpu_ts, double dur, int stream = 7) {
    return Op("void gemm_kernel<float>(float*)", launch_ts, gpu_ts, dur, stream);
  }
  // Ops linked only by flow events of this category (older Kineto).
  void LinkByFlows(const std::string& cat) {
    with_correlation_ = false;
    flow_cat_ = cat;
  }
  std::string Text() const { return doc_.dump(); }
  std::string Write(const std::string& name) const {
    std::string path = TempPath(name);
    WriteFile(path, Text());
    return path;
  }

 private:
  json doc_;
  int64_t next_ = 1;
  bool with_correlation_ = true;
  std::string flow_cat_;
};

RankReport Analyze(const std::string& path, AnalyzeOptions o = {}) {
  Result<RankReport> r = AnalyzeTraceFile(path, 0, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : RankReport();
}

const Finding* FindCause(const std::vector<Finding>& v, const std::string& cause) {
  for (const Finding& f : v)
    if (f.name() == cause) return &f;
  return nullptr;
}

bool HasNote(const RankReport& r, const std::string& part) {
  for (const std::string& n : r.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// Four steps on one stream, each gap made for one cause. Times in µs; the
// last step (#4) is left out as HTA leaves it.
TraceBuilder IdleScenario() {
  TraceBuilder b;
  b.Step(1, 0, 1000);
  b.Step(2, 1000, 1000);
  b.Step(3, 2100, 900);  // [2000, 2100) is between steps
  b.Step(4, 3000, 1000);
  // Step 1: after the data loader, K1 and K2 (5 µs apart, K2 queued: kernel
  // wait), K3 50 µs later (queued: other), then the host blocks in a sync
  // until K3 ends at 675 and launches K4 at 880: a 215 µs gap after a sync.
  b.Loader(0, 300);
  b.Kernel(310, 320, 100);
  b.Kernel(320, 425, 100);
  b.Kernel(330, 575, 100);
  b.Host("cudaStreamSynchronize", 340, 340, "cuda_runtime");
  b.Kernel(880, 890, 100);
  // Step 2: the loader for 400 µs; K5 at 1420 (gap 990-1420: 400 in the
  // loader, 30 other); Optimizer.step [1600, 1900) with K6 and K7 (gaps 100
  // and 70, of which 20 and 70 in the optimizer).
  b.Loader(1000, 400);
  b.Kernel(1410, 1420, 100);
  b.Host("Optimizer.step#SGD.step", 1600, 300);
  b.Kernel(1610, 1620, 20);
  b.Kernel(1700, 1710, 10);
  // Step 3: K8 at 2160 (gap 1720-2160: 180 in the optimizer, 100 between
  // steps, 160 other); a pageable copy whose launch call blocks until 2450,
  // so the 30 µs gap before K9 began in a blocking copy; a pinned copy (gap
  // 40, other); a synchronous cudaMemcpy DtoH (gap 60, other) and K10 after
  // it (30, blocking copy).
  b.Kernel(2150, 2160, 100);
  b.Op("Memcpy HtoD (Pageable -> Device)", 2300, 2310, 130, 7, "cudaMemcpyAsync", 150, "gpu_memcpy",
       1300000);
  b.Kernel(2460, 2470, 100);
  b.Op("Memcpy HtoD (Pinned -> Device)", 2600, 2610, 40, 7, "cudaMemcpyAsync", 5, "gpu_memcpy",
       2000000);
  b.Op("Memcpy DtoH (Device -> Pageable)", 2700, 2710, 80, 7, "cudaMemcpy", 100, "gpu_memcpy",
       800000);
  b.Kernel(2810, 2820, 80);
  // Step 4 (left out): K11.
  b.Kernel(3010, 3020, 80);
  return b;
}

TEST(Analyze, TemporalBreakdownAsHtaDefinesIt) {
  RankReport r = Analyze(IdleScenario().Write("idle.json"));
  // Kept: K1-K10 and three copies (K11 was launched in the last step).
  EXPECT_EQ(r.gpu_ops, 13);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps.back().number, 3);
  // Span 320 .. 2900; busy 810 (kernels) + 250 (copies); idle the rest.
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 2580);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 2580 - 1060);
  EXPECT_DOUBLE_EQ(r.temporal.compute_us, 810);
  EXPECT_DOUBLE_EQ(r.temporal.non_compute_us, 250);
  EXPECT_TRUE(HasNote(r, "1 of 14 GPU ops left out"));
}

TEST(Analyze, IdleGapsOfKnownLengthAndCause) {
  RankReport r = Analyze(IdleScenario().Write("idle.json"));
  const HostCauses& c = r.idle_causes;
  EXPECT_DOUBLE_EQ(c.queued_us, 5 + 50);
  EXPECT_DOUBLE_EQ(c.data_loader_us, 400);
  EXPECT_DOUBLE_EQ(c.sync_us, 215);
  EXPECT_DOUBLE_EQ(c.blocking_copy_us, 30 + 30);
  EXPECT_DOUBLE_EQ(c.optimizer_us, 20 + 70 + 180);
  EXPECT_DOUBLE_EQ(c.between_steps_us, 100);
  EXPECT_DOUBLE_EQ(c.other_us, 30 + 80 + 160 + 50 + 40 + 60);
  EXPECT_DOUBLE_EQ(c.Total(), r.temporal.idle_us);
  // HTA's per-stream split: every gap but K2's (kernel wait) and K3's (other)
  // began before the next op's launch.
  ASSERT_EQ(r.streams.size(), 1u);
  const StreamIdle& s = r.streams[0];
  EXPECT_EQ(s.stream, 7);
  EXPECT_DOUBLE_EQ(s.kernel_wait_us, 5);
  EXPECT_DOUBLE_EQ(s.other_us, 50);
  EXPECT_DOUBLE_EQ(s.host_wait_us, 1520 - 55);
  EXPECT_DOUBLE_EQ(s.host_causes.data_loader_us, 400);
  EXPECT_DOUBLE_EQ(s.host_causes.sync_us, 215);
  EXPECT_DOUBLE_EQ(s.host_causes.queued_us, 0);
  EXPECT_DOUBLE_EQ(s.host_causes.Total(), s.host_wait_us);
}

TEST(Analyze, KernelWaitThresholdIsAnOption) {
  AnalyzeOptions o;
  o.kernel_wait_us = 60;  // K3's 50 µs gap becomes kernel wait too
  RankReport r = Analyze(IdleScenario().Write("idle.json"), o);
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_DOUBLE_EQ(r.streams[0].kernel_wait_us, 55);
  EXPECT_DOUBLE_EQ(r.streams[0].other_us, 0);
}

TEST(Analyze, PageableAndPinnedCopies) {
  RankReport r = Analyze(IdleScenario().Write("idle.json"));
  std::map<std::string, CopyStats> by;
  for (const CopyStats& c : r.copies) by[c.direction] = c;
  ASSERT_EQ(by.count("HtoD"), 1u);
  EXPECT_EQ(by["HtoD"].count, 2);
  EXPECT_DOUBLE_EQ(by["HtoD"].bytes, 3.3e6);
  EXPECT_EQ(by["HtoD"].pageable, 1);
  EXPECT_DOUBLE_EQ(by["HtoD"].pageable_bytes, 1.3e6);
  EXPECT_EQ(by["HtoD"].synchronous, 0);
  EXPECT_NEAR(by["HtoD"].GBps(), 3.3e6 / 170 / 1e3, 1e-9);
  EXPECT_EQ(by["DtoH"].synchronous, 1);
  const Finding* f = FindCause(r.findings, "h2d_copy");
  ASSERT_NE(f, nullptr);
  // Blocking-copy idle (60) and the HtoD copies' GPU time (170), of 2580.
  EXPECT_NEAR(f->share_lost, 230.0 / 2580, 1e-9);
  EXPECT_NE(f->fix.find("pin_memory=True"), std::string::npos);
}

TEST(Analyze, LaunchStatistics) {
  RankReport r = Analyze(IdleScenario().Write("idle.json"));
  // Ten kernel launches and two cudaMemcpyAsync (cudaMemcpy is not a launch
  // call in HTA's list); only the pageable copy (130 µs) ran shorter than its
  // 150 µs call. Delays: 5 µs for all but K2 (100), K3 (240), the pageable
  // copy (-140): the median is 5.
  EXPECT_EQ(r.launches.launches, 12);
  EXPECT_NEAR(r.launches.shorter_than_launch, 1.0 / 12, 1e-12);
  EXPECT_DOUBLE_EQ(r.launches.delay_median_us, 5);
  EXPECT_DOUBLE_EQ(r.launches.cpu_median_us, 5);
  EXPECT_EQ(r.launches.cpu_over_50us, 1);
  EXPECT_EQ(r.launches.delay_over_100us, 1);
}

TEST(Analyze, FindingsNameEachCauseWithItsShare) {
  RankReport r = Analyze(IdleScenario().Write("idle.json"));
  const double span = 2580;
  const Finding* input = FindCause(r.findings, "input_workers");
  ASSERT_NE(input, nullptr);
  EXPECT_NEAR(input->share_lost, 400 / span, 1e-12);
  EXPECT_NE(input->evidence.find(kLoaderName), std::string::npos);
  EXPECT_NE(input->fix.find("num_workers"), std::string::npos);
  const Finding* sync = FindCause(r.findings, "host_sync");
  ASSERT_NE(sync, nullptr);
  EXPECT_NEAR(sync->share_lost, 215 / span, 1e-12);
  EXPECT_NE(sync->evidence.find("cudaStreamSynchronize"), std::string::npos);
  const Finding* launch = FindCause(r.findings, "small_batch");
  ASSERT_NE(launch, nullptr);
  EXPECT_NEAR(launch->share_lost, (420 + 270) / span, 1e-12);
  // 100 µs between steps is 3.9%: under the 5% line.
  EXPECT_EQ(FindCause(r.findings, "loop_overhead"), nullptr);
  for (size_t i = 1; i < r.findings.size(); ++i)
    EXPECT_GE(r.findings[i - 1].share_lost, r.findings[i].share_lost);
}

TEST(Analyze, StepsOption) {
  AnalyzeOptions o;
  o.first_step = 2;
  o.last_step = 2;
  RankReport r = Analyze(IdleScenario().Write("idle.json"), o);
  // Launched in step 2 [1000, 2000): K5, K6, K7; gaps 100 and 70.
  EXPECT_EQ(r.gpu_ops, 3);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 1720 - 1420);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 170);
  EXPECT_NE(r.window.find("ProfilerStep#2"), std::string::npos);
  o.first_step = 9;
  o.last_step = 12;
  Result<RankReport> bad = AnalyzeTraceFile(IdleScenario().Write("idle.json"), 0, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ProfilerStep#1-#4"), std::string::npos)
      << bad.status().message();
}

// Kineto draws each ProfilerStep on the GPU's timeline too; HTA's cut is the
// latest start of any of them, so host events up to the GPU copy's start stay.
TEST(Analyze, GpuStepAnnotationsMoveTheCutAsInHta) {
  TraceBuilder b;
  b.Step(1, 0, 1000);
  b.Step(2, 1000, 1000);
  b.Add({{"ph", "X"},
         {"cat", "gpu_user_annotation"},
         {"name", "ProfilerStep#2"},
         {"pid", 0},
         {"tid", 7},
         {"ts", 1100},
         {"dur", 500},
         {"args", {{"External id", 9}}}});
  b.Kernel(100, 110, 100);
  b.Kernel(1050, 1060, 100);  // launched in step 2, before its GPU copy began: kept
  b.Kernel(1150, 1160, 100);  // after: left out
  RankReport r = Analyze(b.Write("annotated.json"));
  EXPECT_EQ(r.gpu_ops, 2);
  ASSERT_EQ(r.steps.size(), 1u);  // step 2 is still the left-out one
  EXPECT_EQ(r.steps[0].number, 1);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 1160 - 110);
}

TEST(Analyze, OverlappingCommunicationAndComputation) {
  TraceBuilder b;            // no ProfilerStep: the whole trace
  b.Kernel(900, 1000, 100);  // [1000, 1100)
  b.Kernel(910, 1150, 100);  // [1150, 1250)
  b.Op("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 920, 1050, 150, 13);  // [1050, 1200)
  b.Op("Memset (Device)", 930, 1260, 10, 7, "cudaMemsetAsync", 5, "gpu_memset");     // [1260, 1270)
  RankReport r = Analyze(b.Write("comm.json"));
  EXPECT_TRUE(HasNote(r, "no ProfilerStep"));
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 270);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 10);
  EXPECT_DOUBLE_EQ(r.temporal.compute_us, 200);
  EXPECT_DOUBLE_EQ(r.temporal.non_compute_us, 60);
  EXPECT_EQ(r.comm.kernels, 1);
  EXPECT_DOUBLE_EQ(r.comm.comm_us, 150);
  EXPECT_DOUBLE_EQ(r.comm.overlap_us, 100);  // [1050, 1100) and [1150, 1200)
  std::map<KernelClass, ClassTime> cls;
  for (const ClassTime& c : r.classes) cls[c.cls] = c;
  EXPECT_EQ(cls[KernelClass::kComputation].count, 2);
  EXPECT_EQ(cls[KernelClass::kCommunication].count, 1);
  EXPECT_DOUBLE_EQ(cls[KernelClass::kMemory].merged_us, 10);
  const Finding* f = FindCause(r.findings, "communication");
  ASSERT_NE(f, nullptr);
  EXPECT_NEAR(f->share_lost, 50.0 / 270, 1e-12);
}

TEST(Analyze, KernelClassesByName) {
  EXPECT_EQ(ClassifyKernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)"),
            KernelClass::kCommunication);
  EXPECT_EQ(ClassifyKernel("void ncclKernel_AllReduce(ncclWorkElem)"), KernelClass::kCommunication);
  EXPECT_EQ(ClassifyKernel("Memcpy DtoD (Device -> Device)"), KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernel("Memset (Device)"), KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernel("dma_copy"), KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernel("void at::native::Memcpy_like_kernel()"), KernelClass::kComputation);
}

// Rank 1 computes 400 µs longer; rank 0 waits for it inside the all-reduce.
std::string RankFile(int rank, double compute, double comm, double t0, const std::string& name) {
  TraceBuilder b;
  b.Rank(rank, 2);
  b.Kernel(t0 - 50, t0, compute);
  b.Op("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", t0 - 40, t0 + compute, comm, 13);
  return b.Write(name);
}

TEST(Analyze, StragglerRank) {
  std::string dir = fs::path(RankFile(0, 400, 500, 1000, "r0.json")).parent_path().string();
  RankFile(1, 800, 100, 1000, "r1.json");
  Result<TraceReport> rep = AnalyzeTraces({dir}, {});
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  ASSERT_EQ(rep->ranks.size(), 2u);
  EXPECT_FALSE(rep->mixed_runs);
  ASSERT_TRUE(rep->cross.compared);
  EXPECT_EQ(rep->cross.straggler, 1);
  EXPECT_DOUBLE_EQ(rep->cross.waited_us.at(0), 400);
  const Finding* f = FindCause(rep->findings, "uneven_ranks");
  ASSERT_NE(f, nullptr);
  EXPECT_NEAR(f->share_lost, 400.0 / 900, 1e-12);  // rank 0's span is 900 µs
  EXPECT_NE(f->title.find("rank 1"), std::string::npos);
  // Exposed communication is judged on the straggler (the others' includes
  // the wait): rank 1's 100 µs of 900.
  const Finding* comm = FindCause(rep->findings, "communication");
  ASSERT_NE(comm, nullptr);
  EXPECT_NE(comm->evidence.find("rank 1:"), std::string::npos);
  EXPECT_NEAR(comm->share_lost, 100.0 / 900, 1e-12);
  // --rank keeps one rank in the report; the comparison still used both.
  AnalyzeOptions o;
  o.rank = 0;
  rep = AnalyzeTraces({dir}, o);
  ASSERT_TRUE(rep.ok());
  ASSERT_EQ(rep->ranks.size(), 1u);
  EXPECT_EQ(rep->ranks[0].rank, 0);
  EXPECT_NE(FindCause(rep->findings, "uneven_ranks"), nullptr);
  o.rank = 5;
  EXPECT_FALSE(AnalyzeTraces({dir}, o).ok());
}

TEST(Analyze, RanksOfDifferentRunsAreNotCompared) {
  // Two files that both say rank 0.
  std::string a = RankFile(0, 400, 500, 1000, "a.json");
  std::string b = RankFile(0, 800, 100, 1000, "b.json");
  Result<TraceReport> rep = AnalyzeTraces({a, b}, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->mixed_runs);
  EXPECT_FALSE(rep->cross.compared);
  EXPECT_NE(rep->cross.note.find("both say rank 0"), std::string::npos) << rep->cross.note;
  EXPECT_TRUE(rep->findings.empty());  // per file instead
  EXPECT_FALSE(rep->ranks[0].findings.empty());
  // Ranks 0 and 1 recorded a day apart (Unix-time timestamps).
  a = RankFile(0, 400, 500, 1.7e15, "c.json");
  b = RankFile(1, 800, 100, 1.7e15 + 86400e6, "d.json");
  rep = AnalyzeTraces({a, b}, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->mixed_runs);
  EXPECT_NE(rep->cross.note.find("different times"), std::string::npos) << rep->cross.note;
}

TEST(Analyze, FloatNanosecondTimestampsRoundAsHta) {
  TraceBuilder b;
  b.Kernel(990.5, 1000.2, 99.9);  // [1001, 1100]: start rounded up, end (1100.1) down
  b.Kernel(991.5, 1120.3, 0.4);   // [1121, 1120.7 -> 1120]: ends before it starts: 0 long
  b.Kernel(992.5, 1150.7, 49.6);  // [1151, 1200.3 -> 1200]
  RankReport r = Analyze(b.Write("float.json"));
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 199);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 199 - 99 - 49);
  ASSERT_EQ(r.streams.size(), 1u);
  // Gaps 1100 -> 1121 (21 < 30: kernel wait) and 1121 -> 1151 (30: other);
  // every kernel was launched long before.
  EXPECT_DOUBLE_EQ(r.streams[0].kernel_wait_us, 21);
  EXPECT_DOUBLE_EQ(r.streams[0].other_us, 30);
  EXPECT_DOUBLE_EQ(r.streams[0].host_wait_us, 0);
}

void ExpectFlowsLink(const std::string& cat) {
  TraceBuilder b;
  b.LinkByFlows(cat);
  b.Step(1, 0, 1000);
  b.Step(2, 1000, 1000);
  b.Kernel(10, 20, 100);     // [20, 120)
  b.Kernel(300, 310, 100);   // launched after 120: a 190 µs host wait
  b.Kernel(1010, 1020, 50);  // the last step's
  RankReport r = Analyze(b.Write(cat + ".json"));
  // Unlinked, both kernels would be dropped with the last step's (no launch
  // in the window) and the gap could not be called host wait.
  EXPECT_EQ(r.gpu_ops, 2) << cat;
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_DOUBLE_EQ(r.streams[0].host_wait_us, 190) << cat;
  EXPECT_TRUE(HasNote(r, "flow events")) << cat;
}

TEST(Analyze, AsyncCpuToGpuFlowsLinkLaunchesToKernels) { ExpectFlowsLink("async_cpu_to_gpu"); }
TEST(Analyze, Ac2gFlowsLinkLaunchesToKernels) { ExpectFlowsLink("ac2g"); }

TEST(Analyze, GzipAndTopLevelKeysInAnyOrder) {
  TraceBuilder b;
  b.Kernel(0, 10, 100);
  b.Kernel(5, 200, 100);
  std::string text = b.Text();
  // traceEvents first, metadata after it (and a key with an escaped quote).
  json doc = json::parse(text);
  std::string reordered = "{\"traceEvents\": " + doc["traceEvents"].dump() +
                          ", \"deviceProperties\": [{\"id\": 0, \"name\": \"H100 \\\"SXM\\\"\"}], "
                          "\"distributedInfo\": {\"rank\": 3, \"world_size\": 4}, "
                          "\"baseTimeNanoseconds\": 1700000000000000000}";
  std::string path = TempPath("trace.json.gz");
  WriteGzip(path, reordered);
  RankReport r = Analyze(path);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.device_name, "H100 \"SXM\"");
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 290);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 90);
}

// gzip members as tools write them: concatenated (cat a.gz b.gz), with the
// optional header fields (extra field, file name, comment, header CRC), and
// zero padding after the last one.
TEST(Analyze, GzipMembersWithEveryHeaderFieldAndPadding) {
  TraceBuilder b;
  b.Kernel(0, 10, 100);
  b.Kernel(5, 200, 100);
  std::string text = b.Text();
  std::string first = TempPath("a.gz"), second = TempPath("b.gz");
  size_t half = text.size() / 2;
  WriteGzip(first, text.substr(0, half));
  WriteGzip(second, text.substr(half));
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  std::string a = read(first), b2 = read(second);
  // The second member's header: FHCRC|FEXTRA|FNAME|FCOMMENT (2|4|8|16), then
  // the fields in RFC 1952's order, before its deflate data.
  std::string header = b2.substr(0, 10);
  header[3] = static_cast<char>(2 | 4 | 8 | 16);
  header += std::string("\x03\x00", 2) + "abc";  // XLEN 3, extra data
  header += std::string("trace.json\0", 11);     // FNAME
  header += std::string("a comment\0", 10);      // FCOMMENT
  header += std::string("\x00\x00", 2);          // FHCRC (skipped: the trailer checks the text)
  std::string joined = a + header + b2.substr(10) + std::string(16, '\0');
  std::string path = TempPath("joined.json.gz");
  WriteFile(path, joined);
  RankReport r = Analyze(path);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 290);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 90);
}

// The gzip reader with each inflater (ISA-L's igzip where built, and zlib):
// the same text from several members with every header field, padding, a
// text of many read blocks read a little at a time, and the same errors for
// a cut stream, a cut trailer and a flipped checksum.
std::string ReadAll(const std::string& path, Inflater which, size_t cap, std::string* error) {
  auto src = OpenSource(path, which);
  if (!src.ok()) {
    *error = src.status().message();
    return "";
  }
  std::string out, buf(cap, '\0');
  for (;;) {
    Result<size_t> n = (*src)->Read(buf.data(), cap);
    if (!n.ok()) {
      *error = n.status().message();
      return out;
    }
    if (*n == 0) return out;
    out.append(buf.data(), *n);
  }
}

TEST(Analyze, BothInflatersReadEveryGzipCaseAlike) {
  std::string text;
  for (int i = 0; text.size() < (3u << 20); ++i)
    text += "{\"name\": \"kernel_" + std::to_string(i * 7919 % 100003) + "\", \"ts\": " +
            std::to_string(i) + "},\n";
  std::string first = TempPath("m1.gz"), second = TempPath("m2.gz");
  WriteGzip(first, text.substr(0, text.size() / 3));
  WriteGzip(second, text.substr(text.size() / 3));
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  std::string a = bytes(first), b = bytes(second);
  std::string header = b.substr(0, 10);
  header[3] = static_cast<char>(2 | 4 | 8 | 16);
  header += std::string("\x02\x00", 2) + "xy" + std::string("n.json\0", 7) +
            std::string("c\0", 2) + std::string("\x00\x00", 2);
  std::string joined = a + header + b.substr(10) + std::string(9, '\0');
  struct Case {
    std::string name, file, want_error;
  };
  std::vector<Case> cases = {{"joined", joined, ""},
                             {"cut", a.substr(0, a.size() / 2), "truncated gzip"},
                             {"cut trailer", a.substr(0, a.size() - 5), "truncated gzip"}};
  std::string flipped = a;
  flipped[flipped.size() - 7] ^= 0x04;
  cases.push_back({"flipped", flipped, "gzip checksum mismatch"});
  for (const Case& c : cases) {
    std::string path = TempPath("case.json.gz");
    WriteFile(path, c.file);
    for (Inflater which : {Inflater::kFastest, Inflater::kZlib})
      for (size_t cap : {size_t{997}, size_t{1} << 18}) {
        std::string error;
        std::string got = ReadAll(path, which, cap, &error);
        std::string label = c.name + (which == Inflater::kZlib ? " zlib " : " fastest ") +
                            std::to_string(cap);
        if (c.want_error.empty()) {
          EXPECT_EQ(error, "") << label;
          EXPECT_TRUE(got == text) << label << ": " << got.size() << " of " << text.size();
        } else {
          EXPECT_NE(error.find(c.want_error), std::string::npos) << label << ": " << error;
        }
      }
  }
}

// Names full of quotes, backslashes and brackets, at every offset, over
// more text than one read block (1 MB), so escapes fall across every
// boundary the reader has.
TEST(Analyze, EscapesAndBracketsInsideStrings) {
  TraceBuilder b;
  const std::string nasty = "q\"}]{[\\\"\\";  // q"}]{[\"\ once escaped by the JSON writer
  const int kKernels = 6000;
  std::map<std::string, int> expected;
  for (int i = 0; i < kKernels; ++i) {
    std::string name =
        std::string(i % 41, 'a') + nasty + std::to_string(i % 7) + std::string(200, 'k');
    expected[name]++;
    b.Op(name, i * 20.0, i * 20.0 + 5, 10);
  }
  RankReport r;
  {
    AnalyzeOptions o;
    o.top_kernels = 1000;
    r = Analyze(b.Write("nasty.json"), o);
  }
  EXPECT_EQ(r.gpu_ops, kKernels);
  std::map<std::string, int> seen;
  for (const KernelStat& k : r.top_kernels) seen[k.name] = static_cast<int>(k.count);
  EXPECT_EQ(seen, expected);
}

TEST(Analyze, NegativeDurationsAndOutOfOrderOpsAreStated) {
  TraceBuilder b;
  b.Kernel(0, 100, 100);  // [100, 200)
  b.Kernel(1, 150, 100);  // starts inside the previous op of its stream
  b.Kernel(2, 400, -50);  // negative: left out
  RankReport r = Analyze(b.Write("odd.json"));
  EXPECT_TRUE(HasNote(r, "1 events with a negative duration")) << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(HasNote(r, "out of order"));
  EXPECT_EQ(r.gpu_ops, 2);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 150);
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, 0);
}

// Found by fuzz/trace_fuzz (fuzz/regressions/trace/): a timestamp of 1e111
// reached a cast to whole microseconds, which is undefined past 2^63.
TEST(Analyze, TimesBeyondAnyClockAreLeftOutAndCounted) {
  TraceBuilder b;
  b.Kernel(0, 100, 100);
  b.Kernel(0, 5.77778e+111, 10);
  b.Host("ProfilerStep#1", -1e300, 10);
  b.Kernel(0, 300, 9007199254740992.0);  // 2^53 us: the first duration refused
  RankReport r = Analyze(b.Write("far.json"));
  EXPECT_TRUE(HasNote(r, "3 events with a time or duration beyond 2^53 us left out"))
      << ::testing::PrintToString(r.notes);
  EXPECT_EQ(r.gpu_ops, 1);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, 100);
}

// Found by fuzz/trace_fuzz: a stream or correlation past int64's range went
// through an undefined cast; such a value is read as absent.
TEST(Analyze, IdsBeyondInt64AreReadAsAbsent) {
  TraceBuilder b;
  b.Kernel(0, 100, 100);
  b.Add({{"ph", "X"}, {"cat", "kernel"}, {"name", "k"}, {"pid", 0}, {"tid", 7}, {"ts", 300},
         {"dur", 10}, {"args", {{"stream", 5.90222e+88}, {"correlation", -1e19}}}});
  RankReport r = Analyze(b.Write("bigids.json"));
  EXPECT_EQ(r.gpu_ops, 1);  // without a stream the second is no GPU op
}

void ExpectError(const std::string& path, const std::string& part) {
  Result<RankReport> r = AnalyzeTraceFile(path, 0, {});
  ASSERT_FALSE(r.ok()) << path;
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(part), std::string::npos) << m;
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST(Analyze, BadInputsAreOneLineErrors) {
  std::string p = TempPath("text.json");
  WriteFile(p, "hello, this is not a trace");
  ExpectError(p, "not JSON");
  p = TempPath("empty.json");
  WriteFile(p, "");
  ExpectError(p, "empty file");
  p = TempPath("other.json");
  WriteFile(p, "{\"a\": [1, 2, {\"b\": \"]}\"}]}");
  ExpectError(p, "no traceEvents");
  p = TempPath("numbers.json");
  WriteFile(p, "{\"traceEvents\": [1, 2]}");
  ExpectError(p, "event object");
  p = TempPath("none.json");
  WriteFile(p, "{\"traceEvents\": []}");
  ExpectError(p, "nothing to analyse");
  p = TempPath("badevent.json");
  WriteFile(
      p, "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 1, \"dur\": 2}, {\"ph\": \"X\", \"ts\": }]}");
  ExpectError(p, "event 1 is not valid JSON");
  // Cut inside the events, as a profiler killed while writing leaves it.
  std::string text = IdleScenario().Text();
  p = TempPath("cut.json");
  WriteFile(p, text.substr(0, text.size() / 2));
  // The byte it names is where the file ends (it once printed a negative one).
  ExpectError(p, "truncated: the text ends at byte " + std::to_string(text.size() / 2) + " inside traceEvents");
  // A missing comma: the byte named is the one where the comma should be,
  // and a cut after one whole event counts that one.
  const std::string event = R"({"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1})";
  const std::string no_comma = "{\"traceEvents\": [" + event + " " + event + "]}";
  p = TempPath("nocomma.json");
  WriteFile(p, no_comma);
  ExpectError(p, "not valid JSON at byte " + std::to_string(no_comma.find(event, 20)) + ": expected");
  const std::string one_and_a_half = "{\"traceEvents\": [" + event + ", " + event.substr(0, 20);
  p = TempPath("half.json");
  WriteFile(p, one_and_a_half);
  ExpectError(p, "truncated: the text ends at byte " + std::to_string(one_and_a_half.size()) +
                     " inside traceEvents after 1 events");
  p = TempPath("cut.json.gz");
  WriteGzip(p, text);
  std::string gz;
  {
    std::ifstream in(p, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  WriteFile(p, gz.substr(0, gz.size() / 2));
  ExpectError(p, "truncated gzip");
  // Whole, but a byte of the text's checksum flipped; or cut in the trailer.
  std::string flipped = gz;
  flipped[flipped.size() - 6] ^= 0x10;
  WriteFile(p, flipped);
  ExpectError(p, "gzip checksum mismatch");
  for (size_t cut : {3, 8, 9, 12}) {  // in the trailer, or the last deflate bytes too
    WriteFile(p, gz.substr(0, gz.size() - cut));
    ExpectError(p, "truncated gzip");
  }
  ExpectError(TempPath("missing.json"), "No such file");
}

TEST(Analyze, FolderWithoutTracesIsAnError) {
  std::string dir = fs::path(TempPath("x")).parent_path().string();
  Result<TraceReport> rep = AnalyzeTraces({dir}, {});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().message().find("no *.json"), std::string::npos);
}

TEST(Analyze, UnreadableFilesAreListedAndTheRestAnalysed) {
  std::string bad = TempPath("bad.json");
  WriteFile(bad, "not json");
  Result<TraceReport> rep = AnalyzeTraces({bad, IdleScenario().Write("idle.json")}, {});
  ASSERT_TRUE(rep.ok());
  ASSERT_EQ(rep->errors.size(), 1u);
  EXPECT_NE(rep->errors[0].find("bad.json"), std::string::npos);
  EXPECT_EQ(rep->ranks.size(), 1u);
  rep = AnalyzeTraces({bad}, {});
  EXPECT_FALSE(rep.ok());
}

// ---- real traces, against a brute-force reference ------------------------------------------

// What the reference needs of a Kineto trace, read with nlohmann (not simdjson).
struct Reference {
  int64_t span = 0, idle = 0, compute = 0;
  int64_t idle_in_loader = 0;  // idle µs inside data-loader spans, in gaps the host caused
  double loader_host = 0, steps_host = 0;
};

// HTA's window (host events before the last ProfilerStep's start, kernels
// launched by them), then one flag per microsecond.
Reference BruteForce(const std::string& path) {
  std::string text = path.size() > 3 && path.substr(path.size() - 3) == ".gz" ? ReadGzip(path) : "";
  if (text.empty()) {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  json doc = json::parse(text);
  const json& events = doc.is_array() ? doc : doc["traceEvents"];
  double last_step = -1;
  for (const json& e : events)
    if (e.value("name", "").rfind("ProfilerStep#", 0) == 0)
      last_step = std::max(last_step, e["ts"].get<double>());
  std::map<int64_t, double> launch;  // correlation -> launch ts
  Reference ref;
  std::vector<std::pair<int64_t, int64_t>> loader;
  for (const json& e : events) {
    if (e.value("ph", "") != "X" || (e.contains("args") && e["args"].contains("stream"))) continue;
    double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    if (ts >= last_step) continue;
    const std::string name = e.value("name", "");
    if (e.contains("args") && e["args"].contains("correlation"))
      launch[e["args"]["correlation"].get<int64_t>()] = ts;
    if (name.rfind("enumerate(DataLoader)", 0) == 0) {
      loader.push_back({static_cast<int64_t>(ts), static_cast<int64_t>(ts + dur)});
      ref.loader_host += dur;
    }
    if (name.rfind("ProfilerStep#", 0) == 0) ref.steps_host += dur;
  }
  struct K {
    int64_t start, end, launch;
    bool compute;
  };
  std::vector<K> kernels;
  for (const json& e : events) {
    if (e.value("ph", "") != "X" || !e.contains("args") || !e["args"].contains("stream")) continue;
    auto it = launch.find(e["args"].value("correlation", int64_t{-1}));
    if (it == launch.end()) continue;
    std::string name = e["name"];
    bool compute =
        name.rfind("Memcpy", 0) != 0 && name.rfind("Memset", 0) != 0 && name.rfind("nccl", 0) != 0;
    int64_t ts = e["ts"].get<int64_t>();
    kernels.push_back(
        {ts, ts + e["dur"].get<int64_t>(), static_cast<int64_t>(it->second), compute});
  }
  if (kernels.empty()) return ref;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const K& k : kernels) lo = std::min(lo, k.start), hi = std::max(hi, k.end);
  std::vector<char> busy(hi - lo, 0), comp(hi - lo, 0), in_loader(hi - lo, 0);
  std::vector<int64_t> launch_at_start(hi - lo + 1,
                                       INT64_MAX);  // earliest launch of an op starting here
  for (const K& k : kernels) {
    for (int64_t t = k.start; t < k.end; ++t) busy[t - lo] = 1, comp[t - lo] |= k.compute;
    launch_at_start[k.start - lo] = std::min(launch_at_start[k.start - lo], k.launch);
  }
  for (auto [a, b] : loader)
    for (int64_t t = std::max(a, lo); t < std::min(b, hi); ++t) in_loader[t - lo] = 1;
  ref.span = hi - lo;
  for (int64_t i = 0; i < hi - lo; ++i) {
    ref.idle += !busy[i];
    ref.compute += comp[i];
  }
  // Each idle run: a host-caused gap when the op ending it was launched after it began.
  for (int64_t i = 0; i < hi - lo;) {
    if (busy[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    int64_t in = 0;
    while (j < hi - lo && !busy[j]) in += in_loader[j++];
    if (launch_at_start[j] > lo + i) ref.idle_in_loader += in;
    i = j;
  }
  return ref;
}

TEST(Analyze, RealTraceWithoutWorkersIsInputBound) {
  RankReport r = Analyze(kWorkers0);
  Reference ref = BruteForce(kWorkers0);
  EXPECT_DOUBLE_EQ(r.temporal.span_us, static_cast<double>(ref.span));
  EXPECT_DOUBLE_EQ(r.temporal.idle_us, static_cast<double>(ref.idle));
  EXPECT_DOUBLE_EQ(r.temporal.compute_us, static_cast<double>(ref.compute));
  EXPECT_DOUBLE_EQ(r.idle_causes.data_loader_us, static_cast<double>(ref.idle_in_loader));
  // Its fp32 ResNet-50 on a V100 (fp16 tensor cores unused) may come first: the idle
  // GPU is the input's, whatever is on top.
  const Finding* input = FindCause(r.findings, "input_workers");
  ASSERT_NE(input, nullptr) << RenderFindings(r.findings, 9);
  const Finding& top = *input;
  EXPECT_NEAR(top.share_lost, static_cast<double>(ref.idle_in_loader) / ref.span, 1e-12);
  EXPECT_NE(top.evidence.find(kLoaderName), std::string::npos) << top.evidence;
  EXPECT_NE(top.fix.find("num_workers"), std::string::npos);
  EXPECT_EQ(r.window.find("ProfilerStep#5-#9"), 0u) << r.window;
}

TEST(Analyze, RealTraceWithFourWorkersLosesTheInputFinding) {
  Reference ref0 = BruteForce(kWorkers0), ref4 = BruteForce(kWorkers4);
  RankReport r0 = Analyze(kWorkers0), r4 = Analyze(kWorkers4);
  EXPECT_DOUBLE_EQ(r4.temporal.span_us, static_cast<double>(ref4.span));
  EXPECT_DOUBLE_EQ(r4.temporal.idle_us, static_cast<double>(ref4.idle));
  double share0 = static_cast<double>(ref0.idle_in_loader) / ref0.span;
  double share4 = static_cast<double>(ref4.idle_in_loader) / ref4.span;
  // The host's own view agrees that the loader stopped mattering.
  EXPECT_LT(ref4.loader_host / ref4.steps_host, ref0.loader_host / ref0.steps_host / 10);
  EXPECT_NEAR(r4.idle_causes.data_loader_us / r4.temporal.span_us, share4, 1e-12);
  // Shrunk by what the trace shows: from share0 to share4 (under the 5% line).
  const Finding* f0 = FindCause(r0.findings, "input_workers");
  ASSERT_NE(f0, nullptr);
  const Finding* f4 = FindCause(r4.findings, "input_workers");
  if (share4 >= 0.05) {
    ASSERT_NE(f4, nullptr);
    EXPECT_NEAR(f0->share_lost - f4->share_lost, share0 - share4, 1e-12);
  } else {
    EXPECT_EQ(f4, nullptr);
  }
  EXPECT_NE(r4.host.data_loader_name.find("_MultiProcessingDataLoaderIter"), std::string::npos);
}

// fp32 ResNet-50 on a V100: every GEMM and convolution kernel is fp32 SIMT
// (volta_sgemm, volta_scudnn, implicit_convolve_sgemm, cuDNN's Winograd),
// none ran on the fp16 tensor cores; the kernels' time is summed by hand here.
TEST(Analyze, RealV100TraceRanItsMatmulsInFp32) {
  RankReport r = Analyze(kWorkers0);
  EXPECT_EQ(r.device_name, "Tesla V100-DGXS-32GB");
  ASSERT_EQ(r.gemm_math_us.size(), 1u) << "only fp32 SIMT";
  double simt = r.gemm_math_us.at(KernelMath::kFp32Simt);
  double by_hand = 0, kernels = 0;
  for (const KernelStat& k : r.top_kernels) kernels += k.total_us;
  ASSERT_GT(kernels, 0);
  for (const KernelStat& k : r.top_kernels)
    if (k.name.find("sgemm") != std::string::npos || k.name.find("scudnn") != std::string::npos ||
        k.name.find("_engine<float") != std::string::npos || k.name.find("winograd") != std::string::npos)
      by_hand += k.total_us;
  EXPECT_GE(simt, by_hand) << "the top kernels' matmuls are part of it";
  EXPECT_GT(simt / r.temporal.compute_us, 0.5) << "matmuls are most of ResNet-50's GPU time";
  const Finding* f = FindCause(r.findings, "precision");
  ASSERT_NE(f, nullptr) << RenderFindings(r.findings, 9);
  EXPECT_NEAR(f->share_lost, simt / r.temporal.span_us * (1 - 15.7 / 125), 1e-9);
  EXPECT_NE(f->evidence.find("V100 DGXS"), std::string::npos) << f->evidence;
  EXPECT_NE(f->fix.find("torch.float16"), std::string::npos) << "a V100 has no bf16: " << f->fix;
  EXPECT_NE(f->fix.find("GradScaler"), std::string::npos) << f->fix;
  TraceReport rep;
  rep.ranks.push_back(r);
  json j = TraceReportJson(rep);
  EXPECT_DOUBLE_EQ(j["ranks"][0]["gemm_math_us"]["fp32_simt"].get<double>(), simt);
}

TEST(Analyze, RealTracePageableBatchCopies) {
  RankReport r = Analyze(kWorkers0);
  // Every batch goes over as one pageable HtoD copy, each after a blocking
  // .to(device) (cudaStreamSynchronize inside aten::copy_).
  ASSERT_EQ(r.copies.size(), 1u);
  EXPECT_EQ(r.copies[0].direction, "HtoD");
  EXPECT_EQ(r.copies[0].pageable, r.copies[0].count);
  EXPECT_GT(r.copies[0].count, 0);
  ASSERT_FALSE(r.host.syncs.empty());
  EXPECT_EQ(r.host.syncs.begin()->first, "cudaStreamSynchronize in aten::copy_");
  EXPECT_FALSE(r.host.sync_sites.empty());
}

// Real CUDA traces from torch 2.11 on an H200 (bench/gpu_traces; fixtures/README.md):
// each loop was written to have one cause, which must come out on top.
std::string H200(const std::string& name) {
  return kFixtures + "/torch211_h200_" + name + ".pt.trace.json.gz";
}

void ExpectSharesOfTheSteps(const RankReport& r) {
  EXPECT_GT(r.host.window_us, 0);
  EXPECT_LE(r.host.data_loader_us, r.host.window_us);
  EXPECT_LE(r.host.sync_us, r.host.window_us);
  EXPECT_LE(r.host.optimizer_us, r.host.window_us);
  EXPECT_NEAR(r.temporal.idle_us + r.temporal.compute_us + r.temporal.non_compute_us,
              r.temporal.span_us, 1.0);
}

TEST(Analyze, RealCudaTraceStarvedByTheDataLoader) {
  RankReport r = Analyze(H200("starved"));
  EXPECT_TRUE(r.has_gpu);
  ExpectSharesOfTheSteps(r);
  ASSERT_FALSE(r.findings.empty());
  const Finding& top = r.findings.front();
  EXPECT_EQ(top.name(), "input_workers");
  EXPECT_GT(top.share_lost, 0.8);  // ~3 ms of host work per sample against a ~3 ms GPU step
  EXPECT_NE(top.evidence.find(kLoaderName), std::string::npos) << top.evidence;
  EXPECT_NEAR(top.share_lost, r.idle_causes.data_loader_us / r.temporal.span_us, 1e-12);
}

TEST(Analyze, RealCudaTraceLaunchBound) {
  RankReport r = Analyze(H200("launch"));
  ExpectSharesOfTheSteps(r);
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings.front().name(), "small_batch");
  EXPECT_GT(r.launches.shorter_than_launch, 0.9);  // an MLP of width 256 at batch 8
  EXPECT_NE(r.findings.front().fix.find("CUDA graphs"), std::string::npos);
}

TEST(Analyze, RealCudaTracesPageableAgainstPinnedCopies) {
  RankReport pageable = Analyze(H200("pageable")), pinned = Analyze(H200("pinned"));
  ExpectSharesOfTheSteps(pageable);
  ExpectSharesOfTheSteps(pinned);
  for (const RankReport* r : {&pageable, &pinned}) {
    ASSERT_EQ(r->copies.size(), 1u);
    EXPECT_EQ(r->copies[0].direction, "HtoD");
    EXPECT_GE(r->copies[0].count, 4);  // 64 MiB a step
    EXPECT_NEAR(r->copies[0].bytes / r->copies[0].count, 64.0 * 1024 * 1024, 1.0);
  }
  EXPECT_EQ(pageable.copies[0].pageable, pageable.copies[0].count);
  EXPECT_EQ(pinned.copies[0].pageable, 0);
  EXPECT_GT(pinned.copies[0].GBps(), 3 * pageable.copies[0].GBps());
  const Finding* slow = FindCause(pageable.findings, "h2d_copy");
  const Finding* fast = FindCause(pinned.findings, "h2d_copy");
  ASSERT_NE(slow, nullptr);
  ASSERT_NE(fast, nullptr);
  EXPECT_NE(slow->fix.find("pin_memory=True"), std::string::npos);
  EXPECT_EQ(fast->fix.find("pin_memory"), std::string::npos);
  EXPECT_GT(slow->share_lost, fast->share_lost);
}

TEST(Analyze, RealCudaTraceItemEveryStepNamesItsPlace) {
  RankReport r = Analyze(H200("sync"));  // with_stack=True: python_function events
  ExpectSharesOfTheSteps(r);
  const Finding* f = FindCause(r.findings, "host_sync");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->evidence.find("aten::_local_scalar_dense"), std::string::npos) << f->evidence;
  ASSERT_EQ(r.host.sync_sites.size(), 1u);
  // The innermost user frame around loss.item(): the loop's function, sync().
  EXPECT_EQ(r.host.sync_sites.begin()->first, "gpu_traces(123): sync");
  EXPECT_EQ(r.host.sync_sites.begin()->second, static_cast<int64_t>(r.steps.size()));
  EXPECT_NE(f->evidence.find("gpu_traces(123): sync"), std::string::npos);
}

TEST(Analyze, RealGlooRanksNameTheStraggler) {
  // Rank 1 slept 30 ms before each step; Gloo's collectives ran on the host,
  // so there are no communication kernels to compare.
  Result<TraceReport> rep = AnalyzeTraces({H200("ranks_rank0"), H200("ranks_rank1")}, {});
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  ASSERT_EQ(rep->ranks.size(), 2u);
  EXPECT_FALSE(rep->mixed_runs);
  for (const RankReport& r : rep->ranks) {
    EXPECT_EQ(r.comm.kernels, 0);
    EXPECT_GT(r.comm.host_collectives, 0);
  }
  ASSERT_TRUE(rep->cross.compared) << rep->cross.note;
  EXPECT_EQ(rep->cross.basis, "Gloo collectives on the host");
  EXPECT_EQ(rep->cross.straggler, 1);
  double steps = static_cast<double>(rep->ranks[0].steps.size());
  EXPECT_NEAR(rep->cross.waited_us.at(0) / steps, 30000, 3000);  // the sleep, per step
  const Finding* f = FindCause(rep->findings, "uneven_ranks");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->title.find("rank 1"), std::string::npos);
  EXPECT_NE(f->evidence.find("Gloo collectives"), std::string::npos);
  EXPECT_EQ(rep->findings.front().name(), "uneven_ranks");
  // Rank 0 waits for rank 1 in cudaEventSynchronize inside gloo:all_reduce:
  // communication, not a sync of its own loop.
  const RankReport& r0 = rep->ranks[0].rank == 0 ? rep->ranks[0] : rep->ranks[1];
  EXPECT_GT(r0.idle_causes.collective_us, rep->cross.waited_us.at(0) / 2);
  EXPECT_EQ(FindCause(r0.findings, "host_sync"), nullptr);
  EXPECT_NE(FindCause(r0.findings, "communication"), nullptr);
}

TEST(Analyze, CpuOnlyTraceFromTorch113) {
  // Made by make_cpu_trace.py: every batch of 4 waits 3 ms per sample.
  RankReport r = Analyze(kCpuTrace);
  Reference ref = BruteForce(kCpuTrace.c_str());
  EXPECT_FALSE(r.has_gpu);
  EXPECT_TRUE(HasNote(r, "CPU-only"));
  ASSERT_GE(r.steps.size(), 2u);
  EXPECT_GE(r.host.data_loader_us, 12000.0 * r.steps.size());
  EXPECT_NEAR(r.host.data_loader_us, ref.loader_host, 1.0 * r.steps.size());  // rounding
  EXPECT_NEAR(r.host.window_us, ref.steps_host, 1.0 * r.steps.size());
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings.front().name(), "input_workers");
  EXPECT_NEAR(r.findings.front().share_lost, r.host.data_loader_us / r.host.window_us, 1e-12);
}

TEST(Analyze, JsonCarriesTheSections) {
  Result<TraceReport> rep = AnalyzeTraces({IdleScenario().Write("idle.json")}, {});
  ASSERT_TRUE(rep.ok());
  json j = TraceReportJson(*rep);
  const json& r = j["ranks"][0];
  EXPECT_EQ(r["temporal"]["span_us"], 2580);
  EXPECT_EQ(r["idle_causes"]["data_loader_us"], 400);
  EXPECT_EQ(r["streams"][0]["kernel_wait_us"], 5);
  EXPECT_EQ(j["findings"][0]["cause"], rep->findings[0].name());
  std::string text = RenderTraceReport(*rep);
  EXPECT_NE(text.find("temporal (HTA)"), std::string::npos);
  EXPECT_EQ(text.find("nan"), std::string::npos);
}

// ---- the command ---------------------------------------------------------------------------

struct CommandResult {
  int code = -1;
  std::string out;
};

CommandResult Command(const std::string& args) {
  CommandResult r;
  std::string cmd = std::string(FULLBURN_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(AnalyzeCommand, JsonOfARealTrace) {
  CommandResult r = Command("analyze --json " + kWorkers0);
  ASSERT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out);
  std::set<std::string> causes;
  for (const json& f : j["findings"]) causes.insert(f["cause"].get<std::string>());
  EXPECT_EQ(causes.count("input_workers"), 1u) << r.out;
  EXPECT_EQ(causes.count("precision"), 1u) << r.out;  // fp32 on a V100's fp16 tensor cores
  EXPECT_EQ(j["ranks"][0]["window"].get<std::string>().find("ProfilerStep#5-#9"), 0u);
}

TEST(AnalyzeCommand, CpuTraceSaysWhatItCannotMeasure) {
  CommandResult r = Command("analyze " + kCpuTrace);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CPU-only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[input_workers]"), std::string::npos) << r.out;
}

TEST(AnalyzeCommand, StepsAndFolders) {
  CommandResult r = Command("analyze --steps 6-7 " + kWorkers0);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ProfilerStep#6-#7 (asked)"), std::string::npos) << r.out;
  r = Command("analyze " + kFixtures);
  ASSERT_EQ(r.code, 0) << r.out;
  // Two single-GPU runs recorded on different days are not ranks of one job.
  EXPECT_NE(r.out.find("files of different runs"), std::string::npos) << r.out;
}

TEST(AnalyzeCommand, BadInputIsOneLineAndNonZero) {
  std::string bad = TempPath("bad.json");
  WriteFile(bad, "<html>not a trace</html>");
  for (const std::string& args :
       {"analyze " + bad, std::string("analyze /nonexistent/trace.json"),
        "analyze --steps 9-x " + kWorkers0, "analyze --steps 40-50 " + kWorkers0,
        "analyze --rank 3 " + kWorkers0}) {
    CommandResult r = Command(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_EQ(r.out.rfind("fullburn: ", 0), 0u) << args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": " << r.out;
  }
}

// Messages true to the input (issue 53): each number or name a refusal
// quotes is the one in the files that produced it.
TEST(AnalyzeMessages, QuoteTheStepsRanksAndFileCountsOfTheInput) {
  // --steps outside the trace: the range named is the trace's own steps.
  AnalyzeOptions steps;
  steps.first_step = 40;
  steps.last_step = 50;
  std::string idle = IdleScenario().Write("idle.json");
  Result<RankReport> r = AnalyzeTraceFile(idle, 0, steps);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), idle + ": --steps 40-50: the trace has ProfilerStep#1-#4");
  TraceBuilder one;
  one.Step(7, 0, 1000);
  one.Kernel(10, 20, 100);
  std::string single = one.Write("one_step.json");
  r = AnalyzeTraceFile(single, 0, steps);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), single + ": --steps 40-50: the trace has ProfilerStep#7");

  // --rank that no file has: the ranks listed are those the files name.
  std::string dir = TempPath("ranks");
  fs::create_directories(dir);
  RankFile(0, 400, 500, 1000, "ranks/r0.json");
  RankFile(1, 800, 100, 1000, "ranks/r1.json");
  AnalyzeOptions rank;
  rank.rank = 5;
  Result<TraceReport> rep = AnalyzeTraces({dir}, rank);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().message(), "--rank 5: no trace of that rank (ranks: 0, 1)");

  // Every file unreadable: the count is the files given, the first error
  // the first file's.
  std::string a = TempPath("a_text.json"), b = TempPath("b_empty.json"), c = TempPath("c.json");
  WriteFile(a, "hello");
  WriteFile(b, "");
  WriteFile(c, "{\"traceEvents\": []}");
  rep = AnalyzeTraces({a, b, c}, {});
  ASSERT_FALSE(rep.ok());
  const std::string& m = rep.status().message();
  EXPECT_EQ(m.rfind("none of the 3 files could be analysed; the first: " + a + ": not JSON", 0), 0u)
      << m;
}

}  // namespace
}  // namespace fullburn
