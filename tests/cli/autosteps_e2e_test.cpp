// End to end: `fullburn run` times the steps of an unchanged PyTorch script
// (python/fullburn_autosteps/) with real torch: Debian's python3-torch
// 1.13, and again (the tests named *.torch2) under PyPI's 2.x in the venv of
// scripts/torch2-venv.sh, named by FULLBURN_TEST_PYTHON.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fullburn/diagnose.h"
#include "fullburn/store.h"
#include "fullburn/tune.h"
#include "process.h"

namespace fullburn {
namespace {

using testing::RunToEnd;

const char* const kPython =
    std::getenv("FULLBURN_TEST_PYTHON") ? std::getenv("FULLBURN_TEST_PYTHON") : "/usr/bin/python3";
const std::string kScript = std::string(SOURCE_DIR) + "/examples/scenarios/plain_torch.py";
const std::string kGetBatchScript =
    std::string(SOURCE_DIR) + "/examples/scenarios/get_batch_loop.py";

bool PythonHasTorch() {
  static const bool has = RunToEnd({kPython, "-c", "import torch"}).code == 0;
  return has;
}

class AutoStepsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PythonHasTorch())
      GTEST_SKIP() << kPython
                   << " cannot import torch: scripts/install-deps.sh installs python3-torch, "
                      "scripts/torch2-venv.sh PyPI's 2.x";
    dir_ = testing::FreshTestDir("fb_autosteps");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
    ::unsetenv("FULLBURN_NO_AUTO_STEPS");
    ::unsetenv("PYTHONPATH");
    ::unsetenv("FULLBURN_TUNE_SET");
  }
  void TearDown() override {
    ::unsetenv("PYTHONPATH");
    ::unsetenv("FULLBURN_TUNE_SET");
  }
  testing::Outcome Run(std::vector<std::string> args, std::vector<std::string> flags = {},
                       const std::string& script = kScript) {
    std::vector<std::string> argv = {FULLBURN_BIN, "run", "--interval", "0.2", "--store", store_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", kPython, script});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv);
  }
  RunData Stored() {
    auto store = RunStore::Open(store_);
    EXPECT_TRUE(store.ok());
    auto run = (*store)->LoadRun("last");
    EXPECT_TRUE(run.ok()) << run.status().message();
    return run.ok() ? *run : RunData{};
  }
  std::string dir_, store_;
};

std::vector<nlohmann::json> EventsOf(const RunData& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const RunEvent& e : run.events)
    if (e.kind == kind) out.push_back(nlohmann::json::parse(e.data));
  return out;
}

// Medians: one step a busy machine preempted does not decide a bound.
// The top finding besides idle_phases: that one holds the job's start-up
// (the interpreter, torch's import), whose length is the machine's load,
// not the job's, so a test that names what limits the steps asks past it.
const Finding& TopBesidesIdle(const std::vector<Finding>& findings) {
  for (const Finding& f : findings)
    if (f.name() != "idle_phases") return f;
  static const Finding kNone{CauseId::kHealthy, "(no finding besides idle_phases)", "", 0, 0, ""};
  return kNone;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Checked by the clocks the script wrote, not by step lengths, which a busy
// machine stretches: no step's span overlaps an evaluation's.
void ExpectNoStepHoldsAnEvaluation(const RunData& run) {
  for (const RunEvent& e : run.events) {
    if (e.kind != "evaluation") continue;
    const double eval_end = e.t;
    const double eval_start = e.t - nlohmann::json::parse(e.data).value("duration_s", 0.0);
    for (const StepRecord& s : run.steps) {
      const double step_start = s.t - s.step_s;
      EXPECT_TRUE(s.t <= eval_start + 1e-3 || step_start >= eval_end - 1e-3)
          << "step " << s.step << " [" << step_start << ", " << s.t << "] holds the evaluation ["
          << eval_start << ", " << eval_end << "]";
    }
  }
}

// 128 samples of 8, two micro-batches per optimizer step, 2 epochs: 16 steps
// of 16 samples, each waiting 3 ms per sample; a validation pass per epoch.
TEST_F(AutoStepsE2E, AnUnchangedPyTorchScriptGetsStepsDataWaitAndItsEvaluations) {
  auto o = Run({"--workers", "0", "--epochs", "2"});
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), 16u) << o.err;
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepRecord& s = run.steps[i];
    EXPECT_EQ(s.step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(s.epoch, i < 8 ? 0 : 1);
    EXPECT_EQ(s.samples, 16);  // both micro-batches
    ASSERT_TRUE(s.data_wait_s.has_value());
    // 16 samples x 3 ms of sleeping: the data wait is most of the step.
    EXPECT_GT(*s.data_wait_s, 0.040);
    EXPECT_LE(*s.data_wait_s, s.step_s + 1e-6);
    EXPECT_GT(s.loss, 0);  // the loss passed to backward(), a CPU tensor
    EXPECT_DOUBLE_EQ(s.lr, 0.1);
  }
  // The validation passes (32 samples = 96 ms each) are events, not folded
  // into the first step of the next epoch.
  auto evaluations = EventsOf(run, "evaluation");
  ASSERT_EQ(evaluations.size(), 2u);
  for (const auto& e : evaluations) EXPECT_GT(e.value("duration_s", 0.0), 0.080) << e.dump();
  ExpectNoStepHoldsAnEvaluation(run);
  auto loaders = EventsOf(run, "dataloader");
  ASSERT_EQ(loaders.size(), 1u);  // the training loader only
  EXPECT_EQ(loaders[0].value("num_workers", -1), 0);
  EXPECT_EQ(loaders[0].value("batch_size", -1), 8);
  EXPECT_NE(run.run.config_json.find("\"auto_steps\":true"), std::string::npos);
  // The diagnosis reads them like any marked job's: input-bound (with idle
  // cores, input_workers; on a machine busy with other work, input_cpu).
  auto findings = Diagnose(run);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(TopBesidesIdle(findings).name().rfind("input_", 0), 0u) << RenderFindings(findings);
  EXPECT_NE(TopBesidesIdle(findings).evidence.find("num_workers=0"), std::string::npos);
}

