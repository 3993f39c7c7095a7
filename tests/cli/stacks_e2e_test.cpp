// End to end: `fullburn run` samples the Python stacks of an unchanged job
// (py-spy) and each finding names where its time went in the job's code.
// examples/scenarios/planted.py plants one slow function per run, which by
// design takes nearly all of its phase's work; the test asserts that it is
// named on top at its file:line (the line marked "# planted: NAME"),
// under a plain loop, Lightning and the HF Trainer, in-process and in
// workers started by fork and by spawn. Debian's torch 1.13 here, PyPI's
// 2.11 as StacksE2E.*.torch2. Skipped, saying why, without py-spy.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "fullburn/diagnose.h"
#include "fullburn/stacks.h"
#include "fullburn/store.h"
#include "process.h"
#include "test_python.h"

namespace fullburn {
namespace {

using testing::RunToEnd;

const char* const kPython = testing::TestPython();
const std::string kPlanted = std::string(SOURCE_DIR) + "/examples/scenarios/planted.py";

// The py-spy the tests use: $FULLBURN_PY_SPY, else the one CMake found
// (the torch 2.x venv's, tests/python/torch2-requirements.txt).
std::string PySpy() {
  if (const char* named = std::getenv("FULLBURN_PY_SPY"); named && *named) return named;
  return FULLBURN_TEST_PY_SPY;
}

// The line of planted.py that ends in "# planted: NAME".
int PlantedLine(const std::string& name) {
  std::ifstream in(kPlanted);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find("# planted: " + name) != std::string::npos) return n;
  return 0;
}

// The run's DataLoader as the hooks described it (its last `dataloader` event).
nlohmann::json LoaderEvent(const RunData& run) {
  nlohmann::json loader = nlohmann::json::object();
  for (const RunEvent& e : run.events)
    if (e.kind == "dataloader") loader = nlohmann::json::parse(e.data);
  return loader;
}

// A store of its own per test, and planted.py run under fullburn run.
class PlantedRun : public ::testing::Test {
 protected:
  bool Prepare(const std::string& name) {
    if (!testing::TestPythonHas("torch")) return false;
    dir_ = testing::FreshTestDir(name);
    store_ = dir_ + "/runs.db";
    for (const char* var : {"FULLBURN_NVML_LIBRARY", "FULLBURN_STORE", "FULLBURN_NO_STACKS",
                            "FULLBURN_LAYERS", "PYTHONPATH"})
      ::unsetenv(var);
    return true;
  }
  testing::Outcome Run(std::vector<std::string> args, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {FULLBURN_BIN, "run", "--interval", "0.25", "--store", store_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", kPython, kPlanted});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, 240);
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

#define NEED_TORCH()                                                                            \
  GTEST_SKIP() << kPython << " cannot import torch: scripts/install-deps.sh installs python3-torch"

class StacksE2E : public PlantedRun {
 protected:
  void SetUp() override {
    if (PySpy().empty() || ::access(PySpy().c_str(), X_OK) != 0)
      GTEST_SKIP() << "no py-spy (" << (PySpy().empty() ? "none found" : PySpy())
                   << "): scripts/torch2-venv.sh installs it; $FULLBURN_PY_SPY names one";
    if (!Prepare("fb_stacks")) NEED_TORCH();
    ::setenv("FULLBURN_PY_SPY", PySpy().c_str(), 1);
    ::setenv("HF_HUB_OFFLINE", "1", 1);
  }
  // The finding whose name starts with `prefix` ("input_", "loop_overhead").
  static Finding Named(const std::vector<Finding>& findings, const std::string& prefix) {
    for (const Finding& f : findings)
      if (f.name().rfind(prefix, 0) == 0) return f;
    return Finding{CauseId::kHealthy, "(none named " + prefix + ")", "", 0, 0, ""};
  }
  // Runs planted.py with `args`, and checks that the finding named `prefix`
  // says the planted `function` at its line first, with at least 60% of its
  // phase (by design nearly all: 6 ms of CPU per sample against a few
  // microseconds of the rest).
  Finding ExpectNamed(std::vector<std::string> args, const std::string& prefix,
                      const std::string& plant, const std::string& function) {
    testing::Outcome o = Run(args);
    EXPECT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(o.err.find("no Python stacks"), std::string::npos) << o.err;
    RunData run = Stored();
    std::vector<Finding> findings = Diagnose(run);
    Finding f = Named(findings, prefix);
    EXPECT_EQ(f.name().rfind(prefix, 0), 0u) << RenderFindings(findings, 9) << o.err;
    std::string expected = "planted.py:" + std::to_string(PlantedLine(plant)) + " " + function;
    EXPECT_EQ(f.where.rfind(expected, 0), 0u)
        << "expected " << expected << " on top; where: " << f.where << "\n"
        << RenderStackPhases(RunStacks(run)) << o.err;
    std::smatch m;
    std::string rest = f.where.size() > expected.size() ? f.where.substr(expected.size()) : "";
    if (std::regex_search(rest, m, std::regex(R"(^ (\d+)% of)")))
      EXPECT_GE(std::stoi(m[1]), 60) << f.where << "\n" << RenderStackPhases(RunStacks(run));
    else
      ADD_FAILURE() << "no share after the place: " << f.where;
    // The stderr's findings say it too.
    EXPECT_NE(o.err.find("where: " + expected), std::string::npos) << o.err;
    return f;
  }
};

// Its num_workers came from the script's -j/--workers: the fix names the flag.
TEST_F(StacksE2E, ASlowTransformInProcessIsNamedInTheDataWait) {
  Finding f = ExpectNamed({"--plant", "transform", "-j", "0", "--steps", "60"}, "input_", "transform",
                          "slow_augment");
  nlohmann::json loader = LoaderEvent(Stored());
  EXPECT_EQ(loader.value("workers_flag", ""), "--workers") << loader.dump();
  // Whether more workers is the fix depends on the cores the machine had
  // free (input_cpu when it had none): the flag goes with that fix.
  if (f.name() == "input_workers") {
    EXPECT_NE(f.fix.find("planted.py ... --workers "), std::string::npos) << f.fix;
  }
}

TEST_F(StacksE2E, ASlowTransformInForkedWorkersIsNamedInTheWorkers) {
  ExpectNamed({"--plant", "transform", "--workers", "2", "--start", "fork", "--steps", "100"},
              "input_", "transform", "slow_augment");
  StackSummary s = RunStacks(Stored());
  EXPECT_EQ(s.workers.size(), 2u) << RenderStackPhases(s);
}

// A spawned worker is a new interpreter that imports torch again: that goes
// to start-up, and the workers' own work is the transform.
TEST_F(StacksE2E, ASlowTransformInSpawnedWorkersIsNamedInTheWorkers) {
  ExpectNamed({"--plant", "transform", "--workers", "2", "--start", "spawn", "--steps", "100"},
              "input_", "transform", "slow_augment");
  StackSummary s = RunStacks(Stored());
  EXPECT_EQ(s.workers.size(), 2u) << RenderStackPhases(s);
  EXPECT_GT(s.of(StackPhase::kStartup).samples, 0);
}

TEST_F(StacksE2E, ASlowCollateIsNamed) {
  ExpectNamed({"--plant", "collate", "--steps", "60"}, "input_", "collate", "pad_collate");
}

TEST_F(StacksE2E, ALoggerThatSyncsAndSleepsIsTheLoopsOwnWork) {
  ExpectNamed({"--plant", "logger", "--steps", "80"}, "loop_overhead", "logger", "log_metrics");
}

TEST_F(StacksE2E, UnderLightningTheTransformInWorkersAndTheLoggerCallbackAreNamed) {
  NEED_PYTHON_MODULE("lightning");
  ExpectNamed({"--trainer", "lightning", "--plant", "transform", "--workers", "2", "--steps", "100"},
              "input_", "transform", "slow_augment");
  ExpectNamed({"--trainer", "lightning", "--plant", "logger", "--steps", "80"}, "loop_overhead",
              "logger", "log_metrics");
}

TEST_F(StacksE2E, UnderTheHfTrainerTheCollateAndTheLoggerCallbackAreNamed) {
  NEED_PYTHON_MODULE("transformers");
  // TrainingArguments from the command line, as HF's example scripts take
  // them: the fix names --dataloader_num_workers.
  Finding f = ExpectNamed({"--trainer", "hf", "--plant", "collate", "--steps", "60",
                           "--dataloader_num_workers", "0"},
                          "input_", "collate", "pad_collate");
  nlohmann::json loader = LoaderEvent(Stored());
  EXPECT_EQ(loader.value("workers_flag", ""), "--dataloader_num_workers") << loader.dump();
  if (f.name() == "input_workers") {
    EXPECT_NE(f.fix.find("planted.py ... --dataloader_num_workers "), std::string::npos) << f.fix;
  }
  ExpectNamed({"--trainer", "hf", "--plant", "logger", "--steps", "80"}, "loop_overhead", "logger",
              "log_metrics");
}

// The exports: folded stacks (flamegraph.pl's "frame;frame COUNT", each
// led by its phase) and speedscope's JSON, per phase.
TEST_F(StacksE2E, TheStacksAreExportedFoldedAndAsSpeedscope) {
  ASSERT_EQ(Run({"--plant", "transform", "--steps", "40"}).code, 0);
  auto folded = RunToEnd({FULLBURN_BIN, "runs", "stacks", "last", "--store", store_});
  ASSERT_EQ(folded.code, 0) << folded.err;
  std::istringstream lines(folded.out);
  std::string line;
  int64_t total = 0, planted = 0;
  while (std::getline(lines, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, std::regex(R"(([a-z_]+);(.*) (\d+))"))) << line;
    StackPhase p;
    EXPECT_TRUE(ParseStackPhase(m[1], &p)) << line;
    total += std::stoll(m[3]);
    if (m[1] == "data_wait" && line.find("slow_augment") != std::string::npos) planted += std::stoll(m[3]);
  }
  EXPECT_GT(planted, 10) << folded.out.substr(0, 3000);
  auto one = RunToEnd({FULLBURN_BIN, "runs", "stacks", "last", "--store", store_, "--phase", "data_wait"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(one.out.find("\nstartup;"), std::string::npos);
  EXPECT_NE(one.out.find("slow_augment"), std::string::npos);
  auto speedscope =
      RunToEnd({FULLBURN_BIN, "runs", "stacks", "last", "--store", store_, "--format", "speedscope"});
  ASSERT_EQ(speedscope.code, 0) << speedscope.err;
  auto j = nlohmann::json::parse(speedscope.out);
  EXPECT_EQ(j.value("$schema", ""), "https://www.speedscope.app/file-format-schema.json");
  ASSERT_TRUE(j["profiles"].is_array() && !j["profiles"].empty());
  double seconds = 0;  // each sample weighs 1/rate s (the default 50 per second)
  for (const auto& p : j["profiles"]) {
    EXPECT_EQ(p["type"], "sampled");
    EXPECT_EQ(p["unit"], "seconds");
    EXPECT_EQ(p["samples"].size(), p["weights"].size());
    for (const auto& w : p["weights"]) seconds += w.get<double>();
  }
  EXPECT_NEAR(seconds * 50, static_cast<double>(total), 1e-6 * total);
  auto bad = RunToEnd({FULLBURN_BIN, "runs", "stacks", "last", "--store", store_, "--phase", "lunch"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("lunch"), std::string::npos) << bad.err;
}

// The report shows each finding's where, every phase's top frames and the
// layers' table, as Chromium renders it (its DOM after the scripts ran).
TEST_F(StacksE2E, TheReportShowsWhereTheTimeWentInChromium) {
  ASSERT_EQ(Run({"--plant", "transform", "--steps", "40"}, {"--layers"}).code, 0);
  std::string html = dir_ + "/report.html";
  auto report = RunToEnd({FULLBURN_BIN, "report", "last", "--store", store_, "-o", html});
  ASSERT_EQ(report.code, 0) << report.err;
  auto dom = RunToEnd({"chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                       "--user-data-dir=" + dir_ + "/chromium-profile", "--dump-dom", "file://" + html},
                      90);
  ASSERT_EQ(dom.code, 0) << dom.err;
  std::string where = "planted.py:" + std::to_string(PlantedLine("transform")) + " slow_augment";
  EXPECT_TRUE(std::regex_search(dom.out, std::regex("class=\"where\"><b>where</b> <code>" + where)))
      << dom.out.substr(0, 3000);
  EXPECT_NE(dom.out.find("Where the time went in the code (Python stacks)"), std::string::npos);
  EXPECT_NE(dom.out.find("<td>data_wait</td>"), std::string::npos);
  EXPECT_NE(dom.out.find("<h3>Layers</h3>"), std::string::npos);
  EXPECT_NE(dom.out.find("<td>Linear</td>"), std::string::npos);
}

// Without py-spy, too old a one, or with --no-stacks: one line (none for
// --no-stacks), and the job runs and ends as it would.
TEST_F(StacksE2E, WithoutAUsablePySpyTheRunGoesOnWithoutStacks) {
  ::setenv("FULLBURN_PY_SPY", (dir_ + "/no-such-py-spy").c_str(), 1);
  auto o = Run({"--plant", "logger", "--steps", "5"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("fullburn: no Python stacks: "), std::string::npos) << o.err;
  EXPECT_TRUE(RunStacks(Stored()).empty());
  EXPECT_EQ(Stored().steps.size(), 5u);

  std::string old = dir_ + "/py-spy";
  std::ofstream(old) << "#!/bin/sh\necho 'py-spy 0.3.1'\n";
  std::filesystem::permissions(old, std::filesystem::perms::owner_all);
  ::setenv("FULLBURN_PY_SPY", old.c_str(), 1);
  o = Run({"--plant", "logger", "--steps", "5"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("0.3.1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("is older than 0.3.14"), std::string::npos) << o.err;

  ::setenv("FULLBURN_PY_SPY", PySpy().c_str(), 1);
  o = Run({"--plant", "logger", "--steps", "5"}, {"--no-stacks"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err.find("Python stacks"), std::string::npos) << o.err;
  EXPECT_TRUE(RunStacks(Stored()).empty());
}

// A job that ends at once, and one that fails: its exit code is fullburn's,
// whatever the sampler was doing.
TEST_F(StacksE2E, AJobThatExitsWhileSampledKeepsItsExitCode) {
  auto quick = RunToEnd({FULLBURN_BIN, "run", "--store", store_, "--", kPython, "-c", "pass"});
  EXPECT_EQ(quick.code, 0) << quick.err;
  auto failing = RunToEnd({FULLBURN_BIN, "run", "--store", store_, "--", kPython, "-c",
                           "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\nraise SystemExit(3)"});
  EXPECT_EQ(failing.code, 3) << failing.err;
  StackSummary s = RunStacks(Stored());
  EXPECT_GT(s.samples, 10) << failing.err;
}

// py-spy reads 4,096 frames: a deeper stack is a sample it counts as an
// error, said in `runs show`, and the run is stored as it would be.
TEST_F(StacksE2E, AStackDeeperThanPySpyReadsIsCountedAndSaid) {
  auto o = RunToEnd({FULLBURN_BIN, "run", "--store", store_, "--", kPython, "-c",
                     "import sys, time\nsys.setrecursionlimit(20000)\n"
                     "def down(n):\n    if n == 0:\n        end = time.time() + 12\n"
                     "        while time.time() < end: pass\n        return 0\n"
                     "    return down(n - 1) + 1\ndown(6000)\n"});
  ASSERT_EQ(o.code, 0) << o.err;
  StackSummary s = RunStacks(Stored());
  // How many py-spy tries in those 12 s depends on the CPU it gets (it is
  // held to its budget, and each try walks 6,000 frames): at least one. 3 s
  // gave it none once beside a compile on both cores (ctest -j2 runs this
  // beside the pip test's build).
  EXPECT_GT(s.errors, 0) << o.err;
  auto show = RunToEnd({FULLBURN_BIN, "runs", "show", "last", "--store", store_});
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_NE(show.out.find(std::to_string(s.errors) + " samples py-spy could not read"), std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("a stack deeper than the 4,096 frames it reads"), std::string::npos) << show.out;
}

// ptrace as a user with no privilege (as the pip test runs): fullburn's
// child may be read by its sampler (PR_SET_PTRACER under Yama's scope 1;
// these machines have no Yama, so this checks the plain uid rule).
TEST_F(StacksE2E, AnUnprivilegedUserGetsTheStacksOfItsJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "runs as root, to become nobody";
  if (std::string(kPython).rfind("/usr/bin/", 0) != 0)
    GTEST_SKIP() << kPython << " is not readable by nobody; Debian's python3 checks this";
  std::string spy = dir_ + "/bin/py-spy";
  std::filesystem::create_directories(dir_ + "/bin");
  std::filesystem::copy_file(PySpy(), spy);
  ASSERT_EQ(RunToEnd({"chown", "-R", "nobody:nogroup", dir_}).code, 0);
  auto o = RunToEnd({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
                     "env", "HOME=" + dir_, "FULLBURN_PY_SPY=" + spy, FULLBURN_BIN, "run",
                     "--interval", "0.25", "--store", store_, "--", kPython, kPlanted, "--plant",
                     "logger", "--steps", "60"},
                    240);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err.find("no Python stacks"), std::string::npos) << o.err;
  Finding f = Named(Diagnose(Stored()), "loop_overhead");
  EXPECT_EQ(f.where.rfind("planted.py:" + std::to_string(PlantedLine("logger")) + " log_metrics", 0), 0u)
      << f.where << o.err;
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

// fullburn run --layers (python/fullburn_layers.py): the model's top-level
// layers timed and their activations counted by module hooks; here on the
// CPU, where planted.py's "heavy" layer burns 8 ms of its forward by design.
class LayersE2E : public PlantedRun {
 protected:
  void SetUp() override {
    if (!Prepare("fb_layers")) NEED_TORCH();
  }
  // Stacks off: only the layer hooks are under test.
  testing::Outcome Run(std::vector<std::string> args, std::vector<std::string> flags) {
    flags.insert(flags.begin(), "--no-stacks");
    return PlantedRun::Run(std::move(args), std::move(flags));
  }
};

TEST_F(LayersE2E, EachTopLevelLayerGetsItsTimesAndActivations) {
  auto o = Run({"--plant", "layer", "--steps", "40"}, {"--layers"});
  ASSERT_EQ(o.code, 0) << o.err;
  RunLayerTimes layers = RunLayers(Stored());
  ASSERT_EQ(layers.layers.size(), 4u) << o.err;
  EXPECT_EQ(layers.model, "Layered");
  EXPECT_EQ(layers.device, "cpu");
  EXPECT_GE(layers.steps, 30);
  std::vector<std::string> names;
  for (const LayerTime& l : layers.layers) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "squeeze", "heavy", "head"}));
  const LayerTime& heavy = layers.layers[2];
  EXPECT_EQ(heavy.type, "Heavy");
  EXPECT_GE(heavy.forward_s, 0.008 * 0.95);  // its burn's wall time, whatever the load
  for (const LayerTime& l : layers.layers) {
    EXPECT_GT(l.backward_s, 0) << l.name;  // each has weights to take gradients for
    if (l.name != "heavy") {
      EXPECT_LT(l.forward_s + l.backward_s, heavy.forward_s) << l.name;
    }
  }
  // What autograd saves for backward, weights left out: each Linear's input
  // (batch 8, float32); the heavy layer's projection input and its ReLU's output.
  EXPECT_EQ(layers.layers[0].activation_bytes, 8 * 64 * 4);
  EXPECT_EQ(layers.layers[1].activation_bytes, 8 * 256 * 4);
  EXPECT_EQ(layers.layers[2].activation_bytes, 2 * 8 * 64 * 4);
  EXPECT_EQ(layers.layers[3].activation_bytes, 8 * 64 * 4);
  EXPECT_EQ(TopLayers(layers, 1).rfind("heavy (Heavy) ", 0), 0u) << TopLayers(layers, 1);
  auto show = RunToEnd({FULLBURN_BIN, "runs", "show", "last", "--store", store_});
  EXPECT_NE(show.out.find("layers of Layered (cpu, medians per step"), std::string::npos) << show.out;
  // Without --layers, none.
  ASSERT_EQ(Run({"--plant", "layer", "--steps", "5"}, {}).code, 0);
  EXPECT_TRUE(RunLayers(Stored()).empty());
}

// An out-of-memory (planted.py raises torch.cuda.OutOfMemoryError in its
// heavy layer's 5th call, as the allocator would): the record names the layer
// and the pass with --layers, the module's type from the traceback without.
TEST_F(LayersE2E, AnOutOfMemoryRecordsTheLayerThatRan) {
  auto o = Run({"--plant", "oom", "--steps", "20"}, {"--layers"});
  EXPECT_EQ(o.code, 1) << o.err;
  std::vector<Finding> findings = Diagnose(Stored());
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].name(), "job_failed");
  EXPECT_NE(findings[0].evidence.find("it ran out in layer heavy (forward)"), std::string::npos)
      << findings[0].evidence;
  EXPECT_NE(findings[0].evidence.find("the CUDA allocator's numbers were not read"), std::string::npos)
      << findings[0].evidence;
  EXPECT_NE(findings[0].fix.find("torch.utils.checkpoint.checkpoint around layer heavy"), std::string::npos)
      << findings[0].fix;
  EXPECT_NE(findings[0].fix.find("(8 -> 4)"), std::string::npos) << findings[0].fix;
  o = Run({"--plant", "oom", "--steps", "20"}, {});
  EXPECT_EQ(o.code, 1) << o.err;
  findings = Diagnose(Stored());
  ASSERT_FALSE(findings.empty());
  EXPECT_NE(findings[0].evidence.find("it ran out in a Heavy (forward; fullburn run --layers names the layer)"),
            std::string::npos)
      << findings[0].evidence;
}

}  // namespace
}  // namespace fullburn
