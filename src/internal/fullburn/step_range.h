// Step ranges as every command takes them ("20-25", or "7": that step
// alone): fullburn run --profile, profile.steps of fullburn train, fullburn
// analyze --steps. One parser, so all three accept the same text.
//
// Contract: a pure function. Only digits, with one '-' between two numbers:
// no spaces, signs or trailing text. An error's message is the reason
// alone ("B is before A"); the caller names the option it came from.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fullburn/status.h"

namespace fullburn {

// (first, last) with min_first <= first <= last.
Result<std::pair<int64_t, int64_t>> ParseStepRange(const std::string& text, int64_t min_first);

}  // namespace fullburn
