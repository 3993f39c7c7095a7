// The writers that keep what a refusing store cannot take. The lock is a
// real SQLite write lock held by another connection, as a long `runs rm`
// or an sqlite3 shell left in a transaction would hold it.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <thread>

#include "fullburn/store.h"
#include "replay_env.h"

namespace fullburn {
namespace {

using Clock = std::chrono::steady_clock;

class RecordWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::FreshTestDir("fb_records") + "/runs.db";
    auto opened = RunStore::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    store_ = std::move(*opened);
    RunInfo info;
    info.name = "records";
    info.start_time = 1000;
    run_ = store_->BeginRun(info).value();
  }
  void TearDown() override {
    if (lock_) sqlite3_close(lock_);
  }
  void Lock() {
    ASSERT_EQ(sqlite3_open(path_.c_str(), &lock_), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(lock_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  void Unlock() {
    ASSERT_EQ(sqlite3_exec(lock_, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(lock_);
    lock_ = nullptr;
  }
  static RunRecords Steps(int from, int to) {
    RunRecords r;
    for (int i = from; i <= to; ++i) {
      StepRecord s;
      s.step = i;
      s.t = i;
      s.step_s = 1;
      r.steps.push_back(s);
    }
    return r;
  }
  static std::optional<AsyncRecordWriter::Change> WaitForChange(AsyncRecordWriter* w) {
    for (auto end = Clock::now() + std::chrono::seconds(30); Clock::now() < end;) {
      if (auto c = w->TakeChange()) return c;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

  std::string path_;
  std::unique_ptr<RunStore> store_;
  int64_t run_ = 0;
  sqlite3* lock_ = nullptr;
};

// Past max_kept the oldest go, counted; the newest are written.
TEST_F(RecordWriterTest, KeepsTheNewestUpToItsBound) {
  RecordWriter w(store_.get(), run_, /*max_kept=*/2);
  w.Add(Steps(1, 5));
  EXPECT_EQ(w.dropped(), 3);
  EXPECT_EQ(w.kept_steps(), 2u);
  ASSERT_TRUE(w.Flush().ok());
  EXPECT_TRUE(w.empty());
  std::vector<StepRecord> stored = store_->LoadSteps(run_).value();
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0].step, 4);
  EXPECT_EQ(stored[1].step, 5);
}

// While another connection holds the write lock past the busy timeout (5 s),
// Add comes back at once, the writer says the store refuses, and once the
// lock goes every kind of record is written and that is said too.
TEST_F(RecordWriterTest, AsyncWriterNeverWaitsOnALockedStoreAndLosesNothing) {
  AsyncRecordWriter w(store_.get(), run_, 200000, /*retry_s=*/0.2);
  Lock();
  auto start = Clock::now();
  w.Add(Steps(1, 3));
  RunRecords more = Steps(4, 6);
  more.events.push_back({4.5, "warning", "{}"});
  more.samples.push_back({"rank1.proc.cpu_util", 4.5, 50});
  more.checkpoints.push_back({6, 6.0, "/ckpt/step-6.pt", 100, 0.01, 0.1});
  w.Add(std::move(more));
  double add_s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(add_s, 4.0) << "Add waited on the store";  // its busy timeout is 5 s
  std::optional<AsyncRecordWriter::Change> refused = WaitForChange(&w);
  ASSERT_TRUE(refused);
  EXPECT_TRUE(refused->failing);
  EXPECT_FALSE(refused->error.empty());
  EXPECT_TRUE(store_->LoadSteps(run_).value().empty());  // nothing half written
  Unlock();
  std::optional<AsyncRecordWriter::Change> back = WaitForChange(&w);
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->failing);
  EXPECT_EQ(back->lost, 0);
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_EQ(store_->LoadSteps(run_).value().size(), 6u);
  std::vector<RunEvent> events = store_->LoadEvents(run_).value();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "warning");
  std::vector<CheckpointRecord> cks = store_->LoadCheckpoints(run_).value();
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].step, 6);
  EXPECT_EQ(store_->LoadSamples(run_).value().count("rank1.proc.cpu_util"), 1u);
}

// Sync waits for what was added; Finish on a store still locked says why
// and counts what it could not write, without hanging.
TEST_F(RecordWriterTest, AsyncWriterSyncsAndFinishesOnALockedStoreWithWhatIsLeft) {
  AsyncRecordWriter w(store_.get(), run_);
  w.Add(Steps(1, 2));
  w.Sync();
  EXPECT_EQ(store_->LoadSteps(run_).value().size(), 2u);
  Lock();
  w.Add(Steps(3, 5));
  Status last = w.Finish();
  EXPECT_FALSE(last.ok());
  EXPECT_EQ(w.kept_steps(), 3u);
  std::optional<AsyncRecordWriter::Change> refused = w.TakeChange();
  ASSERT_TRUE(refused);
  EXPECT_TRUE(refused->failing);
  w.Add(Steps(6, 6));  // after Finish: not written, and Sync does not wait for it
  w.Sync();
  Unlock();
  EXPECT_EQ(store_->LoadSteps(run_).value().size(), 2u);
}

}  // namespace
}  // namespace fullburn
