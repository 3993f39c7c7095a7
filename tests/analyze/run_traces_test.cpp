#include "fullburn/run_traces.h"

#include <gtest/gtest.h>

#include <string>

namespace fullburn {
namespace {

RunEvent Profile(const std::string& data) {
  RunEvent e;
  e.kind = "profile";
  e.data = data;
  return e;
}

TEST(RunTraces, ARunWithoutProfileEventsHasNone) {
  RunData run;
  RunEvent other;
  other.kind = "checkpoint";
  other.data = R"({"path":"x"})";
  run.events.push_back(other);
  RunTraces t = AnalyzeRunTraces(run);
  EXPECT_TRUE(t.paths.empty());
  EXPECT_TRUE(t.error.empty());
}

// One event per rank with the same steps: each file once, the steps once;
// the real fixture is analysed as `fullburn analyze` would.
TEST(RunTraces, EachRanksFileIsAnalysedOnce) {
  std::string trace = std::string(ANALYZE_FIXTURES) + "/torch113_cpu_dataloader.json";
  RunData run;
  for (int rank = 0; rank < 2; ++rank)
    run.events.push_back(Profile(R"({"path":")" + trace +
                                 R"(","first_step":20,"last_step":25,"rank":)" +
                                 std::to_string(rank) + "}"));
  RunTraces t = AnalyzeRunTraces(run);
  ASSERT_EQ(t.paths.size(), 1u);
  EXPECT_EQ(t.steps, "20-25");
  EXPECT_TRUE(t.error.empty()) << t.error;
  EXPECT_FALSE(t.text.empty());
}

// The event is written from the job's side (python/fullburn_autosteps/profiler.py):
// fields of another type are unknown steps, not an exception out of report.
TEST(RunTraces, StepsOfAnotherTypeAreUnknownAndAMissingFileIsTheError) {
  RunData run;
  run.events.push_back(
      Profile(R"({"path":"/nonexistent/rank0.pt.trace.json","first_step":"20","last_step":null})"));
  run.events.push_back(Profile(R"({"path":7})"));
  run.events.push_back(Profile("not json"));
  RunTraces t;
  ASSERT_NO_THROW(t = AnalyzeRunTraces(run));
  ASSERT_EQ(t.paths.size(), 1u);
  EXPECT_EQ(t.steps, "?-?");
  EXPECT_NE(t.error.find("/nonexistent/rank0.pt.trace.json"), std::string::npos) << t.error;
}

}  // namespace
}  // namespace fullburn
