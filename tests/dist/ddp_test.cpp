// Data parallelism end to end: ranks are separate processes started by
// `fullburn launch`, talking Gloo over loopback (tests/dist/ddp_worker.cpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <thread>

#include "process.h"

namespace fullburn {
namespace {

using testing::RunToEnd;

class DdpTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("fb_ddp"); }
  // Runs `nproc` ranks (0: the single-process reference); the worker's stdout.
  testing::Outcome Run(int nproc, std::vector<std::string> args, const std::string& name) {
    std::vector<std::string> argv;
    if (nproc > 0) argv = {FULLBURN_BIN, "launch", "--nproc", std::to_string(nproc), "--"};
    argv.push_back(DDP_WORKER);
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--out");
    argv.push_back(dir_ + "/" + name);
    if (nproc == 0) argv.push_back("--single");
    return RunToEnd(argv, 120);
  }
  std::vector<float> Params(const std::string& name, int rank) {
    std::ifstream in(dir_ + "/" + name + "." + std::to_string(rank), std::ios::binary);
    std::vector<float> v;
    float x;
    while (in.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
    return v;
  }
  double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      d = std::max(d, std::fabs(double(a[i]) - b[i]));
    return d;
  }
  std::string dir_;
};

TEST_F(DdpTest, TwoAndThreeRanksMatchOneProcessOnTheGlobalBatch) {
  ASSERT_EQ(Run(0, {"--steps", "8"}, "single").code, 0);
  std::vector<float> reference = Params("single", 0);
  ASSERT_GT(reference.size(), 1000u);
  for (int world : {2, 3}) {
    std::string name = "ddp" + std::to_string(world);
    auto o = Run(world, {"--steps", "8"}, name);
    ASSERT_EQ(o.code, 0) << o.err;
    std::vector<float> r0 = Params(name, 0);
    for (int r = 1; r < world; ++r) {
      std::vector<float> other = Params(name, r);
      ASSERT_EQ(other.size(), r0.size());
      EXPECT_EQ(std::memcmp(other.data(), r0.data(), r0.size() * sizeof(float)), 0)
          << "rank " << r << " differs";
    }
    EXPECT_LT(MaxDiff(r0, reference), 1e-5) << world << " ranks";
  }
}

TEST_F(DdpTest, AccumulationWithNoSyncMatches) {
  ASSERT_EQ(Run(0, {"--steps", "6", "--accumulate", "2"}, "single").code, 0);
  auto o = Run(2, {"--steps", "6", "--accumulate", "2"}, "acc");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_LT(MaxDiff(Params("acc", 0), Params("single", 0)), 1e-5);
  EXPECT_EQ(Params("acc", 0), Params("acc", 1));
}

TEST_F(DdpTest, ASkipOnOneRankIsASkipOnEveryRank) {
  ASSERT_EQ(Run(0, {"--steps", "6", "--skip-step", "2"}, "single").code, 0);
  ASSERT_EQ(Run(0, {"--steps", "6"}, "noskip").code, 0);
  auto o = Run(2, {"--steps", "6", "--skip-on-rank", "1", "--skip-step", "2"}, "skip");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Params("skip", 0), Params("skip", 1));
  EXPECT_LT(MaxDiff(Params("skip", 0), Params("single", 0)), 1e-5);
  EXPECT_GT(MaxDiff(Params("skip", 0), Params("noskip", 0)), 1e-4);  // the skip did something
}

TEST_F(DdpTest, BucketsStartDuringBackward) {
  // Small buckets: several per backward. With overlap, all but the last start
  // from the gradient hooks, before backward returns; without, none does.
  auto o = Run(2, {"--steps", "3", "--bucket-mb", "0.002"}, "overlap");
  ASSERT_EQ(o.code, 0) << o.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.out, m,
                                std::regex("stats buckets=(\\d+) in_backward=(\\d+) after=(\\d+)")))
      << o.out;
  int buckets = std::stoi(m[1]), during = std::stoi(m[2]), after = std::stoi(m[3]);
  EXPECT_GE(buckets, 3);
  EXPECT_GE(during, 3 * (buckets - 1));  // 3 steps
  auto off = Run(2, {"--steps", "3", "--bucket-mb", "0.002", "--no-overlap"}, "off");
  ASSERT_EQ(off.code, 0) << off.err;
  ASSERT_TRUE(std::regex_search(off.out, m, std::regex("in_backward=(\\d+) after=(\\d+)")));
  EXPECT_EQ(std::stoi(m[1]), 0);
  EXPECT_EQ(Params("overlap", 0), Params("off", 0));  // same numbers either way
  (void)after;
}

