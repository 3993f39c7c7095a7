// PNG through libpng's simplified API: decoded whole (PNG has no cheaper
// partial decode), to 8-bit RGB whatever the source depth or palette.
#include <png.h>

#include <cstring>

#include "fullburn/codec.h"

namespace fullburn {

bool IsPng(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return size >= 8 && std::memcmp(data, kSignature, 8) == 0;
}

Status DecodePng(const uint8_t* data, size_t size, DecodedRegion* out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    return Status::Corruption(std::string("not a decodable PNG: ") + image.message);
  image.format = PNG_FORMAT_RGB;
  out->width = static_cast<int>(image.width);
  out->height = static_cast<int>(image.height);
  out->scale = 1;
  out->origin_x = out->origin_y = 0;
  out->rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out->rgb.data(), 0, nullptr)) {
    std::string why = image.message;
    png_image_free(&image);
    return Status::Corruption("not a decodable PNG: " + why);
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> EncodePng(const uint8_t* rgb, int width, int height) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, rgb, 0, nullptr))
    return Status::InvalidArgument(std::string("cannot encode PNG: ") + image.message);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, rgb, 0, nullptr))
    return Status::InvalidArgument(std::string("cannot encode PNG: ") + image.message);
  out.resize(size);
  return out;
}

}  // namespace fullburn
