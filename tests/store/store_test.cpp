#include "fullburn/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "replay_env.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_store");
    path_ = dir_ + "/runs.db";
  }
  std::unique_ptr<RunStore> OpenOk() {
    auto r = RunStore::Open(path_);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
  static Snapshot Snap(double t, double util) {
    Snapshot s;
    s.unix_time = 1000 + t;
    s.mono_time = t;
    s.host.cpu.util = util;
    GpuSample g;
    g.util = util / 2;
    s.gpus.push_back(g);
    return s;
  }
  std::string dir_, path_;
};

TEST_F(StoreTest, RoundTripsRunsAndSamples) {
  auto store = OpenOk();
  ASSERT_TRUE(store);
  RunInfo info;
  info.name = "train";
  info.command = {"python3", "train.py", "--lr", "3e-4"};
  info.cwd = "/work";
  info.start_time = 1000;
  info.recorder_pid = ::getpid();
  info.config_json = R"({"interval_s":0.5})";
  auto id = store->BeginRun(info);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store->AppendSamples(*id, 1000, {Snap(0, 10), Snap(0.5, 20)}).ok());
  ASSERT_TRUE(store->AppendSamples(*id, 1000, {Snap(1.0, 30)}).ok());
  ASSERT_TRUE(store->FinishRun(*id, 1001.5, 3, "finished").ok());

  auto run = store->GetRun("last");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->id, *id);
  EXPECT_EQ(run->command, info.command);
  EXPECT_EQ(run->status, "finished");
  EXPECT_EQ(*run->exit_code, 3);
  EXPECT_DOUBLE_EQ(*run->end_time, 1001.5);
  EXPECT_EQ(run->sample_count, 3);
  EXPECT_EQ(run->config_json, info.config_json);
  auto samples = store->LoadSamples(*id);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 2u);
  const Series& cpu = samples->at("host.cpu_util");
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_DOUBLE_EQ(cpu[1].t, 0.5);
  EXPECT_DOUBLE_EQ(cpu[2].v, 30);
  EXPECT_DOUBLE_EQ(samples->at("gpu0.util")[2].v, 15);
  EXPECT_EQ(*store->IntegrityCheck(), "ok");
}

TEST_F(StoreTest, ReopenKeepsRunsAndListsThemInOrder) {
  {
    auto store = OpenOk();
    RunInfo a, b;
    a.name = "a";
    b.name = "b";
    ASSERT_TRUE(store->BeginRun(a).ok());
    ASSERT_TRUE(store->BeginRun(b).ok());
  }
  auto store = OpenOk();
  auto runs = store->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].name, "a");
  EXPECT_EQ((*runs)[1].name, "b");
  EXPECT_EQ(store->GetRun("1")->name, "a");
}

TEST_F(StoreTest, DeleteRemovesRunAndSamples) {
  auto store = OpenOk();
  RunInfo a;
  a.name = "a";
  auto id = store->BeginRun(a);
  ASSERT_TRUE(store->AppendSamples(*id, 1000, {Snap(0, 1)}).ok());
  ASSERT_TRUE(store->DeleteRun(*id).ok());
  EXPECT_FALSE(store->GetRun(std::to_string(*id)).ok());
  EXPECT_TRUE(store->LoadSamples(*id)->empty());
}

TEST_F(StoreTest, UnknownRunsGiveClearErrors) {
  auto store = OpenOk();
  auto last = store->GetRun("last");
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("has no runs yet"), std::string::npos);
  auto missing = store->GetRun("42");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no run 42"), std::string::npos);
  auto bad = store->GetRun("abc");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a run id"), std::string::npos);
}

TEST_F(StoreTest, MissingDirectoryIsRefused) {
  auto r = RunStore::Open(dir_ + "/nope/runs.db");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not exist: create it or pass --store"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/nope"));
}

TEST_F(StoreTest, DirectoryThatCannotHoldFilesIsRefused) {
  // /proc exists but no file can be created in it, even by root.
  auto r = RunStore::Open("/proc/fullburn-test.db");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--store"), std::string::npos) << r.status().message();
}

