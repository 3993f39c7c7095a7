// The stack sampler's decisions that need no py-spy: which one is used,
// which is too old, and when Yama refuses before py-spy starts (read
// through the Env seam from a recorded /proc).
#include "stacks_sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "process.h"
#include "replay_env.h"

namespace fullburn::cli {
namespace {

TEST(StacksSampler, PySpyOlderThan0314IsRefusedNamingItsVersion) {
  EXPECT_NE(PySpyTooOld("py-spy 0.3.13\n").find("py-spy 0.3.13 is older than 0.3.14"), std::string::npos);
  EXPECT_NE(PySpyTooOld("py-spy 0.2.9").find("older"), std::string::npos);
  EXPECT_EQ(PySpyTooOld("py-spy 0.3.14\n"), "");
  EXPECT_EQ(PySpyTooOld("py-spy 0.4.3\n"), "");
  EXPECT_EQ(PySpyTooOld("py-spy 1.0.0"), "");
  EXPECT_NE(PySpyTooOld("command not found").find("its version could not be read"), std::string::npos);
}

class Yama : public ::testing::Test {
 protected:
  std::string Scope(const std::string& value, bool root) {
    std::string dir = fullburn::testing::FreshTestDir("fb_yama_" + value);
    if (!value.empty()) {
      std::filesystem::create_directories(dir + "/proc/sys/kernel/yama");
      std::ofstream(dir + "/proc/sys/kernel/yama/ptrace_scope") << value << "\n";
    }
    fullburn::testing::ReplayEnv env(dir);
    return PtraceRefusal(env, root);
  }
};

TEST_F(Yama, ScopesZeroAndOneLetTheSamplerRead) {
  EXPECT_EQ(Scope("", false), "");  // no Yama: the plain uid rule
  EXPECT_EQ(Scope("0", false), "");
  EXPECT_EQ(Scope("1", false), "");  // PR_SET_PTRACER admits fullburn's children
}

TEST_F(Yama, ScopeTwoIsRootsOnlyAndScopeThreeNobodys) {
  EXPECT_NE(Scope("2", false).find("kernel.yama.ptrace_scope is 2: only root"), std::string::npos);
  EXPECT_EQ(Scope("2", true), "");
  EXPECT_NE(Scope("3", true).find("kernel.yama.ptrace_scope is 3"), std::string::npos);
  EXPECT_NE(Scope("3", false).find("needs a reboot"), std::string::npos);
}

TEST(StacksSampler, FindsPySpyNamedOnPathOrBesideTheJobsInterpreter) {
  std::string dir = fullburn::testing::FreshTestDir("fb_find_py_spy");
  auto executable = [](const std::string& path) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << "#!/bin/sh\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  };
  const char* old_path = std::getenv("PATH");
  std::string saved_path = old_path ? old_path : "";
  ::unsetenv("FULLBURN_PY_SPY");
  ::setenv("PATH", (dir + "/empty").c_str(), 1);
  EXPECT_EQ(FindPySpy({"python3", "train.py"}), "");
  executable(dir + "/venv/bin/py-spy");
  EXPECT_EQ(FindPySpy({dir + "/venv/bin/python", "train.py"}), dir + "/venv/bin/py-spy");
  executable(dir + "/tools/py-spy");
  ::setenv("PATH", (dir + "/tools").c_str(), 1);
  EXPECT_EQ(FindPySpy({dir + "/venv/bin/python"}), dir + "/tools/py-spy");  // PATH before the venv's
  ::setenv("FULLBURN_PY_SPY", "/opt/named/py-spy", 1);
  EXPECT_EQ(FindPySpy({dir + "/venv/bin/python"}), "/opt/named/py-spy");  // named first, as it is
  ::unsetenv("FULLBURN_PY_SPY");
  ::setenv("PATH", saved_path.c_str(), 1);
}

}  // namespace
}  // namespace fullburn::cli
