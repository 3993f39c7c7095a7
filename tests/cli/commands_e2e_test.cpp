// End to end: watch, runs, serve and the bad inputs of every command.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "fullburn/pipeline.h"
#include "fullburn/store.h"
#include "process.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Background;
using testing::ReadText;
using testing::RunToEnd;

class CommandsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_cmd");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
  }
  void FakeGpu(double util) {
    std::string script = dir_ + "/nvml.json";
    std::ofstream(script)
        << R"({"driver": "550.1", "gpus": [{"name": "Fake A100", "uuid": "GPU-cmd",
      "util": [)"
        << util << R"(], "mem_util": [3], "mem_used": [2147483648], "mem_total": 4294967296,
      "power_mw": [123000], "temp": [55], "throttle": [68],
      "processes": [[{"pid": 1, "mem": 1048576}]]}]})";
    ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
    ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
  }
  testing::Outcome Fb(std::vector<std::string> args) {
    args.insert(args.begin(), FULLBURN_BIN);
    return RunToEnd(args);
  }
  // A synthetic JPEG folder under the test's directory.
  std::string MakeImages(const std::string& classes, const std::string& per_class,
                         const std::string& size) {
    std::string imgs = dir_ + "/imgs";
    auto o = Fb({"make-dataset", "images", imgs, "--classes", classes, "--per-class", per_class,
                 "--size", size});
    EXPECT_EQ(o.code, 0) << o.err;
    return imgs;
  }
  void RecordRun(const std::string& name) {
    auto o = Fb({"run", "-q", "--name", name, "--interval", "0.1", "--store", store_, "--",
                 WORKLOAD_BIN, "burn", "--seconds", "0.5"});
    ASSERT_EQ(o.code, 0) << o.err;
  }
  std::string dir_, store_;
};

size_t Lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

