// fullburn tune's decisions: knobs, measuring, keeping, grids, durations.
#include "fullburn/tune.h"

#include <gtest/gtest.h>

namespace fullburn {
namespace {

// Steps of `samples` each taking `step_s`, ending at t = (i + 1) * step_s.
RunData StepsRun(int n, double step_s, int64_t samples, int ranks = 1) {
  RunData d;
  d.run.id = 7;
  for (int r = 0; r < ranks; ++r)
    for (int i = 0; i < n; ++i) {
      StepRecord s;
      s.rank = r;
      s.step = i + 1;
      s.t = (i + 1) * step_s;
      s.step_s = step_s;
      s.samples = samples;
      d.steps.push_back(s);
    }
  return d;
}

TEST(TuneMeasure, SteadyStepsGiveTheirThroughputWithNoSpread) {
  auto m = MeasureRun(StepsRun(50, 0.1, 32), Objective::kSamplesPerSecond);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NEAR(m->value, 320, 1e-6);
  EXPECT_NEAR(m->spread, 0, 1e-9);
  EXPECT_EQ(m->unit, "samples/s");
  EXPECT_LT(m->steps, 50);  // warm-up left out
  EXPECT_GE(m->steps, 8);
}

TEST(TuneMeasure, SlowWarmupStepsAreLeftOut) {
  RunData d = StepsRun(40, 0.1, 10);
  // The first three steps take 2 s each (compilation, cache warm-up).
  double shift = 0;
  for (size_t i = 0; i < d.steps.size(); ++i) {
    if (i < 3) {
      d.steps[i].step_s = 2.0;
      shift += 1.9;
    }
    d.steps[i].t += shift;
  }
  auto m = MeasureRun(d, Objective::kSamplesPerSecond);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->value, 100, 1e-6);
}

TEST(TuneMeasure, ThroughputCountsEveryRank) {
  auto m = MeasureRun(StepsRun(40, 0.1, 16, 2), Objective::kSamplesPerSecond);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->value, 320, 1e-6);
}

TEST(TuneMeasure, MarkersWithoutSamplesCountSteps) {
  auto m = MeasureRun(StepsRun(40, 0.05, 0), Objective::kSamplesPerSecond);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->unit, "steps/s");
  EXPECT_NEAR(m->value, 20, 1e-6);
}

TEST(TuneMeasure, FewStepsAreMeasuredRoughlyAndTooFewAreAnError) {
  auto rough = MeasureRun(StepsRun(6, 0.5, 32), Objective::kSamplesPerSecond);
  ASSERT_TRUE(rough.ok());
  EXPECT_TRUE(rough->rough);
  EXPECT_NEAR(rough->value, 64, 1e-6);
  EXPECT_TRUE(std::isnan(rough->spread));
  EXPECT_EQ(rough->steps, 5);
  EXPECT_FALSE(MeasureRun(StepsRun(50, 0.1, 32), Objective::kSamplesPerSecond)->rough);
  auto m = MeasureRun(StepsRun(2, 0.1, 32), Objective::kSamplesPerSecond);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--trial"), std::string::npos);
}

TEST(TuneMeasure, SamplesPerJouleIntegratesPower) {
  RunData d = StepsRun(60, 0.1, 50);  // 500 samples/s for 6 s
  for (int i = 0; i <= 7; ++i) d.samples["gpu0.power_w"].push_back({static_cast<double>(i), 250.0});
  auto m = MeasureRun(d, Objective::kSamplesPerJoule);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NEAR(m->value, 2.0, 1e-6);  // 500 samples/s / 250 W
  EXPECT_EQ(m->unit, "samples/J");
  RunData no_power = StepsRun(60, 0.1, 50);
  auto e = MeasureRun(no_power, Objective::kSamplesPerJoule);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("samples_per_s"), std::string::npos);
}

TEST(TuneMeasure, ValuesFromOutputDropWarmup) {
  auto m = MeasureValues({1, 100, 100, 100, 100}, "metric");
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->value, 100);
  EXPECT_FALSE(MeasureValues({100, 100}, "metric").ok());
}

