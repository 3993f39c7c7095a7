// Reading py-spy's raw samples: the parser, the phases, the roles of the
// processes, the places and the exports (stacks.h). Stacks are written in
// py-spy 0.4's raw format; one file is a real recording (data/).
#include "fullburn/stacks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "fullburn/diagnose.h"

namespace fullburn {
namespace {

const std::string kTorch = "/usr/lib/python3/dist-packages/torch/";
const std::string kStd = "/usr/lib/python3.11/";
const std::string kAutosteps = "/opt/fullburn/share/fullburn/python/fullburn_autosteps/";
const std::string kHooks = kAutosteps + "torch_hooks.py";
// Before python/fullburn_autosteps/ was a package: one file (an older install's stacks).
const std::string kOldHooks = "/opt/fullburn/share/fullburn/python/fullburn_autosteps.py";

// One raw line: `frames` as "func (file:line)" joined by ';'.
std::string Line(int pid, int tid, const std::vector<std::string>& frames, int count,
                 const std::string& parent = "") {
  std::string s = parent.empty() ? "" : parent + ";";
  s += "process " + std::to_string(pid) + ":\"python train.py --lr 0.1\";thread (" + std::to_string(tid) +
       "): " + (tid == pid ? "MainThread" : "Thread-1");
  for (const std::string& f : frames) s += ";" + f;
  return s + " " + std::to_string(count) + "\n";
}

std::string Main() { return "<module> (/home/u/train.py:120)"; }
std::string Loop() { return "train (/home/u/train.py:88)"; }
std::string Next() { return "_next_hook.<locals>.__next__ (" + kHooks + ":862)"; }
std::string LoaderNext() { return "_BaseDataLoaderIter.__next__ (" + kTorch + "utils/data/dataloader.py:628)"; }
std::string Fetch() { return "_MapDatasetFetcher.fetch (" + kTorch + "utils/data/_utils/fetch.py:51)"; }
std::string GetItem() { return "Photos.__getitem__ (/home/u/data.py:42)"; }
std::string Resize() { return "Image.resize (/usr/lib/python3/dist-packages/PIL/Image.py:2192)"; }
std::string CallImpl() { return "Module._call_impl (" + kTorch + "nn/modules/module.py:1194)"; }
std::string WorkerLoop() { return "_worker_loop (" + kTorch + "utils/data/_utils/worker.py:302)"; }
std::string QueueGet() { return "Queue.get (" + kStd + "multiprocessing/queues.py:113)"; }

StackSample One(const std::string& line) {
  std::vector<StackSample> s = ParseFoldedStacks(line);
  EXPECT_EQ(s.size(), 1u);
  return s.empty() ? StackSample{} : s[0];
}

TEST(Stacks, ParsesProcessChainsThreadsFramesAndCounts) {
  int64_t bad = -1;
  std::string text =
      Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), Fetch(), GetItem(), Resize()}, 7,
           "process 10:\"bash run.sh; echo \"done\"\"") +
      "not a stack\n" + "process 11:\"python x.py\";<module> (x.py:3) many\n" +
      "process 12:\"python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)\";"
      "thread (12): MainThread;<module> (<string>:1);spawn_main (" + kStd + "multiprocessing/spawn.py:120) 3\n";
  std::vector<StackSample> s = ParseFoldedStacks(text, &bad);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(bad, 2);  // no count; a count that is no number
  EXPECT_EQ(s[0].pid, 20);  // the innermost process of the chain
  EXPECT_EQ(s[0].tid, 20);
  EXPECT_EQ(s[0].thread, "MainThread");
  EXPECT_EQ(s[0].count, 7);
  ASSERT_EQ(s[0].frames.size(), 7u);
  EXPECT_EQ(s[0].frames[0].function, "<module>");
  EXPECT_EQ(s[0].frames[0].file, "/home/u/train.py");
  EXPECT_EQ(s[0].frames[0].line, 120);
  EXPECT_EQ(s[0].frames[6].function, "Image.resize");
  // A command line with ';' in it (a spawned worker's) stays whole.
  EXPECT_EQ(s[1].pid, 12);
  ASSERT_EQ(s[1].frames.size(), 2u);
  EXPECT_EQ(s[1].frames[0].file, "<string>");
  EXPECT_EQ(s[1].frames[1].function, "spawn_main");
}