TEST_F(CommandsE2E, WatchOnceJsonWithoutGpus) {
  auto o = Fb({"watch", "--once", "--json", "--store", store_});
  ASSERT_EQ(o.code, 0) << o.err;
  json j = json::parse(o.out);
  EXPECT_TRUE(j["metrics"].contains("host.cpu_util"));
  EXPECT_TRUE(j["metrics"].contains("host.mem_used_bytes"));
  EXPECT_TRUE(j["metrics"].contains("host.cpu0.util"));
  EXPECT_FALSE(j["metrics"].contains("gpu0.util"));  // absent, not 0
  EXPECT_NE(j["gpu_unavailable"].get<std::string>().find("libnvidia-ml.so.1"), std::string::npos);
  EXPECT_EQ(j["jobs"], json::array());  // none running in this store
  // A store that cannot be read costs the jobs, not the machine's view.
  std::ofstream(dir_ + "/bad.db") << "not a database";
  o = Fb({"watch", "--once", "--json", "--store", dir_ + "/bad.db"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(json::parse(o.out)["metrics"].contains("host.cpu_util"));
  EXPECT_NE(o.err.find("is not a fullburn run store or is corrupt"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("watching without the jobs"), std::string::npos) << o.err;
}

TEST_F(CommandsE2E, WatchOnceJsonWithFakeGpu) {
  FakeGpu(77);
  auto o = Fb({"watch", "--once", "--json", "--store", store_});
  ASSERT_EQ(o.code, 0) << o.err;
  json j = json::parse(o.out);
  EXPECT_EQ(j["metrics"]["gpu0.util"], 77);
  EXPECT_EQ(j["metrics"]["gpu0.power_w"], 123);
  EXPECT_EQ(j["metrics"]["gpu0.mem_total_bytes"], 4294967296.0);
  EXPECT_EQ(j["gpus"][0]["name"], "Fake A100");
  EXPECT_EQ(j["gpus"][0]["throttle_reasons"], json({"sw_power_cap", "hw_thermal_slowdown"}));
  EXPECT_EQ(j["gpus"][0]["processes"][0]["pid"], 1);
}

TEST_F(CommandsE2E, WatchOnceTextFrame) {
  FakeGpu(50);
  auto o = Fb({"watch", "--once", "--store", store_});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("GPU 0 Fake A100"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("THROTTLED: sw_power_cap,hw_thermal_slowdown"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("CPU  ["), std::string::npos);
  EXPECT_NE(o.out.find("pid       1"), std::string::npos) << o.out;
}

TEST_F(CommandsE2E, RunsListShowExportRemove) {
  RecordRun("first");
  RecordRun("second");
  auto list = Fb({"runs", "list", "--json", "--store", store_});
  ASSERT_EQ(list.code, 0) << list.err;
  json runs = json::parse(list.out);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["name"], "first");
  EXPECT_EQ(runs[1]["status"], "finished");
  EXPECT_GE(runs[1]["samples"].get<int>(), 3);

  auto text = Fb({"runs", "list", "--store", store_});
  EXPECT_NE(text.out.find("second"), std::string::npos);
  EXPECT_TRUE(runs[0]["parent_id"].is_null());

  // A run recorded as part of the first (a tuning's trial) is listed under it.
  auto part = Fb({"run", "-q", "--name", "trial", "--parent", "1", "--interval", "0.1", "--store",
                  store_, "--", WORKLOAD_BIN, "burn", "--seconds", "0.2"});
  ASSERT_EQ(part.code, 0) << part.err;
  json grouped = json::parse(Fb({"runs", "list", "--json", "--store", store_}).out);
  ASSERT_EQ(grouped.size(), 3u);
  EXPECT_EQ(grouped[2]["parent_id"], 1);
  text = Fb({"runs", "list", "--store", store_});
  size_t first = text.out.find("first"), trial = text.out.find("- trial"),
         second = text.out.find(" second ");  // not the command's --seconds
  ASSERT_NE(trial, std::string::npos) << text.out;
  EXPECT_LT(first, trial) << text.out;
  EXPECT_LT(trial, second) << "a part follows its run: " << text.out;
  ASSERT_EQ(Fb({"runs", "rm", "3", "--store", store_}).code, 0);

  auto show = Fb({"runs", "show", "last", "--json", "--store", store_});
  ASSERT_EQ(show.code, 0) << show.err;
  json s = json::parse(show.out);
  EXPECT_EQ(s["name"], "second");
  const json& cpu = s["metrics"]["proc.cpu_util"];
  EXPECT_EQ(cpu["unit"], "%");
  EXPECT_GE(cpu["count"].get<int>(), 2);
  EXPECT_LE(cpu["min"].get<double>(), cpu["median"].get<double>());
  EXPECT_LE(cpu["median"].get<double>(), cpu["p95"].get<double>());
  EXPECT_LE(cpu["p95"].get<double>(), cpu["max"].get<double>());

  auto csv = Fb({"runs", "export", "1", "--format", "csv", "--store", store_});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("t,", 0), 0u);
  EXPECT_NE(csv.out.find("proc.cpu_util"), std::string::npos);
  EXPECT_EQ(Lines(csv.out), 1 + runs[0]["samples"].get<size_t>());

  auto js = Fb({"runs", "export", "1", "--format", "json", "--store", store_});
  json e = json::parse(js.out);
  EXPECT_EQ(e["run"]["id"], 1);
  EXPECT_EQ(e["metrics"]["proc.rss_bytes"]["unit"], "bytes");
  EXPECT_EQ(e["metrics"]["proc.rss_bytes"]["t"].size(), e["metrics"]["proc.rss_bytes"]["v"].size());

  auto rm = Fb({"runs", "rm", "1", "--store", store_});
  EXPECT_EQ(rm.code, 0) << rm.err;
  runs = json::parse(Fb({"runs", "list", "--json", "--store", store_}).out);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["name"], "second");
}

// A store with many runs: the table shows the newest 20 and says how many
// it left out; --last, --all, --status and --name pick, and a tuning's
// trials come with it.
TEST_F(CommandsE2E, RunsListPicksTheNewestAndFilters) {
  {
    auto store = RunStore::Open(store_);
    ASSERT_TRUE(store.ok()) << store.status().message();
    auto add = [&](const std::string& name, std::optional<int64_t> parent, int exit_code) {
      RunInfo r;
      r.name = name;
      r.command = {"true"};
      r.start_time = 1000;
      r.parent_id = parent;
      int64_t id = (*store)->BeginRun(r).value();
      EXPECT_TRUE((*store)->FinishRun(id, 1001, exit_code, "finished").ok());
      return id;
    };
    for (int i = 1; i <= 25; ++i) add("job-" + std::to_string(i), std::nullopt, i == 7 ? 1 : 0);
    int64_t tuning = add("ResNet tuning", std::nullopt, 0);
    add("trial batch=64", tuning, 0);
    add("trial batch=128", tuning, 3);
  }
  auto names = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"runs", "list", "--json", "--store", store_});
    auto o = Fb(args);
    EXPECT_EQ(o.code, 0) << o.err;
    std::string out;
    for (const json& r : json::parse(o.out)) out += r["name"].get<std::string>() + ",";
    return out;
  };
  // A script gets every run unless it asks for fewer.
  EXPECT_EQ(json::parse(Fb({"runs", "list", "--json", "--store", store_}).out).size(), 28u);
  EXPECT_EQ(names({"--last", "2"}), "job-25,ResNet tuning,trial batch=64,trial batch=128,");
  EXPECT_EQ(names({"--status", "failed"}), "job-7,trial batch=128,");
  EXPECT_EQ(names({"--name", "resnet"}), "ResNet tuning,trial batch=64,trial batch=128,");
  EXPECT_EQ(names({"--name", "job-1", "--last", "3"}), "job-17,job-18,job-19,");

  auto table = Fb({"runs", "list", "--store", store_});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_EQ(table.out.find(" job-6 "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(" job-7 "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("(6 older runs not shown: --last N or --all)"), std::string::npos)
      << table.out;
  EXPECT_EQ(Lines(table.out), 1 + 20 + 2 + 1);  // header, 20 runs, 2 trials, the note
  auto all = Fb({"runs", "list", "--all", "--store", store_});
  EXPECT_EQ(Lines(all.out), 1 + 28);
  auto none = Fb({"runs", "list", "--status", "running", "--store", store_});
  EXPECT_EQ(none.code, 0);
  EXPECT_NE(none.out.find("none of the 28 runs"), std::string::npos) << none.out;
  auto bad = Fb({"runs", "list", "--status", "crashed", "--store", store_});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("failed"), std::string::npos) << bad.err;  // names the choices
}