TEST(TuneKeep, AChangeMustBeatTheNoise) {
  Measure best, quiet, noisy;
  best.value = 100, best.spread = 0.02;
  quiet.value = 110, quiet.spread = 0.02;
  noisy.value = 110, noisy.spread = 0.4;
  double gain = 0;
  EXPECT_TRUE(BeatsBest(quiet, best, 0.03, &gain));
  EXPECT_NEAR(gain, 0.10, 1e-9);
  EXPECT_FALSE(BeatsBest(noisy, best, 0.03, &gain));  // (0.4 + 0.02) / 2 > 10%
  Measure small = quiet;
  small.value = 102;
  EXPECT_FALSE(BeatsBest(small, best, 0.03, &gain));
  Measure failed;
  EXPECT_FALSE(BeatsBest(failed, best, 0.03, &gain));
}

TEST(TuneKeep, TheBestNamesTheTrialsItDoesNotBeatBeyondTheNoise) {
  std::vector<Trial> trials(5);
  double values[] = {50, 99, 100, 90, 101};
  for (int i = 0; i < 5; ++i) {
    trials[i].index = i + 1;
    trials[i].measure.value = values[i];
    trials[i].measure.spread = 0.02;
  }
  trials[4].status = TrialStatus::kFailed;  // failed trials neither win nor tie
  EXPECT_EQ(BestTrial(trials), 2);
  // 100 vs 99: 1%, under the 3% minimum gain; vs 90: 11%, beyond it.
  EXPECT_EQ(TiedWithBest(trials, 2, 0.03), (std::vector<int>{1}));
  EXPECT_EQ(TiedWithBest(trials, 2, 0.15), (std::vector<int>{1, 3}));
  trials[1].measure.spread = 0.5;  // too noisy to tell apart even from 90
  trials[3].measure.spread = 0.3;
  EXPECT_EQ(TiedWithBest(trials, 2, 0.03), (std::vector<int>{1, 3}));
  EXPECT_EQ(BestTrial({}), -1);
  EXPECT_TRUE(TiedWithBest(trials, -1, 0.03).empty());
}

TEST(TuneKnobs, UnknownKnobSuggestsTheClosest) {
  auto k = ParseKnobList("batch,thread");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("did you mean 'threads'"), std::string::npos);
  auto ok = ParseKnobList("precision,data.threads,batch");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<std::string>{"precision", "loader_threads", "batch"}));
  EXPECT_FALSE(ParseKnobList(",").ok());
  // Named after the config key the knob sets, or as other tools name it.
  for (auto [given, knob] : {std::pair<const char*, const char*>{"batch_size", "batch"},
                             {"num_workers", "loader_threads"},
                             {"data.prefetchh", "prefetch"}}) {
    auto named = ParseKnobList(given);
    ASSERT_FALSE(named.ok()) << given;
    EXPECT_NE(named.status().message().find(std::string("did you mean '") + knob + "'"),
              std::string::npos)
        << given << ": " << named.status().message();
  }
}

TEST(TuneKnobs, TheBottleneckIsTunedFirst) {
  Finding input{CauseId::kInputWorkers, "", "", 0.4, 0.9, ""};
  Finding healthy{CauseId::kHealthy, "", "", 0, 0.9, ""};
  EXPECT_EQ(KnobOrder({input}, {}).front(), "pack");
  EXPECT_EQ(KnobOrder({input}, {"batch", "loader_threads"}),
            (std::vector<std::string>{"loader_threads", "batch"}));
  EXPECT_EQ(KnobOrder({healthy}, {"batch", "loader_threads"}),
            (std::vector<std::string>{"batch", "loader_threads"}));
  // A failure listed first is not the bottleneck: the finding after it is.
  Finding failed{CauseId::kJobFailed, "", "", 0, 0.9, ""};
  EXPECT_TRUE(InputBound({failed, input}));
  EXPECT_FALSE(InputBound({failed, healthy}));
}