// An optimizer made but stepped through something the hooks do not see
// (here: never stepped, the update done by hand): no step count rather than
// a wrong one, and one line saying so and how to mark the steps.
TEST_F(AutoStepsE2E, StepsTheHooksCannotSeeAreSaidNotMiscounted) {
  std::string script = dir_ + "/unseen_steps.py";
  std::ofstream(script) << "import torch\n"
                           "model = torch.nn.Linear(4, 1)\n"
                           "opt = torch.optim.SGD(model.parameters(), lr=0.1)  # never stepped\n"
                           "for _ in range(5):\n"
                           "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
                           "    loss.backward()\n"
                           "    with torch.no_grad():\n"
                           "        for p in model.parameters():\n"
                           "            p -= 0.1 * p.grad\n"
                           "            p.grad = None\n";
  auto o = Run({}, {}, script);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(Stored().steps.empty());
  EXPECT_NE(o.err.find("fullburn: no optimizer step was seen after 5 backward() calls"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("mark the steps with fullburn_markers"), std::string::npos) << o.err;
}

// fp16's GradScaler skips an update whose scaled gradients overflowed
// (optimizer.step() is not called), halving its scale: no step ends there,
// so that batch's samples and time go to the next update's step. Its scale
// starts far too large, as a new fp16 run's does, so the first updates are
// skipped until it fits; the script prints the scaler's own count. On the
// CPU only from torch 2.3 (torch.amp.GradScaler("cpu")): skipped before.
TEST_F(AutoStepsE2E, UpdatesAGradScalerSkipsGoToTheNextStep) {
  std::string script = dir_ + "/scaler.py";
  std::ofstream(script)
      << "import torch\n"
         "if not hasattr(getattr(torch, 'amp', None), 'GradScaler'):\n"
         "    raise SystemExit('no torch.amp.GradScaler in torch ' + torch.__version__)\n"
         "torch.manual_seed(0)\n"
         "scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 127, growth_interval=1000)\n"
         "model = torch.nn.Linear(8, 1)\n"
         "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
         "dataset = torch.utils.data.TensorDataset(torch.randn(160, 8), torch.randn(160, 1))\n"
         "skipped = 0\n"
         "for x, y in torch.utils.data.DataLoader(dataset, batch_size=8):\n"
         "    loss = 30 * torch.nn.functional.mse_loss(model(x), y)\n"
         "    scaler.scale(loss).backward()\n"
         "    scaler.step(opt)\n"
         "    before = scaler.get_scale()\n"
         "    scaler.update()\n"
         "    skipped += scaler.get_scale() < before\n"
         "    opt.zero_grad()\n"
         "print('skipped', skipped)\n";
  auto o = Run({}, {}, script);
  if (o.err.find("no torch.amp.GradScaler") != std::string::npos)
    GTEST_SKIP() << "this torch has no CPU GradScaler: " << o.err;
  ASSERT_EQ(o.code, 0) << o.err;
  size_t at = o.out.find("skipped ");
  ASSERT_NE(at, std::string::npos) << o.out;
  int skipped = std::atoi(o.out.c_str() + at + 8);
  ASSERT_GE(skipped, 2) << "the planted overflow did not happen";
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), static_cast<size_t>(20 - skipped));
  EXPECT_EQ(run.steps[0].samples, 8 * (skipped + 1)) << "the skipped batches and the first update";
  int64_t samples = 0;
  for (const StepRecord& s : run.steps) {
    samples += s.samples;
    EXPECT_TRUE(std::isfinite(s.loss)) << s.step;
  }
  EXPECT_EQ(samples, 160);
}

