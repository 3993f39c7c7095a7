// fullburn launch: start the processes of a data-parallel job on this node
// with torchrun's environment; if one fails, stop the others.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "child.h"
#include "cli.h"
#include "fullburn/dist.h"

namespace fullburn::cli {
namespace {

struct LaunchOptions {
  LaunchPlan plan;
  std::string master;  // ADDR:PORT
  double grace_s = 10;
  std::vector<std::string> command;
};

// A port the kernel says is free now (single node: nothing to agree on).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return kDefaultPort;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = kDefaultPort;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

Status ParseMaster(const std::string& master, LaunchPlan* plan) {
  size_t colon = master.rfind(':');
  if (colon == std::string::npos || colon == 0) return Status::InvalidArgument("--master must be ADDR:PORT, e.g. node0:29500");
  plan->master_addr = master.substr(0, colon);
  try {
    plan->master_port = std::stoi(master.substr(colon + 1));
  } catch (...) {
    return Status::InvalidArgument("--master " + master + ": the port is not a number");
  }
  return Status::Ok();
}

int Launch(LaunchOptions o) {
  if (o.command.empty()) return Fail("no command given: use fullburn launch --nproc N -- CMD ARGS...");
  if (!o.master.empty()) {
    if (Status s = ParseMaster(o.master, &o.plan); !s.ok()) return Fail(s.message());
  } else if (o.plan.nnodes > 1) {
    return Fail("several nodes need --master ADDR:PORT (node 0's address, the same on every node)");
  } else {
    o.plan.master_port = FreePort();
  }
  if (Status s = CheckLaunchPlan(o.plan); !s.ok()) return Fail(s.message());
  InstallSignalForwarding();
  std::map<pid_t, int> ranks;  // pid -> global rank
  for (int local = 0; local < o.plan.nproc; ++local) {
    Result<pid_t> pid = SpawnChild(o.command, LaunchEnvironment(o.plan, local));
    if (!pid.ok()) {
      SignalChildren(SIGTERM);
      while (WaitAnyChild().first > 0) {
      }
      return Fail(pid.status().message(), kExitCannotStart);
    }
    ranks[*pid] = o.plan.node_rank * o.plan.nproc + local;
  }
  int code = 0;
  std::atomic<bool> done{false};
  std::thread killer;
  for (size_t left = ranks.size(); left > 0; --left) {
    auto [pid, status] = WaitAnyChild();
    if (pid < 0) break;
    if (status == 0 || code != 0) continue;
    code = status;
    std::fprintf(stderr, "fullburn launch: rank %d exited with code %d; stopping the other ranks (SIGTERM, SIGKILL after %gs)\n",
                 ranks[pid], status, o.grace_s);
    SignalChildren(SIGTERM);
    killer = std::thread([&done, grace = o.grace_s] {
      auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
      while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!done) SignalChildren(SIGKILL);
    });
  }
  done = true;
  if (killer.joinable()) killer.join();
  return code;
}

}  // namespace

void SetupLaunch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* launch = app.add_subcommand(
      "launch", "Start N processes of a data-parallel job with torchrun's environment (RANK, WORLD_SIZE, ...)");
  launch->footer("Usage: fullburn launch --nproc N [--nnodes M --node-rank R --master ADDR:PORT] -- CMD [ARGS...]");
  launch->add_option("--nproc", o->plan.nproc, "Processes on this node (one per GPU)")
      ->envname("FULLBURN_NPROC")
      ->capture_default_str();
  launch->add_option("--nnodes", o->plan.nnodes, "Nodes in the job")->capture_default_str();
  launch->add_option("--node-rank", o->plan.node_rank, "This node's index, 0..nnodes-1")->capture_default_str();
  launch->add_option("--master", o->master,
                     "Rendezvous ADDR:PORT (node 0); default on one node: 127.0.0.1 and a free port")
      ->envname("FULLBURN_MASTER");
  launch->add_option("--grace", o->grace_s, "Seconds between SIGTERM and SIGKILL for the others when a rank fails")
      ->capture_default_str();
  launch->add_option("command", o->command, "The command each process runs, after --")->required();
  launch->positionals_at_end();
  launch->callback([o] { ExitCode() = Launch(*o); });
}

}  // namespace fullburn::cli
