// The trackers' names, the store feed and TensorBoard's framing. That the
// files are TensorBoard's is checked with TensorBoard's own reader
// (tests/python/trackers_test.py); here: the parts it rests on.
#include "fullburn/trackers.h"

#include <gtest/gtest.h>
#include <cstring>
#include <fstream>
#include <sstream>

#include "replay_env.h"

namespace fullburn {
namespace {

const TrackerPoint* Find(const std::vector<TrackerPoint>& points, const std::string& key, int64_t step) {
  for (const TrackerPoint& p : points)
    if (p.key == key && p.step == step) return &p;
  return nullptr;
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // Incremental: the CRC of a whole is the CRC of its parts chained.
  EXPECT_EQ(Crc32c("6789", 4, Crc32c("12345", 5)), 0xE3069283u);
}

TEST(TfRecord, FramesLengthAndDataWithMaskedCrcs) {
  std::string r = TfRecord("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  uint64_t length;
  std::memcpy(&length, r.data(), 8);
  EXPECT_EQ(length, 3u);
  uint32_t length_crc, data_crc;
  std::memcpy(&length_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 15, 4);
  EXPECT_EQ(length_crc, MaskedCrc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, 3), "abc");
  uint32_t crc = Crc32c("abc", 3);
  EXPECT_EQ(data_crc, ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(ScalarEvent, IsTheProtobufOfAnEventWithOneSimpleValue) {
  std::string e = ScalarEvent(1.5, 300, {{"a", 2.0f}});
  // wall_time (field 1, 64-bit) 1.5; step (field 2, varint) 300 = ac 02;
  // summary (field 5) { value (1) { tag (1) "a", simple_value (2, 32-bit) 2.0 } }.
  const unsigned char want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0xac, 0x02, 0x2a, 0x0a, 0x0a,
                                0x08, 0x0a, 0x01, 'a', 0x15, 0, 0, 0, 0x40};
  ASSERT_EQ(e.size(), sizeof want);
  EXPECT_EQ(std::memcmp(e.data(), want, sizeof want), 0);
}

TEST(TrackerKey, TakesMlflowsSystemNamesForRankZeroOnly) {
  double scale = 0;
  EXPECT_EQ(TrackerKey("gpu1.util", TrackerStyle::kMlflow, &scale), "system/gpu_1_utilization_percentage");
  EXPECT_EQ(scale, 1);
  EXPECT_EQ(TrackerKey("gpu0.mem_used_bytes", TrackerStyle::kMlflow, &scale),
            "system/gpu_0_memory_usage_megabytes");
  EXPECT_DOUBLE_EQ(scale, 1e-6);
  EXPECT_EQ(TrackerKey("host.cpu_util", TrackerStyle::kMlflow, &scale), "system/cpu_utilization_percentage");
  EXPECT_EQ(TrackerKey("host.mem_used_bytes", TrackerStyle::kMlflow, &scale),
            "system/system_memory_usage_megabytes");
  EXPECT_EQ(TrackerKey("gpu0.tensor_active", TrackerStyle::kMlflow, &scale), "fullburn/gpu0.tensor_active");
  EXPECT_EQ(TrackerKey("rank2.gpu0.util", TrackerStyle::kMlflow, &scale), "fullburn/rank2.gpu0.util");
  EXPECT_EQ(TrackerKey("gpu0.util", TrackerStyle::kTensorBoard, &scale), "fullburn/gpu0.util");
  EXPECT_EQ(scale, 1);
}

TEST(SamplePoints, AddsMlflowsSharesAndLeavesOutPerCoreReadings) {
  RunInfo run;
  run.start_time = 1000;
  run.interval_s = 0.5;
  std::map<std::string, Series> samples{
      {"gpu0.mem_used_bytes", {{1.0, 40e9}}}, {"gpu0.mem_total_bytes", {{1.0, 80e9}}},
      {"gpu0.power_w", {{1.0, 350}}},          {"gpu0.power_limit_w", {{1.0, 700}}},
      {"host.mem_used_bytes", {{1.0, 3e9}}},   {"host.mem_total_bytes", {{1.0, 12e9}}},
      {"host.cpu3.user", {{1.0, 50}}},         {"gpu0.util", {{1.0, 97}, {1.5, std::nan("")}}}};
  auto points = SamplePoints(run, samples, TrackerStyle::kMlflow);
  const TrackerPoint* mem = Find(points, "system/gpu_0_memory_usage_megabytes", 2);
  ASSERT_NE(mem, nullptr);
  EXPECT_DOUBLE_EQ(mem->value, 40000);
  EXPECT_DOUBLE_EQ(mem->unix_time, 1001);
  ASSERT_NE(Find(points, "system/gpu_0_memory_usage_percentage", 2), nullptr);
  EXPECT_DOUBLE_EQ(Find(points, "system/gpu_0_memory_usage_percentage", 2)->value, 50);
  EXPECT_DOUBLE_EQ(Find(points, "system/gpu_0_power_usage_percentage", 2)->value, 50);
  EXPECT_DOUBLE_EQ(Find(points, "system/system_memory_usage_percentage", 2)->value, 25);
  EXPECT_EQ(Find(points, "fullburn/host.cpu3.user", 2), nullptr);
  EXPECT_NE(Find(points, "system/gpu_0_utilization_percentage", 2), nullptr);
  EXPECT_EQ(Find(points, "system/gpu_0_utilization_percentage", 3), nullptr) << "NaN is left out";
}

TEST(StepPoints, NamesEachRanksStepMetrics) {
  RunInfo run;
  run.start_time = 100;
  StepRecord a;
  a.step = 7;
  a.t = 3;
  a.step_s = 0.25;
  a.samples = 64;
  a.data_wait_s = 0.05;
  a.loss = 2.5;
  a.lr = 1e-3;
  StepRecord b = a;
  b.rank = 1;
  b.loss = std::nan("");
  auto points = StepPoints(run, {a, b});
  ASSERT_NE(Find(points, "fullburn/step_time_ms", 7), nullptr);
  EXPECT_DOUBLE_EQ(Find(points, "fullburn/step_time_ms", 7)->value, 250);
  EXPECT_DOUBLE_EQ(Find(points, "fullburn/steps_per_s", 7)->value, 4);
  EXPECT_DOUBLE_EQ(Find(points, "fullburn/samples_per_s", 7)->value, 256);
  EXPECT_DOUBLE_EQ(Find(points, "fullburn/data_wait_pct", 7)->value, 20);
  EXPECT_DOUBLE_EQ(Find(points, "fullburn/loss", 7)->unix_time, 103);
  EXPECT_NE(Find(points, "fullburn/rank1.step_time_ms", 7), nullptr);
  EXPECT_EQ(Find(points, "fullburn/rank1.loss", 7), nullptr);
}

class TrackerFeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_trackers");
    auto s = RunStore::Open(dir_ + "/runs.db");
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(*s);
    run_.name = "job";
    run_.start_time = 5000;
    run_.interval_s = 1;
    auto id = store_->BeginRun(run_);
    ASSERT_TRUE(id.ok());
    run_.id = *id;
  }
  std::string dir_;
  std::unique_ptr<RunStore> store_;
  RunInfo run_;
};

TEST_F(TrackerFeedTest, SendsEachReadingOnceAndPicksUpAnotherRanksLateOnes) {
  TrackerFeed feed(run_, TrackerStyle::kMlflow);
  ASSERT_TRUE(store_->AppendNamedSamples(run_.id, {{"gpu0.util", 1, 90}, {"gpu0.util", 2, 91}}).ok());
  auto first = feed.Poll(store_.get());
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->points.size(), 2u);
  EXPECT_FALSE(first->finished);
  // Rank 1's reading of t=1.5 lands after rank 0's of t=3.
  ASSERT_TRUE(store_->AppendNamedSamples(run_.id, {{"gpu0.util", 3, 92}}).ok());
  ASSERT_TRUE(store_->AppendNamedSamples(run_.id, {{"rank1.gpu0.util", 1.5, 50}}).ok());
  StepRecord s;
  s.step = 1;
  s.t = 2.5;
  s.step_s = 0.5;
  ASSERT_TRUE(store_->AppendSteps(run_.id, {s}).ok());
  auto second = feed.Poll(store_.get());
  ASSERT_TRUE(second.ok());
  EXPECT_NE(Find(second->points, "system/gpu_0_utilization_percentage", 3), nullptr);
  EXPECT_EQ(Find(second->points, "system/gpu_0_utilization_percentage", 1), nullptr) << "sent already";
  EXPECT_NE(Find(second->points, "fullburn/rank1.gpu0.util", 2), nullptr);
  EXPECT_NE(Find(second->points, "fullburn/step_time_ms", 1), nullptr);
  ASSERT_TRUE(store_->FinishRun(run_.id, 5004, 0, "finished").ok());
  auto last = feed.Poll(store_.get());
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->points.empty());
  EXPECT_TRUE(last->finished);
}