// A GAN steps two optimizers per iteration: a step per update of the first
// to step (the generator's here), said in one line.
TEST_F(AutoStepsE2E, TwoOptimizersPerIterationCountOneStepAndSaySo) {
  std::string script = dir_ + "/gan.py";
  std::ofstream(script) << "import torch\n"
                           "g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)\n"
                           "opt_g = torch.optim.Adam(g.parameters())\n"
                           "opt_d = torch.optim.SGD(d.parameters(), lr=0.1)\n"
                           "for _ in range(6):\n"
                           "    d(g(torch.randn(8, 4))).mean().backward()\n"
                           "    opt_g.step(); opt_g.zero_grad(); opt_d.zero_grad()\n"
                           "    d(torch.randn(8, 4)).mean().backward()\n"
                           "    opt_d.step(); opt_d.zero_grad()\n";
  auto o = Run({}, {}, script);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Stored().steps.size(), 6u);
  EXPECT_NE(o.err.find("fullburn: a second optimizer (SGD) steps too: a step is counted per Adam "
                       "update, the first to step"),
            std::string::npos)
      << o.err;
}

// A loop with no optimizer object, updating its parameters by hand after
// backward() as older examples do: each backward() ends a step (at the next
// batch's fetch, so the update is in it), with its data wait and loss.
TEST_F(AutoStepsE2E, ALoopThatUpdatesByHandGetsItsSteps) {
  auto o = Run({"--workers", "0", "--epochs", "2", "--accumulate", "1", "--manual-update"});
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), 32u) << o.err;  // 2 epochs of 16 batches
  for (const StepRecord& s : run.steps) {
    EXPECT_EQ(s.samples, 8);
    ASSERT_TRUE(s.data_wait_s.has_value());
    EXPECT_GT(*s.data_wait_s, 0.020);  // 8 samples x 3 ms
    EXPECT_LE(*s.data_wait_s, s.step_s + 1e-6);
    EXPECT_GT(s.loss, 0);
    EXPECT_FALSE(s.lr > 0) << "no optimizer, no learning rate";
  }
  EXPECT_EQ(EventsOf(run, "evaluation").size(), 2u);  // still kept out of the steps
  auto findings = Diagnose(run);
  EXPECT_EQ(TopBesidesIdle(findings).name().rfind("input_", 0), 0u) << RenderFindings(findings);
}