// Housekeeping: runs picked by id, by age or beyond the newest N; a tuning
// goes with its trials, a run being recorded is never deleted, checkpoint
// files go only when asked (never one a kept run resumed from), and
// --vacuum gives the space back to the disk.
TEST_F(CommandsE2E, RunsRemoveByIdAgeAndCountWithPartsAndCheckpoints) {
  double now = static_cast<double>(std::time(nullptr));
  std::string ck = dir_ + "/ck";
  fs::create_directories(ck + "/a");
  fs::create_directories(ck + "/b");
  for (const char* f : {"/a/step-1.safetensors", "/a/step-2.safetensors", "/b/step-3.safetensors"})
    std::ofstream(ck + f) << "weights";
  int64_t live = 0;
  {
    auto store = RunStore::Open(store_);
    ASSERT_TRUE(store.ok()) << store.status().message();
    auto add = [&](const std::string& name, double age_days, std::optional<int64_t> parent,
                   std::vector<std::string> checkpoints, bool recording = false) {
      RunInfo r;
      r.name = name;
      r.command = {"true"};
      r.start_time = now - age_days * 86400;
      r.parent_id = parent;
      r.recorder_pid = recording ? static_cast<int>(::getpid()) : 0;
      int64_t id = (*store)->BeginRun(r).value();
      int64_t step = 0;
      for (const std::string& c : checkpoints)
        EXPECT_TRUE((*store)->AddCheckpoint(id, {++step, 1, ck + c, 7}).ok());
      if (!recording) {
        EXPECT_TRUE((*store)->FinishRun(id, r.start_time + 1, 0, "finished").ok());
      }
      return id;
    };
    int64_t tuning = add("old-tuning", 60, std::nullopt, {});
    add("trial-a", 60, tuning, {});
    add("trial-b", 60, tuning, {});
    int64_t old_train =
        add("old-train", 40, std::nullopt, {"/a/step-1.safetensors", "/a/step-2.safetensors"});
    std::vector<StepRecord> steps(30000);  // megabytes to give back
    for (size_t i = 0; i < steps.size(); ++i) steps[i].step = static_cast<int64_t>(i) + 1;
    EXPECT_TRUE((*store)->AppendSteps(old_train, steps).ok());
    add("resumed", 1, std::nullopt, {"/a/step-2.safetensors", "/b/step-3.safetensors"});
    live = add("recording", 50, std::nullopt, {}, true);
    add("recent", 0, std::nullopt, {});
  }
  auto names = [&] {
    std::string out;
    for (const json& r : json::parse(Fb({"runs", "list", "--json", "--store", store_}).out))
      out += r["name"].get<std::string>() + " ";
    return out;
  };
  const std::string all = "old-tuning trial-a trial-b old-train resumed recording recent ";
  ASSERT_EQ(names(), all);

  // Refused, and nothing deleted: a run being recorded, an unknown id.
  auto busy = Fb({"runs", "rm", "5", "6", "--store", store_});
  EXPECT_EQ(busy.code, 2);
  EXPECT_NE(busy.err.find("run 6 \"recording\" is being recorded"), std::string::npos) << busy.err;
  auto unknown = Fb({"runs", "rm", "1", "99", "--store", store_});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("no run 99"), std::string::npos) << unknown.err;
  EXPECT_EQ(Fb({"runs", "rm", "--store", store_}).code, 2);
  auto vacuum_busy = Fb({"runs", "rm", "--older-than", "30d", "--vacuum", "--store", store_});
  EXPECT_NE(vacuum_busy.err.find("--vacuum: run 6"), std::string::npos) << vacuum_busy.err;
  auto dry = Fb({"runs", "rm", "--older-than", "30d", "--dry-run", "--store", store_});
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("would delete run 1 \"old-tuning\" and its 2 parts"), std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("kept run 6: it is being recorded"), std::string::npos) << dry.out;
  EXPECT_EQ(names(), all);

  // By age, with the checkpoint files only the deleted runs recorded.
  auto old = Fb({"runs", "rm", "--older-than", "30d", "--checkpoints", "--store", store_});
  ASSERT_EQ(old.code, 0) << old.err;
  EXPECT_EQ(names(), "resumed recording recent ");
  EXPECT_FALSE(fs::exists(ck + "/a/step-1.safetensors"));
  EXPECT_TRUE(fs::exists(ck + "/a/step-2.safetensors")) << "the resumed run's starting point";
  EXPECT_NE(old.out.find("deleted 1 checkpoint file"), std::string::npos) << old.out;
  EXPECT_NE(old.out.find("free inside the store"), std::string::npos) << old.out;

  // All but the newest, then the file shrinks; checkpoint files stay unasked.
  {
    auto store = RunStore::Open(store_);
    ASSERT_TRUE((*store)->FinishRun(live, now, 0, "finished").ok());
  }
  auto size = [&] {
    return fs::file_size(store_) +
           (fs::exists(store_ + "-wal") ? fs::file_size(store_ + "-wal") : 0);
  };
  uintmax_t before = size();
  auto keep = Fb({"runs", "rm", "--keep", "1", "--vacuum", "--store", store_});
  ASSERT_EQ(keep.code, 0) << keep.err;
  EXPECT_EQ(names(), "recent ");
  EXPECT_NE(keep.out.find("kept their 2 checkpoint files"), std::string::npos) << keep.out;
  EXPECT_TRUE(fs::exists(ck + "/b/step-3.safetensors"));
  EXPECT_LT(size() * 4, before) << keep.out;
  auto store = RunStore::Open(store_);
  EXPECT_EQ((*store)->IntegrityCheck().value(), "ok");
}