std::vector<std::string> ValuesOf(const std::vector<Candidate>& cs) {
  std::vector<std::string> out;
  for (const Candidate& c : cs) out.push_back(c.value);
  return out;
}

// An unchanged PyTorch script: what its markers recorded is the start.
TEST(TuneScriptKnobs, TheScriptsOwnSettingsAreReadFromItsEvents) {
  std::vector<RunEvent> events = {
      {1, "dataloader",
       R"({"num_workers": 2, "prefetch_factor": 2, "persistent_workers": false,
           "pin_memory": false, "batch_size": 8, "rank": 0})"},
      {2, "dataloader", R"({"num_workers": 0, "rank": 0})"},  // its validation loader
      {3, "torch", R"({"threads": 1, "version": "1.13.0", "rank": 0})"}};
  ScriptSettings s = ScriptSettings::FromEvents(events);
  EXPECT_TRUE(s.has_loader);
  EXPECT_EQ(s.num_workers, 2);
  EXPECT_EQ(s.prefetch_factor, 2);
  EXPECT_EQ(s.persistent_workers, 0);
  EXPECT_EQ(s.pin_memory, 0);
  EXPECT_EQ(s.threads, 1);
  EXPECT_FALSE(ScriptSettings::FromEvents({}).has_loader);
  EXPECT_EQ(ScriptRanks(events), 1);
  EXPECT_EQ(ScriptRanks({}), 1);
}

// Each rank of a data-parallel job applies the settings itself: each is read.
TEST(TuneScriptKnobs, EachRanksSettingsAreReadOnTheirOwn) {
  std::vector<RunEvent> events = {{1, "dataloader", R"({"num_workers": 2, "rank": 0})"},
                                  {1, "dataloader", R"({"num_workers": 0, "rank": 1})"},
                                  {2, "torch", R"({"threads": 1, "rank": 1})"},
                                  {2, "torch", R"({"threads": 1, "rank": 0})"}};
  EXPECT_EQ(ScriptRanks(events), 2);
  EXPECT_EQ(ScriptSettings::FromEvents(events).num_workers, 2);
  EXPECT_EQ(ScriptSettings::FromEvents(events, 1).num_workers, 0);
  EXPECT_NE(ScriptSettingsMismatch({{"num_workers", "2"}}, ScriptSettings::FromEvents(events, 1)),
            "");
}

TEST(TuneScriptKnobs, CandidatesFollowTheCoresAndWhatTorchAccepts) {
  ScriptContext ctx;
  ctx.cores = 8;
  ctx.current.has_loader = true;
  ctx.current.num_workers = 0;
  ctx.current.threads = 8;
  std::string skip;
  EXPECT_EQ(ValuesOf(ScriptKnobCandidates("workers", ctx, &skip)),
            (std::vector<std::string>{"4", "8", "16"}));  // 2x cores: workers that wait
  EXPECT_EQ(ValuesOf(ScriptKnobCandidates("threads", ctx, &skip)), (std::vector<std::string>{"4"}));
  // torch refuses prefetch_factor and persistent_workers without workers.
  skip.clear();
  EXPECT_TRUE(ScriptKnobCandidates("prefetch", ctx, &skip).empty());
  EXPECT_NE(skip.find("num_workers = 0"), std::string::npos) << skip;
  skip.clear();
  EXPECT_TRUE(ScriptKnobCandidates("pin_memory", ctx, &skip).empty());
  EXPECT_NE(skip.find("no GPU"), std::string::npos) << skip;
  ctx.cuda = true;
  ctx.current.num_workers = 4;
  skip.clear();
  auto pin = ScriptKnobCandidates("pin_memory", ctx, &skip);
  ASSERT_EQ(pin.size(), 1u);
  EXPECT_EQ(pin[0].overrides.at("pin_memory"), "true");
  EXPECT_EQ(ValuesOf(ScriptKnobCandidates("prefetch", ctx, &skip)),
            (std::vector<std::string>{"4", "8"}));
  ctx.current.has_loader = false;
  skip.clear();
  EXPECT_TRUE(ScriptKnobCandidates("workers", ctx, &skip).empty());
  EXPECT_NE(skip.find("no torch DataLoader"), std::string::npos) << skip;
  auto k = ParseKnobList("workers,prefetchh", ScriptKnobs());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("did you mean 'prefetch'"), std::string::npos);
  EXPECT_FALSE(ParseKnobList("batch", ScriptKnobs()).ok());  // fullburn train's knob
}

