// The store's fault matrix (docs/store.md, "When the store refuses writes"):
// each fault made for real around the real `fullburn run` of a marked job,
// and what it says, how the job ends and what is kept checked. Faults that
// need a file system of their own (a full disk) mount a small tmpfs and are
// skipped, saying why, where mounting is not allowed.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "fullburn/diagnose.h"
#include "fullburn/spill.h"
#include "fullburn/store.h"
#include "process.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;
using testing::Background;
using testing::Outcome;
using testing::ReadText;
using testing::RunToEnd;

class StoreFaultsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_faults");
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
    // Spills go to a folder of this test's own, on another file system
    // than the store's (the machine's tmpfs), so tests do not meet.
    spills_ = std::string("/dev/shm/fb_spill_") + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(spills_);
    fs::create_directories(spills_);
    ::setenv("XDG_RUNTIME_DIR", spills_.c_str(), 1);
  }
  void TearDown() override {
    for (const std::string& m : mounts_) RunToEnd({"umount", "-l", m});
    ::unsetenv("XDG_RUNTIME_DIR");
    fs::remove_all(spills_);
  }
  // A tmpfs of `size` at `dir`; false (and the test is skipped) where mounting is refused.
  bool Mount(const std::string& dir, const std::string& size) {
    fs::create_directories(dir);
    Outcome o = RunToEnd({"mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", dir});
    if (o.code != 0) return false;
    mounts_.push_back(dir);
    return true;
  }
  // A job that marks `steps` steps of `ms` each.
  std::string Job(int steps, double ms) {
    std::string path = dir_ + "/job.py";
    std::ofstream(path) << "import sys, time\nsys.path.insert(0, '" << SOURCE_DIR
                        << "/python')\nimport fullburn_markers\nm = fullburn_markers.Markers()\n"
                        << "for i in range(" << steps << "):\n    time.sleep(" << ms / 1000
                        << ")\n    m.step_end(samples=8, loss=1.0 / (i + 1))\n";
    return path;
  }
  std::vector<std::string> Run(const std::string& store, const std::string& job) {
    return {FULLBURN_BIN, "run", "--interval", "0.1", "--store", store, "--", "python3", job};
  }
  std::vector<std::string> Spills() {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(spills_))
      if (e.path().extension() == ".fbspill") out.push_back(e.path().string());
    return out;
  }
  // Steps stored for the store's last run.
  size_t StoredSteps(const std::string& store) {
    auto s = RunStore::Open(store);
    if (!s.ok()) return 0;
    auto steps = (*s)->LoadSteps((*s)->GetRun("last")->id);
    return steps.ok() ? steps->size() : 0;
  }
  // Waits for the store's last run to hold `n` steps.
  bool WaitForSteps(const std::string& store, size_t n) {
    return testing::WaitFor([&] { return fs::exists(store) && StoredSteps(store) >= n; }, 30);
  }
  Outcome Fb(std::vector<std::string> args) {
    args.insert(args.begin(), FULLBURN_BIN);
    return RunToEnd(args);
  }
  std::string dir_, spills_;
  std::vector<std::string> mounts_;
};