TEST_F(StoreTest, CorruptFileIsRefusedAndLeftUntouched) {
  std::string junk(64 * 1024, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 7919) % 251);
  std::ofstream(path_, std::ios::binary) << junk;
  auto r = RunStore::Open(path_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
  EXPECT_NE(r.status().message().find("not a fullburn run store or is corrupt"), std::string::npos);
  EXPECT_EQ(testing::ReadText(path_), junk);
}

TEST_F(StoreTest, ForeignSqliteFileIsRefused) {
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_exec(db, "CREATE TABLE other(x); INSERT INTO other VALUES (1);", nullptr, nullptr,
               nullptr);
  sqlite3_close(db);
  auto r = RunStore::Open(path_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a fullburn run store"), std::string::npos);
}

TEST_F(StoreTest, NewerSchemaIsRefused) {
  OpenOk().reset();
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  auto r = RunStore::Open(path_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("newer than this fullburn"), std::string::npos);
}

TEST_F(StoreTest, RunOfADeadRecorderReadsInterrupted) {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // now a pid that no longer exists
  auto store = OpenOk();
  RunInfo info;
  info.name = "killed";
  info.recorder_pid = child;
  auto id = store->BeginRun(info);
  EXPECT_EQ(store->GetRun(std::to_string(*id))->status, "interrupted");
  info.recorder_pid = ::getpid();
  auto live = store->BeginRun(info);
  EXPECT_EQ(store->GetRun(std::to_string(*live))->status, "running");
  auto done = store->BeginRun(info);
  ASSERT_TRUE(store->FinishRun(*done, 1, 0, "finished").ok());
  // What fullburn serve polls: only the live one.
  std::vector<RunInfo> running = store->ListRunning().value();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].id, *live);
}

TEST_F(StoreTest, ProcessesOpeningANewStoreTogetherAllSucceed) {
  // Ranks of one job start together and open the same new store. Two races
  // failed here: switching the new file to WAL answered "database is locked"
  // at once (about one start in four), and a migration that committed between
  // two reads made the file look foreign ("not a fullburn run store").
  for (int round = 0; round < 20; ++round) {
    std::string path = dir_ + "/race" + std::to_string(round) + ".db";
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < 4; ++i) {
      pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        char c;
        (void)!::read(go[0], &c, 1);  // returns when the parent closes its end
        auto store = RunStore::Open(path);
        if (!store.ok()) {
          std::fprintf(stderr, "%s\n", store.status().message().c_str());
          ::_exit(1);
        }
        ::_exit(store.value()->BeginRun(RunInfo{}).ok() ? 0 : 2);
      }
      children.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (pid_t pid : children) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round;
    }
    auto store = RunStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ(store.value()->ListRuns().value().size(), 4u);
    if (HasFailure()) return;
  }
}

