// The JPEG decoder's wrapper over libjpeg: the header, a full decode, and a
// cropped, DCT-downscaled region as the loader asks for.
#include "fullburn/pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = fullburn::ReadJpegHeader(data, size);
  if (!header.ok()) return 0;
  // A decode allocates width x height x 3: the fuzzer's malloc limit would
  // report a valid 65535 x 65535 header as a runaway allocation.
  if (static_cast<int64_t>(header->width) * header->height > (int64_t{1} << 22)) return 0;
  fullburn::DecodedRegion full;
  (void)fullburn::DecodeJpeg(data, size, &full);
  fullburn::DecodedRegion region;
  fullburn::BoxF crop{0.25 * header->width, 0.25 * header->height, 0.5 * header->width,
                      0.5 * header->height};
  (void)fullburn::DecodeJpegRegion(data, size, crop, 8, 8, &region);
  return 0;
}