TEST(Stacks, ParsesFramesWithoutLinesAndStacksWithoutThreads) {
  StackSample s = One("process 5:\"python t.py\";<module> (/a/t.py);step (/a/t.py:9) 2\n");
  EXPECT_EQ(s.tid, 0);
  ASSERT_EQ(s.frames.size(), 2u);
  EXPECT_EQ(s.frames[0].line, 0);
  EXPECT_EQ(s.frames[0].file, "/a/t.py");
  EXPECT_EQ(s.frames[1].line, 9);
}

// python -c with a script of several lines: py-spy writes the command line
// as it is, newlines and all; a line cut short before the next stack is bad.
TEST(Stacks, ACommandLineOfSeveralLinesIsOneStack) {
  int64_t bad = 0;
  auto samples = ParseFoldedStacks(
      "process 7:\"python -c import time\nx = 123\ndown(6000)\n\";thread (7): MainThread;"
      "<module> (<string>:3) 4\n"
      "process 7:\"python -c import time\nprocess 8:\"python t.py\";thread (8): MainThread;"
      "<module> (/a/t.py:1) 2\n",
      &bad);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].pid, 7);
  EXPECT_EQ(samples[0].count, 4);
  ASSERT_EQ(samples[0].frames.size(), 1u);
  EXPECT_EQ(samples[0].frames[0].file, "<string>");
  EXPECT_EQ(samples[1].pid, 8);
  EXPECT_EQ(samples[1].count, 2);
  EXPECT_EQ(bad, 1);
}

