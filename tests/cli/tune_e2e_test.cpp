// End to end: fullburn tune --grid over a real script (examples/tune/toy_train.py,
// whose speed depends on its arguments), its bad inputs, and Ctrl-C.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fullburn/env.h"
#include "fullburn/store.h"
#include "fullburn/tune.h"
#include "process.h"

namespace fullburn {
namespace {

using nlohmann::json;
using testing::Background;
using testing::RunToEnd;

const std::string kToy = std::string(SOURCE_DIR) + "/examples/tune/toy_train.py";
const std::string kPlainTorch = std::string(SOURCE_DIR) + "/examples/scenarios/plain_torch.py";

class TuneE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_tune");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
  }
  testing::Outcome Tune(std::vector<std::string> args, double timeout_s = 120) {
    args.insert(args.begin(), {FULLBURN_BIN, "tune", "--store", store_});
    return RunToEnd(args, timeout_s);
  }
  std::unique_ptr<RunStore> Store() {
    auto s = RunStore::Open(store_);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // The tuning run (the first run without a parent) and its trials' events.
  std::vector<json> Trials(int64_t* tuning_id = nullptr) {
    auto store = Store();
    std::vector<json> out;
    std::vector<RunInfo> runs = store->ListRuns().value();
    for (const RunInfo& r : runs) {
      if (r.parent_id) continue;
      if (tuning_id) *tuning_id = r.id;
      std::vector<RunEvent> events = store->LoadEvents(r.id).value();
      for (const RunEvent& e : events)
        if (e.kind == "tune_trial") out.push_back(json::parse(e.data));
      break;
    }
    return out;
  }
  std::string dir_, store_;
};

TEST_F(TuneE2E, GridPicksTheFastestCombinationAndRecordsFailures) {
  auto o = Tune({"--grid", "batch=16,128,1024", "--grid", "workers=1,2", "--trial", "30s", "--budget", "5m", "--",
                 "python3", kToy, "--batch-size", "{batch}", "--workers", "{workers}", "--seconds", "2"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("best batch=128 workers=2"), std::string::npos) << o.out;
  int64_t tuning = 0;
  std::vector<json> trials = Trials(&tuning);
  ASSERT_EQ(trials.size(), 6u);
  auto store = Store();
  for (const json& t : trials) {
    bool oom = t["value"].get<std::string>().find("batch=1024") != std::string::npos;
    EXPECT_EQ(t["status"], oom ? "failed" : "ok") << t.dump();
    if (oom) {
      EXPECT_NE(t["reason"].get<std::string>().find("out of memory"), std::string::npos);
    }
    // Every trial is a run of its own, linked to the tuning.
    auto run = store->GetRun(std::to_string(t["run_id"].get<int64_t>()));
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(run->parent_id, tuning);
  }
  // The report of the tuning lists every trial.
  std::string html = dir_ + "/tuning.html";
  auto r = RunToEnd({FULLBURN_BIN, "report", std::to_string(tuning), "--store", store_, "-o", html});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string page = testing::ReadText(html);
  size_t rows = 0;
  for (size_t pos = 0; (pos = page.find("<tr class=trial>", pos)) != std::string::npos; ++pos) ++rows;
  EXPECT_EQ(rows, 6u);
  EXPECT_NE(page.find("Tuning trials"), std::string::npos);
}

TEST_F(TuneE2E, MetricRegexRanksByTheCommandsOwnNumbers) {
  auto o = Tune({"--grid", "batch=8,256", "--metric-regex", "throughput: ([0-9.]+)", "--trial", "30s", "--",
                 "python3", kToy, "--batch-size", "{batch}", "--workers", "2", "--seconds", "1.5", "--print"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("best batch=256"), std::string::npos) << o.out;
  for (const json& t : Trials()) EXPECT_EQ(t["unit"], "metric");
}

// fullburn rebuilt (or upgraded) while a tuning runs: the next trials start
// the new binary at the same path, not the deleted file the tuner runs from.
TEST_F(TuneE2E, TrialsGoOnWhenTheBinaryIsReplacedMidTuning) {
  std::string fb = dir_ + "/fullburn";
  std::filesystem::copy_file(FULLBURN_BIN, fb);
  std::filesystem::permissions(fb, std::filesystem::perms::owner_all);
  // The first combination replaces the binary (a new file moved over it).
  std::string replace = "cp " + fb + " " + fb + ".new && mv " + fb + ".new " + fb + "; ";
  auto o =
      RunToEnd({fb, "tune", "--store", store_, "--grid", "n=1,2", "--metric-regex", "rate ([0-9]+)",
                "--trial", "30s", "--", "sh", "-c",
                "[ {n} = 1 ] && { " + replace + "}; for i in 1 2 3 4 5; do echo rate {n}; done"},
               120);
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<json> trials = Trials();
  ASSERT_EQ(trials.size(), 2u) << o.err;
  for (const json& t : trials) EXPECT_EQ(t["status"], "ok") << t.dump();
  EXPECT_NE(o.out.find("best n=2"), std::string::npos) << o.out;
}

TEST_F(TuneE2E, CombinationsAsFastAsTheBestAreNamed) {
  // {secs} changes how long the script runs, not its speed: the two batch=128
  // runs tie, and batch=16 (about 4x slower) ties with nothing.
  auto o = Tune({"--grid", "batch=16,128", "--grid", "secs=1.5,2", "--min-gain", "0.5", "--trial",
                 "30s", "--", "python3", kToy, "--batch-size", "{batch}", "--workers", "2",
                 "--seconds", "{secs}"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("ties #"), std::string::npos) << o.out;
  int64_t tuning = 0;
  std::vector<json> trials = Trials(&tuning);
  ASSERT_EQ(trials.size(), 4u);
  auto store = Store();
  json result;
  std::vector<RunEvent> events = store->LoadEvents(tuning).value();
  for (const RunEvent& e : events)
    if (e.kind == "tune_result") result = json::parse(e.data);
  int best = result.at("best_trial").get<int>();
  ASSERT_GE(best, 3);  // #3 and #4 are batch=128
  ASSERT_EQ(result.at("ties").size(), 1u) << result.dump();
  EXPECT_EQ(result["ties"][0].get<int>(), 7 - best);
  EXPECT_NE(o.out.find("as fast within the noise"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("#" + std::to_string(7 - best) + " batch=128"), std::string::npos) << o.out;
}

TEST_F(TuneE2E, SamplesPerJouleUsesThePowerReadings) {
  std::string script = dir_ + "/nvml.json";
  std::ofstream(script) << R"({"driver": "550.1", "gpus": [{"name": "Fake H100", "uuid": "GPU-tune",
    "util": [90], "mem_util": [3], "mem_used": [2147483648], "mem_total": 4294967296,
    "power_mw": [200000], "temp": [55], "throttle": [0], "processes": [[]]}]})";
  ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  auto o = Tune({"--grid", "batch=32", "--objective", "samples_per_joule", "--trial", "30s", "--", "python3", kToy,
                 "--batch-size", "{batch}", "--workers", "2", "--seconds", "3"});
  ::unsetenv("FULLBURN_NVML_LIBRARY");
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<json> trials = Trials();
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0]["unit"], "samples/J");
  // 32 samples per ~5.9 ms step is about 5400 samples/s; at 200 W, about 27 samples/J.
  EXPECT_GT(trials[0]["objective"].get<double>(), 5.0);
  EXPECT_LT(trials[0]["objective"].get<double>(), 40.0);
}

