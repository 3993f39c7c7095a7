// Test double at the OS boundary: serves recorded /proc trees and a clock the
// test sets, and can make chosen paths fail.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "fullburn/env.h"

namespace fullburn::testing {

class ReplayEnv : public Env {
 public:
  explicit ReplayEnv(std::string root) : root_(std::move(root)) {}
  void SetRoot(const std::string& root) { root_ = root; }
  void SetTime(double t) { now_ = t; }
  void FailPath(const std::string& path) { failing_.insert(path); }

  Result<std::string> ReadFile(const std::string& path) const override {
    if (failing_.count(path)) return Status::IoError("injected failure: " + path);
    return Env::ReadFile(root_ + path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) const override {
    if (failing_.count(path)) return Status::IoError("injected failure: " + path);
    return Env::ListDir(root_ + path);
  }
  double MonotonicSeconds() const override { return now_; }
  double UnixSeconds() const override { return 1.7e9 + now_; }
  long ClockTicksPerSecond() const override { return 100; }
  long PageSize() const override { return 4096; }

 private:
  std::string root_;
  double now_ = 0;
  std::set<std::string> failing_;
};

// A fresh, empty directory named after the running test.
inline std::string FreshTestDir(const std::string& prefix) {
  std::string dir = ::testing::TempDir() + "/" + prefix + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The two /proc recordings made one second apart (tests/telemetry/fixtures).
inline std::string Recording(int i) { return std::string(FIXTURES_DIR) + "/t" + std::to_string(i); }

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace fullburn::testing
