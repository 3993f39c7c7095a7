#include "fullburn/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fullburn {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fullburn_atomic_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Everything in the folder but the destination: temporaries left behind.
  int Leftovers(const std::string& keep) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().filename() != keep;
    return n;
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, CommitReplacesTheOldFileWhole) {
  fs::path path = dir_ / "report.html";
  std::ofstream(path) << "old";
  for (Durability d : {Durability::kVisible, Durability::kSurvivesCrash}) {
    auto file = AtomicFile::Create(path.string(), d);
    ASSERT_TRUE(file.ok()) << file.status().message();
    ASSERT_TRUE((*file)->Append("new "));
    ASSERT_TRUE((*file)->Append(std::string(100000, 'x')));
    EXPECT_EQ((*file)->size(), 100004u);
    EXPECT_EQ(Read(path), "old") << "visible before Commit";
    EXPECT_EQ(Leftovers("report.html"), 1) << "the temporary sits beside it";
    ASSERT_TRUE((*file)->Commit().ok());
    EXPECT_EQ(Read(path), "new " + std::string(100000, 'x'));
    EXPECT_EQ(Leftovers("report.html"), 0);
    std::ofstream(path, std::ios::trunc) << "old";
  }
}

TEST_F(AtomicFileTest, AnAbandonedFileLeavesTheOldOneAndNoFragment) {
  fs::path path = dir_ / "index";
  std::ofstream(path) << "old";
  {
    auto file = AtomicFile::Create(path.string(), Durability::kSurvivesCrash);
    ASSERT_TRUE(file.ok());
    (*file)->Append("half of it");
  }  // an error path returned before Commit
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(Leftovers("index"), 0);
}

TEST_F(AtomicFileTest, TwoWritersOfOnePathDoNotShareATemporary) {
  fs::path path = dir_ / "config.toml";
  auto a = AtomicFile::Create(path.string(), Durability::kVisible);
  auto b = AtomicFile::Create(path.string(), Durability::kVisible);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->Append("a");
  (*b)->Append("b");
  ASSERT_TRUE((*a)->Commit().ok());
  EXPECT_EQ(Read(path), "a");
  ASSERT_TRUE((*b)->Commit().ok());
  EXPECT_EQ(Read(path), "b");
  EXPECT_EQ(Leftovers("config.toml"), 0);
}

TEST_F(AtomicFileTest, AMissingFolderIsNamed) {
  std::string path = (dir_ / "no-such-folder" / "out.json").string();
  auto file = AtomicFile::Create(path, Durability::kVisible);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), "cannot write " + path +
                                         ": No such file or directory; check the folder exists "
                                         "and is writable");
  Status s = WriteFileAtomically(path, "x");
  EXPECT_EQ(s.message(), file.status().message());
}

// A full disk, as the kernel reports it to a writer past its file-size limit
// (EFBIG): the first failed write is kept, Commit names it, the old file stays.
TEST_F(AtomicFileTest, AFailedWriteIsReportedAndTheOldFileKept) {
  fs::path path = dir_ / "tokens.bin";
  std::ofstream(path) << "old";
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto file = AtomicFile::Create(path.string(), Durability::kSurvivesCrash);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append(std::string(4096, 'x')));
  EXPECT_FALSE((*file)->Append("one byte too many"));
  EXPECT_FALSE((*file)->Append("and later ones are no-ops"));
  Status s = (*file)->Commit();
  ::setrlimit(RLIMIT_FSIZE, &saved);
  EXPECT_EQ(s.message(), "cannot write " + path.string() +
                             ": File too large; free space, then try again (the file there "
                             "before is untouched)");
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(Leftovers("tokens.bin"), 0);
}

TEST_F(AtomicFileTest, ARenameOntoAFolderFailsAndCleansUp) {
  fs::path path = dir_ / "taken";
  fs::create_directories(path / "inside");
  Status s = WriteFileAtomically(path.string(), "x", Durability::kSurvivesCrash);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("cannot rename the new file into " + path.string() + ": ", 0), 0u)
      << s.message();
  EXPECT_EQ(Leftovers("taken"), 0);
}

}  // namespace
}  // namespace fullburn
