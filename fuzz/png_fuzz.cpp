// The PNG decoder's wrapper over libpng.
#include "fullburn/pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fullburn::DecodedRegion out;
  (void)fullburn::DecodePng(data, size, &out);
  return 0;
}
