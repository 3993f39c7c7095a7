// Crop geometry as torchvision defines it, and the fused resize that writes
// each output pixel once, straight into its place in the batch.
#include <algorithm>
#include <cmath>
#include <cstring>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "fullburn/crop.h"

namespace fullburn {

BoxF RandomResizedCropBox(int width, int height, const CropParams& p,
                          const std::function<double()>& uniform) {
  const double area = static_cast<double>(width) * height;
  const double log_min = std::log(p.ratio_min), log_max = std::log(p.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * (p.scale_min + uniform() * (p.scale_max - p.scale_min));
    double aspect = std::exp(log_min + uniform() * (log_max - log_min));
    // Python's round(): halves go to even, as std::nearbyint does by default.
    int w = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
    int h = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      // torch.randint(0, H - h + 1) and (0, W - w + 1).
      int top = std::min(height - h, static_cast<int>(uniform() * (height - h + 1)));
      int left = std::min(width - w, static_cast<int>(uniform() * (width - w + 1)));
      return BoxF{double(left), double(top), double(w), double(h)};
    }
  }
  // Fallback: the whole image, clamped to the ratio range, centered.
  double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_min) {
    h = static_cast<int>(std::nearbyint(w / p.ratio_min));
  } else if (in_ratio > p.ratio_max) {
    w = static_cast<int>(std::nearbyint(h * p.ratio_max));
  }
  return BoxF{double((width - w) / 2), double((height - h) / 2), double(w), double(h)};
}

BoxF ResizeCenterCropBox(int width, int height, int resize, int crop) {
  // Resize: the shorter side becomes `resize` (torchvision truncates the other).
  double rw = width <= height ? resize : static_cast<int>(resize * static_cast<double>(width) / height);
  double rh = height <= width ? resize : static_cast<int>(resize * static_cast<double>(height) / width);
  // CenterCrop: top = int(round((H - c) / 2)).
  double top = std::nearbyint((rh - crop) / 2.0), left = std::nearbyint((rw - crop) / 2.0);
  double sx = width / rw, sy = height / rh;
  return BoxF{left * sx, top * sy, crop * sx, crop * sy};
}

namespace {

// Separable bilinear in fixed point: 7-bit weights keep the first pass in
// 16 bits (255 * 128 < 32768).
constexpr int kBits = 7;
constexpr int kOne = 1 << kBits;

struct Tap {
  int i0, i1, w1;  // source indices and the weight of i1 (of kOne)
  int32_t w01;     // (kOne - w1) | w1 << 16: the pair pmaddwd multiplies by
};

// Bilinear taps for `n` outputs over [start, start + len) source pixels.
void Taps(double start, double len, int n, int limit, std::vector<Tap>* taps) {
  taps->resize(static_cast<size_t>(n));
  double step = len / n;
  for (int o = 0; o < n; ++o) {
    double f = start + (o + 0.5) * step - 0.5;
    f = std::clamp(f, 0.0, static_cast<double>(limit - 1));
    int i0 = static_cast<int>(f);
    int i1 = std::min(i0 + 1, limit - 1);
    int w1 = static_cast<int>(std::lround((f - i0) * kOne));
    (*taps)[static_cast<size_t>(o)] = Tap{i0, i1, w1, (kOne - w1) | (w1 << 16)};
  }
}

constexpr uint32_t kHalf = 1u << (2 * kBits - 1);

// The horizontal pass of one output row from the vertically blended row `v`:
// out[ox] = the two taps' pixels weighted, rounded to 8 bits.
void BlendRow(const uint16_t* v, const Tap* tx, int out_w, uint8_t* out) {
  int ox = 0;
#ifdef __SSE2__
  // Four pixels per step, the last of a row left to the plain loop below so
  // the 4-byte stores (3 channels and one spare) stay inside the row. Each
  // pixel: its two source pixels' channels interleaved (a0 b0 a1 b1 ...) and
  // multiplied by (w0, w1) with pmaddwd (values < 2^15, weights <= 2^7).
  // The 16-bit loads take one value past the pixel: `v` has 4 spare values.
  const __m128i half = _mm_set1_epi32(static_cast<int>(kHalf));
  auto pixel = [&](const Tap& t) {
    __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + t.i0 * 3));
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + t.i1 * 3));
    __m128i sum = _mm_madd_epi16(_mm_unpacklo_epi16(a, b), _mm_set1_epi32(t.w01));
    return _mm_srli_epi32(_mm_add_epi32(sum, half), 2 * kBits);
  };
  for (; ox + 5 <= out_w; ox += 4) {
    __m128i p01 = _mm_packs_epi32(pixel(tx[ox]), pixel(tx[ox + 1]));
    __m128i p23 = _mm_packs_epi32(pixel(tx[ox + 2]), pixel(tx[ox + 3]));
    alignas(16) uint8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm_packus_epi16(p01, p23));
    // In order, each store's spare byte overwritten by the next pixel.
    for (int k = 0; k < 4; ++k) std::memcpy(out + (ox + k) * 3, bytes + 4 * k, 4);
  }
