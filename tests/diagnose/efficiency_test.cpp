// Used well, not just busy: the cause catalog, the GPU peak table, MFU from
// the step hooks' FLOP count, and the precision and low_mfu rules, each on
// runs built here (a case that fires and a near miss that must not).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fullburn/causes.h"
#include "fullburn/diagnose.h"
#include "fullburn/gpu_peaks.h"

namespace fullburn {
namespace {

// ---- The catalog ------------------------------------------------------------

TEST(CauseCatalog, EveryCauseHasOneEntryInIdOrder) {
  std::set<std::string> names;
  for (size_t i = 0; i < Causes().size(); ++i) {
    const Cause& c = Causes()[i];
    EXPECT_EQ(static_cast<size_t>(c.id), i);
    EXPECT_TRUE(names.insert(c.name).second) << c.name << " twice";
    EXPECT_NE(std::string(c.title), "") << c.name;
    EXPECT_NE(std::string(c.evidence), "") << c.name;
    ASSERT_NE(c.fix[0], nullptr) << c.name << ": plain PyTorch's fix is the fallback";
    EXPECT_EQ(FindCause(c.name), &c);
    EXPECT_EQ(std::string(CauseName(c.id)), c.name);
  }
  EXPECT_EQ(FindCause("no_such_cause"), nullptr);
  EXPECT_EQ(std::string(CauseName(CauseId::kInputWorkers)), "input_workers");
}

TEST(CauseCatalog, AFrameworkWithoutWordsOfItsOwnGetsPlainPyTorchs) {
  EXPECT_STREQ(FixFor(CauseId::kThrottlePower, Framework::kLightning),
               FixFor(CauseId::kThrottlePower, Framework::kPytorch));
  EXPECT_STRNE(FixFor(CauseId::kPrecision, Framework::kLightning),
               FixFor(CauseId::kPrecision, Framework::kPytorch));
  EXPECT_EQ(FrameworkFrom("lightning", false), Framework::kLightning);
  EXPECT_EQ(FrameworkFrom("transformers", false), Framework::kTransformers);
  EXPECT_EQ(FrameworkFrom("timm", false), Framework::kPytorch);
  EXPECT_EQ(FrameworkFrom("lightning", true), Framework::kFullburnTrain);
  EXPECT_STREQ(SettingIn(FrameworkSetting::kEvaluationSchedule, Framework::kPytorch), "");
}

TEST(CauseCatalog, TheDocsTableIsTheCatalogs) {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/diagnosis.md");
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  EXPECT_NE(doc.find(RenderCauses(true)), std::string::npos)
      << "docs/diagnosis.md's catalog table differs from `fullburn causes --markdown`";
}

TEST(CauseCatalog, TheInputCausesKnobsComeFirstInTheTunersOrder) {
  std::vector<std::string> knobs;
  for (const Cause& c : Causes())
    if (c.input_bound) knobs.push_back(c.tune_knob);
  EXPECT_EQ(knobs, (std::vector<std::string>{"pack", "cache", "loader_threads", "prefetch"}));
}

// ---- The peak table -----------------------------------------------------------

std::string Model(const char* nvml_name) {
  const GpuPeak* p = FindGpuPeak(nvml_name);
  return p ? p->model : "none";
}

TEST(GpuPeaks, NamesMatchByWholeTokensTheSpecificFirst) {
  EXPECT_EQ(Model("NVIDIA H100 80GB HBM3"), "H100 SXM");
  EXPECT_EQ(Model("NVIDIA H100 PCIe"), "H100 PCIe");
  EXPECT_EQ(Model("NVIDIA H100 NVL"), "H100 NVL");
  EXPECT_EQ(Model("NVIDIA H200"), "H200 SXM");
  EXPECT_EQ(Model("NVIDIA H200 NVL"), "H200 NVL");
  EXPECT_EQ(Model("NVIDIA GH200 480GB"), "GH200");  // not an H200
  EXPECT_EQ(Model("NVIDIA A100-SXM4-80GB"), "A100");
  EXPECT_EQ(Model("NVIDIA A100 80GB PCIe"), "A100");
  EXPECT_EQ(Model("NVIDIA A10G"), "A10G");
  EXPECT_EQ(Model("NVIDIA A10"), "A10");
  EXPECT_EQ(Model("NVIDIA L40S"), "L40S");
  EXPECT_EQ(Model("NVIDIA L4"), "L4");
  EXPECT_EQ(Model("Tesla V100-SXM2-16GB"), "V100 SXM2");
  EXPECT_EQ(Model("Tesla V100-PCIE-32GB"), "V100 PCIe");
  EXPECT_EQ(Model("Tesla V100-DGXS-32GB"), "V100 DGXS");  // the committed traces' GPUs
  EXPECT_EQ(Model("Tesla T4"), "T4");
  EXPECT_EQ(Model("NVIDIA GeForce RTX 4090"), "GeForce RTX 4090");
  EXPECT_EQ(Model("NVIDIA GeForce RTX 3090"), "GeForce RTX 3090");
  // Near misses: substrings of a row's name, and other cards.
  EXPECT_EQ(Model("NVIDIA GeForce RTX 4090 D"), "none");
  EXPECT_EQ(Model("NVIDIA RTX A1000"), "none");
  EXPECT_EQ(Model("NVIDIA T400"), "none");
  EXPECT_EQ(Model("Fake GPU"), "none");
}

TEST(GpuPeaks, DenseFiguresAndTheMfuPeak) {
  const GpuPeak* h100 = FindGpuPeak("NVIDIA H100 80GB HBM3");
  ASSERT_NE(h100, nullptr);
  EXPECT_DOUBLE_EQ(h100->Mfu(), 989.4);  // 1979 with sparsity, halved
  EXPECT_TRUE(h100->TensorCores());
  const GpuPeak* v100 = FindGpuPeak("Tesla V100-SXM2-16GB");
  ASSERT_NE(v100, nullptr);
  EXPECT_TRUE(std::isnan(v100->bf16));
  EXPECT_DOUBLE_EQ(v100->Mfu(), 125);  // fp16 where there is no bf16
  for (const GpuPeak& p : GpuPeaks()) {
    EXPECT_GT(p.fp32, 0) << p.model;
    EXPECT_GT(p.Mfu(), p.fp32) << p.model << ": tensor cores beat SIMT";
    EXPECT_NE(std::string(p.source), "") << p.model;
  }
}

// ---- A run with counted FLOPs ---------------------------------------------------

struct JobRun {
  RunData d;
  explicit JobRun(const char* gpu = "NVIDIA H100 80GB HBM3", double util = 97) {
    d.run.config_json = R"({"interval_s": 1, "auto_steps": true})";  // a wrapped job
    d.run.start_time = 0;
    d.run.end_time = 60;
    d.run.interval_s = 1;
    d.run.gpus_json = nlohmann::json::array({{{"index", 0}, {"name", gpu}, {"uuid", "GPU-0"}}}).dump();
    for (int i = 0; i < 60; ++i) {
      d.samples["gpu0.util"].push_back({double(i), util});
      d.samples["gpu0.mem_total_bytes"].push_back({double(i), 80e9});
      d.samples["gpu0.mem_used_bytes"].push_back({double(i), 60e9});
      d.samples["host.cpu_util"].push_back({double(i), 30});
    }
    for (int i = 1; i <= 100; ++i) {
      StepRecord r;
      r.step = i;
      r.step_s = i == 3 ? 0.9 : 0.5;  // step 3 was counted, slower
      r.t = 5 + 0.5 * i;
      r.samples = 32;
      r.data_wait_s = 0.005;
      r.forward_s = 0.2;
      r.backward_s = 0.25;
      r.optimizer_s = 0.04;
      d.steps.push_back(r);
    }
  }
  JobRun& Gpm(double sm, double tensor, double fp32 = NAN) {
    for (int i = 0; i < 60; ++i) {
      d.samples["gpu0.sm_active"].push_back({double(i), sm});
      d.samples["gpu0.tensor_active"].push_back({double(i), tensor});
      if (!std::isnan(fp32)) d.samples["gpu0.fp32_active"].push_back({double(i), fp32});
    }
    return *this;
  }
  JobRun& Flops(nlohmann::json data) {
    data["step"] = 3;
    data["rank"] = 0;
    d.events.push_back({7, "flops", data.dump()});
    return *this;
  }
  JobRun& Counted(double flops, const char* dtype = "bfloat16", bool tf32 = false) {
    return Flops({{"flops", flops}, {"by_dtype", {{dtype, flops}}}, {"conv_by_dtype", nlohmann::json::object()},
                  {"device", "cuda"}, {"uncounted", nlohmann::json::array()}, {"tf32_matmul", tf32},
                  {"tf32_cudnn", true}});
  }
  JobRun& ByFramework(const char* name) {
    d.events.push_back({6, "dataloader", nlohmann::json{{"num_workers", 4}, {"framework", name}}.dump()});
    return *this;
  }
  const Finding* Find(CauseId id) {
    findings = Diagnose(d);
    for (const Finding& f : findings)
      if (f.cause == id) return &f;
    return nullptr;
  }
  std::vector<Finding> findings;
};

TEST(Mfu, CountedFlopsAtTheMedianStepOfThePeak) {
  JobRun r;
  r.Counted(1.5e14);  // 150 TFLOP a step, 0.5 s a step: 300 TFLOPS of 989.4
  Mfu m = ComputeMfu(r.d);
  ASSERT_TRUE(m.known()) << m.why;
  EXPECT_NEAR(m.value, 1.5e14 / 0.5 / 989.4e12, 1e-9);
  EXPECT_DOUBLE_EQ(m.step_s, 0.5) << "the counted step (0.9 s) is left out of the median";
  EXPECT_EQ(m.gpus, 1);
  EXPECT_NE(m.peak_from.find("H100 SXM"), std::string::npos) << m.peak_from;
  EXPECT_NE(m.Text().find("MFU 30.3%"), std::string::npos) << m.Text();
  EXPECT_EQ(MfuJson(m)["value"].get<double>(), m.value);
}

TEST(Mfu, ThePeakFromTheRunsConfigOverridesTheTable) {
  JobRun r("NVIDIA Unknown 9000");
  r.Counted(1e14);
  Mfu none = ComputeMfu(r.d);
  EXPECT_FALSE(none.known());
  EXPECT_NE(none.why.find("not in fullburn's peak table"), std::string::npos) << none.why;
  EXPECT_NE(none.why.find(kPeakTflopsEnvVar), std::string::npos) << none.why;
  r.d.run.config_json = R"({"peak_tflops": 400})";
  Mfu m = ComputeMfu(r.d);
  ASSERT_TRUE(m.known()) << m.why;
  EXPECT_NEAR(m.value, 1e14 / 0.5 / 400e12, 1e-9);
  EXPECT_EQ(m.peak_from, kPeakTflopsEnvVar);
}

TEST(Mfu, UncountedOpsMakeItALowerBound) {
  JobRun r;
  r.Flops({{"flops", 1e14}, {"by_dtype", {{"bfloat16", 1e14}}}, {"device", "cuda"},
           {"uncounted", {"flash_attn._flash_attn_forward"}}, {"lower_bound", true}});
  Mfu m = ComputeMfu(r.d);
  ASSERT_TRUE(m.known());
  EXPECT_NE(m.Text().find("MFU >= "), std::string::npos) << m.Text();
  EXPECT_NE(m.Text().find("flash_attn._flash_attn_forward"), std::string::npos) << m.Text();
  EXPECT_TRUE(MfuJson(m)["lower_bound"].get<bool>());
}

TEST(Mfu, WithoutACountOrOnTheCpuItSaysWhy) {
  JobRun none;
  EXPECT_FALSE(ComputeMfu(none.d).counted);
  EXPECT_EQ(RenderMfu(ComputeMfu(none.d)), "") << "no line for a run the hooks never counted";
  JobRun old;
  old.Flops({{"error", "PyTorch 1.13.1 has no torch.utils.flop_counter.FlopCounterMode"}});
  Mfu m = ComputeMfu(old.d);
  EXPECT_TRUE(m.counted);
  EXPECT_FALSE(m.known());
  EXPECT_NE(RenderMfu(m).find("1.13.1"), std::string::npos) << RenderMfu(m);
  JobRun cpu;
  cpu.Flops({{"flops", 1e9}, {"by_dtype", {{"float32", 1e9}}}, {"device", "cpu"}});
  EXPECT_NE(ComputeMfu(cpu.d).why.find("on the cpu"), std::string::npos) << ComputeMfu(cpu.d).why;
  JobRun broken;
  broken.d.events.push_back({7, "flops", "{not json"});
  EXPECT_FALSE(ComputeMfu(broken.d).known());
}

// ---- precision --------------------------------------------------------------------

TEST(Precision, BusyH100WithIdleTensorCoresFromGpm) {
  JobRun r;
  r.Gpm(95, 2, 80);
  const Finding* f = r.Find(CauseId::kPrecision);
  ASSERT_NE(f, nullptr) << RenderFindings(r.findings, 9);
  EXPECT_NE(f->evidence.find("tensor activity 2%"), std::string::npos) << f->evidence;
  // fp32 pipes busy 80% of the time, bf16 on tensor cores ~15x faster.
  EXPECT_NEAR(f->share_lost, 0.8 * (1 - 67 / 989.4), 1e-6);
  EXPECT_NE(f->fix.find("torch.autocast(\"cuda\", dtype=torch.bfloat16)"), std::string::npos) << f->fix;
  EXPECT_NE(f->fix.find("allow_tf32"), std::string::npos) << f->fix;
  EXPECT_EQ(r.findings.front().cause, CauseId::kPrecision) << RenderFindings(r.findings, 9);
}

TEST(Precision, TensorCoresAtWorkIsNoFinding) {
  JobRun r;
  r.Gpm(95, 60, 10);
  EXPECT_EQ(r.Find(CauseId::kPrecision), nullptr) << RenderFindings(r.findings, 9);
  JobRun idle_sms;  // tensor cores idle because the SMs are: not precision
  idle_sms.Gpm(30, 2);
  EXPECT_EQ(idle_sms.Find(CauseId::kPrecision), nullptr) << RenderFindings(idle_sms.findings, 9);
}

TEST(Precision, Fp32MatmulsCountedByTheHooks) {
  JobRun r;
  r.Counted(1e13, "float32");  // 10 TFLOP in fp32 a 0.5 s step: 30% of it at H100's 67 TFLOPS
  const Finding* f = r.Find(CauseId::kPrecision);
  ASSERT_NE(f, nullptr) << RenderFindings(r.findings, 9);
  EXPECT_NE(f->evidence.find("100% of its 10 TFLOP"), std::string::npos) << f->evidence;
  EXPECT_NEAR(f->share_lost, 1e13 / 67e12 / 0.5 * (1 - 67 / 989.4), 1e-6);
  JobRun bf16;
  bf16.Counted(1e13, "bfloat16");
  EXPECT_EQ(bf16.Find(CauseId::kPrecision), nullptr) << RenderFindings(bf16.findings, 9);
  JobRun tf32;  // fp32 matmuls on TF32 tensor cores
  tf32.Counted(1e13, "float32", true);
  EXPECT_EQ(tf32.Find(CauseId::kPrecision), nullptr) << RenderFindings(tf32.findings, 9);
}

TEST(Precision, TheFixInTheFrameworksWords) {
  struct {
    const char* framework;
    const char* words;
  } cases[] = {{"lightning", "Trainer(precision=\"bf16-mixed\")"},
               {"transformers", "TrainingArguments(bf16=True)"},
               {"accelerate", "Accelerator(mixed_precision=\"bf16\")"}};
  for (const auto& c : cases) {
    JobRun r;
    r.Gpm(95, 1, 70).ByFramework(c.framework);
    const Finding* f = r.Find(CauseId::kPrecision);
    ASSERT_NE(f, nullptr) << c.framework;
    EXPECT_NE(f->fix.find(c.words), std::string::npos) << c.framework << ": " << f->fix;
  }
  JobRun v100("Tesla V100-SXM2-16GB");  // no bf16: fp16 with a scaler
  v100.Counted(1e12, "float32");
  const Finding* f = v100.Find(CauseId::kPrecision);
  ASSERT_NE(f, nullptr) << RenderFindings(v100.findings, 9);
  EXPECT_NE(f->fix.find("torch.float16"), std::string::npos) << f->fix;
  EXPECT_NE(f->fix.find("GradScaler"), std::string::npos) << f->fix;
  EXPECT_EQ(f->fix.find("allow_tf32"), std::string::npos) << "a V100 has no TF32: " << f->fix;
}

TEST(Precision, NotWithoutTensorCoresOrWithoutTheGpu) {
  JobRun unknown("Fake GPU");
  unknown.Gpm(95, 2, 80);
  EXPECT_EQ(unknown.Find(CauseId::kPrecision), nullptr) << "no peaks: nothing to promise";
  JobRun idle("NVIDIA H100 80GB HBM3", 20);
  idle.Gpm(95, 2, 80);
  EXPECT_EQ(idle.Find(CauseId::kPrecision), nullptr) << RenderFindings(idle.findings, 9);
}

// ---- low_mfu ----------------------------------------------------------------------

TEST(LowMfu, BusyYetLittleOfThePeak) {
  JobRun r;
  r.Counted(1.5e13);  // 3% MFU in bf16
  const Finding* f = r.Find(CauseId::kLowMfu);
  ASSERT_NE(f, nullptr) << RenderFindings(r.findings, 9);
  EXPECT_NE(f->evidence.find("MFU 3.0%"), std::string::npos) << f->evidence;
  EXPECT_DOUBLE_EQ(f->share_lost, 0) << "MFU alone says what is possible, not what a change gains";
  EXPECT_NE(f->fix.find("torch.compile"), std::string::npos) << f->fix;
  JobRun hf;
  hf.Counted(1.5e13).ByFramework("transformers");
  ASSERT_NE(hf.Find(CauseId::kLowMfu), nullptr);
  EXPECT_NE(hf.Find(CauseId::kLowMfu)->fix.find("TrainingArguments(torch_compile=True)"),
            std::string::npos);
}

TEST(LowMfu, IdleSmsInsideBusyTimeCostTheirShare) {
  JobRun r;
  r.Gpm(40, 20);
  const Finding* f = r.Find(CauseId::kLowMfu);
  ASSERT_NE(f, nullptr) << RenderFindings(r.findings, 9);
  EXPECT_NEAR(f->share_lost, 1 - 40.0 / 80, 1e-9);
}

TEST(LowMfu, AGoodMfuOrAnFp32JobIsNotIt) {
  JobRun good;
  good.Counted(2e14);  // 40% MFU
  EXPECT_EQ(good.Find(CauseId::kLowMfu), nullptr) << RenderFindings(good.findings, 9);
  JobRun fp32;  // precision explains the low MFU first
  fp32.Counted(1.5e13, "float32");
  EXPECT_NE(fp32.Find(CauseId::kPrecision), nullptr);
  EXPECT_EQ(fp32.Find(CauseId::kLowMfu), nullptr) << RenderFindings(fp32.findings, 9);
}

}  // namespace
}  // namespace fullburn