TEST_F(CommandsE2E, StoreFromEnvironmentAndXdg) {
  ::setenv("FULLBURN_STORE", store_.c_str(), 1);
  auto o = Fb({"run", "-q", "--", "/bin/true"});
  ::unsetenv("FULLBURN_STORE");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(fs::exists(store_));
  std::string xdg = dir_ + "/xdg";
  fs::create_directories(xdg);
  ::setenv("XDG_DATA_HOME", xdg.c_str(), 1);
  o = Fb({"run", "-q", "--", "/bin/true"});
  ::unsetenv("XDG_DATA_HOME");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(fs::exists(xdg + "/fullburn/runs.db"));  // default directory created on first use
}

TEST_F(CommandsE2E, MetricsDocMatchesTheCatalog) {
  auto o = Fb({"metrics", "--markdown"});
  ASSERT_EQ(o.code, 0);
  EXPECT_NE(ReadText(std::string(SOURCE_DIR) + "/docs/metrics.md").find(o.out), std::string::npos)
      << "docs/metrics.md is out of date: paste the output of 'fullburn metrics --markdown'";
}

// ---- bad input: one line naming the problem and the fix, non-zero exit ----

void ExpectOneLineError(const testing::Outcome& o, const std::string& needle, int code = 2) {
  EXPECT_EQ(o.code, code) << o.err;
  EXPECT_EQ(Lines(o.err), 1u) << o.err;
  EXPECT_EQ(o.err.rfind("fullburn: ", 0), 0u) << o.err;
  EXPECT_NE(o.err.find(needle), std::string::npos) << o.err;
}

TEST_F(CommandsE2E, UnknownSubcommandAndFlag) {
  ExpectOneLineError(Fb({"frobnicate"}), "unknown command 'frobnicate'");
  ExpectOneLineError(Fb({"run", "--bogus", "--", "true"}), "--bogus");
  ExpectOneLineError(Fb({"watch", "--interval", "0"}), "--interval");
  ExpectOneLineError(Fb({"runs", "export", "1", "--format", "xml"}), "--format");
  ExpectOneLineError(Fb({"runs", "show", "nope", "--store", store_}), "not a run id");
  ExpectOneLineError(Fb({"runs", "show", "7", "--store", store_}), "no run 7");
}