#endif
  for (; ox < out_w; ++ox) {
    const Tap& t = tx[ox];
    const uint16_t* a = v + t.i0 * 3;
    const uint16_t* b = v + t.i1 * 3;
    const uint32_t w1 = static_cast<uint32_t>(t.w1), w0 = kOne - w1;
    out[ox * 3 + 0] = static_cast<uint8_t>((a[0] * w0 + b[0] * w1 + kHalf) >> (2 * kBits));
    out[ox * 3 + 1] = static_cast<uint8_t>((a[1] * w0 + b[1] * w1 + kHalf) >> (2 * kBits));
    out[ox * 3 + 2] = static_cast<uint8_t>((a[2] * w0 + b[2] * w1 + kHalf) >> (2 * kBits));
  }
}

}  // namespace

// Vertical first: blending two source rows is contiguous and vectorizes; the
// horizontal gather then runs once per output row, over out_w pixels only.
void ResizeInto(const ImageView& src, const BoxF& box, int out_w, int out_h, bool flip,
                Layout layout, uint8_t* dst) {
  thread_local std::vector<Tap> xs, ys;
  thread_local std::vector<uint16_t> blended;
  thread_local std::vector<uint8_t> line;
  Taps((box.x - src.origin_x) * src.scale, box.w * src.scale, out_w, src.width, &xs);
  Taps((box.y - src.origin_y) * src.scale, box.h * src.scale, out_h, src.height, &ys);
  if (flip) std::reverse(xs.begin(), xs.end());
  int x_lo = src.width, x_hi = 0;  // source columns the taps touch
  for (const Tap& t : xs) {
    x_lo = std::min(x_lo, t.i0);
    x_hi = std::max(x_hi, t.i1 + 1);
  }
  const size_t n = static_cast<size_t>(out_w) * 3;
  const size_t stride = static_cast<size_t>(src.width) * 3;
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  const size_t lo = static_cast<size_t>(x_lo) * 3, hi = static_cast<size_t>(x_hi) * 3;
  blended.resize(stride + 4);  // BlendRow's loads read up to 4 values past a pixel
  line.resize(n);
  // Plain pointers: every use of a thread_local vector would re-check its
  // initialisation, which costs more than the arithmetic in these loops.
  uint16_t* v = blended.data();
  std::fill(v + stride, v + stride + 4, uint16_t{0});
  uint8_t* tmp = line.data();
  const Tap* tx = xs.data();
  const Tap* tys = ys.data();
  for (int oy = 0; oy < out_h; ++oy) {
    const Tap& ty = tys[oy];
    const uint8_t* r0 = src.rgb + ty.i0 * stride;
    const uint8_t* r1 = src.rgb + ty.i1 * stride;
    const uint16_t wy1 = static_cast<uint16_t>(ty.w1), wy0 = static_cast<uint16_t>(kOne - ty.w1);
    for (size_t k = lo; k < hi; ++k) v[k] = static_cast<uint16_t>(r0[k] * wy0 + r1[k] * wy1);
    uint8_t* out = layout == Layout::kNHWC ? dst + static_cast<size_t>(oy) * n : tmp;
    BlendRow(v, tx, out_w, out);
    if (layout == Layout::kNCHW) {
      uint8_t* row = dst + static_cast<size_t>(oy) * out_w;
      for (int ox = 0; ox < out_w; ++ox)
        for (int c = 0; c < 3; ++c)
          row[c * plane + static_cast<size_t>(ox)] = tmp[static_cast<size_t>(ox) * 3 + c];
    }
  }
}

}  // namespace fullburn

namespace fullburn {

void NormalizeInto(const uint8_t* src, int pixels, Layout layout, const Normalization& n, float* dst) {
  // (v / 255 - mean) / std as one multiply-add per value.
  float scale[3], bias[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * n.std[c]);
    bias[c] = -n.mean[c] / n.std[c];
  }
  if (layout == Layout::kNHWC) {
    for (int i = 0; i < pixels; ++i)
      for (int c = 0; c < 3; ++c) dst[3 * i + c] = src[3 * i + c] * scale[c] + bias[c];
    return;
  }
  for (int c = 0; c < 3; ++c) {
    const uint8_t* plane = src + static_cast<size_t>(c) * pixels;
    float* out = dst + static_cast<size_t>(c) * pixels;
    for (int i = 0; i < pixels; ++i) out[i] = plane[i] * scale[c] + bias[c];
  }
}

}  // namespace fullburn
