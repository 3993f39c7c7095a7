// A duration as `fullburn fleet --window` and Prometheus's scrapeInterval
// give it ("7d", "1m30s"), read by ParsePromDuration.
#include <cmath>
#include <cstdlib>
#include <string>

#include "fullburn/fleet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  fullburn::Result<double> seconds = fullburn::ParsePromDuration(text);
  // The window sizes a query's grid: an accepted duration is a real one.
  if (seconds.ok() && !(std::isfinite(*seconds) && *seconds > 0)) std::abort();
  return 0;
}
