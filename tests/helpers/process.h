// Running fullburn and helper programs from end-to-end tests.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "replay_env.h"

namespace fullburn::testing {

// A loopback port the kernel says is free now, for ranks started by hand
// ("" if none could be had).
inline std::string FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? std::to_string(ntohs(a.sin_port)) : "";
}

struct Outcome {
  int code = -1;
  std::string out, err;
};

// A started process whose stdout and stderr go to files. It leads a process
// group of its own, and whatever is left of the group when the Background
// goes is killed with it, so a test leaves no worker behind.
struct Background {
  pid_t pid = -1;
  pid_t group = -1;
  std::string out_path, err_path;
  std::string Err() const { return ReadText(err_path); }
  std::string Out() const { return ReadText(out_path); }
  // Waits up to `timeout_s`; returns the shell-style exit code, or -1 on timeout.
  int Wait(double timeout_s = 60) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  ~Background() {
    if (group > 0) ::kill(-group, SIGKILL);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

inline void Start(Background* b, const std::vector<std::string>& argv, const std::string& tag) {
  b->out_path = ::testing::TempDir() + "/" + tag + ".out";
  b->err_path = ::testing::TempDir() + "/" + tag + ".err";
  // Emptied here, before the fork: a test reading them at once must not see
  // a previous run's output (the child truncates them only when it runs).
  for (const std::string& path : {b->out_path, b->err_path})
    ::close(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  b->pid = ::fork();
  if (b->pid == 0) {
    ::setpgid(0, 0);
    int out = ::open(b->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(b->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = ::open("/dev/null", O_RDONLY);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execvp(args[0], args.data());  // PATH lookup for tools such as chromium
    ::_exit(126);
  }
  ::setpgid(b->pid, b->pid);  // also here: the child may not have run yet
  b->group = b->pid;
}

// Polls `done` every 20 ms for up to `timeout_s`: whether it came true.
// For waiting on what a process has done, not on how long it takes.
inline bool WaitFor(const std::function<bool()>& done, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline Outcome RunToEnd(const std::vector<std::string>& argv, double timeout_s = 120) {
  static int n = 0;
  Background b;
  Start(&b, argv, "proc" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  Outcome o;
  o.code = b.Wait(timeout_s);
  o.out = b.Out();
  o.err = b.Err();
  return o;
}

}  // namespace fullburn::testing