// The swap to fullburn.ImageLoader: offered for an ImageFolder, taken or not
// as the trial's dataloader event says, and said as the two lines to change.
TEST(TuneScriptKnobs, TheSwapIsTriedForAnImageFolderAndCheckedAfter) {
  std::vector<RunEvent> events = {
      {1, "dataloader", R"({"num_workers": 2, "dataset": "ImageFolder", "rank": 0})"}};
  ScriptContext ctx;
  ctx.cores = 2;
  ctx.current = ScriptSettings::FromEvents(events);
  EXPECT_EQ(ctx.current.dataset, "ImageFolder");
  std::string skip;
  auto swap = ScriptKnobCandidates("swap", ctx, &skip);
  ASSERT_EQ(swap.size(), 1u) << skip;
  EXPECT_EQ(swap[0].overrides.at("loader"), "fullburn");
  EXPECT_EQ(ScriptSettingsJson(swap[0].overrides).dump(), R"({"loader":"fullburn"})");
  EXPECT_NE(ScriptAdvice({{"loader", "fullburn"}, {"num_workers", "2"}})
                .find("loader = fullburn.ImageLoader(root, batch_size)"),
            std::string::npos);
  // The trial's run must show it took: "swapped" in its dataloader event.
  EXPECT_NE(ScriptSettingsMismatch({{"loader", "fullburn"}}, ctx.current), "");
  ScriptSettings took = ScriptSettings::FromEvents(
      {{1, "dataloader", R"({"num_workers": 2, "dataset": "ImageFolder", "swapped": "fullburn.ImageLoader"})"}});
  EXPECT_EQ(took.loader, "fullburn");
  EXPECT_EQ(ScriptSettingsMismatch({{"loader", "fullburn"}, {"num_workers", "4"}}, took), "");
  ctx.current = took;
  skip.clear();
  EXPECT_TRUE(ScriptKnobCandidates("swap", ctx, &skip).empty());
  EXPECT_EQ(skip, "already fullburn.ImageLoader");
  ctx.current = ScriptSettings::FromEvents({{1, "dataloader", R"({"num_workers": 2, "dataset": "Tokens"})"}});
  skip.clear();
  EXPECT_TRUE(ScriptKnobCandidates("swap", ctx, &skip).empty());
  EXPECT_NE(skip.find("a Tokens, not an ImageFolder"), std::string::npos) << skip;
  Finding input{CauseId::kInputWorkers, "", "", 0.4, 0.9, ""};
  auto order = ScriptKnobOrder({input}, {});
  EXPECT_LT(std::find(order.begin(), order.end(), "workers"),
            std::find(order.begin(), order.end(), "swap"));  // against the best worker count
}

TEST(TuneScriptKnobs, TheLoaderFirstWhenItIsTheBottleneck) {
  Finding input{CauseId::kInputWorkers, "", "", 0.4, 0.9, ""};
  Finding healthy{CauseId::kHealthy, "", "", 0, 0.9, ""};
  EXPECT_EQ(ScriptKnobOrder({input}, {}).front(), "workers");
  EXPECT_EQ(ScriptKnobOrder({healthy}, {}).front(), "threads");
  EXPECT_EQ(ScriptKnobOrder({input}, {"threads", "prefetch"}),
            (std::vector<std::string>{"prefetch", "threads"}));
}

