// JPEG through libjpeg-turbo's libjpeg API, which (unlike TurboJPEG 2.x) can
// skip rows (jpeg_skip_scanlines) and crop columns (jpeg_crop_scanline), so a
// small RandomResizedCrop decodes only its region, downscaled in the DCT domain.
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

// clang-format off: jpeglib.h uses size_t and FILE without including them.
#include <jpeglib.h>
// clang-format on

#include "fullburn/codec.h"

namespace fullburn {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Corrupt-data warnings (a truncated file, say) become errors: a damaged
// image must be skipped or fail, never feed garbage pixels to training.
void OnWarning(j_common_ptr cinfo, int level) {
  if (level < 0) OnError(cinfo);
}

// The libjpeg state of one decode; destroyed on every path out.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  Decompressor() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnError;
    err.pub.emit_message = OnWarning;
    err.message[0] = 0;
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
};

Status HeaderError(const char* what) {
  return Status::Corruption(std::string("not a decodable JPEG: ") + what);
}

// Print-workflow JPEGs (a few in ImageNet's training set): libjpeg gives CMYK
// (from YCCK too), converted to RGB here as Pillow's convert("RGB") does.
bool IsCmyk(const jpeg_decompress_struct& c) {
  return c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
}

// a * b / 255, rounded exactly (Pillow's MULDIV255).
inline uint8_t MulDiv255(int a, int b) {
  int t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

// Adobe's CMYK JPEGs (Photoshop, Pillow) store inverted inks; others plain.
void CmykRowToRgb(const uint8_t* cmyk, int width, bool inverted, uint8_t* rgb) {
  for (int x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int ch = 0; ch < 3; ++ch) rgb[ch] = MulDiv255(inverted ? cmyk[ch] : 255 - cmyk[ch], k);
  }
}

// Checks what fullburn can decode to RGB; call after jpeg_read_header.
Status CheckSupported(const jpeg_decompress_struct& c) {
  if (c.data_precision != 8)
    return Status::InvalidArgument("unsupported JPEG: " + std::to_string(c.data_precision) +
                                   "-bit samples (only 8-bit)");
  if (IsCmyk(c))
    return c.num_components == 4 ? Status::Ok() : HeaderError("CMYK without 4 components");
  if (c.num_components != 1 && c.num_components != 3)
    return Status::InvalidArgument("unsupported JPEG: " + std::to_string(c.num_components) +
                                   " components");
  return Status::Ok();
}

}  // namespace

Result<JpegHeader> ReadJpegHeader(const uint8_t* data, size_t size) {
  if (size < 4) return HeaderError(size == 0 ? "empty file" : "too short");
  Decompressor d;
  if (setjmp(d.err.jump)) return HeaderError(d.err.message);
  jpeg_create_decompress(&d.cinfo);
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d.cinfo, TRUE);
  if (Status s = CheckSupported(d.cinfo); !s.ok()) return s;
  JpegHeader h;
  h.width = static_cast<int>(d.cinfo.image_width);
  h.height = static_cast<int>(d.cinfo.image_height);
  h.components = d.cinfo.num_components;
  return h;
}

Status DecodeJpegRegion(const uint8_t* data, size_t size, const BoxF& crop, int min_w, int min_h,
                        DecodedRegion* out) {
  if (size < 4) return HeaderError(size == 0 ? "empty file" : "too short");
  Decompressor d;
  jpeg_decompress_struct& c = d.cinfo;
  if (setjmp(d.err.jump)) return HeaderError(d.err.message);
  jpeg_create_decompress(&c);
  jpeg_mem_src(&c, data, static_cast<unsigned long>(size));
  jpeg_read_header(&c, TRUE);
  if (Status s = CheckSupported(c); !s.ok()) return s;
  // The smallest of 1/8, 1/4, 1/2, 1 that keeps the crop at least min_w x
  // min_h. libjpeg-turbo has SIMD inverse DCTs for these four only; the
  // other eighths run plain C and cost more than they save.
  int num = 8;
  for (int n : {1, 2, 4, 8}) {
    if (crop.w * n / 8.0 >= min_w && crop.h * n / 8.0 >= min_h) {
      num = n;
      break;
    }
  }
  c.scale_num = static_cast<unsigned>(num);
  c.scale_denom = 8;
  const bool cmyk = IsCmyk(c);
  c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  c.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&c);
  const double s = static_cast<double>(c.output_width) / c.image_width;
  const int full_w = static_cast<int>(c.output_width), full_h = static_cast<int>(c.output_height);
  // The crop in decoded pixels, with one pixel of margin for bilinear taps.
  int x0 = std::max(0, static_cast<int>(std::floor(crop.x * s)) - 1);
  int x1 = std::min(full_w, static_cast<int>(std::ceil((crop.x + crop.w) * s)) + 1);
  int y0 = std::max(0, static_cast<int>(std::floor(crop.y * s)) - 1);
  int y1 = std::min(full_h, static_cast<int>(std::ceil((crop.y + crop.h) * s)) + 1);
  if (x1 <= x0 || y1 <= y0) return Status::InvalidArgument("crop lies outside the image");
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), xw = static_cast<JDIMENSION>(x1 - x0);
  if (xoff > 0 || xw < c.output_width) jpeg_crop_scanline(&c, &xoff, &xw);  // widens to iMCU edges
  if (y0 > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(y0));
  out->width = static_cast<int>(c.output_width);
  out->height = y1 - y0;
  out->scale = s;
  out->origin_x = xoff / s;
  out->origin_y = y0 / s;
  out->rgb.resize(static_cast<size_t>(out->width) * out->height * 3);
  std::vector<uint8_t> cmyk_row(cmyk ? static_cast<size_t>(out->width) * 4 : 0);
  for (int row = 0; row < out->height; ++row) {
    uint8_t* rgb = out->rgb.data() + static_cast<size_t>(row) * out->width * 3;
    JSAMPROW ptr = cmyk ? cmyk_row.data() : rgb;
    if (jpeg_read_scanlines(&c, &ptr, 1) != 1) return HeaderError("fewer rows than the header says");
    if (cmyk) CmykRowToRgb(cmyk_row.data(), out->width, c.saw_Adobe_marker, rgb);
  }
  jpeg_abort_decompress(&c);
  return Status::Ok();
}

Status DecodeJpeg(const uint8_t* data, size_t size, DecodedRegion* out) {
  Result<JpegHeader> h = ReadJpegHeader(data, size);
  if (!h.ok()) return h.status();
  BoxF all{0, 0, static_cast<double>(h->width), static_cast<double>(h->height)};
  return DecodeJpegRegion(data, size, all, h->width, h->height, out);
}

Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality) {
  jpeg_compress_struct c;
  ErrorManager err;
  c.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = OnError;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&c);
    std::free(buffer);
    return Status::InvalidArgument(std::string("cannot encode JPEG: ") + err.message);
  }
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, &buffer, &size);
  c.image_width = static_cast<JDIMENSION>(width);
  c.image_height = static_cast<JDIMENSION>(height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb) + static_cast<size_t>(c.next_scanline) * width * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&c);
  std::free(buffer);
  return out;
}

}  // namespace fullburn