TEST_F(DdpTest, GradientsAreViewsOfTheBucketsAndCopiedOnlyOnce) {
  // One bucket holds every gradient. Cleared in place, each .grad stays a
  // view of it: copied in at the first backward only. Set to none each step
  // (torch 2.x's zero_grad), each is copied in every step. Same numbers.
  ASSERT_EQ(Run(0, {"--steps", "5", "--accumulate", "2"}, "single").code, 0);
  std::vector<std::string> job = {"--steps", "5", "--accumulate", "2", "--bucket-mb", "1"};
  std::vector<std::string> in_place = job;
  in_place.push_back("--zero-in-place");
  auto views = Run(2, in_place, "views");
  ASSERT_EQ(views.code, 0) << views.err;
  auto none = Run(2, job, "none");
  ASSERT_EQ(none.code, 0) << none.err;
  std::smatch m;
  const int kParams = 6;  // three Linear layers
  ASSERT_TRUE(std::regex_search(views.out, m, std::regex("copies=(\\d+) views=(\\d+)")))
      << views.out;
  EXPECT_EQ(std::stoi(m[1]), kParams);
  EXPECT_EQ(std::stoi(m[2]), kParams);
  ASSERT_TRUE(std::regex_search(none.out, m, std::regex("copies=(\\d+) views=(\\d+)"))) << none.out;
  EXPECT_EQ(std::stoi(m[1]), 5 * kParams);
  EXPECT_EQ(Params("views", 0), Params("views", 1));
  EXPECT_EQ(Params("views", 0), Params("none", 0));
  EXPECT_LT(MaxDiff(Params("views", 0), Params("single", 0)), 1e-5);
}

TEST_F(DdpTest, Fp16CompressionStaysClose) {
  ASSERT_EQ(Run(0, {"--steps", "5"}, "single").code, 0);
  auto o = Run(2, {"--steps", "5", "--compress", "fp16"}, "fp16");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Params("fp16", 0), Params("fp16", 1));
  EXPECT_LT(MaxDiff(Params("fp16", 0), Params("single", 0)), 1e-2);
}

TEST_F(DdpTest, ALostRankStopsTheOthersWithinTheTimeout) {
  // Started directly (not by fullburn launch, which would stop the survivor
  // itself): rank 1 dies at step 2, rank 0 must notice and exit; the same
  // with sharded gradients (reduces to each owner, then broadcasts).
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded gradients" : "all-reduce");
    std::vector<testing::Background> ranks(2);
    std::string port = std::to_string(29600 + (::getpid() + (sharded ? 150 : 0)) % 300);
    for (int r = 0; r < 2; ++r) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", "2", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      std::vector<std::string> argv = {DDP_WORKER, "--steps",    "50",          "--die-rank",
                                       "1",        "--die-step", "2",           "--timeout",
                                       "10",       "--out",      dir_ + "/lost"};
      if (sharded) argv.push_back("--shard-grads");
      testing::Start(&ranks[r], argv,
                     std::string(sharded ? "lost_sharded" : "lost_rank") + std::to_string(r));
    }
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
    EXPECT_EQ(ranks[1].Wait(60), 9);
    auto start = std::chrono::steady_clock::now();
    int code = ranks[0].Wait(60);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
    EXPECT_EQ(code, 1);
    EXPECT_NE(ranks[0].Err().find("lost contact with the other ranks"), std::string::npos)
        << ranks[0].Err();
    EXPECT_NE(ranks[0].Err().find("not responding: rank 1"), std::string::npos) << ranks[0].Err();
    EXPECT_FALSE(std::ifstream(dir_ + "/lost.0").good());  // no result file from a failed job
  }
}

// ZeRO stage 2: each gradient reduced to its owner only (several buckets,
// each split by owner), the others freed; the owners' updates, broadcast,
// give the single process's weights, with and without accumulation.
TEST_F(DdpTest, ShardedGradientsMatchOneProcessAndEachRankHoldsItsShare) {
  for (int accumulate : {1, 2}) {
    std::vector<std::string> job = {"--steps", "6", "--accumulate", std::to_string(accumulate)};
    ASSERT_EQ(Run(0, job, "single").code, 0);
    std::vector<float> reference = Params("single", 0);
    int64_t total = static_cast<int64_t>(reference.size());
    job.push_back("--shard-grads");
    for (int world : {2, 3}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, accumulate " + std::to_string(accumulate));
      std::string name = "zero2_" + std::to_string(world);
      auto o = Run(world, job, name);
      ASSERT_EQ(o.code, 0) << o.err;
      for (int r = 0; r < world; ++r) EXPECT_LT(MaxDiff(Params(name, r), reference), 1e-5) << r;
      // Every rank's "held N" line: its own gradients, within the largest
      // parameter (32x32) of an equal share, and all of them once in total.
      std::regex held("held (\\d+)");
      int64_t sum = 0;
      int lines = 0;
      for (auto it = std::sregex_iterator(o.out.begin(), o.out.end(), held);
           it != std::sregex_iterator(); ++it, ++lines) {
        int64_t n = std::stoll((*it)[1]);
        EXPECT_LE(n, total / world + 32 * 32);
        sum += n;
      }
      EXPECT_EQ(lines, world) << o.out;
      EXPECT_EQ(sum, total);
      std::smatch m;
      ASSERT_TRUE(std::regex_search(o.out, m, std::regex("buckets=(\\d+) in_backward=(\\d+)")))
          << o.out;
      EXPECT_GE(std::stoi(m[1]), 3);  // more than the two reduces allowed in flight
      EXPECT_GT(std::stoi(m[2]), 0);  // the reduces overlap backward as the all-reduces do
    }
  }
}