TEST(TuneScriptKnobs, TheWinnerIsSaidAsCodeAndAsTheVariable) {
  std::map<std::string, std::string> best = {
      {"num_workers", "4"}, {"persistent_workers", "true"}, {"threads", "2"}};
  EXPECT_EQ(ScriptAdvice(best),
            "DataLoader(num_workers=4, persistent_workers=True); torch.set_num_threads(2)");
  EXPECT_EQ(ScriptAdvice({}), "nothing to change");
  EXPECT_EQ(ScriptSettingsJson(best).dump(),
            R"({"num_workers":4,"persistent_workers":true,"threads":2})");
  ScriptSettings had;
  had.num_workers = 4;
  had.persistent_workers = 1;
  had.threads = 2;
  EXPECT_EQ(ScriptSettingsMismatch(best, had), "");
  had.num_workers = 0;  // the script's loader did not go through torch's DataLoader
  EXPECT_EQ(ScriptSettingsMismatch(best, had), "num_workers 4 was asked, the run had 0");
  had.num_workers = 4;
  had.threads = -1;
  EXPECT_NE(ScriptSettingsMismatch(best, had).find("did not record its threads"),
            std::string::npos);
}

TEST(TuneKnobs, CandidatesLeaveOutTheCurrentValueAndSayWhyNone) {
  TuneContext ctx;
  ctx.cores = 8;
  ctx.settings.data.threads = 4;
  ctx.settings.train.precision = "fp32";
  ctx.settings.model.name = "mlp";
  std::string skip;
  auto threads = KnobCandidates("loader_threads", ctx, &skip);
  ASSERT_TRUE(skip.empty());
  std::vector<std::string> values;
  for (const Candidate& c : threads) values.push_back(c.overrides.at("data.threads"));
  EXPECT_EQ(values, (std::vector<std::string>{"0", "7", "8"}));
  values.clear();  // train.threads = 0 is all 8 cores: not tried again as 8
  for (const Candidate& c : KnobCandidates("threads", ctx, &skip))
    values.push_back(c.overrides.at("train.threads"));
  EXPECT_EQ(values, (std::vector<std::string>{"4", "7"}));
  auto precision = KnobCandidates("precision", ctx, &skip);
  ASSERT_EQ(precision.size(), 1u);  // CPU: bf16 only
  EXPECT_EQ(precision[0].overrides.at("train.precision"), "bf16");
  ctx.cuda = true;
  EXPECT_EQ(KnobCandidates("precision", ctx, &skip).size(), 2u);
  EXPECT_TRUE(KnobCandidates("channels_last", ctx, &skip).empty());
  EXPECT_NE(skip.find("ResNet"), std::string::npos);
  auto graphs = KnobCandidates("cuda_graphs", ctx, &skip);
  ASSERT_EQ(graphs.size(), 1u);
  EXPECT_EQ(graphs[0].overrides.at("train.cuda_graphs"), "true");
  ctx.settings.train.cuda_graphs = true;  // already on: nothing to try
  EXPECT_TRUE(KnobCandidates("cuda_graphs", ctx, &skip).empty());
  ctx.settings.train.cuda_graphs = false;
  ctx.cuda = false;
  EXPECT_TRUE(KnobCandidates("cudnn_benchmark", ctx, &skip).empty());
  EXPECT_FALSE(skip.empty());
  EXPECT_TRUE(KnobCandidates("cuda_graphs", ctx, &skip).empty());
  EXPECT_NE(skip.find("CPU"), std::string::npos);
  EXPECT_TRUE(KnobCandidates("cache", ctx, &skip).empty());
  EXPECT_NE(skip.find("not the bottleneck"), std::string::npos);
}

