#include "fullburn/step_range.h"

#include <gtest/gtest.h>

namespace fullburn {
namespace {

TEST(ParseStepRange, TakesARangeOrOneStep) {
  auto r = ParseStepRange("20-25", 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 20);
  EXPECT_EQ(r->second, 25);
  auto one = ParseStepRange("7", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->first, 7);
  EXPECT_EQ(one->second, 7);
  auto zero = ParseStepRange("0-3", 0);  // ProfilerStep numbers start at 0
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->first, 0);
}

TEST(ParseStepRange, RefusesAnythingElseSayingWhy) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {{"", "not a range"},        {"a-b", "not a range"},   {"5-", "no last step"},
               {"5-3", "B is before A"},    {"0-3", "count from 1"},  {" 5-6", "not a range"},
               {"5 -6", "digits only"},     {"+5", "not a range"},    {"5-6x", "digits only"},
               {"1-2-3", "digits only"},    {"99999999999999999999", "not a range"}};
  for (const Case& c : cases) {
    auto r = ParseStepRange(c.text, 1);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << c.text << ": " << r.status().message();
  }
}

}  // namespace
}  // namespace fullburn