TEST(Stacks, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  StackSample s = One("process 5:\"python t.py\";thread (5): MainThread;<module> (/data/caf\xe9/t.py:3) 1\n");
  ASSERT_EQ(s.frames.size(), 1u);
  EXPECT_EQ(s.frames[0].file, "/data/caf\xEF\xBF\xBD/t.py");
  EXPECT_NO_THROW(StackSummaryJson(SummarizeStacks({s}, 5, 50)).dump());
  EXPECT_EQ(ValidUtf8("ok \xC3\xA9 \xF0\x9F\x98\x80"), "ok \xC3\xA9 \xF0\x9F\x98\x80");  // é, an emoji
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an overlong '/'
  EXPECT_EQ(ValidUtf8("cut \xE2\x82"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");
}

// Recorded: a name py-spy read while the interpreter was still building it.
TEST(Stacks, AFrameNameReadTornIsKeptOnOneLineWithoutItsControlBytes) {
  using namespace std::string_literals;
  std::string torn = "process 5:\"python t.py\";thread (5): MainThread;<module> (t.py:3);~\0\x01 (mm:2);f (t.py:9) 4\n"s;
  ASSERT_NE(torn.find('\0'), std::string::npos);
  std::vector<StackSample> samples = ParseFoldedStacks(torn);
  ASSERT_EQ(samples.size(), 1u);
  ASSERT_EQ(samples[0].frames.size(), 3u);
  EXPECT_EQ(samples[0].frames[1].function, "~\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(samples[0].frames[1].file, "mm");
  EXPECT_EQ(samples[0].frames[1].line, 2);
  std::string folded = FoldedStacks(samples, 5, "");
  EXPECT_EQ(std::count(folded.begin(), folded.end(), '\n'), 1) << folded;
  EXPECT_EQ(folded.find('\0'), std::string::npos);
  EXPECT_NE(folded.find(";f (t.py:9) 4\n"), std::string::npos) << folded;
}

StackPhase PhaseIn(const std::vector<std::string>& frames, int pid = 20, int tid = 20) {
  std::vector<StackSample> all = ParseFoldedStacks(Line(pid, tid, frames, 1));
  StackRoles roles;
  roles.root = 20;
  roles.training = {20};
  return PhaseOf(all.at(0), roles);
}

TEST(Stacks, TheHooksOwnFramesDecideThePhase) {
  // A torchvision transform is a Module: inside the data wait it is the data wait.
  EXPECT_EQ(PhaseIn({Main(), Loop(), Next(), LoaderNext(), Fetch(), GetItem(), CallImpl()}), StackPhase::kDataWait);
  EXPECT_EQ(PhaseIn({Main(), Loop(), "backward (" + kHooks + ":876)", "Tensor.backward (" + kTorch + "_tensor.py:488)"}),
            StackPhase::kBackward);
  EXPECT_EQ(PhaseIn({Main(), Loop(), "save (" + kHooks + ":931)", "_save (" + kTorch + "serialization.py:653)"}),
            StackPhase::kCheckpoint);
  std::string save_file = "save_file (/usr/lib/python3/dist-packages/safetensors/torch.py:286)";
  EXPECT_EQ(PhaseIn({Main(), Loop(), "timed (" + kAutosteps + "checkpoints.py:97)", save_file}),
            StackPhase::kCheckpoint);
  // The hooks as one file, before the package.
  EXPECT_EQ(PhaseIn({Main(), Loop(), "_hook_torch.<locals>.backward (" + kOldHooks + ":876)",
                     "Tensor.backward (" + kTorch + "_tensor.py:488)"}),
            StackPhase::kBackward);
  // Without the hooks, the DataLoader's own __next__ still says so.
  EXPECT_EQ(PhaseIn({Main(), Loop(), LoaderNext(), Fetch(), GetItem()}), StackPhase::kDataWait);
}

TEST(Stacks, OtherwiseTheInnermostTorchFrameDecides) {
  EXPECT_EQ(PhaseIn({Main(), Loop(), CallImpl(), "Net.forward (/home/u/model.py:30)"}), StackPhase::kForward);
  EXPECT_EQ(PhaseIn({Main(), Loop(), "SGD.step (" + kTorch + "optim/sgd.py:70)"}), StackPhase::kOptimizer);
  EXPECT_EQ(PhaseIn({Main(), Loop(), "clip_grad_norm_ (" + kTorch + "nn/utils/clip_grad.py:55)"}),
            StackPhase::kOptimizer);
  // Lightning's closure: the optimizer's step runs the forward and the backward.
  std::string step = "SGD.step (" + kTorch + "optim/sgd.py:70)";
  std::string closure = "Closure.__call__ (/v/site-packages/lightning/pytorch/loops/optimization/automatic.py:140)";
  EXPECT_EQ(PhaseIn({Main(), step, closure, CallImpl()}), StackPhase::kForward);
  EXPECT_EQ(PhaseIn({Main(), step, closure, "_engine_run_backward (" + kTorch + "autograd/graph.py:769)"}),
            StackPhase::kBackward);
  EXPECT_EQ(PhaseIn({Main(), step, closure}), StackPhase::kOptimizer);
  EXPECT_EQ(PhaseIn({Main(), Loop(), "log_metrics (/home/u/train.py:60)"}), StackPhase::kOther);
}

TEST(Stacks, EvaluationIsTheJobsNoGradFunctionOrAFrameworksLoop) {
  std::string no_grad = "_DecoratorContextManager.__call__.<locals>.decorate_context (" + kTorch +
                        "utils/_contextlib.py:115)";
  std::string estimate = "estimate_loss (/home/u/train.py:70)";
  EXPECT_EQ(PhaseIn({Main(), no_grad, estimate, CallImpl()}), StackPhase::kEvaluation);
  // The batches an evaluation reads are its own time too.
  EXPECT_EQ(PhaseIn({Main(), no_grad, estimate, LoaderNext()}), StackPhase::kEvaluation);
  // A library's no_grad function (an EMA update in timm) is not an evaluation.
  EXPECT_EQ(PhaseIn({Main(), Loop(), no_grad, "ModelEmaV2.update (/v/site-packages/timm/utils/model_ema.py:99)",
                     CallImpl()}),
            StackPhase::kForward);
  EXPECT_EQ(PhaseIn({Main(), "_EvaluationLoop.run (/v/site-packages/lightning/pytorch/loops/evaluation_loop.py:135)",
                     CallImpl()}),
            StackPhase::kEvaluation);
  EXPECT_EQ(PhaseIn({Main(), "Trainer.evaluate (/v/site-packages/transformers/trainer.py:4100)", CallImpl()}),
            StackPhase::kEvaluation);
  EXPECT_EQ(PhaseIn({Main(), "_find_and_load (<frozen importlib._bootstrap>:1178)", CallImpl()}),
            StackPhase::kStartup);
}

TEST(Stacks, ProcessesAreWorkersTrainingRanksOrOthers) {
  std::string text =
      // torchrun's agent, two ranks, one rank's worker, a compile pool's process.
      Line(10, 10, {"main (/v/site-packages/torch/distributed/run.py:900)", "time.sleep"}, 50) +
      Line(20, 20, {Main(), Loop(), CallImpl()}, 30) + Line(21, 21, {Main(), Loop(), CallImpl()}, 30) +
      Line(20, 25, {"Thread._bootstrap (" + kStd + "threading.py:1002)", "_pin_memory_loop (" + kTorch +
                                                                             "utils/data/_utils/pin_memory.py:49)"},
           4) +
      Line(30, 30, {"_bootstrap (" + kStd + "multiprocessing/process.py:314)", WorkerLoop(), Fetch(), GetItem(), Resize()},
           40) +
      Line(30, 30, {"_bootstrap (" + kStd + "multiprocessing/process.py:314)", WorkerLoop(), QueueGet()}, 60) +
      Line(40, 40, {"<module> (/v/site-packages/torch/_inductor/compile_worker/__main__.py:40)"}, 9);
  std::vector<StackSample> samples = ParseFoldedStacks(text);
  StackRoles roles = FindStackRoles(samples, 10);
  EXPECT_EQ(roles.training, (std::set<int>{20, 21}));
  EXPECT_EQ(roles.workers, (std::set<int>{30}));
  StackSummary s = SummarizeStacks(samples, 10, 50);
  EXPECT_EQ(s.samples, 50 + 30 + 30 + 4 + 40 + 60 + 9);
  EXPECT_EQ(s.of(StackPhase::kForward).samples, 60);
  EXPECT_EQ(s.of(StackPhase::kThreads).samples, 4);
  EXPECT_EQ(s.of(StackPhase::kWorkers).samples, 100);
  // A worker waiting for indices names no line.
  EXPECT_EQ(s.of(StackPhase::kWorkers).waiting, 60);
  ASSERT_EQ(s.of(StackPhase::kWorkers).top.size(), 1u);
  EXPECT_EQ(s.of(StackPhase::kWorkers).top[0].where, "data.py:42 Photos.__getitem__ -> PIL Image.resize");
  EXPECT_EQ(s.of(StackPhase::kProcesses).samples, 59);
}

// A forked worker's stack holds its parent's frames above its worker loop:
// the job's loop there is not the worker's place.
TEST(Stacks, AForkedWorkersParentFramesAreNotItsPlace) {
  StackSample forked = One(Line(30, 30, {Main(), Loop(), WorkerLoop(), Fetch(), GetItem()}, 3));
  EXPECT_EQ(PlaceOf(forked).Render(42), "data.py:42 Photos.__getitem__")
      << PlaceOf(forked).key;
  StackSample collating = One(Line(30, 30, {Main(), Loop(), WorkerLoop(), "collate (" + kTorch +
                                                                          "utils/data/_utils/collate.py:141)"},
                                   2));
  EXPECT_EQ(PlaceOf(collating).file, "") << PlaceOf(collating).key;
  EXPECT_NE(PlaceOf(collating).key.find("collate"), std::string::npos) << PlaceOf(collating).key;
}

TEST(Stacks, WithoutAStepPhaseTheStartedProcessTrains) {
  std::vector<StackSample> samples = ParseFoldedStacks(Line(20, 20, {Main(), "work (/home/u/train.py:5)"}, 3));
  StackRoles roles = FindStackRoles(samples, 20);
  EXPECT_EQ(roles.training, (std::set<int>{20}));
  EXPECT_EQ(SummarizeStacks(samples, 20, 50).of(StackPhase::kOther).samples, 3);
}

TEST(Stacks, PlacesFoldLibraryFramesUnderTheJobsAndSumByFunction) {
  std::string text = Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), Fetch(), GetItem(), Resize()}, 30) +
                     Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), Fetch(), "Photos.__getitem__ (/home/u/data.py:44)",
                                   Resize()},
                          50) +
                     Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), Fetch(), "Photos.__getitem__ (/home/u/data.py:40)"}, 20) +
                     // The DataLoader's own code, no frame of the job's under it.
                     Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), "collate (" + kTorch + "utils/data/_utils/collate.py:90)"},
                          5);
  StackSummary s = SummarizeStacks(ParseFoldedStacks(text), 20, 50);
  const StackPhaseSummary& wait = s.of(StackPhase::kDataWait);
  EXPECT_EQ(wait.samples, 105);
  ASSERT_EQ(wait.top.size(), 3u);
  // Lines 42 and 44 are one function's: said at its busiest line.
  EXPECT_EQ(wait.top[0].where, "data.py:44 Photos.__getitem__ -> PIL Image.resize");
  EXPECT_EQ(wait.top[0].samples, 80);
  EXPECT_EQ(wait.top[1].where, "data.py:40 Photos.__getitem__");
  EXPECT_EQ(wait.top[2].where, "train.py:88 train -> torch collate");
  EXPECT_EQ(RenderStackPlaces(s, StackPhase::kDataWait, 2),
            "data.py:44 Photos.__getitem__ -> PIL Image.resize 76% of the data wait, data.py:40 "
            "Photos.__getitem__ 19%");
}

