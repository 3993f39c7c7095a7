// End to end: the trainers people run (Lightning's Trainer.fit, Hugging
// Face's Trainer, an accelerate loop, timm), unchanged
// (examples/frameworks/), under `fullburn run`.
// They need PyPI's PyTorch 2.x with the frameworks (scripts/torch2-venv.sh):
// CTest runs them as FrameworksE2E.*.torch2 with FULLBURN_TEST_PYTHON set;
// under an interpreter without them they are skipped, saying so.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/store.h"
#include "process.h"
#include "test_python.h"

namespace fullburn {
namespace {

using testing::RunToEnd;

const char* const kPython = testing::TestPython();
const std::string kExamples = std::string(SOURCE_DIR) + "/examples/frameworks/";

// Not idle_phases: that one holds the interpreter's start-up and the
// framework's import, whose length is the machine's load, not the job's.
const Finding& TopBesidesIdle(const std::vector<Finding>& findings) {
  for (const Finding& f : findings)
    if (f.name() != "idle_phases") return f;
  static const Finding kNone{CauseId::kHealthy, "(no finding besides idle_phases)", "", 0, 0, ""};
  return kNone;
}

bool HasInputFinding(const std::vector<Finding>& findings) {
  for (const Finding& f : findings)
    if (f.name().rfind("input_", 0) == 0) return true;
  return false;
}

#define NEED(module) NEED_PYTHON_MODULE(module)

class FrameworksE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_frameworks");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
    ::unsetenv("PYTHONPATH");
    ::setenv("HF_HUB_OFFLINE", "1", 1);
  }
  RunData Record(const std::string& script, std::vector<std::string> args) {
    std::vector<std::string> argv = {FULLBURN_BIN, "run",   "--interval", "0.25",
                                     "--store",    store_, "--",         kPython,
                                     kExamples + script};
    argv.insert(argv.end(), args.begin(), args.end());
    testing::Outcome o = RunToEnd(argv);
    EXPECT_EQ(o.code, 0) << o.err;
    auto store = RunStore::Open(store_);
    EXPECT_TRUE(store.ok());
    auto run = (*store)->LoadRun("last");
    EXPECT_TRUE(run.ok());
    return run.ok() ? *run : RunData{};
  }
  // The run's checkpoint writes: the step each came after and its file's
  // name, each with a size.
  static std::vector<std::pair<int64_t, std::string>> Saves(const RunData& run) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const RunEvent& e : run.events) {
      if (e.kind != "checkpoint") continue;
      auto data = nlohmann::json::parse(e.data);
      EXPECT_GT(data.value("bytes", int64_t{0}), 0) << e.data;
      std::string path = data.value("path", "");
      out.push_back({data.value("after_step", int64_t{0}), path.substr(path.rfind('/') + 1)});
    }
    return out;
  }
  static int Evaluations(const RunData& run) {
    int n = 0;
    for (const RunEvent& e : run.events) n += e.kind == "evaluation";
    return n;
  }
  static nlohmann::json Loader(const RunData& run) {
    for (const RunEvent& e : run.events)
      if (e.kind == "dataloader") return nlohmann::json::parse(e.data);
    return nullptr;
  }
  std::string dir_, store_;
};