TEST_F(StoreTest, BatchWriterCommitsAboutOnceASecond) {
  auto store = OpenOk();
  RunInfo info;
  auto id = store->BeginRun(info);
  BatchWriter w(store.get(), *id, 1000, 1.0);
  ASSERT_TRUE(w.Add(Snap(0.0, 1)).ok());  // the first sample is written at once
  EXPECT_EQ(store->GetRun("last")->sample_count, 1);
  for (double t = 0.1; t < 0.95; t += 0.1) ASSERT_TRUE(w.Add(Snap(t, 1)).ok());
  EXPECT_EQ(store->GetRun("last")->sample_count, 1);  // still pending
  ASSERT_TRUE(w.Add(Snap(1.0, 1)).ok());
  EXPECT_EQ(store->GetRun("last")->sample_count, 11);
  ASSERT_TRUE(w.Add(Snap(1.1, 1)).ok());
  ASSERT_TRUE(w.Flush().ok());
  EXPECT_EQ(store->GetRun("last")->sample_count, 12);
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

TEST_F(StoreTest, StepsCheckpointsAndEventsRoundTrip) {
  auto store = OpenOk();
  ASSERT_TRUE(store);
  RunInfo info;
  info.name = "train";
  info.start_time = 1000;
  int64_t id = store->BeginRun(info).value();
  std::vector<StepRecord> steps;
  for (int i = 1; i <= 3; ++i) {
    StepRecord r;
    r.step = i;
    r.epoch = i / 2;
    r.t = i * 0.5;
    r.loss = 2.0 / i;
    r.lr = 0.1 * i;
    r.samples = 64;
    r.step_s = 0.25;
    if (i != 2) r.forward_s = 0.1;
    r.loss_scale = 65536;
    steps.push_back(r);
  }
  steps[2].loss = INFINITY;
  steps[2].skipped = true;
  ASSERT_TRUE(store->AppendSteps(id, steps).ok());
  auto back = store->LoadSteps(id);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_DOUBLE_EQ((*back)[0].loss, 2.0);
  EXPECT_DOUBLE_EQ((*back)[1].lr, 0.2);
  EXPECT_FALSE((*back)[1].forward_s.has_value());
  EXPECT_DOUBLE_EQ(*(*back)[0].forward_s, 0.1);
  EXPECT_TRUE(std::isinf((*back)[2].loss) && (*back)[2].loss > 0);  // a diverged loss stays inf
  EXPECT_TRUE((*back)[2].skipped);
  EXPECT_EQ((*back)[2].samples, 64);

  ASSERT_TRUE(store->AddCheckpoint(id, {10, 5.0, "/tmp/x.ckpt", 1234, 0.01, 0.2}).ok());
  ASSERT_TRUE(store->AddEvent(id, {1.0, "batch_trial", R"({"batch":64})"}).ok());
  auto ck = store->LoadCheckpoints(id);
  ASSERT_TRUE(ck.ok());
  ASSERT_EQ(ck->size(), 1u);
  EXPECT_EQ((*ck)[0].path, "/tmp/x.ckpt");
  EXPECT_EQ((*ck)[0].bytes, 1234);
  auto ev = store->LoadEvents(id);
  ASSERT_TRUE(ev.ok());
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].kind, "batch_trial");

  ASSERT_TRUE(store->DeleteRun(id).ok());
  EXPECT_TRUE(store->LoadSteps(id)->empty());
  EXPECT_TRUE(store->LoadCheckpoints(id)->empty());
  EXPECT_TRUE(store->LoadEvents(id)->empty());
}

// fullburn serve reads what a running job added since its last look: the
// rows after a time, in the same order as a whole read, nothing older.
TEST_F(StoreTest, ReadsOnlyWhatCameAfterATime) {
  auto store = OpenOk();
  ASSERT_TRUE(store);
  RunInfo info;
  info.start_time = 1000;
  int64_t id = store->BeginRun(info).value();
  int64_t other = store->BeginRun(info).value();
  std::vector<StepRecord> steps;
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 1; i <= 4; ++i) {
      StepRecord r;
      r.rank = rank;
      r.step = i;
      r.t = i + 0.1 * rank;
      r.step_s = 1;
      steps.push_back(r);
    }
  ASSERT_TRUE(store->AppendSteps(id, steps).ok());
  ASSERT_TRUE(store->AppendSteps(other, steps).ok());
  ASSERT_TRUE(store->AppendSamples(id, 1000, {Snap(1, 10), Snap(2, 20), Snap(3, 30)}).ok());
  ASSERT_TRUE(store->AddEvent(id, {1.5, "evaluation", "{}"}).ok());
  ASSERT_TRUE(store->AddEvent(id, {3.5, "evaluation", "{}"}).ok());

  std::vector<StepRecord> late = store->LoadSteps(id, 2.5).value();
  std::vector<std::pair<int, int64_t>> got;
  for (const StepRecord& r : late) got.push_back({r.rank, r.step});
  EXPECT_EQ(got, (std::vector<std::pair<int, int64_t>>{{0, 3}, {0, 4}, {1, 3}, {1, 4}}));
  EXPECT_EQ(store->LoadSteps(id, 4.1).value().size(), 0u);  // after: not at
  EXPECT_EQ(store->LoadSteps(id).value().size(), 8u);

  auto samples = store->LoadSamples(id, 1.5).value();
  ASSERT_EQ(samples.size(), 2u);
  const Series& cpu = samples.at("host.cpu_util");
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_DOUBLE_EQ(cpu[0].t, 2);
  EXPECT_DOUBLE_EQ(cpu[1].v, 30);
  EXPECT_EQ(store->LoadSamples(id).value().at("gpu0.util").size(), 3u);

  auto events = store->LoadEvents(id, 2).value();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_DOUBLE_EQ(events[0].t, 3.5);
}