// A listening loopback socket on a free port that child processes do not
// inherit (a rank holding it would keep the port busy); -1 on failure.
int ListenOnLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd, 16) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
}

TEST_F(DdpTest, BadRendezvousIsAClearError) {
  auto mismatch =
      RunToEnd({FULLBURN_BIN, "launch", "--nproc", "2", "--", "sh", "-c",
                std::string(DDP_WORKER) + " --steps 1 --out " + dir_ + "/m --config-hash h$RANK"},
               60);
  EXPECT_NE(mismatch.code, 0);
  EXPECT_NE(mismatch.err.find("config differs"), std::string::npos) << mismatch.err;
  // Nobody at the master: rank 1 gives up after the timeout with the address.
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "9", 1);
  auto alone = RunToEnd({DDP_WORKER, "--steps", "1", "--timeout", "2", "--out", dir_ + "/a"}, 60);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  EXPECT_EQ(alone.code, 1);
  EXPECT_NE(alone.err.find("cannot meet the other ranks at 127.0.0.1:9"), std::string::npos)
      << alone.err;

  // Rank 0 cannot serve the rendezvous on a port something else holds.
  int port = 0, fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  auto busy = RunToEnd({DDP_WORKER, "--steps", "1", "--timeout", "2", "--out", dir_ + "/b"}, 60);
  // Rank 1 pointed at that port connects (the kernel accepts into the
  // backlog) but nothing there speaks the rendezvous.
  ::setenv("RANK", "1", 1);
  auto stranger = RunToEnd(
      {DDP_WORKER, "--steps", "1", "--timeout", "2", "--out", dir_ + "/c", "--config-hash", "same"},
      60);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  ::close(fd);
  EXPECT_EQ(busy.code, 1);
  EXPECT_NE(busy.err.find("is in use"), std::string::npos) << busy.err;
  EXPECT_EQ(stranger.code, 1);
  EXPECT_NE(stranger.err.find("no rendezvous answered there"), std::string::npos) << stranger.err;
}

// Rank 1 reaches the port before rank 0 listens there, through something
// that accepts and hangs up (a proxy, or a Service ahead of its pod): it
// tries again within its timeout, and the job starts once rank 0 is up.
TEST_F(DdpTest, ARankThatMeetsAHangUpBeforeRankZeroTriesAgain) {
  int port = 0, fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0);
  std::atomic<int> hung_up{0};
  std::atomic<bool> stop{false};
  std::thread hang_up([&] {
    while (!stop) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) continue;
        linger reset{1, 0};  // hang up with a reset: no TIME_WAIT left on the port
        ::setsockopt(c, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        ::close(c);
        ++hung_up;
      }
    }
  });
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("RANK", "1", 1);
  testing::Background one, zero;
  testing::Start(&one, {DDP_WORKER, "--steps", "2", "--timeout", "30", "--out", dir_ + "/h"},
                 "rank1");
  // Up to 60 s: the rank loads libtorch first, slow on a busy machine.
  for (int i = 0; i < 1200 && hung_up < 2; ++i) ::usleep(50 * 1000);
  stop = true;
  hang_up.join();
  ::close(fd);
  ::setenv("RANK", "0", 1);
  testing::Start(&zero, {DDP_WORKER, "--steps", "2", "--timeout", "30", "--out", dir_ + "/h"},
                 "rank0");
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  EXPECT_GE(hung_up, 2) << "rank 1 should have met the hang-up at least twice";
  EXPECT_EQ(zero.Wait(90), 0) << zero.Err();
  EXPECT_EQ(one.Wait(90), 0) << one.Err();
  EXPECT_EQ(Params("h", 0), Params("h", 1));
}

}  // namespace
}  // namespace fullburn