// Lightning calls training_step and backward inside optimizer.step(closure):
// one step per optimizer update, its time forward and backward, not the
// optimizer's. The DataModule's loader has no workers and a slow transform:
// input-bound, and the fix names the DataModule's train_dataloader().
TEST_F(FrameworksE2E, LightningsStarvedLoaderIsFixedInItsDataModule) {
  NEED("lightning");
  RunData run = Record("lightning_fit.py", {"--starved", "--steps", "24"});
  ASSERT_EQ(run.steps.size(), 24u);
  for (const StepRecord& s : run.steps) {
    EXPECT_EQ(s.samples, 32);
    ASSERT_TRUE(s.data_wait_s.has_value());
    EXPECT_GT(*s.data_wait_s, 32 * 0.008 * 0.9);  // the transform's wall time, whatever the load
    EXPECT_GT(s.loss, 0);
  }
  nlohmann::json loader = Loader(run);
  ASSERT_TRUE(loader.is_object());
  EXPECT_EQ(loader.value("framework", ""), "lightning");
  EXPECT_EQ(loader.value("created_in", ""), "ShapesData.train_dataloader");
  EXPECT_NE(loader.value("created_at", "").find("lightning_fit.py:"), std::string::npos);
  auto findings = Diagnose(run);
  const Finding& top = TopBesidesIdle(findings);
  EXPECT_EQ(top.name().rfind("input_", 0), 0u) << RenderFindings(findings);
  EXPECT_NE(top.fix.find("in Lightning: give the DataLoader that your LightningDataModule's"),
            std::string::npos)
      << top.fix;
  EXPECT_NE(top.fix.find("made in ShapesData.train_dataloader at"), std::string::npos) << top.fix;
}

// A validation every 5 steps (val_check_interval=5, 24 batches each): each
// one an evaluation event outside the steps (and the sanity check Lightning
// runs before training), and the time outside steps fixed in Lightning's
// own settings. A ModelCheckpoint every 10 steps: one checkpoint event each,
// the file's path and size (Lightning serializes into memory, then writes
// the file: the whole save is one write).
TEST_F(FrameworksE2E, LightningsFrequentValidationIsFixedInTheTrainersSettings) {
  NEED("lightning");
  RunData run = Record("lightning_fit.py", {"--steps", "20", "--val-every", "5", "--val-batches",
                                            "24", "--checkpoint-every", "10"});
  ASSERT_EQ(run.steps.size(), 20u);
  EXPECT_EQ(Evaluations(run), 5) << "4 validations and the sanity check";
  using Save = std::pair<int64_t, std::string>;
  EXPECT_EQ(Saves(run), (std::vector<Save>{{10, "epoch=0-step=10.ckpt"}, {20, "epoch=0-step=20.ckpt"}}));
  auto findings = Diagnose(run);
  const Finding* idle = nullptr;
  for (const Finding& f : findings)
    if (f.name() == "idle_phases") idle = &f;
  ASSERT_NE(idle, nullptr) << RenderFindings(findings);
  EXPECT_NE(idle->evidence.find("evaluation"), std::string::npos) << idle->evidence;
  EXPECT_NE(idle->fix.find("in Lightning: Trainer(val_check_interval=..."), std::string::npos)
      << idle->fix;
}

// accumulate_grad_batches=4: Lightning's max_steps counts optimizer updates,
// and so does fullburn: 8 steps of 4 micro-batches of 32 samples.
TEST_F(FrameworksE2E, LightningsAccumulatedStepIsOneStepOfAllItsSamples) {
  NEED("lightning");
  RunData run = Record("lightning_fit.py", {"--steps", "8", "--accumulate", "4"});
  ASSERT_EQ(run.steps.size(), 8u);
  for (const StepRecord& s : run.steps) EXPECT_EQ(s.samples, 4 * 32);
  EXPECT_FALSE(HasInputFinding(Diagnose(run))) << RenderFindings(Diagnose(run));
}

// bf16 autocast on the CPU (precision="bf16-mixed"): the same steps, the
// loss still read.
TEST_F(FrameworksE2E, LightningInBf16MixedPrecisionRecordsItsStepsAndLoss) {
  NEED("lightning");
  RunData run = Record("lightning_fit.py", {"--steps", "8", "--precision", "bf16-mixed"});
  ASSERT_EQ(run.steps.size(), 8u);
  for (const StepRecord& s : run.steps) EXPECT_GT(s.loss, 0);
}