// Disk full mid-run: a filler file takes the store's file system's last
// byte. The job goes on and ends with its own code; what the store refused
// is in the spill, named with its import; the cut is diagnosed as cut; once
// there is room the import stores every step, and a second import adds none.
TEST_F(StoreFaultsE2E, ADiskThatFillsMidRunLosesNoStep) {
  const std::string disk = dir_ + "/disk";
  if (!Mount(disk, "2m")) GTEST_SKIP() << "mount -t tmpfs was refused (needs root): no small disk to fill";
  const std::string store = disk + "/runs.db";
  const int kSteps = 800;
  Background b;
  testing::Start(&b, Run(store, Job(kSteps, 5)), "diskfull");
  ASSERT_TRUE(WaitForSteps(store, 50)) << b.Err();
  {
    std::ofstream filler(disk + "/filler", std::ios::binary);
    std::string mib(1 << 20, 'x');
    for (int i = 0; i < 4 && filler; ++i) filler.write(mib.data(), static_cast<std::streamsize>(mib.size()));
  }
  ASSERT_EQ(b.Wait(120), 0) << b.Err();
  std::string err = b.Err();
  EXPECT_NE(err.find("database or disk is full; free disk space"), std::string::npos) << err;
  std::vector<std::string> spills = Spills();
  ASSERT_EQ(spills.size(), 1u) << err;
  EXPECT_NE(err.find("fullburn runs import " + spills[0]), std::string::npos) << err;
  EXPECT_LT(StoredSteps(store), static_cast<size_t>(kSteps));
  // Before the import: the run reads as finished (its end is in the spill if
  // the store refused it), and its diagnosis names the cut first.
  Outcome list = Fb({"runs", "list", "--json", "--store", store});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["status"], "finished") << list.out;
  Outcome diag = Fb({"diagnose", "last", "--json", "--store", store});
  ASSERT_EQ(diag.code, 0) << diag.err;
  nlohmann::json findings = nlohmann::json::parse(diag.out);
  EXPECT_EQ(findings[0]["cause"], "record_cut") << diag.out;
  EXPECT_NE(findings[0]["evidence"].get<std::string>().find("database or disk is full"),
            std::string::npos);
  for (const auto& f : findings) EXPECT_NE(f["cause"], "idle_phases") << "the cut is not idle: " << diag.out;
  fs::remove(disk + "/filler");
  Outcome imported = Fb({"runs", "import", "--keep", "--store", store, spills[0]});
  EXPECT_EQ(imported.code, 0) << imported.err;
  EXPECT_EQ(StoredSteps(store), static_cast<size_t>(kSteps));
  auto events = [&] {
    auto s = RunStore::Open(store);
    return (*s)->LoadEvents((*s)->GetRun("last")->id)->size();
  };
  size_t once = events();
  Outcome again = Fb({"runs", "import", "--store", store, spills[0]});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(StoredSteps(store), static_cast<size_t>(kSteps));
  EXPECT_EQ(events(), once) << "imported twice, stored once";
  EXPECT_FALSE(fs::exists(spills[0])) << "a wholly stored spill is removed (without --keep)";
}

// A read-only store: nothing can be recorded into it, so the job is not
// started, and the one line names the file, its folder and the fix. SQLite's
// WAL needs to write beside the file even to read it, so reads fail alike.
TEST_F(StoreFaultsE2E, AReadOnlyStoreIsRefusedBeforeTheJobStarts) {
  const std::string made = dir_ + "/made";
  fs::create_directories(made);
  ASSERT_EQ(Fb({"run", "-q", "--store", made + "/runs.db", "--", "true"}).code, 0);
  std::string store = made + "/runs.db";
  if (::geteuid() == 0) {
    const std::string ro = dir_ + "/ro";
    fs::create_directories(ro);
    if (RunToEnd({"mount", "--bind", made, ro}).code != 0) GTEST_SKIP() << "mount --bind was refused";
    mounts_.push_back(ro);
    ASSERT_EQ(RunToEnd({"mount", "-o", "remount,bind,ro", ro}).code, 0);
    store = ro + "/runs.db";
  } else {
    fs::permissions(store, fs::perms::owner_read);
    fs::permissions(made, fs::perms::owner_read | fs::perms::owner_exec);
  }
  std::string marker = dir_ + "/started";
  Outcome o = Fb({"run", "--store", store, "--", "touch", marker});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("is not writable"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("check that the file and its directory are writable or pass --store"),
            std::string::npos)
      << o.err;
  EXPECT_FALSE(fs::exists(marker)) << "the job was not started";
  Outcome list = Fb({"runs", "list", "--store", store});
  EXPECT_EQ(list.code, 2) << list.err;
  EXPECT_NE(list.err.find("is not writable"), std::string::npos) << list.err;
  if (::geteuid() != 0) fs::permissions(made, fs::perms::owner_all);
}