// A store written by the first release (schema v1) is migrated in place and
// keeps its runs and samples.
TEST_F(StoreTest, SchemaV1StoreIsMigrated) {
  fs::copy_file(std::string(STORE_FIXTURES_DIR) + "/store_v1.db", path_);
  auto store = OpenOk();
  ASSERT_TRUE(store);
  auto runs = store->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].command.front(), "sleep");
  auto samples = store->LoadSamples((*runs)[0].id);
  ASSERT_TRUE(samples.ok());
  EXPECT_FALSE(samples->empty());
  EXPECT_FALSE((*runs)[0].parent_id);
  StepRecord r;
  r.step = 1;
  EXPECT_TRUE(store->AppendSteps((*runs)[0].id, {r}).ok());
  RunInfo child;
  child.name = "trial";
  child.parent_id = (*runs)[0].id;
  auto child_id = store->BeginRun(child);
  ASSERT_TRUE(child_id.ok());
  EXPECT_EQ(store->GetRun(std::to_string(*child_id))->parent_id, (*runs)[0].id);
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), kSchemaVersion);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

TEST(StepEvents, StepRoundTripsThroughTheLineFormat) {
  StepRecord r;
  r.rank = 1;
  r.step = 42;
  r.epoch = 3;
  r.t = 12.5;
  r.loss = 0.75;
  r.lr = 0.1;
  r.loss_scale = 65536;
  r.samples = 64;
  r.step_s = 0.2;
  r.data_wait_s = 0.05;
  r.forward_s = 0.07;
  r.comm_s = 0.01;
  r.skipped = true;
  std::string line = StepEventLine(r, 1000);
  ASSERT_EQ(line.back(), '\n');
  auto e = ParseEventLine(line.substr(0, line.size() - 1), 1000);
  ASSERT_TRUE(e.ok()) << e.status().message();
  ASSERT_TRUE(e->is_step);
  EXPECT_EQ(e->step.rank, 1);
  EXPECT_EQ(e->step.step, 42);
  EXPECT_EQ(e->step.epoch, 3);
  EXPECT_DOUBLE_EQ(e->step.t, 12.5);
  EXPECT_DOUBLE_EQ(e->step.loss, 0.75);
  EXPECT_DOUBLE_EQ(*e->step.loss_scale, 65536);
  EXPECT_EQ(e->step.samples, 64);
  EXPECT_DOUBLE_EQ(*e->step.data_wait_s, 0.05);
  EXPECT_DOUBLE_EQ(*e->step.comm_s, 0.01);
  EXPECT_FALSE(e->step.h2d_s.has_value());  // absent stays absent, never 0
  EXPECT_TRUE(e->step.skipped);
}

TEST(StepEvents, ADivergedLossKeepsItsValue) {
  StepRecord r;
  r.step = 7;
  r.step_s = 0.1;
  for (double loss : {double(INFINITY), -double(INFINITY), double(NAN)}) {
    r.loss = loss;
    std::string line = StepEventLine(r, 0);
    ASSERT_TRUE(nlohmann::json::accept(line)) << "valid JSON: " << line;
    auto e = ParseEventLine(line, 0);
    ASSERT_TRUE(e.ok()) << line << ": " << e.status().message();
    if (std::isnan(loss))
      EXPECT_TRUE(std::isnan(e->step.loss)) << line;
    else
      EXPECT_EQ(e->step.loss, loss) << line;
  }
  // What Python's json.dumps writes for float("nan") and float("-inf"): bare
  // words, not JSON. Words inside strings are left alone.
  auto nan = ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":1,"loss":NaN})", 0);
  ASSERT_TRUE(nan.ok()) << nan.status().message();
  EXPECT_TRUE(std::isnan(nan->step.loss));
  auto minus =
      ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":1,"loss":-Infinity})", 0);
  ASSERT_TRUE(minus.ok()) << minus.status().message();
  EXPECT_EQ(minus->step.loss, -INFINITY);
  auto named =
      ParseEventLine(R"({"kind":"event","name":"NaN \"Infinity\" check","time":1,"x":NaN})", 0);
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->event.kind, "NaN \"Infinity\" check");
  // No loss at all is NaN (unknown), never 0; a loss that is no number is an error.
  auto none = ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":1})", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(std::isnan(none->step.loss));
  EXPECT_NE(ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":1,"loss":"high"})", 0)
                .status()
                .message()
                .find("\"loss\""),
            std::string::npos);
}