// The Trainer builds its DataLoader from TrainingArguments (through
// accelerate): its user never wrote one, so the fix is in TrainingArguments.
TEST_F(FrameworksE2E, HuggingFaceTrainersStarvedLoaderIsFixedInTrainingArguments) {
  NEED("transformers");
  RunData run = Record("hf_trainer.py", {"--starved", "--steps", "16"});
  ASSERT_EQ(run.steps.size(), 16u);
  // accelerate's DataLoaderShard reads one batch ahead: the first step's
  // window fetches two batches, every later one one (docs/frameworks.md).
  EXPECT_EQ(run.steps[0].samples, 32);
  for (const StepRecord& s : run.steps) {
    if (s.step > 1) {
      EXPECT_EQ(s.samples, 16);
    }
    ASSERT_TRUE(s.data_wait_s.has_value());
    EXPECT_GT(*s.data_wait_s, 16 * 0.03 * 0.9);
    EXPECT_GT(s.loss, 0);
  }
  nlohmann::json loader = Loader(run);
  ASSERT_TRUE(loader.is_object());
  EXPECT_EQ(loader.value("framework", ""), "transformers");
  auto findings = Diagnose(run);
  const Finding& top = TopBesidesIdle(findings);
  EXPECT_EQ(top.name().rfind("input_", 0), 0u) << RenderFindings(findings);
  EXPECT_NE(top.fix.find("TrainingArguments(dataloader_num_workers="), std::string::npos) << top.fix;
  EXPECT_EQ(top.fix.find("fullburn.ImageLoader"), std::string::npos) << top.fix;
}

// The healthy variant: the same Trainer without the slow transform: no
// input finding.
TEST_F(FrameworksE2E, HuggingFaceTrainersHealthyRunHasNoInputFinding) {
  NEED("transformers");
  RunData run = Record("hf_trainer.py", {"--steps", "16"});
  ASSERT_EQ(run.steps.size(), 16u);
  EXPECT_FALSE(HasInputFinding(Diagnose(run))) << RenderFindings(Diagnose(run));
}

// An evaluation every 10 steps on a large eval set, and a checkpoint every 10
// (TrainingArguments(eval_steps=10, save_steps=10)): each evaluation an event
// outside the steps, each checkpoint's files (the weights through
// safetensors, the optimizer's, scheduler's and RNG's state through
// torch.save) checkpoint events after its step, and the time outside steps
// fixed in TrainingArguments.
TEST_F(FrameworksE2E, HuggingFaceTrainersEvaluationsAndCheckpointsAreTheirOwnPhases) {
  NEED("transformers");
  RunData run = Record("hf_trainer.py", {"--steps", "30", "--eval-every", "10", "--val-samples",
                                         "4096", "--save-every", "10"});
  ASSERT_EQ(run.steps.size(), 30u);
  EXPECT_EQ(Evaluations(run), 3);
  std::map<int64_t, std::vector<std::string>> saved;  // after step -> files
  for (const auto& [step, file] : Saves(run)) saved[step].push_back(file);
  ASSERT_EQ(saved.size(), 3u);
  for (int64_t step : {10, 20, 30}) {
    const std::vector<std::string>& files = saved[step];
    EXPECT_NE(std::find(files.begin(), files.end(), "model.safetensors"), files.end()) << step;
    EXPECT_NE(std::find(files.begin(), files.end(), "optimizer.pt"), files.end()) << step;
  }
  auto findings = Diagnose(run);
  const Finding* idle = nullptr;
  for (const Finding& f : findings) {
    if (f.name() == "idle_phases") idle = &f;
    EXPECT_NE(f.name(), "checkpoint_stall") << RenderFindings(findings);  // a few ms each
  }
  ASSERT_NE(idle, nullptr) << RenderFindings(findings);
  EXPECT_NE(idle->evidence.find("evaluation"), std::string::npos) << idle->evidence;
  EXPECT_NE(idle->fix.find("TrainingArguments(eval_steps=..., per_device_eval_batch_size=...)"),
            std::string::npos)
      << idle->fix;
}