// --profile A-B: the automatic markers run torch.profiler over those steps,
// the trace lands beside the store, and fullburn run, diagnose and report
// analyse it (a CPU trace here: host ops only, and the analysis says so).
TEST_F(AutoStepsE2E, ProfileTracesTheStepsAskedAndTheRunIsAnalysedWithIt) {
  auto o = Run({"--workers", "0", "--epochs", "1"}, {"--profile", "3-5"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("the profiler's trace of steps 3-5"), std::string::npos) << o.err;
  std::string trace = dir_ + "/traces/run-1/rank0.pt.trace.json";
  ASSERT_TRUE(std::filesystem::exists(trace)) << o.err;
  // Three steps, each marked as the profiler marks them, and no step after
  // them but the sliver that closes the last (left out of the analysis).
  std::string text = testing::ReadText(trace);
  for (int n : {0, 1, 2})
    EXPECT_NE(text.find("ProfilerStep#" + std::to_string(n)), std::string::npos) << n;
  EXPECT_EQ(text.find("ProfilerStep#4"), std::string::npos);
  RunData run = Stored();
  EXPECT_EQ(EventsOf(run, "profile").size(), 1u);
  EXPECT_EQ(run.steps.size(), 8u);  // profiling does not change the steps
  auto diagnosed = RunToEnd({FULLBURN_BIN, "diagnose", "last", "--store", store_});
  ASSERT_EQ(diagnosed.code, 0) << diagnosed.err;
  EXPECT_NE(diagnosed.out.find("from the profiler trace of steps 3-5"), std::string::npos)
      << diagnosed.out;
  auto json = RunToEnd({FULLBURN_BIN, "diagnose", "last", "--json", "--store", store_});
  EXPECT_NE(json.out.find("\"source\": \"profiler trace, steps 3-5\""), std::string::npos)
      << json.out;
  std::string html = dir_ + "/r.html";
  ASSERT_EQ(RunToEnd({FULLBURN_BIN, "report", "last", "-o", html, "--store", store_}).code, 0);
  EXPECT_NE(testing::ReadText(html).find("From the profiler trace (steps 3-5)"), std::string::npos);
  // A bad range is one line and exit 2, before anything runs.
  auto bad = Run({}, {"--profile", "5-3"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--profile '5-3': B is before A"), std::string::npos) << bad.err;
  // Fewer steps than asked: said, not silent.
  auto past = Run({"--workers", "0", "--epochs", "1"}, {"--profile", "50-60"});
  EXPECT_NE(past.err.find("--profile 50-60 wrote no trace"), std::string::npos) << past.err;
}

// A job that marks its own steps (one per micro-batch here) is not counted
// twice: its Markers take over from the automatic ones.
TEST_F(AutoStepsE2E, AJobWithItsOwnMarkersIsCountedOnce) {
  auto o = Run({"--markers", "--epochs", "2", "--sample-ms", "0"});
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  EXPECT_EQ(run.steps.size(), 32u);
  EXPECT_EQ(o.err.find("started again"), std::string::npos) << o.err;
  for (const StepRecord& s : run.steps) EXPECT_EQ(s.samples, 8);
}

// A job that marks its steps by hand still gets its training DataLoader's
// settings recorded, not those of a validation loader it iterates first.
TEST_F(AutoStepsE2E, AJobsOwnMarkersGetTheTrainingLoadersSettings) {
  auto o = Run({"--markers-by-hand", "--validate-first", "--epochs", "2", "--sample-ms", "0"});
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  EXPECT_EQ(run.steps.size(), 16u);
  auto loaders = EventsOf(run, "dataloader");
  ASSERT_FALSE(loaders.empty());
  for (const auto& l : loaders) EXPECT_EQ(l.value("batch_size", -1), 8) << l.dump();  // not 16
}

// --no-auto-steps turns them off; either way a sitecustomize.py the job's own
// PYTHONPATH names still runs, and plain Python (no torch) is untouched.
TEST_F(AutoStepsE2E, OffWhenAskedAndTheJobsOwnSitecustomizeStillRuns) {
  std::string own = dir_ + "/own";
  std::filesystem::create_directories(own);
  std::ofstream(own + "/sitecustomize.py")
      << "import os\nopen(os.environ['OWN_MARK'], 'a').write('ran\\n')\n";
  ::setenv("PYTHONPATH", own.c_str(), 1);
  std::string mark = dir_ + "/mark";
  ::setenv("OWN_MARK", mark.c_str(), 1);
  auto off = Run({"--epochs", "1", "--sample-ms", "0"}, {"--no-auto-steps"});
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_TRUE(Stored().steps.empty());
  EXPECT_NE(Stored().run.config_json.find("\"auto_steps\":false"), std::string::npos);
  auto on = Run({"--epochs", "1", "--sample-ms", "0"});
  ASSERT_EQ(on.code, 0) << on.err;
  EXPECT_EQ(Stored().steps.size(), 8u);
  EXPECT_EQ(testing::ReadText(mark), "ran\nran\n");
  auto plain = RunToEnd({FULLBURN_BIN, "run", "--store", store_, "--", kPython, "-c",
                         "import sys; print('fullburn_autosteps' in sys.modules)"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, "True\n");  // loaded, waiting for an import of torch that never comes
  EXPECT_EQ(plain.err.find("automatic step markers are off"), std::string::npos) << plain.err;
  ::unsetenv("OWN_MARK");
}

// DistributedDataParallel over Gloo, 2 processes under fullburn launch: each
// rank's steps are recorded with its rank, and the slow reader is named.
TEST_F(AutoStepsE2E, EachRankOfADataParallelJobIsRecordedAndTheStragglerNamed) {
  std::vector<std::string> argv = {FULLBURN_BIN, "run",      "--interval", "0.2",    "--store",
                                   store_,       "--",       FULLBURN_BIN, "launch", "--nproc",
                                   "2",          "--",       kPython,      kScript,  "--slow-rank",
                                   "1",          "--epochs", "2"};
  auto o = RunToEnd(argv);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  // 128 samples over 2 ranks, 8 a micro-batch, 2 a step: 4 steps a rank an epoch.
  std::map<int, int> per_rank;
  for (const StepRecord& s : run.steps) {
    ++per_rank[s.rank];
    EXPECT_EQ(s.samples, 16);
  }
  EXPECT_EQ(per_rank, (std::map<int, int>{{0, 8}, {1, 8}})) << o.err;
  auto findings = Diagnose(run);
  bool named = false;
  for (const Finding& f : findings)
    named = named || (f.name() == "uneven_ranks" && f.title.find("rank 1") != std::string::npos);
  EXPECT_TRUE(named) << RenderFindings(findings, 10);
}

// The hooks hold no DataLoader iterator alive: a loop that breaks out early
// frees its iterator, and the worker processes stop, as without fullburn.
TEST_F(AutoStepsE2E, AnIteratorTheLoopDropsIsFreedWithItsWorkers) {
  std::string script = dir_ + "/early_break.py";
  std::ofstream(script)
      << "import gc, multiprocessing, torch\n"
         "data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
         "loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)\n"
         "model = torch.nn.Linear(4, 1)\n"
         "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
         "for i, (x, y) in enumerate(loader):\n"
         "    ((model(x) - y) ** 2).mean().backward()\n"
         "    opt.step()\n"
         "    opt.zero_grad()\n"
         "    if i == 3:\n"
         "        break\n"
         "gc.collect()\n"
         "print('workers alive:', len(multiprocessing.active_children()))\n";
  auto o = RunToEnd({FULLBURN_BIN, "run", "--store", store_, "--", kPython, script});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "workers alive: 0\n") << o.err;
  EXPECT_EQ(Stored().steps.size(), 4u);
}

// An uncaught exception is recorded where it was raised, and the diagnosis
// names the failure first, with the fix for its kind.
TEST_F(AutoStepsE2E, AnUncaughtExceptionIsTheFirstFinding) {
  auto o = Run({"--fail-at", "5", "--sample-ms", "0"});
  ASSERT_EQ(o.code, 1) << o.err;                          // the job's own exit code
  EXPECT_NE(o.err.find("Traceback"), std::string::npos);  // Python still prints it
  RunData run = Stored();
  EXPECT_EQ(run.steps.size(), 5u);
  auto exceptions = EventsOf(run, "exception");
  ASSERT_EQ(exceptions.size(), 1u);
  EXPECT_EQ(exceptions[0]["type"], "RuntimeError");
  EXPECT_EQ(exceptions[0]["where"].get<std::string>().rfind("plain_torch.py:", 0), 0u)
      << exceptions[0].dump();
  auto findings = Diagnose(run);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].name(), "job_failed");
  EXPECT_EQ(findings[0].title, "The job ran out of GPU memory");
  EXPECT_NE(findings[0].evidence.find("exit code 1; raised RuntimeError at plain_torch.py:"),
            std::string::npos)
      << findings[0].evidence;
  EXPECT_NE(findings[0].evidence.find("after step 5"), std::string::npos) << findings[0].evidence;
  // A wrapped plain loop's fix is in its own terms (fullburn_layers.py's record).
  EXPECT_NE(findings[0].fix.find("half the batch"), std::string::npos) << findings[0].fix;
  EXPECT_NE(findings[0].fix.find("torch.utils.checkpoint.checkpoint around"), std::string::npos)
      << findings[0].fix;
  EXPECT_TRUE(exceptions[0].contains("oom")) << exceptions[0].dump();
  EXPECT_NE(o.err.find("[job_failed] The job ran out of GPU memory"), std::string::npos) << o.err;
  // A run that ends well has no such event.
  ASSERT_EQ(Run({"--epochs", "1", "--sample-ms", "0"}).code, 0);
  EXPECT_TRUE(EventsOf(Stored(), "exception").empty());
}

// fullburn tune's settings reach an unchanged script's DataLoaders and
// threads (its own torch.set_num_threads(1) included), and the run records
// what took: with the automatic markers, and with the job's own.
TEST_F(AutoStepsE2E, TuneSettingsReachTheScriptAndAreRecorded) {
  ::setenv("FULLBURN_TUNE_SET", R"({"num_workers": 1, "persistent_workers": true, "threads": 2})",
           1);
  for (const char* own : {"", "--markers"}) {
    std::vector<std::string> args = {"--epochs", "2", "--sample-ms", "0"};
    if (*own) args.push_back(own);
    auto o = Run(args);
    ASSERT_EQ(o.code, 0) << o.err;
    RunData run = Stored();
    ScriptSettings had = ScriptSettings::FromEvents(run.events);
    EXPECT_EQ(had.num_workers, 1) << own;
    EXPECT_EQ(had.persistent_workers, 1) << own;
    EXPECT_EQ(had.threads, 2) << own;
    EXPECT_EQ(ScriptSettingsMismatch({{"num_workers", "1"}, {"threads", "2"}}, had), "") << own;
  }
  // Not a JSON object: said once, and the script runs its own settings.
  ::setenv("FULLBURN_TUNE_SET", "workers=4", 1);
  auto bad = Run({"--epochs", "1", "--sample-ms", "0"});
  ASSERT_EQ(bad.code, 0) << bad.err;
  EXPECT_NE(bad.err.find("fullburn: FULLBURN_TUNE_SET is not a JSON object; running the script's "
                         "own settings"),
            std::string::npos)
      << bad.err;
  ScriptSettings kept = ScriptSettings::FromEvents(Stored().events);
  EXPECT_EQ(kept.num_workers, 0);  // the script's own settings
  EXPECT_EQ(kept.threads, 1);
  ::unsetenv("FULLBURN_TUNE_SET");
  ASSERT_EQ(Run({"--epochs", "1", "--sample-ms", "0"}).code, 0);
  ScriptSettings own = ScriptSettings::FromEvents(Stored().events);
  EXPECT_EQ(own.num_workers, 0);  // the script's own settings again
  EXPECT_EQ(own.threads, 1);
}

// A synchronous torch.save every 4 steps (a 200 MB state): each is a
// checkpoint event, its time kept out of the steps, and the diagnosis names
// what the saves cost. On a background thread they are marked so and cost
// the loop no checkpoint time.
TEST_F(AutoStepsE2E, TorchSavesAreCheckpointsKeptOutOfTheSteps) {
  std::vector<std::string> args = {"--epochs",     "1", "--accumulate", "1",   "--sample-ms", "1",
                                   "--save-every", "4", "--save-mb",    "200", "--save-dir",  dir_};
  auto o = Run(args);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), 16u);
  auto saves = EventsOf(run, "checkpoint");
  ASSERT_EQ(saves.size(), 4u);
  double shortest = 1e9;
  for (size_t i = 0; i < saves.size(); ++i) {
    EXPECT_EQ(saves[i]["path"], dir_ + "/checkpoint.pt");
    EXPECT_GT(saves[i]["bytes"].get<int64_t>(), int64_t{200} << 20);
    EXPECT_EQ(saves[i]["after_step"], 4 * (i + 1));
    EXPECT_FALSE(saves[i].value("background", false));
    shortest = std::min(shortest, saves[i]["duration_s"].get<double>());
  }
  // A step's own work is a tiny MLP's (about a millisecond): none holds a
  // save. Three steps follow a save; one step a busy machine stretched is
  // allowed, three are not.
  int long_steps = 0;
  for (const StepRecord& s : run.steps)
    long_steps += s.step_s - s.data_wait_s.value_or(0) >= shortest / 2;
  EXPECT_LE(long_steps, 1);
  auto findings = Diagnose(run);
  auto stall = std::find_if(findings.begin(), findings.end(),
                            [](const Finding& f) { return f.name() == "checkpoint_stall"; });
  ASSERT_NE(stall, findings.end()) << RenderFindings(findings, 9);
  EXPECT_NE(stall->evidence.find("4 checkpoints (torch.save"), std::string::npos)
      << stall->evidence;
  EXPECT_NE(stall->evidence.find("every 4 steps"), std::string::npos) << stall->evidence;
  EXPECT_NE(o.err.find("[checkpoint_stall]"), std::string::npos) << o.err;
  // The trace shows each save in the gap it made.
  auto trace = RunToEnd({FULLBURN_BIN, "runs", "trace", "last", "--store", store_});
  ASSERT_EQ(trace.code, 0) << trace.err;
  int spans = 0;
  nlohmann::json events = nlohmann::json::parse(trace.out);
  for (const auto& e : events["traceEvents"])
    if (e.value("name", "") == "checkpoint" && e.value("ph", "") == "X") ++spans;
  EXPECT_EQ(spans, 4);

  args.push_back("--save-in-thread");
  ASSERT_EQ(Run(args).code, 0);
  run = Stored();
  saves = EventsOf(run, "checkpoint");
  ASSERT_EQ(saves.size(), 4u);
  for (const auto& save : saves) EXPECT_TRUE(save.value("background", false)) << save.dump();
  for (const Finding& f : Diagnose(run)) EXPECT_NE(f.name(), "checkpoint_stall") << f.evidence;
  std::filesystem::remove(dir_ + "/checkpoint.pt");
}