// serve and fleet run in fullburn-net, found beside fullburn: without it
// they say so in one line, and every other command still works.
TEST_F(CommandsE2E, ServeAndFleetNeedTheNetworkHalfBesideFullburn) {
  const std::string alone = dir_ + "/bin/fullburn";
  fs::create_directories(dir_ + "/bin");
  fs::copy_file(FULLBURN_BIN, alone);
  auto serve = RunToEnd({alone, "serve", "--listen", "127.0.0.1:0"});
  ExpectOneLineError(serve, "'serve' needs fullburn-net beside this fullburn, which is missing");
  ExpectOneLineError(RunToEnd({alone, "fleet", "--prometheus", "http://127.0.0.1:9"}),
                     "'fleet' needs fullburn-net beside this fullburn");
  auto version = RunToEnd({alone, "version"});
  EXPECT_EQ(version.code, 0) << version.err;
  EXPECT_NE(version.out.find("serve, fleet: missing"), std::string::npos) << version.out;
  // Beside the real one, the same command reaches fullburn-net's parser.
  auto help = Fb({"serve", "--help"});
  EXPECT_EQ(help.code, 0) << help.err;
  EXPECT_NE(help.out.find("Usage: fullburn serve"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--web-config"), std::string::npos) << help.out;
  EXPECT_NE(Fb({"version"}).out.find("serve, fleet: " + fs::canonical(FULLBURN_BIN).parent_path().string() +
                                     "/fullburn-net"),
            std::string::npos);
}

TEST_F(CommandsE2E, StoreInAMissingDirectory) {
  auto o = Fb({"run", "--store", dir_ + "/missing/runs.db", "--", "/bin/true"});
  ExpectOneLineError(o, "does not exist: create it or pass --store");
  EXPECT_FALSE(fs::exists(dir_ + "/missing"));
}

TEST_F(CommandsE2E, StoreInAReadOnlyPlace) {
  ExpectOneLineError(Fb({"runs", "list", "--store", "/proc/runs.db"}), "--store");
}

TEST_F(CommandsE2E, CorruptStoreIsLeftAlone) {
  RecordRun("kept");
  std::string before = ReadText(store_);
  std::ofstream(dir_ + "/corrupt.db") << std::string(10000, 'x');
  ExpectOneLineError(Fb({"run", "--store", dir_ + "/corrupt.db", "--", "/bin/true"}),
                     "not a fullburn run store or is corrupt");
  EXPECT_EQ(ReadText(dir_ + "/corrupt.db"), std::string(10000, 'x'));
  EXPECT_EQ(ReadText(store_), before);  // the good store is untouched too
}

TEST_F(CommandsE2E, NvmlLibraryMissingSymbols) {
  ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML_BROKEN, 1);
  ExpectOneLineError(Fb({"run", "--store", store_, "--", "/bin/true"}), "lacks nvmlInit");
  ExpectOneLineError(Fb({"watch", "--once"}), "FULLBURN_NVML_LIBRARY");
  EXPECT_FALSE(fs::exists(store_));  // nothing started, nothing recorded
}

// ---- the input pipeline's commands ----

TEST_F(CommandsE2E, MakeDatasetPackAndBenchLoader) {
  std::string imgs = dir_ + "/imgs";
  auto make = Fb(
      {"make-dataset", "images", imgs, "--classes", "3", "--per-class", "10", "--size", "80x60"});
  ASSERT_EQ(make.code, 0) << make.err;
  EXPECT_NE(make.out.find("wrote 30 images"), std::string::npos);
  auto bench = Fb(
      {"bench", "loader", imgs, "--threads", "2", "--batch-size", "8", "--batches", "4", "--json"});
  ASSERT_EQ(bench.code, 0) << bench.err;
  json j = json::parse(bench.out);
  for (const char* key :
       {"images_per_s", "images_per_s_per_thread", "threads", "stages", "skipped"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_GT(j["images_per_s"].get<double>(), 0);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_EQ(j["skipped"], 0);
  EXPECT_GT(j["stages"]["decode_ms_per_image"].get<double>(), 0);
  auto pack = Fb({"pack", imgs, dir_ + "/raw", "--format", "raw", "--max-side", "40"});
  ASSERT_EQ(pack.code, 0) << pack.err;
  EXPECT_NE(pack.out.find("packed 30 images (raw"), std::string::npos) << pack.out;
  bench = Fb({"bench", "loader", dir_ + "/raw", "--batch-size", "8", "--batches", "4", "--json"});
  ASSERT_EQ(bench.code, 0) << bench.err;
  auto decode = Fb({"bench", "decode", imgs, "--batch-size", "8", "--batches", "2", "--json"});
  ASSERT_EQ(decode.code, 0) << decode.err;
  EXPECT_EQ(json::parse(decode.out)["failed"], 0);
  // A PNG among the JPEGs is decoded as the loader decodes it, not failed.
  std::vector<uint8_t> gray(16 * 12 * 3, 128);
  auto png = EncodePng(gray.data(), 16, 12);
  ASSERT_TRUE(png.ok());
  std::ofstream(imgs + "/class_000/extra.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  decode = Fb({"bench", "decode", imgs, "--batch-size", "31", "--batches", "1", "--json"});
  ASSERT_EQ(decode.code, 0) << decode.err;
  EXPECT_EQ(json::parse(decode.out)["failed"], 0) << decode.out;
  EXPECT_EQ(json::parse(decode.out)["png"], 1) << decode.out;
  auto tokens = Fb({"make-dataset", "tokens", dir_ + "/t.bin", "--tokens", "1000"});
  ASSERT_EQ(tokens.code, 0) << tokens.err;
  EXPECT_EQ(fs::file_size(dir_ + "/t.bin"), 2000u);
}

// python/fullburn_pack.py reads what fullburn pack wrote, as fullburn's own
// reader does: the same classes, labels and record bytes, images through
// Pillow the size the index says, and a damaged pack refused with the fix.
TEST_F(CommandsE2E, PythonReadsPacksLikeTheLoader) {
  std::string imgs = MakeImages("3", "7", "48x40");
  std::string script = dir_ + "/read.py";
  std::ofstream(script) << "import json, sys\n"
                           "sys.path.insert(0, '" SOURCE_DIR
                           "/python')\n"
                           "from fullburn_pack import PackDataset, PackError\n"
                           "try:\n"
                           "    d = PackDataset(sys.argv[1])\n"
                           "except PackError as e:\n"
                           "    sys.exit('error: %s' % e)\n"
                           "items = []\n"
                           "for i in range(len(d)):\n"
                           "    img, label = d[i]\n"
                           "    items.append({'label': label, 'bytes': sum(d.raw(i)),\n"
                           "                  'size': list(img.size), 'mode': img.mode,\n"
                           "                  'pixels': sum(img.tobytes())})\n"
                           "print(json.dumps({'format': d.format, 'classes': d.classes,\n"
                           "                  'items': items}))\n";
  for (std::string format : {"raw", "jpeg"}) {
    std::string pack = dir_ + "/" + format;
    ASSERT_EQ(Fb({"pack", imgs, pack, "--format", format, "--max-side", "32"}).code, 0);
    auto o = RunToEnd({"/usr/bin/python3", script, pack});
    ASSERT_EQ(o.code, 0) << o.err;
    json j = json::parse(o.out);
    auto reader = PackReader::Open(pack);
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    EXPECT_EQ(j["format"], format);
    EXPECT_EQ(j["classes"].get<std::vector<std::string>>(), (*reader)->classes());
    ASSERT_EQ(j["items"].size(), (*reader)->records().size());
    for (size_t i = 0; i < (*reader)->records().size(); ++i) {
      const PackRecord& r = (*reader)->records()[i];
      const uint8_t* p = (*reader)->Data(r);
      int64_t sum = 0;
      for (uint32_t k = 0; k < r.size; ++k) sum += p[k];
      const json& item = j["items"][i];
      EXPECT_EQ(item["label"], r.label) << i;
      EXPECT_EQ(item["bytes"], sum) << i;
      EXPECT_EQ(item["size"], json::array({int(r.width), int(r.height)})) << i;
      EXPECT_EQ(item["mode"], "RGB");
      if (format == "raw") {
        EXPECT_EQ(item["pixels"], sum) << i;  // the pixels as stored
      }
    }
  }
  std::string shard = dir_ + "/raw/shard-00000.fbp";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  auto truncated = RunToEnd({"/usr/bin/python3", script, dir_ + "/raw"});
  EXPECT_NE(truncated.code, 0);
  EXPECT_NE(truncated.err.find("(truncated?): re-run fullburn pack"), std::string::npos)
      << truncated.err;
  std::string index = dir_ + "/jpeg/index.fbpx";
  std::string text = ReadText(index);
  text[30] ^= 0x55;
  std::ofstream(index, std::ios::binary | std::ios::trunc) << text;
  auto corrupt = RunToEnd({"/usr/bin/python3", script, dir_ + "/jpeg"});
  EXPECT_NE(corrupt.code, 0);
  EXPECT_NE(corrupt.err.find("is corrupt (checksum mismatch): re-run fullburn pack"),
            std::string::npos)
      << corrupt.err;
}

TEST_F(CommandsE2E, BenchLoaderIntoDeviceMemory) {
  std::string imgs = MakeImages("2", "8", "64x48");
  auto o = Fb({"bench", "loader", imgs, "--device", "cpu", "--batch-size", "4", "--batches", "3",
               "--json"});
  if (!HAVE_TORCH) {
    ExpectOneLineError(o, "needs the training half");
    return;
  }
  ASSERT_EQ(o.code, 0) << o.err;
  json j = json::parse(o.out);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_GT(j["images_per_s"].get<double>(), 0);
  ExpectOneLineError(Fb({"bench", "loader", imgs, "--device", "tpu", "--batch-size", "4"}),
                     "is not a torch device");
}

TEST_F(CommandsE2E, PipelineBadInputs) {
  fs::create_directories(dir_ + "/empty/cats");
  ExpectOneLineError(Fb({"bench", "loader", dir_ + "/empty"}), "has no JPEG or PNG files");
  ExpectOneLineError(Fb({"bench", "loader", dir_ + "/nowhere"}), "does not exist");
  ExpectOneLineError(Fb({"make-dataset", "images", dir_ + "/x", "--size", "big"}), "is not WxH");
  std::string imgs = dir_ + "/imgs";
  ASSERT_EQ(
      Fb({"make-dataset", "images", imgs, "--classes", "2", "--per-class", "4", "--size", "32x32"})
          .code,
      0);
  ASSERT_EQ(Fb({"pack", imgs, dir_ + "/p"}).code, 0);
  ExpectOneLineError(Fb({"pack", imgs, dir_ + "/p"}), "exists and is not empty");
  // A disk that fills up mid-pack (RLIMIT_FSIZE, SIGXFSZ ignored: writes past
  // 8 KiB fail as on a full disk): one line, and no half-written pack left.
  auto full = RunToEnd({"bash", "-c", "trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"", FULLBURN_BIN,
                        "pack", imgs, dir_ + "/full", "--format", "raw"});
  ExpectOneLineError(full, "the partial pack was removed");
  EXPECT_FALSE(fs::exists(dir_ + "/full"));
  auto made =
      RunToEnd({"bash", "-c", "trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"", FULLBURN_BIN,
                "make-dataset", "images", dir_ + "/big", "--per-class", "3", "--size", "512x512"});
  ExpectOneLineError(made, "free space");
  for (const auto& e : fs::recursive_directory_iterator(dir_ + "/big"))
    EXPECT_EQ(e.path().extension(), e.is_directory() ? "" : ".jpg") << e.path();  // no .tmp left
  std::ofstream(dir_ + "/p/index.fbpx", std::ios::trunc) << "FBPACK01 but not really";
  ExpectOneLineError(Fb({"bench", "loader", dir_ + "/p", "--batch-size", "2"}),
                     "re-run fullburn pack");
  ExpectOneLineError(Fb({"bench", "loader", imgs, "--batch-size", "64"}), "fewer than one batch");
}

// ---- serve ----

int PortFrom(const std::string& err) {
  std::smatch m;
  std::regex re("http://127\\.0\\.0\\.1:(\\d+)/metrics");
  return std::regex_search(err, m, re) ? std::stoi(m[1]) : -1;
}

// Starts `fullburn serve --listen 127.0.0.1:0 ARGS...`; the port it took
// (-1 if it said none within 5 s).
int StartServe(Background* b, std::vector<std::string> args, const std::string& tag) {
  args.insert(args.begin(), {FULLBURN_BIN, "serve", "--listen", "127.0.0.1:0"});
  testing::Start(b, args, tag);
  int port = -1;
  for (int i = 0; i < 250 && port < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    port = PortFrom(b->Err());
  }
  return port;
}

std::string RawRequest(int port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return "";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  // The connection stays open (keep-alive): read until the headers are in.
  std::string reply;
  char buf[4096];
  ssize_t n;
  while (reply.find("\r\n\r\n") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0)
    reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply;
}

TEST_F(CommandsE2E, ServeExposesPrometheusMetrics) {
  FakeGpu(91);
  Background b;
  int port = StartServe(&b, {"--interval", "0.2", "--store", store_}, "serve");
  ASSERT_GT(port, 0) << b.Err();
  httplib::Client client("127.0.0.1", port);
  // The host's CPU share is a difference of two readings: it is exported from
  // the second sample on, which a busy machine may take after the port is up.
  auto res = client.Get("/metrics");
  for (int i = 0; i < 100 && res && res->body.find("fullburn_host_cpu_util") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    res = client.Get("/metrics");
  }
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  EXPECT_NE(
      res->body.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-cmd\",modelName=\"Fake A100\""),
      std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("} 91\n"), std::string::npos);
  EXPECT_NE(res->body.find("DCGM_FI_DEV_FB_USED{"), std::string::npos);
  EXPECT_NE(res->body.find("# TYPE fullburn_host_cpu_util gauge"), std::string::npos);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok\n");
  EXPECT_EQ(client.Get("/nope")->status, 404);
  // Malformed requests get a 4xx, or (a request line that is not one:
  // libmicrohttpd's choice) a closed connection, and the server lives on.
  std::string reply = RawRequest(port, "GARBAGE\r\n\r\n");
  EXPECT_TRUE(reply.empty() || reply.rfind("HTTP/1.1 4", 0) == 0) << reply;
  reply = RawRequest(port, "GET\r\n\r\n");
  EXPECT_TRUE(reply.empty() || reply.rfind("HTTP/1.1 4", 0) == 0) << reply;
  reply = RawRequest(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(reply.substr(0, 10), "HTTP/1.1 4") << reply;
  reply = RawRequest(port, std::string(100000, 'A') + "\r\n\r\n");
  EXPECT_EQ(reply.substr(0, 10), "HTTP/1.1 4") << reply;
  EXPECT_EQ(client.Get("/healthz")->status, 200);
  ::kill(b.pid, SIGTERM);
  EXPECT_EQ(b.Wait(10), 0) << b.Err();
}

TEST_F(CommandsE2E, ServeRejectsBadListen) {
  ExpectOneLineError(Fb({"serve", "--listen", "localhost"}), "is not HOST:PORT");
  Background first;
  int port = StartServe(&first, {"--store", store_}, "serve_a");
  ASSERT_GT(port, 0) << first.Err();
  auto second = Fb({"serve", "--listen", "127.0.0.1:" + std::to_string(port), "--store", store_});
  EXPECT_EQ(second.code, 2);
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:"), std::string::npos) << second.err;
  // A web config it cannot honour stops it before it listens, naming the field.
  const std::string web = dir_ + "/web.yml";
  std::ofstream(web) << "tls_server_config:\n  cert_file: " SOURCE_DIR "/tests/http/fixtures/server.pem\n"
                        "  key_file: " SOURCE_DIR "/tests/http/fixtures/rogue.key\n";
  ExpectOneLineError(Fb({"serve", "--listen", "127.0.0.1:0", "--web-config", web}),
                     "web config " + web + ": tls_server_config: the certificate and key do not load");
  ExpectOneLineError(Fb({"serve", "--listen", "127.0.0.1:0", "--web-config", dir_ + "/none.yml"}),
                     "web config " + dir_ + "/none.yml: cannot read it");
}

// The jobs recorded on this host are exported beside the machine: a
// starved loop under fullburn run (it marks its steps) shows its step, rate
// and data wait within seconds, what limits it after 20 s of steps, and is
// gone from /metrics once it ends. fullburn watch shows the same. Time:
// about 25 s, the 20 s of steps before the first diagnosis (LiveDiagnosis::kMinS).
TEST_F(CommandsE2E, ServeAndWatchShowTheJobsRecordedOnThisHost) {
  const std::string loop = std::string(SOURCE_DIR) + "/examples/scenarios/loop.py";
  // Before any recording there is no store: watching and serving read it
  // and never create it; serve opens it once the job's run has made it.
  ASSERT_FALSE(std::filesystem::exists(store_));
  auto none = Fb({"watch", "--once", "--json", "--store", store_});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_TRUE(nlohmann::json::parse(none.out)["jobs"].empty()) << none.out;
  EXPECT_EQ(none.err, "");
  Background serve;
  int port = StartServe(&serve, {"--interval", "0.25", "--store", store_}, "serve_jobs");
  ASSERT_GT(port, 0) << serve.Err();
  EXPECT_FALSE(std::filesystem::exists(store_)) << "serve created the store";
  Background job;
  testing::Start(&job,
                 {FULLBURN_BIN, "run", "-q", "--interval", "0.25", "--store", store_, "--",
                  "python3", loop, "starved", "--seconds", "60"},
                 "serve_job");
  httplib::Client client("127.0.0.1", port);
  // Polls /metrics until `what` shows (up to `seconds`); the last body.
  auto await = [&](const std::string& what, double seconds) {
    std::string body;
    for (double waited = 0; waited < seconds; waited += 0.25) {
      if (auto res = client.Get("/metrics")) body = res->body;
      if (body.find(what) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return body;
  };
  const std::string job_labels = "{run=\"1\",name=\"python3\",Hostname=";
  std::string body = await("fullburn_job_data_wait_ratio" + job_labels, 20);
  EXPECT_NE(body.find("fullburn_job_step" + job_labels), std::string::npos) << body;
  EXPECT_NE(body.find("fullburn_job_samples_per_second" + job_labels), std::string::npos) << body;
  std::smatch wait;
  ASSERT_TRUE(std::regex_search(body, wait,
                                std::regex("fullburn_job_data_wait_ratio\\{[^}]*\\} ([0-9.e-]+)")))
      << body;
  EXPECT_GT(std::stod(wait[1]), 0.3) << body;  // 40 ms of loading per 10 ms of work
  auto watched = Fb({"watch", "--once", "--json", "--store", store_});
  ASSERT_EQ(watched.code, 0) << watched.err;
  nlohmann::json listed = nlohmann::json::parse(watched.out)["jobs"];
  ASSERT_EQ(listed.size(), 1u) << watched.out;
  EXPECT_EQ(listed[0]["run"], 1);
  EXPECT_GT(listed[0].value("step", 0), 0) << listed;
  EXPECT_GT(listed[0].value("data_wait_share", 0.0), 0.3) << listed;
  EXPECT_NE(body.find("fullburn_host_cpu_util{"), std::string::npos);  // the machine's, still
  // input_workers, or input_cpu when the cores are busy with other work.
  body = await("fullburn_job_time_lost_ratio" + job_labels, 45);
  EXPECT_NE(body.find(",cause=\"input_"), std::string::npos) << body;
  watched = Fb({"watch", "--once", "--store", store_});
  EXPECT_NE(watched.out.find("JOBS recorded here"), std::string::npos) << watched.out;
  EXPECT_NE(watched.out.find(" | now: input_"), std::string::npos) << watched.out;

  ::kill(job.pid, SIGTERM);  // fullburn run passes it on; the run ends
  EXPECT_EQ(job.Wait(20), 128 + SIGTERM) << job.Err();
  for (int i = 0; i < 40 && body.find("fullburn_job_") != std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    body = client.Get("/metrics")->body;
  }
  EXPECT_EQ(body.find("fullburn_job_"), std::string::npos) << body;
  watched = Fb({"watch", "--once", "--store", store_});
  EXPECT_EQ(watched.out.find("JOBS recorded here"), std::string::npos) << watched.out;
  ::kill(serve.pid, SIGTERM);
  EXPECT_EQ(serve.Wait(10), 0) << serve.Err();
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

TEST(LaunchE2E, StartsRanksWithTorchrunsEnvironment) {
  auto o = testing::RunToEnd(
      {FULLBURN_BIN, "launch", "--nproc", "3", "--", "sh", "-c",
       "echo rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK at=$MASTER_ADDR:$MASTER_PORT"});
  ASSERT_EQ(o.code, 0) << o.err;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(o.out.find("rank=" + std::to_string(r) + "/3 local=" + std::to_string(r) +
                         " at=127.0.0.1:"),
              std::string::npos)
        << o.out;
}

TEST(LaunchE2E, OneFailedRankStopsTheOthersWithItsExitCode) {
  auto start = std::chrono::steady_clock::now();
  auto o = testing::RunToEnd({FULLBURN_BIN, "launch", "--nproc", "3", "--grace", "2", "--", "sh",
                              "-c", "if [ $RANK = 2 ]; then sleep 0.2; exit 3; fi; exec sleep 60"});
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(o.code, 3);
  EXPECT_LT(took, 50);  // not the 60 s the other ranks would sleep
  EXPECT_NE(o.err.find("rank 2 exited with code 3"), std::string::npos) << o.err;
  // A rank that ignores SIGTERM is killed after the grace period.
  auto stubborn = testing::RunToEnd(
      {FULLBURN_BIN, "launch", "--nproc", "2", "--grace", "1", "--", "sh", "-c",
       "trap '' TERM; if [ $RANK = 1 ]; then exit 4; fi; while :; do sleep 0.1; done"});
  EXPECT_EQ(stubborn.code, 4);
  auto bad = testing::RunToEnd({FULLBURN_BIN, "launch", "--nnodes", "2", "--", "true"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--master"), std::string::npos);
}

}  // namespace
}  // namespace fullburn