// accelerate's loop with gradient_accumulation_steps=4: optimizer.step() is
// called on every micro-batch, but AcceleratedOptimizer steps torch's only
// on the fourth: one step per update of 4 x 16 samples (the first step's
// window also holds DataLoaderShard's batch read ahead). Starved, the fix
// is on the DataLoader given to accelerator.prepare().
TEST_F(FrameworksE2E, AnAccelerateLoopCountsUpdatesAndItsLoaderIsFixedBeforePrepare) {
  NEED("accelerate");
  RunData run = Record("accelerate_loop.py", {"--starved", "--steps", "8"});
  ASSERT_EQ(run.steps.size(), 8u);
  EXPECT_EQ(run.steps[0].samples, 5 * 16);
  for (const StepRecord& s : run.steps) {
    if (s.step > 1) {
      EXPECT_EQ(s.samples, 4 * 16);
    }
    ASSERT_TRUE(s.data_wait_s.has_value());
    EXPECT_GT(*s.data_wait_s, 4 * 16 * 0.01 * 0.9);
    EXPECT_GT(s.loss, 0);
  }
  nlohmann::json loader = Loader(run);
  ASSERT_TRUE(loader.is_object());
  EXPECT_EQ(loader.value("framework", ""), "accelerate");
  auto findings = Diagnose(run);
  const Finding& top = TopBesidesIdle(findings);
  EXPECT_EQ(top.name().rfind("input_", 0), 0u) << RenderFindings(findings);
  EXPECT_NE(top.fix.find("with accelerate: give the DataLoader you pass to accelerator.prepare()"),
            std::string::npos)
      << top.fix;
  // The healthy variant, without the slow transform: no input finding.
  RunData healthy = Record("accelerate_loop.py", {"--steps", "8"});
  ASSERT_EQ(healthy.steps.size(), 8u);
  EXPECT_FALSE(HasInputFinding(Diagnose(healthy))) << RenderFindings(Diagnose(healthy));
}

// timm's model, optimizer factory (its AdamW, a torch.optim.Optimizer) and
// scheduler in a plain loop: a step per update with its samples, loss and
// learning rate, and no input finding.
TEST_F(FrameworksE2E, ATimmLoopGetsItsStepsLossAndLearningRate) {
  NEED("timm");
  RunData run = Record("timm_loop.py", {"--steps", "6"});
  ASSERT_EQ(run.steps.size(), 6u);
  for (const StepRecord& s : run.steps) {
    EXPECT_EQ(s.samples, 16);
    EXPECT_GT(s.loss, 0);
    EXPECT_GT(s.lr, 0);
  }
  // In-memory tensors, a model that computes: the healthy variant.
  EXPECT_FALSE(HasInputFinding(Diagnose(run))) << RenderFindings(Diagnose(run));
}

