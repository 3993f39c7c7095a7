// Percentages as every command prints them: one formatter, so a share reads
// the same in diagnose, report, analyze, fleet and tune.
//
// Contract: pure functions. A share that is not a number (a reading that is
// missing) and a part of nothing print "-", never "nan%" or "0%": a missing
// value must not read as a measured zero. `digits` is the decimals after the
// point: 0 for readings sampled once a second, 1 for profiler traces exact
// to the microsecond.
#pragma once

#include <string>

namespace fullburn {

// 0.253 -> "25%" (digits 0), "25.3%" (digits 1).
std::string Percent(double share, int digits = 0);
// part / whole as a percentage; "-" when whole is not above 0.
std::string PercentOf(double part, double whole, int digits = 0);

}  // namespace fullburn
