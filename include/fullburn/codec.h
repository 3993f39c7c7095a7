// Codec: JPEG and PNG images to and from RGB pixels (the pipeline's decode
// stage, and the encoders its pack and synthetic datasets write with).
//
// Contract
// - Plain functions: the caller owns the encoded bytes (read, never kept) and
//   every output (a DecodedRegion it passes in, the vectors returned); nothing
//   is kept between calls. An ImageView borrows the pixels it points at.
// - Threads: no shared state (each call has its own libjpeg or libpng
//   context), so any number of threads may decode and encode at once.
// - Errors: a Status (Result), never an exception. Data that is not a
//   decodable JPEG or PNG (corrupt, truncated, empty; libjpeg's corrupt-data
//   warnings count, so no garbage pixels come out) is Corruption; a JPEG
//   this decoder does not support (its precision or components), a crop
//   outside the image, or pixels an encoder refuses is InvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

// ---- JPEG ----------------------------------------------------------------

struct JpegHeader {
  int width = 0, height = 0, components = 0;
};
// A decoded region: rgb holds width x height x 3 bytes. Pixel (0, 0) is the
// source point (origin_x, origin_y); one decoded pixel spans 1/scale source
// pixels (scale = DCT scaling factor, 1/8 to 1).
struct DecodedRegion {
  int width = 0, height = 0;
  double scale = 1, origin_x = 0, origin_y = 0;
  std::vector<uint8_t> rgb;
};
struct BoxF {
  double x = 0, y = 0, w = 0, h = 0;  // in source pixels
};
// Pixels to resample: a decoded region, or raw pixels of a packed dataset
// (scale 1, origin 0), without copying either.
struct ImageView {
  const uint8_t* rgb = nullptr;
  int width = 0, height = 0;
  double scale = 1, origin_x = 0, origin_y = 0;
  static ImageView Of(const DecodedRegion& d) {
    return ImageView{d.rgb.data(), d.width, d.height, d.scale, d.origin_x, d.origin_y};
  }
};

Result<JpegHeader> ReadJpegHeader(const uint8_t* data, size_t size);
// Decodes the part of the image under `crop`, downscaled in the DCT domain by
// the largest factor that keeps the crop at least min_w x min_h decoded pixels.
// Rows above and below the crop are skipped, columns outside it are cropped.
Status DecodeJpegRegion(const uint8_t* data, size_t size, const BoxF& crop, int min_w, int min_h,
                        DecodedRegion* out);
// Full decode at scale 1 (the decode-only baseline).
Status DecodeJpeg(const uint8_t* data, size_t size, DecodedRegion* out);
// Encodes RGB pixels as a baseline JPEG (4:2:0) of the given quality.
Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality);

// ---- PNG (decoded whole; no partial or scaled decode exists for it) ---------

bool IsPng(const uint8_t* data, size_t size);
Status DecodePng(const uint8_t* data, size_t size, DecodedRegion* out);
Result<std::vector<uint8_t>> EncodePng(const uint8_t* rgb, int width, int height);

}  // namespace fullburn