TEST(TuneKnobs, PackOnlyWhenTheInputIsTheBottleneckAndKeepsTheHeldOutSplit) {
  TuneContext ctx;
  ctx.settings.data.source = "images";
  ctx.settings.data.path = "";
  ctx.settings.data.val_path = "";
  ctx.settings.data.image_size = 48;
  ctx.data_path = "/s/datasets/imgs/train";
  ctx.val_path = "/s/datasets/imgs/val";
  ctx.pack_dir = "/s/tune-3/pack";
  std::string skip;
  EXPECT_TRUE(KnobCandidates("pack", ctx, &skip).empty());
  EXPECT_NE(skip.find("not the bottleneck"), std::string::npos);
  ctx.input_bound = true;
  auto c = KnobCandidates("pack", ctx, &skip);
  ASSERT_EQ(c.size(), 1u) << skip;
  ASSERT_TRUE(c[0].pack.has_value());
  EXPECT_EQ(c[0].pack->src, "/s/datasets/imgs/train");
  EXPECT_EQ(c[0].pack->dst, "/s/tune-3/pack");
  EXPECT_EQ(c[0].pack->max_side, 96);
  EXPECT_EQ(c[0].overrides.at("data.path"), "/s/tune-3/pack");
  // An empty data.path also meant the default held-out split: keep evaluating it.
  EXPECT_EQ(c[0].overrides.at("data.val_path"), "/s/datasets/imgs/val");
  ctx.settings.data.val_path = "/mine/val";
  EXPECT_EQ(KnobCandidates("pack", ctx, &skip)[0].overrides.count("data.val_path"), 0u);
  ctx.data_is_pack = true;
  EXPECT_TRUE(KnobCandidates("pack", ctx, &skip).empty());
  EXPECT_NE(skip.find("already a pack"), std::string::npos);
  ctx.host_memory_bytes = 64.0 * (1 << 30);
  EXPECT_TRUE(KnobCandidates("cache", ctx, &skip).empty());  // the page cache holds a pack
  EXPECT_NE(skip.find("page cache"), std::string::npos);
  ctx.data_is_pack = false;
  ctx.settings.data.source = "tokens";
  EXPECT_TRUE(KnobCandidates("pack", ctx, &skip).empty());
  EXPECT_NE(skip.find("tokens"), std::string::npos);
}

// 1000 images of at most 96x96 RGB are 27.6 MB raw: the pack is written
// only where that leaves half the free space.
TEST(TuneKnobs, APackIsRefusedWhenItWouldTakeMoreThanHalfTheFreeDisk) {
  const double raw = 1000.0 * 96 * 96 * 3;
  EXPECT_TRUE(CheckPackSpace(1000, 96, 2 * raw, "/s/tune-3").ok());
  Status full = CheckPackSpace(1000, 96, 2 * raw - 1, "/s/tune-3");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), Status::Code::kIoError);
  EXPECT_NE(full.message().find("a raw pack of 1000 images"), std::string::npos) << full.message();
  EXPECT_NE(full.message().find("/s/tune-3 has 0.1 GiB free"), std::string::npos) << full.message();
  EXPECT_NE(full.message().find("set data.path"), std::string::npos);
  EXPECT_FALSE(CheckPackSpace(1, 4096, 0, "/full").ok());
}

TEST(TuneKnobs, BatchSearchKeepsTheEffectiveBatch) {
  TuneContext ctx;
  ctx.settings.train.batch_size = AutoInt{8, false};
  ctx.settings.train.accumulate = 8;
  std::string skip;
  auto c = KnobCandidates("batch", ctx, &skip);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].overrides.at("train.batch_size"), "auto");
  EXPECT_EQ(c[0].overrides.at("train.max_batch_size"), "64");
  EXPECT_EQ(c[0].overrides.at("train.accumulate"), "1");
  ctx.settings.train.accumulate = 1;
  EXPECT_TRUE(KnobCandidates("batch", ctx, &skip).empty());
  EXPECT_NE(skip.find("--free-batch"), std::string::npos);
  ctx.keep_effective_batch = false;
  EXPECT_EQ(KnobCandidates("batch", ctx, &skip).size(), 1u);

  EXPECT_EQ(KeepEffectiveBatch(64, 64), (std::pair<int64_t, int64_t>(64, 1)));
  EXPECT_EQ(KeepEffectiveBatch(48, 64), (std::pair<int64_t, int64_t>(32, 2)));
  EXPECT_EQ(KeepEffectiveBatch(100, 96), (std::pair<int64_t, int64_t>(96, 1)));
  EXPECT_EQ(KeepEffectiveBatch(7, 64), (std::pair<int64_t, int64_t>(4, 16)));
}