// The step's phases are timed around backward(); 25 ms of logging after each
// optimizer step is left outside them, in the next step, and named.
TEST_F(AutoStepsE2E, TheStepsPhasesAreTimedAndTheLoopsOwnWorkNamed) {
  std::vector<std::string> args = {"--epochs", "1", "--sample-ms", "3"};
  auto rest = [](const StepRecord& s) {
    return s.step_s - *s.data_wait_s - *s.forward_s - *s.backward_s - *s.optimizer_s;
  };
  auto has = [](const std::vector<Finding>& findings, const char* cause) {
    return std::any_of(findings.begin(), findings.end(),
                       [&](const Finding& f) { return f.name() == cause; });
  };
  ASSERT_EQ(Run(args).code, 0);
  RunData plain = Stored();
  ASSERT_EQ(plain.steps.size(), 8u);
  std::vector<double> rests;
  for (const StepRecord& s : plain.steps) {
    ASSERT_TRUE(s.data_wait_s && s.forward_s && s.backward_s && s.optimizer_s) << s.step;
    EXPECT_GT(*s.forward_s, 0);
    EXPECT_GT(*s.backward_s, 0);
    EXPECT_GT(*s.optimizer_s, 0);
    EXPECT_GE(rest(s), -1e-6) << "phases overlap in step " << s.step;
    rests.push_back(rest(s));
  }
  // zero_grad and the loop's own bookkeeping: well under the 25 ms of
  // logging the second run adds.
  EXPECT_LT(Median(rests), 0.010);
  EXPECT_FALSE(has(Diagnose(plain), "loop_overhead"));

  args.insert(args.end(), {"--log-ms", "25"});
  auto o = Run(args);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData logged = Stored();
  ASSERT_EQ(logged.steps.size(), 8u);
  std::vector<double> forwards, optimizers;
  for (const StepRecord& s : logged.steps) {
    ASSERT_TRUE(s.forward_s && s.optimizer_s) << s.step;
    // The logging after step k delays step k+1, outside every phase.
    if (s.step > 1) {
      EXPECT_GT(rest(s), 0.020) << "step " << s.step;
    }
    forwards.push_back(*s.forward_s);
    optimizers.push_back(*s.optimizer_s);
  }
  // A phase holding the 25 ms of logging would be at least that long.
  EXPECT_LT(Median(forwards), 0.025);
  EXPECT_LT(Median(optimizers), 0.025);
  auto findings = Diagnose(logged);
  ASSERT_TRUE(has(findings, "loop_overhead")) << RenderFindings(findings, 9);
  EXPECT_NE(o.err.find("[loop_overhead]"), std::string::npos) << o.err;
}