// Found by fuzz/events_fuzz (fuzz/regressions/events/): a field of another
// type threw out of the parser (json's value()), which ended fullburn run.
TEST(StepEvents, FieldsOfTheWrongTypeAreBadLinesNotCrashes) {
  const std::string step = R"({"kind":"step","step":1,"time":5,"step_s":1,)";
  auto message = [](const std::string& line) { return ParseEventLine(line, 0).status().message(); };
  EXPECT_EQ(message(R"({"kind":0})"), R"("kind" must be "step" or "event")");
  EXPECT_EQ(message(step + R"("rank":"0"})"), R"("rank" must be a whole number)");
  EXPECT_EQ(message(step + R"("epoch":1e300})"), R"("epoch" must be a whole number)");
  EXPECT_EQ(message(step + R"("samples":2.5})"), R"("samples" must be a whole number)");
  EXPECT_EQ(message(step + R"("lr":"x"})"), R"("lr" must be a number)");
  EXPECT_EQ(message(step + R"("skipped":1})"), R"("skipped" must be true or false)");
  auto whole = ParseEventLine(step + R"("rank":3.0,"samples":64,"lr":0.1,"skipped":true})", 0);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(whole->step.rank, 3);
  EXPECT_EQ(whole->step.samples, 64);
  EXPECT_TRUE(whole->step.skipped);

  std::string path = ::testing::TempDir() + "/fb_events_types.jsonl";
  std::ofstream(path, std::ios::trunc) << step << R"("rank":1})" << "\n"
                                       << R"({"kind":[]})" << "\n";
  EventFileReader reader(path);
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  EXPECT_EQ(steps.size(), 1u);
  EXPECT_EQ(reader.bad_lines(), 1);
  EXPECT_EQ(reader.first_error(), "line 2 of " + path + R"(: "kind" must be "step" or "event")");
}

TEST(StepEvents, BadLinesSayWhy) {
  EXPECT_NE(ParseEventLine("[1,2]", 0).status().message().find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(ParseEventLine(R"({"kind":"stop"})", 0).status().message().find("\"kind\""),
            std::string::npos);
  EXPECT_NE(
      ParseEventLine(R"({"kind":"step","step":1,"time":5})", 0).status().message().find("step_s"),
      std::string::npos);
  EXPECT_NE(ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":-1})", 0)
                .status()
                .message()
                .find("non-negative"),
            std::string::npos);
  EXPECT_NE(ParseEventLine(R"({"kind":"step","step":1,"time":5,"step_s":1,"data_wait_s":"x"})", 0)
                .status()
                .message()
                .find("data_wait_s"),
            std::string::npos);
  EXPECT_FALSE(ParseEventLine(R"({"kind":"event","time":5})", 0).ok());  // no name
  auto ev = ParseEventLine(
      R"({"kind":"event","name":"evaluation","time":15,"duration_s":4,"data":{"acc":0.9}})", 10);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev->is_step);
  EXPECT_EQ(ev->event.kind, "evaluation");
  EXPECT_DOUBLE_EQ(ev->event.t, 5);
  auto data = nlohmann::json::parse(ev->event.data);
  EXPECT_EQ(data["duration_s"], 4);
  EXPECT_EQ(data["acc"], 0.9);
  // The trainer's events come back the same way.
  auto again = ParseEventLine(RunEventLine(ev->event, 10), 10);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->event.kind, "evaluation");
  EXPECT_EQ(nlohmann::json::parse(again->event.data)["duration_s"], 4);
}