// The store's folder deleted mid-run: SQLite would go on writing into the
// unlinked file and lose it all on close. The writes are refused, kept in
// the spill, and imported into another store as the run made anew.
TEST_F(StoreFaultsE2E, AStoreWhoseFolderIsDeletedMidRunLosesNoStep) {
  const std::string folder = dir_ + "/store";
  fs::create_directories(folder);
  const int kSteps = 600;
  Background b;
  testing::Start(&b, Run(folder + "/runs.db", Job(kSteps, 5)), "deleted");
  ASSERT_TRUE(WaitForSteps(folder + "/runs.db", 30)) << b.Err();
  fs::remove_all(folder);
  ASSERT_EQ(b.Wait(120), 0) << b.Err();
  std::string err = b.Err();
  EXPECT_NE(err.find("was deleted while recording"), std::string::npos) << err;
  std::vector<std::string> spills = Spills();
  ASSERT_EQ(spills.size(), 1u) << err;
  EXPECT_NE(err.find("the run's end among them"), std::string::npos) << err;
  const std::string other = dir_ + "/other.db";
  Outcome imported = Fb({"runs", "import", "--store", other, spills[0]});
  EXPECT_EQ(imported.code, 0) << imported.err;
  EXPECT_NE(imported.out.find("made anew"), std::string::npos) << imported.out;
  // What the deleted store had taken before is gone with it; the rest is here.
  size_t stored = StoredSteps(other);
  EXPECT_GT(stored, 0u);
  EXPECT_LE(stored, static_cast<size_t>(kSteps));
  auto s = RunStore::Open(other);
  EXPECT_EQ((*s)->GetRun("last")->status, "finished");
  EXPECT_EQ((*s)->GetRun("last")->exit_code, 0);
}

// Random bytes over its pages 2 and 3 (the runs table's root and the
// metrics'): a new run is refused with the fix, and nothing is written into it.
TEST_F(StoreFaultsE2E, ADamagedStoreRefusesNewRunsAndIsNotWritten) {
  const std::string store = dir_ + "/runs.db";
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(Fb({"run", "-q", "--interval", "0.05", "--store", store, "--", "sleep", "0.5"}).code, 0);
  ASSERT_EQ(Fb({"runs", "list", "--store", store}).code, 0);  // checkpointed into the file
  ASSERT_GT(fs::file_size(store), 16384u);
  {
    std::fstream f(store, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    std::mt19937 rng(7);
    for (int i = 0; i < 8192; ++i) f.put(static_cast<char>(rng()));
  }
  auto before = fs::file_size(store);
  Outcome o = Fb({"run", "--store", store, "--", "true"});
  EXPECT_NE(o.code, 0);
  EXPECT_NE(o.err.find("database disk image is malformed; move the file aside or pass --store"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(fs::file_size(store), before);
}

// A killed recorder leaves its WAL; damage to it (random bytes in its
// middle) makes SQLite stop at the last frame whose checksum holds, as its
// design promises: the store reads as of then, and takes new runs.
TEST_F(StoreFaultsE2E, ADamagedWalIsReadAsOfItsLastWholeFrame) {
  const std::string store = dir_ + "/runs.db";
  {
    Background b;
    testing::Start(&b, Run(store, Job(100000, 2)), "wal");
    ASSERT_TRUE(WaitForSteps(store, 200)) << b.Err();
    ::kill(b.pid, SIGKILL);
    b.Wait(10);
  }  // the job with it
  std::string wal = store + "-wal";
  if (!fs::exists(wal) || fs::file_size(wal) < 65536) GTEST_SKIP() << "no WAL left to damage";
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(wal) / 2));
    std::mt19937 rng(11);
    for (int i = 0; i < 4096; ++i) f.put(static_cast<char>(rng()));
  }
  Outcome list = Fb({"runs", "list", "--json", "--store", store});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["status"], "interrupted") << list.out;
  EXPECT_EQ(Fb({"diagnose", "last", "--store", store}).code, 0);
  EXPECT_EQ(Fb({"run", "-q", "--store", store, "--", "true"}).code, 0);
  auto s = RunStore::Open(store);
  EXPECT_EQ(*(*s)->IntegrityCheck(), "ok");
}