// A nanoGPT-shaped loop (examples/scenarios/get_batch_loop.py): no DataLoader.
// The model's calls time the forward and count the samples; get_batch(), run
// between a forward and its backward(), is the loop's own work and named so;
// estimate_loss() under no_grad is an evaluation, kept out of the steps; and
// the model pickled by torch.save carries none of the timing hooks.
TEST_F(AutoStepsE2E, ALoopWithoutADataLoaderGetsItsForwardSamplesAndEvaluations) {
  std::string saved = dir_ + "/model.pt";
  auto o = Run({"--iters", "20", "--grad-accum", "2", "--batch-ms", "15", "--save-model", saved},
               {}, kGetBatchScript);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), 20u) << o.err;
  std::vector<double> forwards, rests;
  for (const StepRecord& s : run.steps) {
    EXPECT_EQ(s.samples, 16) << "step " << s.step;  // 2 micro-batches of 8
    EXPECT_FALSE(s.data_wait_s.has_value()) << "unmeasured, not zero";
    ASSERT_TRUE(s.forward_s && s.backward_s && s.optimizer_s) << "step " << s.step;
    EXPECT_GT(*s.forward_s, 0);
    // Two get_batch() calls of 15 ms busy each: in the rest, not the forward.
    double rest = s.step_s - *s.forward_s - *s.backward_s - *s.optimizer_s;
    EXPECT_GT(rest, 0.028) << "step " << s.step;
    forwards.push_back(*s.forward_s);
    rests.push_back(rest);
    EXPECT_GT(s.loss, 0);
  }
  // Had the forward held get_batch(), it would be the longer of the two.
  EXPECT_LT(Median(forwards), Median(rests));
  // Evaluations at iterations 0, 10 and 20: 40 model calls of >= 15 ms each.
  auto evaluations = EventsOf(run, "evaluation");
  ASSERT_EQ(evaluations.size(), 3u);
  double shortest_evaluation = 1e9;
  for (const auto& e : evaluations) {
    EXPECT_GT(e.value("duration_s", 0.0), 0.55) << e.dump();
    EXPECT_EQ(e.value("model_calls", 0), 40) << e.dump();
    shortest_evaluation = std::min(shortest_evaluation, e.value("duration_s", 0.0));
  }
  // Here the step goes on around the evaluation (its start moves by the
  // evaluation's length), so compare lengths from the same run: a step that
  // held one would be longer than it, whatever the machine's load.
  for (const StepRecord& s : run.steps)
    EXPECT_LT(s.step_s, shortest_evaluation) << "step " << s.step << " holds an evaluation";
  EXPECT_EQ(EventsOf(run, "checkpoint").size(), 3u);
  std::ifstream in(saved, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(bytes.size(), 1000u);
  EXPECT_NE(bytes.find("TinyLM"), std::string::npos);  // the pickle is stored uncompressed
  EXPECT_EQ(bytes.find("fullburn"), std::string::npos) << "a timing hook was pickled";
  auto findings = Diagnose(run);
  ASSERT_FALSE(findings.empty());
  const Finding& loop = TopBesidesIdle(findings);
  EXPECT_EQ(loop.name(), "loop_overhead") << RenderFindings(findings, 9);
  EXPECT_NE(loop.title.find("making the batches"), std::string::npos) << loop.title;
  // Its share is the steps' own: their time outside the timed phases.
  double outside = 0, total = 0;
  for (const StepRecord& s : run.steps)
    outside += s.step_s - *s.forward_s - *s.backward_s - *s.optimizer_s, total += s.step_s;
  EXPECT_NEAR(loop.share_lost, outside / total, 1e-6);
  // Called with keywords only, as model(**batch) is: the hooks see no input,
  // and the output (logits first after no tensor) gives the samples.
  o = Run({"--iters", "4", "--eval-iters", "2", "--keywords"}, {}, kGetBatchScript);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData keywords = Stored();
  ASSERT_EQ(keywords.steps.size(), 4u) << o.err;
  for (const StepRecord& s : keywords.steps) EXPECT_EQ(s.samples, 16) << "step " << s.step;
}