TEST(Stacks, FullburnsOwnFilesAreNotTheJobs) {
  EXPECT_FALSE(IsOwnFrame({"__next__", kHooks, 862}));
  EXPECT_FALSE(IsOwnFrame({"exec_and_hook", kAutosteps + "import_watch.py", 27}));
  EXPECT_FALSE(IsOwnFrame({"__next__", kOldHooks, 862}));
  EXPECT_FALSE(IsOwnFrame({"f", "/opt/fb/python/helper.py", 1}, {"/opt/fb/python/"}));
  EXPECT_FALSE(IsOwnFrame({"get", kStd + "queue.py", 1}));
  EXPECT_FALSE(IsOwnFrame({"get", "/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py", 1}));
  EXPECT_FALSE(IsOwnFrame({"<module>", "<string>", 1}));
  EXPECT_TRUE(IsOwnFrame({"main", "/home/u/lib/python_tools/train.py", 1}));
}

TEST(Stacks, TheSummaryRoundTripsThroughItsEvent) {
  std::string text = Line(20, 20, {Main(), Loop(), CallImpl()}, 3) +
                     Line(30, 30, {"_bootstrap (" + kStd + "multiprocessing/process.py:314)", WorkerLoop(), GetItem()}, 4);
  StackSummary s = SummarizeStacks(ParseFoldedStacks(text), 20, 100);
  s.errors = 2;
  StackSummary back = StackSummaryFromJson(nlohmann::json::parse(StackSummaryJson(s).dump()));
  EXPECT_EQ(back.samples, 7);
  EXPECT_EQ(back.errors, 2);
  EXPECT_DOUBLE_EQ(back.rate_hz, 100);
  EXPECT_EQ(back.workers, std::vector<int>{30});
  EXPECT_EQ(back.of(StackPhase::kWorkers).top.at(0).where, "data.py:42 Photos.__getitem__");
  EXPECT_EQ(back.of(StackPhase::kForward).samples, 3);
  EXPECT_TRUE(StackSummaryFromJson(nlohmann::json::parse("{\"phases\": 3}")).empty());
  EXPECT_TRUE(StackSummaryFromJson(nlohmann::json::parse("[1]")).empty());
}