// An unchanged PyTorch script that waits 2 ms a sample with no DataLoader
// workers: the tuner gives it workers through the automatic markers (each
// trial's run had the count it was given) and says what it kept as the code
// to change. Whether a count is kept is a measurement (bench/tune_script
// records the gain); what is checked is that the advice follows the
// verdicts. Time: the start twice and 3 worker counts, 6 s trials, about 40 s.
TEST_F(TuneE2E, AnUnchangedPyTorchScriptsLoaderSettingsAreTriedAndAdvised) {
  if (RunToEnd({"/usr/bin/python3", "-c", "import torch"}).code != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch: scripts/install-deps.sh installs it";
  auto o = Tune({"--knobs", "workers", "--trial", "6s", "--budget", "3m", "--", "/usr/bin/python3",
                 kPlainTorch, "--epochs", "1000", "--samples", "256", "--sample-ms", "2"},
                300);
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<json> trials = Trials();
  ASSERT_GE(trials.size(), 3u) << o.err;
  EXPECT_EQ(trials[0]["verdict"], "start");
  auto store = Store();
  bool kept = false;
  int tried = 0;
  for (const json& t : trials) {
    if (t["knob"] != "workers") continue;
    ASSERT_EQ(t["status"], "ok") << t.dump();
    ++tried;
    kept = kept || t["verdict"].get<std::string>().rfind("kept", 0) == 0;
    // The trial's run had the DataLoader workers it was given.
    std::vector<RunEvent> events = store->LoadEvents(t["run_id"].get<int64_t>()).value();
    ScriptSettings had = ScriptSettings::FromEvents(events);
    EXPECT_EQ(had.num_workers, std::stoi(t["value"].get<std::string>())) << t.dump();
  }
  EXPECT_GE(tried, 2) << o.out;
  if (kept) {
    EXPECT_NE(o.out.find("in the script: DataLoader(num_workers="), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("or unchanged: FULLBURN_TUNE_SET='{\"num_workers\":"), std::string::npos)
        << o.out;
  } else {
    EXPECT_NE(o.out.find("in the script: nothing to change"), std::string::npos) << o.out;
  }
}

// A value whose start is slower than the trial (here: workers take 8 s to
// set up; on a GPU, cuDNN trying algorithms) is tried again, three times as
// long, and measured, rather than failed for too few steps. The budget
// holds one such value. Time: about 50 s.
TEST_F(TuneE2E, AValueWithASlowStartIsMeasuredOnALongerTrial) {
  if (RunToEnd({"/usr/bin/python3", "-c", "import torch"}).code != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch: scripts/install-deps.sh installs it";
  auto o = Tune({"--knobs", "workers", "--trial", "6s", "--budget", "60s", "--", "/usr/bin/python3",
                 kPlainTorch, "--epochs", "1000", "--samples", "256", "--sample-ms", "2",
                 "--slow-start-s", "8"},
                300);
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<json> trials = Trials();
  size_t first = 0;
  while (first < trials.size() && trials[first]["knob"] != "workers") ++first;
  ASSERT_LT(first + 1, trials.size()) << o.err;
  const json& short_trial = trials[first];
  const json& longer = trials[first + 1];
  EXPECT_EQ(short_trial["status"], "failed") << short_trial.dump();
  EXPECT_NE(short_trial["reason"].get<std::string>().find("in 6.0s: tried again at 18.0s"),
            std::string::npos)
      << short_trial.dump();
  EXPECT_EQ(longer["knob"], "workers");
  EXPECT_EQ(longer["value"], short_trial["value"]);
  EXPECT_EQ(longer["status"], "ok") << longer.dump();
  EXPECT_GT(longer["wall_s"].get<double>(), 14.0) << longer.dump();
  EXPECT_NE(o.err.find("(a slower start): once more at"), std::string::npos) << o.err;
}

// The same script as 2 data-parallel ranks under fullburn launch: worker
// counts are tried per rank (the ranks split the cores), and every rank must
// have taken the trial's setting. Time: 4 trials of 6 s, about 30 s.
TEST_F(TuneE2E, ADataParallelScriptIsTunedOnEveryRank) {
  if (RunToEnd({"/usr/bin/python3", "-c", "import torch"}).code != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch: scripts/install-deps.sh installs it";
  auto o = Tune({"--knobs",          "workers",   "--trial",     "6s",
                 "--budget",         "3m",        "--",          FULLBURN_BIN,
                 "launch",           "--nproc",   "2",           "--",
                 "/usr/bin/python3", kPlainTorch, "--epochs",    "1000",
                 "--samples",        "256",       "--sample-ms", "2"},
                300);
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<json> trials = Trials();
  ASSERT_GE(trials.size(), 3u) << o.err;
  int rank_cores = RankCpus(ReadCpuView(Env::Default()), 2);
  auto store = Store();
  int tried = 0;
  for (const json& t : trials) {
    if (t["knob"] != "workers") continue;
    ASSERT_EQ(t["status"], "ok") << t.dump();
    int workers = std::stoi(t["value"].get<std::string>());
    EXPECT_LE(workers, 2 * rank_cores) << "counted the node's cores, not a rank's: " << t.dump();
    std::vector<RunEvent> events = store->LoadEvents(t["run_id"].get<int64_t>()).value();
    ASSERT_EQ(ScriptRanks(events), 2) << t.dump();
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(ScriptSettings::FromEvents(events, rank).num_workers, workers)
          << "rank " << rank << ": " << t.dump();
    ++tried;
  }
  EXPECT_GE(tried, 1) << o.out;
}

TEST_F(TuneE2E, BadInputIsRefusedBeforeAnyTrial) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  std::vector<Case> cases = {
      {{"--grid", "batch=", "--", "python3", kToy, "--batch-size", "{batch}"}, "empty value"},
      {{"--grid", "batch=1,2", "--", "python3", kToy, "--batch-size", "{batch}", "--workers",
        "{workers}"},
       "{workers}"},
      {{"--grid", "batch=1,2", "--", "python3", kToy}, "not used"},
      {{"--grid", "batch=1", "--budget", "10s", "--trial", "1m", "--", "echo", "{batch}"},
       "shorter than one trial"},
      {{"--grid", "batch=1", "--objective", "samples_per_joule", "--", "echo", "{batch}"},
       "power readings"},
      {{"--grid", "batch=1", "--objective", "speed", "--", "echo", "{batch}"}, "unknown objective"},
      {{"--knobs", "batch,thread"}, "did you mean 'threads'"},
      {{"train.batchsize=8"}, "train.batch_size"},
      {{"--budget", "soon"}, "not a duration"},
      {{"--knobs", "batch", "--", "python3", "train.py"}, "unknown knob 'batch'"},
      {{"--"}, "needs a command"},
  };
  for (const Case& c : cases) {
    auto o = Tune(c.args);
    EXPECT_EQ(o.code, 2) << c.says << ": " << o.err;
    EXPECT_NE(o.err.find(c.says), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
  // Nothing ran: the store holds no tuning and no trial.
  auto store = RunStore::Open(store_);
  if (store.ok()) {
    EXPECT_TRUE((*store)->ListRuns()->empty());
  }
}

TEST_F(TuneE2E, InterruptLeavesAValidPartialTable) {
  Background b;
  testing::Start(&b,
                 {FULLBURN_BIN, "tune", "--store", store_, "--grid", "batch=16,32,64", "--trial", "60s", "--", "python3",
                  kToy, "--batch-size", "{batch}", "--workers", "2", "--seconds", "60"},
                 "tune_interrupt");
  // Wait for the first trial to be running (its run exists), then Ctrl-C.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool started = false;
  while (!started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto store = RunStore::Open(store_);
    if (!store.ok()) continue;
    auto runs = (*store)->ListRuns();
    if (runs.ok())
      for (const RunInfo& r : *runs) started |= r.parent_id.has_value();
  }
  ASSERT_TRUE(started) << b.Err();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ::kill(b.pid, SIGINT);
  ASSERT_EQ(b.Wait(30), 130) << b.Err();
  std::string out = b.Out();
  EXPECT_NE(out.find("interrupted"), std::string::npos) << out;
  std::vector<json> trials = Trials();
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[0]["status"], "interrupted");
  EXPECT_EQ(trials[1]["status"], "skipped");
  EXPECT_EQ(trials[1]["reason"], "interrupted");
  auto store = Store();
  auto tuning = store->GetRun("1");
  ASSERT_TRUE(tuning.ok());
  EXPECT_EQ(tuning->status, "finished");
  EXPECT_EQ(tuning->exit_code, 130);
}

}  // namespace
}  // namespace fullburn