// nanoGPT's shape, evaluating and saving every 20 iterations: each
// evaluation (0, 20, 40, 60) is one idle part however short, counted; each
// save a checkpoint; the finding names the evaluation with the script's own
// options; the loop's overhead quotes the means it is a share of.
TEST_F(AutoStepsE2E, AnEvaluationEveryNIterationsIsNamedWithTheScriptsOwnOptions) {
  std::string saved = dir_ + "/model.pt";
  auto o = Run({"--iters", "60", "--grad-accum", "1", "--eval-interval", "20", "--eval-iters", "40",
                "--batch-ms", "4", "--save-model", saved},
               {}, kGetBatchScript);
  ASSERT_EQ(o.code, 0) << o.err;
  RunData run = Stored();
  ASSERT_EQ(run.steps.size(), 60u) << o.err;
  auto evaluations = EventsOf(run, "evaluation");
  ASSERT_EQ(evaluations.size(), 4u);
  double shortest = 1e9;
  for (const auto& e : evaluations) {
    EXPECT_EQ(e.value("model_calls", 0), 80) << e.dump();  // 40 batches of each split
    shortest = std::min(shortest, e.value("duration_s", 0.0));
  }
  for (const StepRecord& s : run.steps)
    EXPECT_LT(s.step_s, shortest) << "step " << s.step << " holds an evaluation";
  EXPECT_EQ(EventsOf(run, "checkpoint").size(), 4u);
  auto findings = Diagnose(run);
  const Finding* idle = nullptr;
  for (const Finding& f : findings)
    if (f.name() == "idle_phases") idle = &f;
  ASSERT_NE(idle, nullptr) << RenderFindings(findings, 9);
  EXPECT_NE(idle->evidence.find("evaluation x4 "), std::string::npos) << idle->evidence;
  EXPECT_NE(idle->evidence.find("(every 20 steps, 80 model calls each)"), std::string::npos)
      << idle->evidence;
  EXPECT_NE(idle->fix.find("get_batch_loop.py ... --eval-interval 100 --eval-iters 10 (the script's own "
                           "options, now --eval-interval 20, --eval-iters 40)"),
            std::string::npos)
      << idle->fix;
  for (const Finding& f : findings) {
    if (f.name() == "loop_overhead") {
      EXPECT_EQ(f.evidence.find("(medians)"), std::string::npos) << f.evidence;
    }
  }
}

// On a terminal, the live line names what limits the job now (the last
// minute's diagnosis) once 20 s of steps are in (LiveDiagnosis::kMinS), so
// the job runs about 30 s. util-linux's `script` gives fullburn run a
// terminal (bsdutils: essential on Debian).
TEST_F(AutoStepsE2E, TheLiveLineNamesWhatLimitsTheJobNow) {
  std::string command = std::string("stty rows 30 cols 250; ") + FULLBURN_BIN +
                        " run --interval 0.5 --store " + store_ + " -- " + kPython + " " + kScript +
                        " --sample-ms 3 --epochs 40";
  auto o = RunToEnd({"script", "-qec", command, "/dev/null"}, 120);
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("| now: input_"), std::string::npos) << o.out.substr(0, 4000);
  EXPECT_EQ(Stored().steps.size(), 320u);
}

}  // namespace
}  // namespace fullburn