TEST(Stacks, FindingsSayWhereTheirTimeWent) {
  std::string text = Line(20, 20, {Main(), Loop(), Next(), LoaderNext(), QueueGet()}, 70) +
                     Line(20, 20, {Main(), Loop(), CallImpl()}, 20) +
                     Line(20, 20, {Main(), Loop(), "log_metrics (/home/u/train.py:60)"}, 10) +
                     Line(30, 30, {"_bootstrap (" + kStd + "multiprocessing/process.py:314)", WorkerLoop(), GetItem(), Resize()}, 90) +
                     Line(30, 30, {"_bootstrap (" + kStd + "multiprocessing/process.py:314)", WorkerLoop(), QueueGet()}, 5);
  StackSummary s = SummarizeStacks(ParseFoldedStacks(text), 20, 50);
  // The main process only waits for its workers: their work is the where.
  EXPECT_EQ(WhereOf(CauseId::kInputWorkers, s), "data.py:42 Photos.__getitem__ -> PIL Image.resize 100% of the DataLoader workers' work");
  EXPECT_EQ(WhereOf(CauseId::kLoopOverhead, s), "train.py:60 log_metrics 10% of step time");
  EXPECT_EQ(WhereOf(CauseId::kMemoryHeadroom, s), "");
  EXPECT_EQ(WhereOf(CauseId::kCheckpointStall, s), "");  // no checkpoint sampled
}

