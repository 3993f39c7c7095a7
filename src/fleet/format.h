// Internal to fleet: the numbers and times its text, page and notes print.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <string>

namespace fullburn::fleet_format {

// GPU-hours with the digits that matter: a week of a fleet, or a minute of a test.
inline std::string Hours(double h) {
  double a = std::fabs(h);
  if (a >= 100) return fmt::format("{:.0f}", h);
  if (a >= 1) return fmt::format("{:.1f}", h);
  if (a >= 0.01 || a == 0) return fmt::format("{:.3f}", h);
  return fmt::format("{:.5f}", h);
}

// Unix seconds as a UTC date and time, "2026-11-25 21:40:05 UTC".
inline std::string Utc(double t) {
  std::time_t secs = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace fullburn::fleet_format