TEST(TuneGrid, AxesExpandAndSubstitute) {
  auto a = ParseGridAxis("batch=64,128");
  auto b = ParseGridAxis("workers=4");
  ASSERT_TRUE(a.ok() && b.ok());
  auto combos = ExpandGrid({*a, *b});
  ASSERT_EQ(combos.size(), 2u);
  EXPECT_EQ(combos[1].at("batch"), "128");
  auto cmd = Substitute({"train.py", "--batch-size={batch}", "-j", "{workers}", "{not a name}"},
                        combos[1]);
  ASSERT_TRUE(cmd.ok()) << cmd.status().message();
  EXPECT_EQ(*cmd,
            (std::vector<std::string>{"train.py", "--batch-size=128", "-j", "4", "{not a name}"}));
}

TEST(TuneGrid, BadGridsAreErrorsBeforeAnyTrial) {
  EXPECT_FALSE(ParseGridAxis("batch=").ok());
  EXPECT_FALSE(ParseGridAxis("batch=64,,128").ok());
  EXPECT_FALSE(ParseGridAxis("=64").ok());
  EXPECT_FALSE(ParseGridAxis("batch").ok());
  auto missing = Substitute({"x", "{batch}", "{lr}"}, {{"batch", "1"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("{lr}"), std::string::npos);
  auto unused = Substitute({"x", "{batch}"}, {{"batch", "1"}, {"lr", "2"}});
  ASSERT_FALSE(unused.ok());
  EXPECT_NE(unused.status().message().find("{lr}"), std::string::npos);
}

TEST(TuneDuration, UnitsAndErrors) {
  EXPECT_DOUBLE_EQ(*ParseDuration("90"), 90);
  EXPECT_DOUBLE_EQ(*ParseDuration("90s"), 90);
  EXPECT_DOUBLE_EQ(*ParseDuration("10m"), 600);
  EXPECT_DOUBLE_EQ(*ParseDuration("1h"), 3600);
  EXPECT_DOUBLE_EQ(*ParseDuration("1m30s"), 90);
  EXPECT_DOUBLE_EQ(*ParseDuration("30d"), 30 * 86400);
  EXPECT_DOUBLE_EQ(*ParseDuration("1d12h"), 36 * 3600);
  EXPECT_DOUBLE_EQ(*ParseDuration("0.5s"), 0.5);
  for (const char* bad : {"", "0", "-5s", "10x", "1m30", "inf", "ten"})
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
}

TEST(TuneTrials, JsonRoundTripsAndTheTableShowsEveryTrial) {
  Trial t;
  t.index = 2;
  t.knob = "loader_threads";
  t.value = "4";
  t.overrides = {{"data.threads", "4"}};
  t.run_id = 12;
  t.verdict = "kept +20%";
  t.measure.value = 512;
  t.measure.spread = 0.04;
  t.measure.unit = "samples/s";
  Trial back = TrialFromJson(TrialJson(t));
  EXPECT_EQ(back.knob, t.knob);
  EXPECT_EQ(back.overrides, t.overrides);
  EXPECT_EQ(back.run_id, 12);
  EXPECT_DOUBLE_EQ(back.measure.value, 512);
  EXPECT_TRUE(std::isnan(back.measure.gpu_util));
  Trial failed;
  failed.index = 3;
  failed.knob = "batch";
  failed.value = "auto";
  failed.status = TrialStatus::kFailed;
  failed.reason = "exit code 1: out of memory";
  std::string table = RenderTrialTable({t, failed});
  EXPECT_NE(table.find("512 ±2%"), std::string::npos) << table;
  EXPECT_NE(table.find("failed: exit code 1: out of memory"), std::string::npos);
  EXPECT_NE(table.find("kept +20%"), std::string::npos);
}

}  // namespace
}  // namespace fullburn
