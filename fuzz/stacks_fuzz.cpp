// py-spy's raw stacks as `fullburn run` keeps them (stacks/run-ID.pyspy):
// parsed, summarized, its summary's JSON read back, and exported folded and
// as speedscope, which must stay valid JSON whatever bytes the file holds.
#include <string>

#include "fullburn/stacks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  int64_t bad = 0;
  std::vector<fullburn::StackSample> samples = fullburn::ParseFoldedStacks(text, &bad);
  int root = samples.empty() ? 0 : samples.front().pid;
  fullburn::StackSummary summary = fullburn::SummarizeStacks(samples, root, 50);
  std::string json = fullburn::StackSummaryJson(summary).dump();
  (void)fullburn::StackSummaryFromJson(nlohmann::json::parse(json));
  (void)fullburn::RenderStackPhases(summary);
  (void)fullburn::FoldedStacks(samples, root);
  (void)nlohmann::json::parse(fullburn::SpeedscopeJson(samples, root, 50, "fuzz").dump());
  return 0;
}