// Used well, not just busy: each trainer, unchanged, on a scripted "H100"
// (the fake NVML: busy 97%, SM activity 95%, tensor activity 2%). The step
// hooks count step 3's FLOPs under every framework (its counting budget
// lifted: what the test checks is the count, not the machine's speed), and
// the precision finding's fix is in the framework's words.
class UsedWellE2E : public FrameworksE2E {
 protected:
  void SetUp() override {
    FrameworksE2E::SetUp();
    ScriptH100(2);
    ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
    ::setenv("FULLBURN_FLOPS_BUDGET", "0", 1);
  }
  void ScriptH100(int tensor_active) {
    std::string script = dir_ + "/h100.json";
    std::ofstream(script) << R"({"gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-h100",
      "gpm": true, "util": 97, "mem_util": 40, "mem_used": 20000000000, "mem_total": 85000000000,
      "sm_active": 95, "fp32_active": 80, "sm_occupancy": 45, "tensor_active": )"
                          << tensor_active << "}]}";
    ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FAKE_NVML_SCRIPT");
    ::unsetenv("FULLBURN_FLOPS_BUDGET");
  }
  static nlohmann::json Flops(const RunData& run) {
    for (const RunEvent& e : run.events)
      if (e.kind == "flops") return nlohmann::json::parse(e.data);
    return nullptr;
  }
  void ExpectCountedAndFixedIn(const RunData& run, const std::string& words) {
    nlohmann::json flops = Flops(run);
    ASSERT_TRUE(flops.is_object()) << "no flops event";
    ASSERT_TRUE(flops.contains("flops")) << flops.dump();
    EXPECT_GT(flops["flops"].get<double>(), 0) << flops.dump();
    EXPECT_EQ(flops.value("step", 0), 3) << flops.dump();
    EXPECT_EQ(flops.value("device", ""), "cpu");  // the job ran on this CPU; the GPU is scripted
    Mfu mfu = ComputeMfu(run);
    EXPECT_TRUE(mfu.counted);
    EXPECT_NE(mfu.why.find("on the cpu"), std::string::npos) << mfu.why;
    std::vector<Finding> findings = Diagnose(run);
    const Finding* precision = nullptr;
    for (const Finding& f : findings)
      if (f.cause == CauseId::kPrecision) precision = &f;
    ASSERT_NE(precision, nullptr) << RenderFindings(findings, 9);
    EXPECT_NE(precision->evidence.find("tensor activity 2%"), std::string::npos)
        << precision->evidence;
    EXPECT_NE(precision->fix.find(words), std::string::npos) << precision->fix;
  }
};

// A plain loop under either PyTorch (1.13 counts no FLOPs: GPM alone tells),
// on an H100 whose tensor cores idle (2%), then one where they work (60%).
TEST_F(UsedWellE2E, ThePrecisionFindingFollowsTheTensorCoresActivity) {
  const std::string loop = std::string(SOURCE_DIR) + "/examples/scenarios/plain_torch.py";
  auto record = [&] {
    testing::Outcome o = RunToEnd({FULLBURN_BIN, "run", "--interval", "0.25", "--store", store_,
                                   "--", kPython, loop, "--epochs", "3", "--sample-ms", "1"});
    EXPECT_EQ(o.code, 0) << o.err;
    auto store = RunStore::Open(store_);
    EXPECT_TRUE(store.ok());
    return Diagnose(*(*store)->LoadRun("last"));
  };
  auto named = [](const std::vector<Finding>& findings) {
    for (const Finding& f : findings)
      if (f.cause == CauseId::kPrecision) return true;
    return false;
  };
  std::vector<Finding> idle = record();
  EXPECT_TRUE(named(idle)) << RenderFindings(idle, 9);
  ScriptH100(60);
  std::vector<Finding> working = record();
  EXPECT_FALSE(named(working)) << RenderFindings(working, 9);
}

TEST_F(UsedWellE2E, LightningsFp32FitGetsBf16MixedPrecision) {
  NEED("lightning");
  RunData run = Record("lightning_fit.py", {"--steps", "8"});
  ExpectCountedAndFixedIn(run, "Trainer(precision=\"bf16-mixed\")");
}

TEST_F(UsedWellE2E, TheHuggingFaceTrainerGetsBf16InItsArguments) {
  NEED("transformers");
  RunData run = Record("hf_trainer.py", {"--steps", "8"});
  ExpectCountedAndFixedIn(run, "TrainingArguments(bf16=True)");
}

TEST_F(UsedWellE2E, AnAccelerateLoopGetsItsMixedPrecisionSwitch) {
  NEED("accelerate");
  RunData run = Record("accelerate_loop.py", {"--steps", "6", "--accumulate", "2"});
  ExpectCountedAndFixedIn(run, "Accelerator(mixed_precision=\"bf16\")");
}

TEST_F(UsedWellE2E, APlainLoopGetsAutocast) {
  NEED("timm");
  RunData run = Record("timm_loop.py", {"--steps", "8"});
  ExpectCountedAndFixedIn(run, "torch.autocast(\"cuda\", dtype=torch.bfloat16)");
}

}  // namespace
}  // namespace fullburn
