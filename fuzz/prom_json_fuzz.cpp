// A Prometheus HTTP API answer (range or instant query) as `fullburn fleet`
// reads it, on a grid like the one it asks for.
#include <string>

#include "fullburn/fleet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  fullburn::Result<fullburn::PromMatrix> m = fullburn::ParsePromMatrix(body, 1700000000, 60);
  if (m.ok())
    for (const fullburn::PromSeries& s : *m) (void)s.At(s.first);
  return 0;
}
