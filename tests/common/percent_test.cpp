#include "fullburn/percent.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fullburn {
namespace {

TEST(Percent, DigitsAsAsked) {
  EXPECT_EQ(Percent(0.253), "25%");
  EXPECT_EQ(Percent(0.253, 1), "25.3%");
  EXPECT_EQ(Percent(1.0), "100%");
  EXPECT_EQ(Percent(0.0), "0%");
  EXPECT_EQ(PercentOf(1, 8, 1), "12.5%");
  EXPECT_EQ(PercentOf(3, 4), "75%");
}

// A missing reading is never printed as a measured zero.
TEST(Percent, MissingValuesAreADash) {
  EXPECT_EQ(Percent(std::nan("")), "-");
  EXPECT_EQ(Percent(std::numeric_limits<double>::infinity()), "-");
  EXPECT_EQ(PercentOf(1, 0), "-");
  EXPECT_EQ(PercentOf(1, -2), "-");
}

}  // namespace
}  // namespace fullburn