TEST(TfEventsWriter, AFolderThatIsAFileIsRefusedWithTheFix) {
  std::string dir = testing::FreshTestDir("fb_tfevents");
  std::ofstream(dir + "/taken") << "x";
  auto w = TfEventsWriter::Open(dir + "/taken/tb", 10);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(dir + "/taken/tb"), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find("pass a folder this user can write"), std::string::npos);
}

TEST(TfEventsWriter, WritesTheVersionRecordThenOneRecordPerStep) {
  std::string dir = testing::FreshTestDir("fb_tfevents");
  auto w = TfEventsWriter::Open(dir + "/tb", 10);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->Write({{"fullburn/a", 1, 1, 11}, {"fullburn/b", 2, 1, 11}, {"fullburn/a", 3, 2, 12}}).ok());
  std::ifstream in((*w)->path(), std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::string file = bytes.str();
  std::vector<std::string> records;
  for (size_t at = 0; at + 12 <= file.size();) {
    uint64_t length;
    std::memcpy(&length, file.data() + at, 8);
    ASSERT_LE(at + 16 + length, file.size());
    records.push_back(file.substr(at + 12, length));
    at += 16 + length;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(records[1], ScalarEvent(11, 1, {{"fullburn/a", 1.0f}, {"fullburn/b", 2.0f}}));
  EXPECT_EQ(records[2], ScalarEvent(12, 2, {{"fullburn/a", 3.0f}}));
}

}  // namespace
}  // namespace fullburn