TEST(Stacks, ExportsFoldedAndSpeedscopeByPhase) {
  std::string text = Line(20, 20, {Main(), Loop(), CallImpl()}, 3) + Line(20, 20, {Main(), Loop(), Next(), GetItem()}, 2);
  std::vector<StackSample> samples = ParseFoldedStacks(text);
  std::string all = FoldedStacks(samples, 20);
  EXPECT_NE(all.find("forward;process 20;thread 20 MainThread;<module> (/home/u/train.py:120);"), std::string::npos);
  EXPECT_NE(all.find(" 3\n"), std::string::npos);
  std::string waits = FoldedStacks(samples, 20, "data_wait");
  EXPECT_EQ(waits.find("forward"), std::string::npos);
  EXPECT_NE(waits.find("Photos.__getitem__ (/home/u/data.py:42) 2\n"), std::string::npos);
  nlohmann::json sp = SpeedscopeJson(samples, 20, 50, "run 1");
  ASSERT_EQ(sp["profiles"].size(), 2u);
  EXPECT_EQ(sp["profiles"][0]["name"], "data_wait");
  EXPECT_EQ(sp["profiles"][0]["type"], "sampled");
  EXPECT_DOUBLE_EQ(sp["profiles"][0]["endValue"].get<double>(), 2 / 50.0);
  // Every frame index points into the shared frames.
  for (const auto& p : sp["profiles"])
    for (const auto& stack : p["samples"])
      for (const auto& i : stack) EXPECT_LT(i.get<size_t>(), sp["shared"]["frames"].size());
}

// py-spy 0.4.3 over a torch 1.13 job whose Dataset calls a slow Python
// function, num_workers=0, under fullburn run's step hooks.
TEST(Stacks, ARecordedJobNamesItsPlantedTransform) {
  std::ifstream in(std::string(STACKS_DATA_DIR) + "/workers0_torch113.pyspy");
  std::stringstream text;
  text << in.rdbuf();
  int64_t bad = 0;
  std::vector<StackSample> samples = ParseFoldedStacks(text.str(), &bad);
  ASSERT_FALSE(samples.empty());
  EXPECT_EQ(bad, 0);
  StackSummary s = SummarizeStacks(samples, samples[0].pid, 50);
  const StackPhaseSummary& wait = s.of(StackPhase::kDataWait);
  ASSERT_FALSE(wait.top.empty());
  EXPECT_EQ(wait.top[0].where.rfind("slow_tf.py:", 0), 0u) << wait.top[0].where;
  EXPECT_NE(wait.top[0].where.find(" heavy_blur"), std::string::npos);
  EXPECT_GE(static_cast<double>(wait.top[0].samples) / (wait.samples - wait.waiting), 0.8);
  EXPECT_GT(s.of(StackPhase::kStartup).samples, 0);  // importing torch
}

}  // namespace
}  // namespace fullburn
