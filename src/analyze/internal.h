// Internal to analyze: what its files share.
#pragma once

#include <vector>

#include "fullburn/analyze.h"
#include "trace.h"

namespace fullburn::analyze {

// One read trace as rank `rank` (when it names none). Resolves flows in
// place.
Result<RankReport> AnalyzeRaw(RawTrace& t, int rank, const AnalyzeOptions& o);

// By share lost, largest first; ties keep their order.
void SortFindings(std::vector<Finding>* v);

}  // namespace fullburn::analyze