// A second fullburn (here sqlite3's own connection) holds the write lock
// well past the busy timeout and the spill's 10 s: the records go to the
// spill, and once the lock is gone the recorder brings them back itself.
TEST_F(StoreFaultsE2E, AWriteLockHeldPastTheRetryTimeIsWaitedOutThroughTheSpill) {
  const std::string store = dir_ + "/runs.db";
  const int kSteps = 250;  // 25 s of 0.1 s steps
  Background b;
  testing::Start(&b, Run(store, Job(kSteps, 100)), "lock");
  ASSERT_TRUE(WaitForSteps(store, 5)) << b.Err();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(store.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  bool spilled = testing::WaitFor([&] { return !Spills().empty(); }, 40);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  ASSERT_EQ(b.Wait(120), 0) << b.Err();
  std::string err = b.Err();
  EXPECT_TRUE(spilled) << err;
  EXPECT_NE(err.find("database is locked"), std::string::npos) << err;
  EXPECT_NE(err.find("are stored"), std::string::npos) << err;
  EXPECT_EQ(StoredSteps(store), static_cast<size_t>(kSteps));
  EXPECT_TRUE(Spills().empty()) << "drained and removed";
}

// The job's events file fills its file system (TMPDIR on a small tmpfs):
// the job goes on to its end, its markers say so once, fullburn says which
// steps were not recorded, and the diagnosis reads that stretch as cut.
TEST_F(StoreFaultsE2E, AFullEventsFileSystemCutsTheStepsNotTheJob) {
  const std::string tmp = dir_ + "/tmp";
  if (!Mount(tmp, "64k")) GTEST_SKIP() << "mount -t tmpfs was refused (needs root): no small disk to fill";
  const std::string store = dir_ + "/runs.db";
  const int kSteps = 2000;
  ::setenv("TMPDIR", tmp.c_str(), 1);
  Outcome o = RunToEnd(Run(store, Job(kSteps, 1)));
  ::unsetenv("TMPDIR");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("step events can no longer be written to"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("No space left on device"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("were not recorded: the file system of the job's step events file"),
            std::string::npos)
      << o.err;
  size_t stored = StoredSteps(store);
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, static_cast<size_t>(kSteps));
  auto s = RunStore::Open(store);
  std::vector<Finding> findings = Diagnose(*(*s)->LoadRun("last"));
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].cause, CauseId::kRecordCut) << RenderFindings(findings, 9);
  for (const Finding& f : findings) EXPECT_NE(f.cause, CauseId::kIdlePhases) << RenderFindings(findings, 9);
}

// fullburn killed with SIGKILL mid-run: the run reads as interrupted, its
// records up to the last committed batch are there and diagnosed.
TEST_F(StoreFaultsE2E, AKilledRecorderLeavesAnInterruptedRunThatIsDiagnosed) {
  const std::string store = dir_ + "/runs.db";
  {
    Background b;
    testing::Start(&b, Run(store, Job(100000, 5)), "killed");
    ASSERT_TRUE(WaitForSteps(store, 50)) << b.Err();
    ::kill(b.pid, SIGKILL);
    b.Wait(10);
  }  // the job with it
  Outcome list = Fb({"runs", "list", "--json", "--store", store});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["status"], "interrupted") << list.out;
  Outcome diag = Fb({"diagnose", "last", "--store", store});
  EXPECT_EQ(diag.code, 0) << diag.err;
  EXPECT_NE(diag.out.find("findings"), std::string::npos) << diag.out;
  EXPECT_GE(StoredSteps(store), 50u);
}

// A spill cut short (a recorder killed while writing it) or damaged: what
// is whole is imported, the rest counted with why, and the exit is 1.
TEST_F(StoreFaultsE2E, ADamagedSpillImportsWhatIsWholeAndSaysWhatWasNot) {
  const std::string store = dir_ + "/runs.db";
  auto s = RunStore::Open(store);
  ASSERT_TRUE(s.ok());
  RunInfo info;
  info.name = "spilled";
  info.start_time = 1000;
  info.id = *(*s)->BeginRun(info);
  SpillFile spill(Env::Default(), store, info);
  for (int batch = 0; batch < 5; ++batch) {
    RunRecords r;
    for (int i = 1; i <= 10; ++i) {
      StepRecord step;
      step.step = batch * 10 + i;
      step.t = step.step;
      step.step_s = 1;
      r.steps.push_back(step);
    }
    ASSERT_TRUE(spill.AddRecords(r, "test").ok());
  }
  std::string path = spill.path();
  std::string text = ReadText(path);
  // Damage the third record line, and cut the last one short.
  size_t third = 0;
  for (int i = 0; i < 3; ++i) third = text.find('\n', third) + 1;
  text[third + 20] ^= 0x5a;
  text.resize(text.size() - 5);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  Outcome o = Fb({"runs", "import", "--store", store, path});
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("2 damaged or cut-short lines skipped"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("checksum does not match"), std::string::npos) << o.err;
  EXPECT_EQ((*s)->LoadSteps(info.id)->size(), 30u);
  EXPECT_TRUE(fs::exists(path)) << "a spill not wholly stored is kept";
  std::ofstream(dir_ + "/not-a-spill") << "hello\n";
  Outcome bad = Fb({"runs", "import", "--store", store, dir_ + "/not-a-spill"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("is not a fullburn spill"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace fullburn
