#include "fullburn/percent.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace fullburn {

std::string Percent(double share, int digits) {
  if (!std::isfinite(share)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f%%", std::clamp(digits, 0, 6), share * 100);
  return buf;
}

std::string PercentOf(double part, double whole, int digits) {
  return whole > 0 ? Percent(part / whole, digits) : "-";
}

}  // namespace fullburn
