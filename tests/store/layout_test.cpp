#include "fullburn/store_layout.h"

#include <gtest/gtest.h>

namespace fullburn {
namespace {

// docs/store.md and docs/tune.md name these paths to users; a change here is
// a change they see.
TEST(StoreLayout, NamesEveryPathBesideTheStore) {
  StoreLayout l("/var/lib/fullburn/runs.db");
  EXPECT_EQ(l.store(), "/var/lib/fullburn/runs.db");
  EXPECT_EQ(l.folder(), "/var/lib/fullburn");
  EXPECT_EQ(l.Traces(7), "/var/lib/fullburn/traces/run-7");
  EXPECT_EQ(l.Checkpoints(7), "/var/lib/fullburn/checkpoints/run-7");
  EXPECT_EQ(l.Datasets(), "/var/lib/fullburn/datasets");
  EXPECT_EQ(l.TuneLogs(12), "/var/lib/fullburn/tune-12");
  EXPECT_EQ(l.TrialLog(12, 3), "/var/lib/fullburn/tune-12/trial-3.log");
  EXPECT_EQ(l.TunePack(12), "/var/lib/fullburn/tune-12/pack");
}

TEST(StoreLayout, ABareFileNameIsInTheWorkingDirectory) {
  EXPECT_EQ(StoreLayout("runs.db").folder(), ".");
  EXPECT_EQ(StoreLayout("runs.db").Traces(1), "./traces/run-1");
  EXPECT_EQ(StoreLayout("/runs.db").folder(), "/");
  EXPECT_EQ(StoreLayout("rel/dir/runs.db").Datasets(), "rel/dir/datasets");
}

}  // namespace
}  // namespace fullburn