TEST(StepEvents, ReaderTakesOnlyCompleteLinesAndSkipsBadOnes) {
  std::string path = ::testing::TempDir() + "/fb_events_reader.jsonl";
  std::remove(path.c_str());
  EventFileReader reader(path);
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());  // not there yet: nothing, no error
  std::string good = R"({"kind":"step","step":1,"time":2,"step_s":0.5})";
  {
    std::ofstream out(path, std::ios::app);
    out << good << "\n"
        << "garbage\n"
        << R"({"kind":"step","step":2,"ti)";  // a line half written
  }
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  EXPECT_EQ(steps.size(), 1u);
  EXPECT_EQ(reader.bad_lines(), 1);
  EXPECT_NE(reader.first_error().find("line 2"), std::string::npos) << reader.first_error();
  {
    std::ofstream out(path, std::ios::app);
    out << R"(me":3,"step_s":0.5})"
        << "\n";
  }
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].step, 2);
  EXPECT_DOUBLE_EQ(steps[1].t, 3);
}

// A counter that starts again (a new Markers each epoch) would overwrite the
// earlier epoch's records, one per (rank, step): they are numbered on.
TEST(StepEvents, ARestartedStepCounterIsNumberedOn) {
  std::string path = ::testing::TempDir() + "/fb_events_restart.jsonl";
  std::remove(path.c_str());
  {
    std::ofstream out(path);
    for (int epoch = 0; epoch < 3; ++epoch)
      for (int step = 1; step <= 2; ++step)
        for (int rank = 0; rank < 2; ++rank)
          if (rank == 0 || epoch == 0)  // rank 1 marks one epoch only
            out << R"({"kind":"step","rank":)" << rank << R"(,"step":)" << step << R"(,"time":)"
                << 10 + epoch * 2 + step << R"(,"step_s":0.5})"
                << "\n";
  }
  EventFileReader reader(path);
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  std::vector<int64_t> rank0, rank1;
  for (const StepRecord& r : steps) (r.rank == 0 ? rank0 : rank1).push_back(r.step);
  EXPECT_EQ(rank0, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(rank1, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(reader.restarts(), 2);
  EXPECT_EQ(reader.first_restarted_rank(), 0);
}

// Messages true to the input (issue 53): the line number counts every line
// of the file, blank ones and one completed across two polls included.
TEST(StepEvents, TheFirstBadLineIsNumberedAsInTheFile) {
  std::string path = ::testing::TempDir() + "/fb_events_lines.jsonl";
  std::remove(path.c_str());
  const std::string good = R"({"kind":"step","step":1,"time":2,"step_s":0.5})";
  {
    std::ofstream out(path);
    out << good << "\n\n" << R"({"kind":"step","step":2,)";  // line 3, half written
  }
  EventFileReader reader(path);
  std::vector<StepRecord> steps;
  std::vector<RunEvent> events;
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  EXPECT_EQ(reader.bad_lines(), 0);
  {
    std::ofstream out(path, std::ios::app);
    out << R"("time":3,"step_s":0.5})" << "\n"
        << "   \n"
        << R"({"kind":"event","time":4})" << "\n"  // line 5: no name
        << R"({"kind":"step","step":3,"time":5,"step_s":-1})" << "\n";
  }
  ASSERT_TRUE(reader.Poll(0, &steps, &events).ok());
  EXPECT_EQ(steps.size(), 2u);
  EXPECT_EQ(reader.bad_lines(), 2);
  EXPECT_EQ(reader.first_error(), "line 5 of " + path + R"(: an event needs a "name")");
  EXPECT_EQ(ParseEventLine(R"({"kind":"step","step":3,"time":5,"step_s":-1})", 0).status().message(),
            R"("step_s" must be a non-negative number)");
  EXPECT_EQ(ParseEventLine(R"({"kind":"step","step":3,"time":5})", 0).status().message(),
            R"(a step needs "step_s")");
  EXPECT_EQ(ParseEventLine(R"({"kind":"event","name":"x","time":-4})", 0).status().message(),
            R"(an event needs "time")");
}

// Messages true to the input (issue 53): the version quoted is the file's.
TEST_F(StoreTest, ANewerSchemaIsQuotedWithTheFilesVersion) {
  OpenOk().reset();
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_exec(db, "PRAGMA user_version = 73", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  auto r = RunStore::Open(path_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(path_ + " has store schema v73, newer than this fullburn (v", 0), 0u)
      << r.status().message();
}

}  // namespace
}  // namespace fullburn
