// The input pipeline's stages against torchvision's definitions and against
// libjpeg-turbo's own full decode, and the loader's ordering guarantees.
#include "fullburn/pipeline.h"

#include <gtest/gtest.h>
#include <jpeglib.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "replay_env.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;

std::function<double()> Draws(std::vector<double> values) {
  auto v = std::make_shared<std::vector<double>>(std::move(values));
  auto i = std::make_shared<size_t>(0);
  return [v, i] { return (*v)[std::min((*i)++, v->size() - 1)]; };
}

TEST(CropGeometry, RandomResizedCropMatchesTorchvision) {
  // torchvision: target = 187500 * (0.08 + 0.5 * 0.92) = 101250; log-ratio
  // midway gives aspect 1; w = h = round(sqrt(101250)) = 318;
  // top = int(0.0 * (375 - 318 + 1)) = 0; left = int(0.999 * (500 - 318 + 1)) = 182.
  BoxF b = RandomResizedCropBox(500, 375, CropParams{}, Draws({0.5, 0.5, 0.0, 0.999}));
  EXPECT_EQ(b.x, 182);
  EXPECT_EQ(b.y, 0);
  EXPECT_EQ(b.w, 318);
  EXPECT_EQ(b.h, 318);
}

TEST(CropGeometry, RandomResizedCropFallsBackToCenteredClampedRatio) {
  // 1000x100: every try is taller than the image, so after 10 the whole
  // image clamped to ratio 4/3: h = 100, w = round(133.3) = 133, centered.
  BoxF b = RandomResizedCropBox(1000, 100, CropParams{}, Draws({1.0, 0.0}));
  EXPECT_EQ(b.h, 100);
  EXPECT_EQ(b.w, 133);
  EXPECT_EQ(b.x, (1000 - 133) / 2);
  EXPECT_EQ(b.y, 0);
}

TEST(CropGeometry, RandomResizedCropStaysInRange) {
  SplitMix rng{42};
  for (int k = 0; k < 20000; ++k) {
    BoxF b = RandomResizedCropBox(500, 375, CropParams{}, [&rng] { return rng.Uniform(); });
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.w, 500);
    ASSERT_LE(b.y + b.h, 375);
    double area = b.w * b.h / (500.0 * 375);
    EXPECT_GT(area, 0.075);
    EXPECT_LE(area, 1.0);
    double ratio = b.w / b.h;
    EXPECT_GT(ratio, 0.74);
    EXPECT_LT(ratio, 1.35);
  }
}

TEST(CropGeometry, ResizeThenCenterCropAsOneBox) {
  // Resize(256): 500x375 -> 341x256 (int(256 * 500 / 375) = 341).
  // CenterCrop(224): top = round(16.0) = 16, left = round(58.5) = 58.
  BoxF b = ResizeCenterCropBox(500, 375, 256, 224);
  EXPECT_DOUBLE_EQ(b.x, 58 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(b.y, 16 * 375.0 / 256);
  EXPECT_DOUBLE_EQ(b.w, 224 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(b.h, 224 * 375.0 / 256);
}

DecodedRegion Gradient(int w, int h) {
  DecodedRegion r;
  r.width = w;
  r.height = h;
  r.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        r.rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * 3 + y * 5 + c * 70) % 256);
  return r;
}

TEST(Resize, IdentityCopiesAndFlipMirrors) {
  DecodedRegion r = Gradient(40, 30);
  std::vector<uint8_t> out(40 * 30 * 3), flipped(40 * 30 * 3);
  BoxF all{0, 0, 40, 30};
  ResizeInto(r, all, 40, 30, false, Layout::kNHWC, out.data());
  EXPECT_EQ(out, r.rgb);
  ResizeInto(r, all, 40, 30, true, Layout::kNHWC, flipped.data());
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 40; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(flipped[(y * 40 + x) * 3 + c], r.rgb[(y * 40 + (39 - x)) * 3 + c]);
}

TEST(Resize, PlanarLayoutHoldsTheSameValues) {
  DecodedRegion r = Gradient(64, 48);
  std::vector<uint8_t> hwc(20 * 16 * 3), chw(20 * 16 * 3);
  BoxF box{5.5, 3.25, 40, 30};
  ResizeInto(r, box, 20, 16, true, Layout::kNHWC, hwc.data());
  ResizeInto(r, box, 20, 16, true, Layout::kNCHW, chw.data());
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 20; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(hwc[(y * 20 + x) * 3 + c], chw[c * 320 + y * 20 + x]);
}

// Bilinear with pixel centres (align_corners=False, edges clamped), in
// double precision, one output value at a time.
double BilinearReference(const DecodedRegion& r, const BoxF& box, int out_w, int out_h, int ox,
                         int oy, int c) {
  auto coord = [](double start, double len, int n, int o, int limit) {
    return std::clamp(start + (o + 0.5) * len / n - 0.5, 0.0, limit - 1.0);
  };
  double fx = coord(box.x, box.w, out_w, ox, r.width), fy = coord(box.y, box.h, out_h, oy, r.height);
  int x0 = static_cast<int>(fx), y0 = static_cast<int>(fy);
  int x1 = std::min(x0 + 1, r.width - 1), y1 = std::min(y0 + 1, r.height - 1);
  auto at = [&](int x, int y) { return static_cast<double>(r.rgb[(y * r.width + x) * 3 + c]); };
  double top = at(x0, y0) * (1 - (fx - x0)) + at(x1, y0) * (fx - x0);
  double bottom = at(x0, y1) * (1 - (fx - x0)) + at(x1, y1) * (fx - x0);
  return top * (1 - (fy - y0)) + bottom * (fy - y0);
}

// Random pixels, sizes (widths not a multiple of 4, down- and upscaling),
// boxes, flips and both layouts: every value within 2.5 of the reference (the
// 7-bit weights are off by up to 1/256 in each pass, at most one level each
// on noise like this, plus the final rounding), so a wrong tap, a store in
// the wrong place or a tail pixel skipped by the vectorized pass shows.
TEST(Resize, EveryValueCloseToADoublePrecisionBilinear) {
  SplitMix rng{7};
  for (int trial = 0; trial < 60; ++trial) {
    DecodedRegion r;
    r.width = 1 + static_cast<int>(rng.Uniform() * 300);
    r.height = 1 + static_cast<int>(rng.Uniform() * 200);
    r.rgb.resize(static_cast<size_t>(r.width) * r.height * 3);
    for (uint8_t& v : r.rgb) v = static_cast<uint8_t>(rng.Uniform() * 256);
    double w = 1 + rng.Uniform() * (r.width - 1), h = 1 + rng.Uniform() * (r.height - 1);
    BoxF box{rng.Uniform() * (r.width - w), rng.Uniform() * (r.height - h), w, h};
    int out_w = 1 + static_cast<int>(rng.Uniform() * 240), out_h = 1 + static_cast<int>(rng.Uniform() * 60);
    bool flip = trial % 2 == 1;
    Layout layout = trial % 3 == 0 ? Layout::kNCHW : Layout::kNHWC;
    std::vector<uint8_t> out(static_cast<size_t>(out_w) * out_h * 3 + 1, 0xEE);
    ResizeInto(r, box, out_w, out_h, flip, layout, out.data());
    ASSERT_EQ(out.back(), 0xEE) << "wrote past the image";
    const size_t plane = static_cast<size_t>(out_w) * out_h;
    for (int oy = 0; oy < out_h; ++oy)
      for (int ox = 0; ox < out_w; ++ox)
        for (int c = 0; c < 3; ++c) {
          size_t at = layout == Layout::kNHWC ? (static_cast<size_t>(oy) * out_w + ox) * 3 + c
                                              : c * plane + static_cast<size_t>(oy) * out_w + ox;
          double want = BilinearReference(r, box, out_w, out_h, flip ? out_w - 1 - ox : ox, oy, c);
          ASSERT_NEAR(out[at], want, 2.5) << "trial " << trial << " " << r.width << "x" << r.height
                                          << " -> " << out_w << "x" << out_h << " at " << ox << ","
                                          << oy << "," << c;
        }
  }
}

TEST(Resize, HalvingAveragesNeighbours) {
  // Output pixel centres fall exactly between two source pixels.
  DecodedRegion r;
  r.width = 4;
  r.height = 2;
  r.rgb = {0, 0, 0, 100, 100, 100, 200, 200, 200, 50, 50, 50,
           0, 0, 0, 100, 100, 100, 200, 200, 200, 50, 50, 50};
  std::vector<uint8_t> out(2 * 1 * 3);
  ResizeInto(r, BoxF{0, 0, 4, 2}, 2, 1, false, Layout::kNHWC, out.data());
  EXPECT_EQ(out, (std::vector<uint8_t>{50, 50, 50, 125, 125, 125}));
}

double Psnr(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double mse = 0;
  for (size_t i = 0; i < a.size(); ++i) mse += (a[i] - b[i]) * (a[i] - b[i]);
  mse /= a.size();
  return mse == 0 ? 99 : 10 * std::log10(255.0 * 255.0 / mse);
}

std::vector<uint8_t> Smooth(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(128 + 100 * std::sin(x * 0.05 + c) * std::cos(y * 0.04));
  return px;
}

TEST(Jpeg, DecodesWhatWasEncoded) {
  std::vector<uint8_t> ref = Smooth(160, 120);
  auto jpeg = EncodeJpeg(ref.data(), 160, 120, 100);
  ASSERT_TRUE(jpeg.ok());
  auto header = ReadJpegHeader(jpeg->data(), jpeg->size());
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->width, 160);
  EXPECT_EQ(header->height, 120);
  DecodedRegion d;
  ASSERT_TRUE(DecodeJpeg(jpeg->data(), jpeg->size(), &d).ok());
  ASSERT_EQ(d.width, 160);
  ASSERT_EQ(d.height, 120);
  EXPECT_GT(Psnr(d.rgb, ref), 40.0);
}

TEST(Jpeg, RegionDecodeMatchesTheFullDecode) {
  std::vector<uint8_t> ref = Smooth(320, 240);
  auto jpeg = EncodeJpeg(ref.data(), 320, 240, 90);
  DecodedRegion full, region;
  ASSERT_TRUE(DecodeJpeg(jpeg->data(), jpeg->size(), &full).ok());
  BoxF crop{100, 70, 150, 120};
  ASSERT_TRUE(DecodeJpegRegion(jpeg->data(), jpeg->size(), crop, 150, 120, &region).ok());
  EXPECT_EQ(region.scale, 1.0);
  EXPECT_LE(region.origin_x, crop.x);
  EXPECT_LE(region.origin_y, crop.y);
  EXPECT_GE(region.origin_x + region.width, crop.x + crop.w);
  EXPECT_GE(region.origin_y + region.height, crop.y + crop.h);
  int max_diff = 0;
  for (int y = 0; y < region.height; ++y)
    for (int x = 0; x < region.width; ++x)
      for (int c = 0; c < 3; ++c) {
        int fy = y + static_cast<int>(region.origin_y), fx = x + static_cast<int>(region.origin_x);
        int a = region.rgb[(static_cast<size_t>(y) * region.width + x) * 3 + c];
        int b = full.rgb[(static_cast<size_t>(fy) * 320 + fx) * 3 + c];
        max_diff = std::max(max_diff, std::abs(a - b));
      }
  EXPECT_LE(max_diff, 2);  // chroma upsampling at the region's edge may differ by rounding
}

TEST(Jpeg, DctDownscaleWhenTheCropAllows) {
  std::vector<uint8_t> ref = Smooth(400, 400);
  auto jpeg = EncodeJpeg(ref.data(), 400, 400, 90);
  DecodedRegion region;
  ASSERT_TRUE(
      DecodeJpegRegion(jpeg->data(), jpeg->size(), BoxF{0, 0, 400, 400}, 96, 96, &region).ok());
  EXPECT_EQ(region.scale, 0.25);  // 400/4 = 100 >= 96; 400/8 = 50 is too small
  EXPECT_EQ(region.width, 100);
  // Compare with a 4x4 box average of the reference.
  std::vector<uint8_t> small(100 * 100 * 3);
  for (int y = 0; y < 100; ++y)
    for (int x = 0; x < 100; ++x)
      for (int c = 0; c < 3; ++c) {
        int sum = 0;
        for (int dy = 0; dy < 4; ++dy)
          for (int dx = 0; dx < 4; ++dx) sum += ref[((y * 4 + dy) * 400 + x * 4 + dx) * 3 + c];
        small[(y * 100 + x) * 3 + c] = static_cast<uint8_t>(sum / 16);
      }
  EXPECT_GT(Psnr(region.rgb, small), 30.0);
}

// A CMYK or progressive JPEG, written with libjpeg directly; a CMYK one is
// flat `ink` (stored values), with or without Adobe's marker (whose
// convention is inverted inks), or YCCK-encoded.
enum class Cmyk { kNone, kAdobe, kPlain, kYcck };
std::vector<uint8_t> EncodeSpecial(bool progressive, bool gray = false,
                                   Cmyk cmyk_kind = Cmyk::kNone,
                                   std::array<uint8_t, 4> ink = {90, 90, 90, 90}) {
  bool cmyk = cmyk_kind != Cmyk::kNone;
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = 32;
  c.image_height = 32;
  c.input_components = cmyk ? 4 : gray ? 1 : 3;
  c.in_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  if (cmyk_kind == Cmyk::kYcck) jpeg_set_colorspace(&c, JCS_YCCK);
  if (cmyk_kind == Cmyk::kPlain) c.write_Adobe_marker = FALSE;
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  std::vector<uint8_t> row(32 * 4, 90);
  if (cmyk)
    for (size_t i = 0; i < row.size(); ++i) row[i] = ink[i % 4];
  while (c.next_scanline < 32) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&c);
  free(buf);
  return out;
}

TEST(Jpeg, BadInputsAreClearErrors) {
  DecodedRegion d;
  std::vector<uint8_t> empty;
  Status s = DecodeJpeg(empty.data(), 0, &d);
  EXPECT_NE(s.message().find("empty file"), std::string::npos);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13};
  EXPECT_NE(DecodeJpeg(png.data(), png.size(), &d).message().find("not a decodable JPEG"),
            std::string::npos);
  std::vector<uint8_t> ref = Smooth(64, 64);
  auto jpeg = EncodeJpeg(ref.data(), 64, 64, 90);
  std::vector<uint8_t> truncated(jpeg->begin(), jpeg->begin() + jpeg->size() / 2);
  EXPECT_FALSE(DecodeJpeg(truncated.data(), truncated.size(), &d).ok());
}

// CMYK JPEGs decode to RGB as Pillow's convert("RGB") gives them (its
// output matched exactly on Pillow-written files): R = (255 - C)(255 - K) / 255
// in plain inks; Adobe's files store inverted inks, so R = C' K' / 255.
TEST(Jpeg, CmykDecodesToRgb) {
  const std::array<uint8_t, 4> ink = {40, 120, 200, 60};
  auto expect = [](int c, int k) { return (255 - c) * (255 - k) / 255.0; };
  struct Case {
    Cmyk kind;
    std::array<double, 3> rgb;
  } cases[] = {
      {Cmyk::kPlain, {expect(40, 60), expect(120, 60), expect(200, 60)}},
      {Cmyk::kAdobe, {40 * 60 / 255.0, 120 * 60 / 255.0, 200 * 60 / 255.0}},
      {Cmyk::kYcck, {40 * 60 / 255.0, 120 * 60 / 255.0, 200 * 60 / 255.0}},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> jpeg = EncodeSpecial(false, false, c.kind, ink);
    auto header = ReadJpegHeader(jpeg.data(), jpeg.size());
    ASSERT_TRUE(header.ok()) << header.status().message();
    DecodedRegion d;
    ASSERT_TRUE(DecodeJpeg(jpeg.data(), jpeg.size(), &d).ok());
    ASSERT_EQ(d.rgb.size(), 32u * 32 * 3);
    for (int ch = 0; ch < 3; ++ch)
      EXPECT_NEAR(d.rgb[(16 * 32 + 16) * 3 + ch], c.rgb[ch], 3) << static_cast<int>(c.kind) << ch;
  }
}

TEST(Jpeg, TwelveBitSamplesAreRefused) {
  std::vector<uint8_t> ref = Smooth(16, 16);
  auto jpeg = EncodeJpeg(ref.data(), 16, 16, 90);
  ASSERT_TRUE(jpeg.ok());
  // Mark the frame (SOF0: FF C0, length, precision) as 12-bit.
  std::vector<uint8_t> bytes = *jpeg;
  for (size_t i = 0; i + 4 < bytes.size(); ++i)
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
      bytes[i + 4] = 12;
      break;
    }
  DecodedRegion d;
  Status s = DecodeJpeg(bytes.data(), bytes.size(), &d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("12"), std::string::npos) << s.message();
}

TEST(Jpeg, ProgressiveAndGrayscaleDecodeToRgb) {
  DecodedRegion d;
  std::vector<uint8_t> progressive = EncodeSpecial(true);
  ASSERT_TRUE(DecodeJpeg(progressive.data(), progressive.size(), &d).ok());
  EXPECT_EQ(d.width, 32);
  EXPECT_NEAR(d.rgb[0], 90, 3);
  std::vector<uint8_t> gray = EncodeSpecial(false, true);
  ASSERT_TRUE(DecodeJpeg(gray.data(), gray.size(), &d).ok());
  EXPECT_EQ(d.rgb.size(), 32u * 32 * 3);
  EXPECT_NEAR(d.rgb[1], 90, 3);
}

// ---- the loader ----

std::string SmallDataset(const std::string& name, int classes = 3, int per_class = 8,
                         int width = 64, int height = 48) {
  std::string dir = ::testing::TempDir() + "/fb_pipe_" + name;
  fs::remove_all(dir);
  SyntheticImagesOptions o;
  o.classes = classes;
  o.per_class = per_class;
  o.width = width;
  o.height = height;
  EXPECT_TRUE(MakeSyntheticImages(dir, o).ok());
  return dir;
}

LoaderOptions Small(const std::string& root, int threads) {
  LoaderOptions o;
  o.root = root;
  o.threads = threads;
  o.batch_size = 4;
  o.prefetch = 2;
  o.out_w = o.out_h = 32;
  o.seed = 7;
  return o;
}

// Rank `rank` of `world` reading `root` in batches of 2.
std::unique_ptr<ImageLoader> OpenRank(const std::string& root, int threads, int rank, int world) {
  LoaderOptions o = Small(root, threads);
  o.batch_size = 2;
  o.rank = rank;
  o.world_size = world;
  return std::move(ImageLoader::Open(o).value());
}

// Every batch of an epoch: bytes and labels.
std::vector<std::vector<uint8_t>> Epoch(ImageLoader& l, int epoch, std::vector<int32_t>* labels) {
  std::vector<std::vector<uint8_t>> out;
  l.StartEpoch(epoch);
  Batch b;
  size_t bytes = static_cast<size_t>(b.size = 4) * 32 * 32 * 3;
  while (l.Next(&b)) {
    out.emplace_back(b.images, b.images + bytes);
    if (labels) labels->insert(labels->end(), b.labels, b.labels + b.size);
    l.Release(b);
  }
  EXPECT_TRUE(l.status().ok()) << l.status().message();
  return out;
}

TEST(Loader, SameBatchesWhateverTheThreadCount) {
  std::string dir = SmallDataset("det");
  auto one = ImageLoader::Open(Small(dir, 1));
  auto three = ImageLoader::Open(Small(dir, 3));
  ASSERT_TRUE(one.ok() && three.ok());
  std::vector<int32_t> l1, l3;
  auto e1 = Epoch(**one, 0, &l1);
  auto e3 = Epoch(**three, 0, &l3);
  ASSERT_EQ(e1.size(), 6u);  // 24 images / 4
  EXPECT_EQ(e1, e3);
  EXPECT_EQ(l1, l3);
  // The next epoch is another order, equally reproducible.
  std::vector<int32_t> n1, n3;
  auto f1 = Epoch(**one, 1, &n1);
  EXPECT_NE(f1, e1);
  EXPECT_EQ(f1, Epoch(**three, 1, &n3));
}

// Without shuffle every epoch reads the dataset in its order.
TEST(Loader, WithoutShuffleTheDatasetsOrder) {
  EXPECT_EQ(EpochPermutation(5, 3, 1, false), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_NE(EpochPermutation(50, 3, 1, true), EpochPermutation(50, 3, 1, false));
  std::string dir = SmallDataset("order");
  LoaderOptions o = Small(dir, 2);
  o.shuffle = false;
  auto l = ImageLoader::Open(o);
  ASSERT_TRUE(l.ok());
  for (int epoch : {0, 3}) {
    (*l)->StartEpoch(epoch);
    std::vector<int64_t> seen;
    Batch b;
    while ((*l)->Next(&b)) {
      seen.insert(seen.end(), b.samples, b.samples + b.size);
      (*l)->Release(b);
    }
    std::vector<int64_t> want(24);
    for (int64_t i = 0; i < 24; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(seen, want) << "epoch " << epoch;
  }
}

// Normalized by the workers: the uint8 images' values as floats, (v / 255 -
// mean) / std per channel, in both layouts.
TEST(Loader, NormalizedImagesAreTheUint8OnesAsFloats) {
  std::string dir = SmallDataset("norm");
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    LoaderOptions o = Small(dir, 2);
    o.layout = layout;
    auto raw = ImageLoader::Open(o);
    o.normalize.enabled = true;
    o.normalize.mean[1] = 0.25f;
    o.normalize.std[2] = 0.5f;
    auto norm = ImageLoader::Open(o);
    ASSERT_TRUE(raw.ok() && norm.ok());
    (*raw)->StartEpoch(0);
    (*norm)->StartEpoch(0);
    Batch a, b;
    ASSERT_TRUE((*raw)->Next(&a) && (*norm)->Next(&b));
    const float* f = reinterpret_cast<const float*>(b.images);
    const size_t n = 4 * 32 * 32 * 3, plane = 32 * 32;
    for (size_t i = 0; i < n; ++i) {
      size_t c = layout == Layout::kNHWC ? i % 3 : (i / plane) % 3;
      float want = (a.images[i] / 255.0f - o.normalize.mean[c]) / o.normalize.std[c];
      ASSERT_NEAR(f[i], want, 1e-5) << i;
    }
    (*raw)->Release(a);
    (*norm)->Release(b);
  }
}

TEST(Loader, EachSampleOncePerEpoch) {
  std::string dir = SmallDataset("once");
  auto l = ImageLoader::Open(Small(dir, 2));
  ASSERT_TRUE(l.ok());
  std::vector<int32_t> labels;
  Epoch(**l, 0, &labels);
  std::sort(labels.begin(), labels.end());
  std::vector<int32_t> want((*l)->folder().labels);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(labels, want);
}

TEST(Loader, SlotInUseIsNeverOverwritten) {
  std::string dir = SmallDataset("slots", 4, 10);
  auto l = ImageLoader::Open(Small(dir, 2));
  ASSERT_TRUE(l.ok());
  ImageLoader& loader = **l;
  loader.StartEpoch(0);
  Batch held;
  ASSERT_TRUE(loader.Next(&held));
  std::vector<uint8_t> copy(held.images, held.images + 4 * 32 * 32 * 3);
  // Take and release the other prefetched batches: the workers now want the
  // held slot for batch 3 and must wait for it.
  for (int k = 1; k <= 2; ++k) {
    Batch b;
    ASSERT_TRUE(loader.Next(&b));
    EXPECT_NE(b.slot, held.slot);
    loader.Release(b);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(std::vector<uint8_t>(held.images, held.images + copy.size()), copy);
  loader.Release(held);
  Batch next;
  ASSERT_TRUE(loader.Next(&next));
  EXPECT_EQ(next.index, 3);
  EXPECT_EQ(next.slot, held.slot);
  loader.Release(next);
}

TEST(Loader, BadSamplesAreSkippedWithoutShrinkingBatches) {
  std::string dir = SmallDataset("bad");
  std::ofstream(dir + "/class_000/img_00000.jpg", std::ios::trunc).close();  // zero bytes
  std::ofstream(dir + "/class_001/img_00003.jpg", std::ios::trunc) << "not a jpeg at all";
  auto l = ImageLoader::Open(Small(dir, 2));
  ASSERT_TRUE(l.ok());
  std::vector<int32_t> labels;
  auto batches = Epoch(**l, 0, &labels);
  EXPECT_EQ(batches.size(), 6u);
  EXPECT_EQ(labels.size(), 24u);
  // Both, once each; the read-ahead of epoch 1 (StartEpoch) may have met
  // them again already.
  EXPECT_GE((*l)->stats().skipped, 2);
  EXPECT_LE((*l)->stats().skipped, 4);
}

TEST(Loader, FailPolicyStopsWithTheFileName) {
  std::string dir = SmallDataset("fail");
  std::ofstream(dir + "/class_002/img_00001.jpg", std::ios::trunc) << "garbage";
  LoaderOptions o = Small(dir, 2);
  o.on_bad_sample = BadSamplePolicy::kFail;
  auto l = ImageLoader::Open(o);
  ASSERT_TRUE(l.ok());
  (*l)->StartEpoch(0);
  Batch b;
  int got = 0;
  while ((*l)->Next(&b)) {
    (*l)->Release(b);
    ++got;
  }
  EXPECT_LT(got, 6);
  EXPECT_NE((*l)->status().message().find("class_002/img_00001.jpg"), std::string::npos)
      << (*l)->status().message();
}

// Drains an epoch of the ring; the batches it handed out.
int DrainRing(SampleRing& ring) {
  ring.StartEpoch(0);
  Batch b;
  int got = 0;
  while (ring.Next(&b)) {
    ring.Release(b);
    ++got;
  }
  return got;
}

RingOptions SmallRing() {
  RingOptions o;
  o.dataset_size = 64;
  o.batch_size = 4;
  o.batch_bytes = 16;
  o.threads = 2;
  return o;
}

// Without the catch in the worker these would end the process
// (std::terminate from a thread), not the run.
TEST(Ring, AMakerThatThrowsStopsTheRunWithItsMessage) {
  auto ring = SampleRing::Open(SmallRing(), [](const SampleJob& job, std::string*) -> bool {
    if (job.position == 9) throw std::bad_alloc();
    return true;
  });
  ASSERT_TRUE(ring.ok());
  EXPECT_LT(DrainRing(**ring), 3);
  const std::string m = (*ring)->status().message();
  EXPECT_EQ(m.rfind("sample ", 0), 0u) << m;  // names the sample
  EXPECT_NE(m.find("bad_alloc"), std::string::npos) << m;
}

TEST(Ring, SlotMemoryThatCannotBeHadStopsTheRunAndSaysWhatToLower) {
  for (bool throws : {true, false}) {
    RingOptions o = SmallRing();
    o.allocate = [throws](size_t) -> uint8_t* {
      if (throws) throw std::runtime_error("cudaHostAlloc failed\nstack trace");
      return nullptr;
    };
    auto ring = SampleRing::Open(o, [](const SampleJob&, std::string*) { return true; });
    ASSERT_TRUE(ring.ok());
    EXPECT_EQ(DrainRing(**ring), 0);
    const std::string m = (*ring)->status().message();
    EXPECT_NE(m.find("could not allocate a batch slot of 16 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("lower the batch size or data.prefetch"), std::string::npos) << m;
    EXPECT_EQ(m.find("stack trace"), std::string::npos) << m;
    if (throws) {
      EXPECT_NE(m.find("cudaHostAlloc failed"), std::string::npos) << m;
    }
  }
}

// A ring whose samples are their (epoch, dataset index, place): what a batch
// holds shows where each sample came from. Counts the samples made per epoch.
struct TracedRing {
  std::array<std::atomic<int>, 8> made{};
  std::unique_ptr<SampleRing> ring;
  explicit TracedRing(RingOptions o) {
    o.batch_bytes = static_cast<size_t>(o.batch_size) * 3 * sizeof(int64_t);
    ring = std::move(SampleRing::Open(o, [this](const SampleJob& job, std::string*) {
                       int64_t* at = reinterpret_cast<int64_t*>(job.slot) + job.index_in_batch * 3;
                       at[0] = job.epoch;
                       at[1] = (*job.order)[static_cast<size_t>(job.position)];
                       at[2] = job.place;
                       *job.sample = at[1];
                       ++made[static_cast<size_t>(job.epoch)];
                       return true;
                     }).value());
  }
  // The rest of the current epoch, batch by batch.
  std::vector<std::vector<int64_t>> Drain() {
    std::vector<std::vector<int64_t>> out;
    Batch b;
    while (ring->Next(&b)) {
      const auto* v = reinterpret_cast<const int64_t*>(b.images);
      out.emplace_back(v, v + b.size * 3);
      ring->Release(b);
    }
    return out;
  }
  // Waits (at most 30 s) until the workers made a sample of `epoch`.
  bool Began(int epoch) {
    for (int i = 0; i < 3000 && made[static_cast<size_t>(epoch)] == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return made[static_cast<size_t>(epoch)] > 0;
  }
};

// A loop that goes from epoch to epoch finds the next epoch's first batches
// made while it finished the last one, and they are the batches a fresh
// start of that epoch makes; any other start drops them.
TEST(Ring, ALoopThatAdvancesFindsTheNextEpochBegun) {
  RingOptions o = SmallRing();
  o.dataset_size = 30;  // 7 batches of 4, two samples dropped
  o.prefetch = 2;
  TracedRing traced(o);
  SampleRing& ring = *traced.ring;
  auto fresh = [&](int epoch, int64_t first_batch) {
    TracedRing other(o);
    other.ring->StartEpoch(epoch, first_batch);
    return other.Drain();
  };
  ring.StartEpoch(0);
  EXPECT_EQ(traced.Drain(), fresh(0, 0));
  ASSERT_TRUE(traced.Began(1));  // from the first epoch on
  // A loop that restarts its epoch (evaluation) stops the read-ahead.
  ring.StartEpoch(0);
  const int made_ahead = traced.made[1];
  EXPECT_EQ(traced.Drain(), fresh(0, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(traced.made[1], made_ahead);
  ring.StartEpoch(1);
  EXPECT_EQ(traced.Drain(), fresh(1, 0));
  // Epoch 1 all handed out and released, the workers fill the 3 slots with
  // epoch 2's batches 0-2 (prefetch 2 ahead of the consumer, plus one).
  ASSERT_TRUE(traced.Began(2));
  for (int i = 0; i < 3000 && ring.stats().ready_batches < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(ring.stats().ready_batches, 3);
  ring.StartEpoch(2);
  Batch first;
  ASSERT_TRUE(ring.TryNext(&first));  // kept: ready without waiting
  EXPECT_EQ(first.epoch, 2);
  EXPECT_EQ(first.index, 0);
  const auto* v = reinterpret_cast<const int64_t*>(first.images);
  std::vector<std::vector<int64_t>> got{std::vector<int64_t>(v, v + first.size * 3)};
  ring.Release(first);
  for (auto& batch : traced.Drain()) got.push_back(batch);
  EXPECT_EQ(got, fresh(2, 0));
  // Epoch 3 begun, but the loop resumes it at batch 2; then epoch 4 begun,
  // but the loop jumps to 5.
  ASSERT_TRUE(traced.Began(3));
  ring.StartEpoch(3, 2);
  EXPECT_EQ(traced.Drain(), fresh(3, 2));
  ASSERT_TRUE(traced.Began(4));
  ring.StartEpoch(5);
  EXPECT_EQ(traced.Drain(), fresh(5, 0));
  // A jump is not a restart: the epoch after 5 is read ahead and kept.
  ASSERT_TRUE(traced.Began(6));
  ring.StartEpoch(6);
  EXPECT_EQ(traced.Drain(), fresh(6, 0));
  EXPECT_TRUE(ring.status().ok());
}

// A sample of the read-ahead fails while another is still being made, and
// the loop starts the next epoch without asking status(): the start must not
// take the order the slow sample still reads (it read a freed one before).
TEST(Ring, AStartAfterAFailureLeavesSamplesInFlightTheirOrder) {
  RingOptions o = SmallRing();
  std::atomic<bool> slow_done{false};
  auto ring = SampleRing::Open(o, [&](const SampleJob& job, std::string* error) {
    if (job.epoch == 1 && job.position == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      *job.sample = (*job.order)[static_cast<size_t>(job.position)];
      slow_done = true;
      return true;
    }
    if (job.epoch == 1 && job.position == 1) {
      *error = "sample 1 is broken";
      return false;
    }
    return true;
  });
  ASSERT_TRUE(ring.ok());
  // Epoch 0; the workers go on into epoch 1, whose failure may end epoch 0's
  // last batches too.
  EXPECT_LE(DrainRing(**ring), 16);
  for (int i = 0; i < 3000 && (*ring)->status().ok(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (*ring)->StartEpoch(1);
  Batch b;
  EXPECT_FALSE((*ring)->Next(&b));
  EXPECT_NE((*ring)->status().message().find("sample 1 is broken"), std::string::npos);
  for (int i = 0; i < 3000 && !slow_done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(slow_done);
}

// Dataset indices of every sample of an epoch, in order.
std::vector<int64_t> EpochSamples(ImageLoader& l, int epoch) {
  std::vector<int64_t> out;
  l.StartEpoch(epoch);
  Batch b;
  while (l.Next(&b)) {
    out.insert(out.end(), b.samples, b.samples + b.size);
    l.Release(b);
  }
  return out;
}

TEST(Loader, ShardsSplitTheEpochWithoutOverlap) {
  std::string dir = SmallDataset("shard");  // 24 images
  std::vector<int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions o = Small(dir, 2);
    o.rank = rank;
    o.world_size = 3;
    auto l = ImageLoader::Open(o);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ((*l)->epoch_size(), 8);
    std::vector<int64_t> mine = EpochSamples(**l, 0);
    EXPECT_EQ(mine.size(), 8u);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(24);
  for (int i = 0; i < 24; ++i) want[i] = i;
  EXPECT_EQ(all, want);  // every sample exactly once across ranks
}

// 3 ranks read 2 batches of 2 each (12 samples), then the job resumes on 2
// ranks: they read the other 12 of the epoch, each once, and nothing twice.
TEST(Loader, ResumeWithAnotherWorldSizeReadsTheRestOfTheEpoch) {
  std::string dir = SmallDataset("reshard");  // 24 images
  auto open = [&](int rank, int world) { return OpenRank(dir, 1, rank, world); };
  std::vector<int64_t> before, after;
  for (int rank = 0; rank < 3; ++rank) {
    auto l = open(rank, 3);
    l->StartEpoch(0);
    Batch b;
    for (int k = 0; k < 2 && l->Next(&b); ++k) {
      before.insert(before.end(), b.samples, b.samples + b.size);
      l->Release(b);
    }
  }
  ASSERT_EQ(before.size(), 12u);
  for (int rank = 0; rank < 2; ++rank) {
    auto l = open(rank, 2);
    l->StartEpoch(0, 0, /*consumed_samples=*/12);
    Batch b;
    int batches = 0;
    while (l->Next(&b)) {
      after.insert(after.end(), b.samples, b.samples + b.size);
      l->Release(b);
      ++batches;
    }
    EXPECT_EQ(batches, 3) << "rank " << rank;
  }
  // The rest is the tail of the epoch's order that one process reads.
  std::vector<int64_t> whole = EpochSamples(*open(0, 1), 0);
  ASSERT_EQ(whole.size(), 24u);
  std::vector<int64_t> head(whole.begin(), whole.begin() + 12),
      tail(whole.begin() + 12, whole.end());
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  std::sort(head.begin(), head.end());
  std::sort(tail.begin(), tail.end());
  EXPECT_EQ(before, head);
  EXPECT_EQ(after, tail);
}

// A sample's random crop and flip come from its place in the epoch: resumed
// by other ranks after some of the epoch, each image is the one a single
// process made of it, so a resumed run trains on the same pixels.
TEST(Loader, AResumedEpochAugmentsEachSampleAsBefore) {
  std::string dir = SmallDataset("reaugment");  // 24 images
  auto open = [&](int rank, int world) { return OpenRank(dir, 2, rank, world); };
  const size_t bytes = 32 * 32 * 3;
  std::map<int64_t, std::vector<uint8_t>> alone;
  auto whole = open(0, 1);
  whole->StartEpoch(1);
  Batch b;
  while (whole->Next(&b)) {
    for (int i = 0; i < b.size; ++i)
      alone[b.samples[i]].assign(b.images + i * bytes, b.images + (i + 1) * bytes);
    whole->Release(b);
  }
  int compared = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto l = open(rank, 2);
    l->StartEpoch(1, 0, /*consumed_samples=*/10);
    while (l->Next(&b)) {
      for (int i = 0; i < b.size; ++i, ++compared)
        EXPECT_TRUE(std::equal(b.images + i * bytes, b.images + (i + 1) * bytes,
                               alone[b.samples[i]].begin()))
            << "sample " << b.samples[i];
      l->Release(b);
    }
  }
  EXPECT_EQ(compared, 12);  // of the epoch's other 14: 7 a rank, 3 whole batches of 2
}

TEST(Loader, ShardPaddingAndDropping) {
  std::string dir = SmallDataset("pad", 5, 5);  // 25 images over 2 ranks
  LoaderOptions o = Small(dir, 1);
  o.world_size = 2;
  o.rank = 1;
  EXPECT_EQ((*ImageLoader::Open(o))->epoch_size(), 13);  // padded: ceil(25 / 2)
  o.shard_pad = false;
  EXPECT_EQ((*ImageLoader::Open(o))->epoch_size(), 12);  // dropped: floor(25 / 2)
  o.rank = 2;
  auto bad = ImageLoader::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 2 is not in 0..1"), std::string::npos);
}

// Evaluation: 25 images over 3 ranks in batches of 4 are all read, each
// once; shares differ by one and each rank's last batch is short.
TEST(Loader, KeepLastReadsEverySampleOnceOverRanks) {
  std::string dir = SmallDataset("keep", 5, 5);  // 25 images
  std::vector<int64_t> all;
  const int64_t shares[] = {9, 8, 8};
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions o = Small(dir, 2);
    o.rank = rank;
    o.world_size = 3;
    o.keep_last = true;
    o.train = false;
    auto l = ImageLoader::Open(o);
    ASSERT_TRUE(l.ok()) << l.status().message();
    EXPECT_EQ((*l)->epoch_size(), shares[rank]);
    EXPECT_EQ((*l)->batches_per_epoch(), rank == 0 ? 3 : 2);
    (*l)->StartEpoch(0);
    Batch b;
    std::vector<int> sizes;
    while ((*l)->Next(&b)) {
      sizes.push_back(b.size);
      all.insert(all.end(), b.samples, b.samples + b.size);
      (*l)->Release(b);
    }
    EXPECT_EQ(sizes, rank == 0 ? std::vector<int>({4, 4, 1}) : std::vector<int>({4, 4}));
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(25);
  for (int i = 0; i < 25; ++i) want[i] = i;
  EXPECT_EQ(all, want);
  // Fewer images than ranks: a rank with nothing to read is an error.
  LoaderOptions o = Small(dir, 1);
  o.keep_last = true;
  o.world_size = 26;
  o.rank = 25;
  EXPECT_FALSE(ImageLoader::Open(o).ok());
  o.batch_size = 64;  // one short batch holds the whole set
  o.world_size = 1;
  o.rank = 0;
  auto whole = ImageLoader::Open(o);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ((*whole)->batches_per_epoch(), 1);
}

TEST(Loader, ResumeMidEpochGivesTheSameRemainingBatches) {
  std::string dir = SmallDataset("resume");
  auto first = ImageLoader::Open(Small(dir, 2));
  std::vector<int32_t> labels;
  auto whole = Epoch(**first, 1, &labels);
  // A fresh loader (another process, other thread count) resumed at batch 4.
  auto resumed = ImageLoader::Open(Small(dir, 3));
  (*resumed)->StartEpoch(1, 4);
  EXPECT_EQ((*resumed)->position().next_batch, 4);
  Batch b;
  std::vector<std::vector<uint8_t>> rest;
  while ((*resumed)->Next(&b)) {
    rest.emplace_back(b.images, b.images + 4 * 32 * 32 * 3);
    (*resumed)->Release(b);
  }
  EXPECT_EQ((*resumed)->position().next_batch, 6);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0], whole[4]);
  EXPECT_EQ(rest[1], whole[5]);
}

TEST(Loader, CacheServesLaterEpochsWithTheSameBytes) {
  std::string dir = SmallDataset("cache");
  LoaderOptions o = Small(dir, 2);
  o.cache_bytes = 64 << 20;
  auto cached = ImageLoader::Open(o);
  auto plain = ImageLoader::Open(Small(dir, 2));
  Epoch(**cached, 0, nullptr);
  EXPECT_GT((*cached)->stats().cache_bytes, 0);
  // Epoch 0 again: every file a hit. The first pass read part of epoch 1
  // ahead (StartEpoch), hits too, at most its 3 slots of 4; an epoch started
  // again reads nothing ahead, so the counts stand still from here.
  Epoch(**cached, 0, nullptr);
  const int64_t hits = (*cached)->stats().cache_hits;
  EXPECT_GE(hits, 24);
  EXPECT_LE(hits, 24 + 12);
  auto e0 = Epoch(**cached, 0, nullptr);
  EXPECT_EQ((*cached)->stats().cache_hits, hits + 24);
  EXPECT_EQ(e0, Epoch(**plain, 0, nullptr));
  // A budget smaller than one file caches nothing.
  o.cache_bytes = 10;
  auto tiny = ImageLoader::Open(o);
  Epoch(**tiny, 0, nullptr);
  Epoch(**tiny, 1, nullptr);
  EXPECT_EQ((*tiny)->stats().cache_hits, 0);
}

TEST(Pack, RoundTripKeepsImagesAndLabels) {
  std::string dir = SmallDataset("packsrc");
  for (PackFormat format : {PackFormat::kJpeg, PackFormat::kRaw}) {
    std::string dst = dir + (format == PackFormat::kRaw ? ".raw" : ".jpg");
    fs::remove_all(dst);
    PackOptions o;
    o.format = format;
    auto report = WritePack(dir, dst, o);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->images, 24);
    auto pack = PackReader::Open(dst);
    ASSERT_TRUE(pack.ok()) << pack.status().message();
    auto folder = ScanImageFolder(dir);
    ASSERT_EQ((*pack)->records().size(), 24u);
    EXPECT_EQ((*pack)->classes(), folder->classes);
    for (size_t i = 0; i < 24; ++i) {
      const PackRecord& r = (*pack)->records()[i];
      EXPECT_EQ(r.label, folder->labels[i]);
      EXPECT_EQ(r.width, 64);
      std::string file = testing::ReadText(folder->files[i]);
      std::vector<uint8_t> bytes(file.begin(), file.end());
      DecodedRegion d;
      ASSERT_TRUE(DecodeJpeg(bytes.data(), bytes.size(), &d).ok());
      std::vector<uint8_t> stored((*pack)->Data(r), (*pack)->Data(r) + r.size);
      if (format == PackFormat::kRaw)
        EXPECT_EQ(stored, d.rgb);  // exactly the decoded pixels
      else
        EXPECT_EQ(stored, bytes);  // not resized: the original file
    }
    // The loader reads a pack like a folder: same labels, same batch count.
    auto l = ImageLoader::Open(Small(dst, 2));
    ASSERT_TRUE(l.ok()) << l.status().message();
    std::vector<int32_t> labels;
    EXPECT_EQ(Epoch(**l, 0, &labels).size(), 6u);
  }
}

TEST(Pack, ResizesToMaxSide) {
  std::string dir = SmallDataset("packresize");
  std::string dst = dir + ".small";
  fs::remove_all(dst);
  PackOptions o;
  o.max_side = 32;
  ASSERT_TRUE(WritePack(dir, dst, o).ok());
  auto pack = PackReader::Open(dst);
  EXPECT_EQ((*pack)->records()[0].width, 32);
  EXPECT_EQ((*pack)->records()[0].height, 24);
}

TEST(Pack, TruncatedOrCorruptPacksAreRefused) {
  std::string dir = SmallDataset("packbad");
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  ASSERT_TRUE(WritePack(dir, dst, PackOptions{}).ok());
  std::string shard = dst + "/shard-00000.fbp";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  auto truncated = PackReader::Open(dst);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated?"), std::string::npos);
  auto l = ImageLoader::Open(Small(dst, 1));
  EXPECT_FALSE(l.ok());
  std::string index = dst + "/index.fbpx";
  std::string text = testing::ReadText(index);
  text[40] ^= 0x55;
  std::ofstream(index, std::ios::binary | std::ios::trunc) << text;
  auto corrupt = PackReader::Open(dst);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.status().message().find("checksum mismatch"), std::string::npos);
  // A destination that already holds files is refused, not overwritten.
  auto again = WritePack(dir, dst, PackOptions{});
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("exists and is not empty"), std::string::npos);
}

// The index checksum is FNV-1a with its published 64-bit offset basis, so
// other readers (python/fullburn_pack.py) can check it; packs from before the
// basis was corrected (a digit short) still open.
TEST(Pack, IndexChecksumIsStandardFnv1aAndEarlyPacksStillOpen) {
  auto fnv1a = [](const std::string& bytes, uint64_t h) {
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
    return h;
  };
  EXPECT_EQ(fnv1a("a", 0xcbf29ce484222325ull), 0xaf63dc4c8601ec8cull);  // published test vector
  std::string dir = SmallDataset("packfnv");
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  ASSERT_TRUE(WritePack(dir, dst, PackOptions{}).ok());
  std::string index = dst + "/index.fbpx";
  std::string text = testing::ReadText(index);
  std::string body = text.substr(0, text.size() - 8);
  uint64_t stored;
  std::memcpy(&stored, text.data() + body.size(), 8);
  EXPECT_EQ(stored, fnv1a(body, 0xcbf29ce484222325ull));
  uint64_t early = fnv1a(body, 1469598103934665603ull);
  std::ofstream(index, std::ios::binary | std::ios::trunc)
      << body << std::string(reinterpret_cast<const char*>(&early), 8);
  auto pack = PackReader::Open(dst);
  ASSERT_TRUE(pack.ok()) << pack.status().message();
  EXPECT_FALSE((*pack)->records().empty());
}

// Found by fuzz/pack_fuzz (fuzz/regressions/pack/): counts the index cannot
// hold were allocated before they were checked (terabytes), and an offset
// near 2^64 wrapped around the shard's end check.
TEST(Pack, DamagedCountsAndOffsetsAreRefused) {
  fs::path dst = fs::path(::testing::TempDir()) / "fb_pack_damaged";
  fs::remove_all(dst);
  fs::create_directories(dst);
  std::string index = (dst / "index.fbpx").string();
  auto put = [](std::string* s, auto v) { s->append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto open = [&](std::string body) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : body) h = (h ^ c) * 0x100000001b3ull;
    put(&body, h);
    std::ofstream(index, std::ios::binary | std::ios::trunc) << body;
    return PackReader::Open(dst.string());
  };
  std::string head = "FBPACK01";
  put(&head, uint32_t{1});  // version
  put(&head, uint32_t{0});  // JPEG
  std::string counts = head;
  put(&counts, uint64_t{1} << 40);  // records
  put(&counts, uint32_t{0});        // classes
  put(&counts, uint32_t{0});        // shards
  auto huge = open(counts);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().message(),
            "pack index " + index + " is corrupt (it lists 0 shards and 1099511627776 records, "
            "more than its 0 bytes of tables hold): re-run fullburn pack");

  std::string wrap = head;
  put(&wrap, uint64_t{1});
  put(&wrap, uint32_t{1});
  put(&wrap, uint32_t{1});
  put(&wrap, uint32_t{1});
  wrap += "a";
  put(&wrap, uint64_t{16});  // shard 0's size
  put(&wrap, uint32_t{0});   // the record: shard, offset, size, width, height, label
  put(&wrap, ~uint64_t{0} - 3);
  put(&wrap, uint32_t{8});
  put(&wrap, uint16_t{1});
  put(&wrap, uint16_t{1});
  put(&wrap, int32_t{0});
  std::ofstream((dst / "shard-00000.fbp").string(), std::ios::binary) << std::string(16, 'x');
  auto outside = open(wrap);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(),
            "pack index " + index + " is corrupt (record 0 has bytes 18446744073709551612 + 8 "
            "of shard 0, which holds 16): re-run fullburn pack");

  // The record's other fields, each wrong alone, named with their numbers.
  auto one_record = [&](uint32_t format, uint32_t shard, uint64_t offset, uint32_t size,
                        int32_t label) {
    std::string body = "FBPACK01";
    put(&body, uint32_t{1});
    put(&body, format);
    put(&body, uint64_t{1});
    put(&body, uint32_t{1});  // classes
    put(&body, uint32_t{1});  // shards
    put(&body, uint32_t{1});
    body += "a";
    put(&body, uint64_t{16});
    put(&body, shard);
    put(&body, offset);
    put(&body, size);
    put(&body, uint16_t{2});
    put(&body, uint16_t{1});
    put(&body, label);
    auto r = open(body);
    return r.ok() ? std::string("opened") : r.status().message();
  };
  auto why = [&](const std::string& text) {
    return "pack index " + index + " is corrupt (record 0 " + text + "): re-run fullburn pack";
  };
  EXPECT_EQ(one_record(0, 3, 0, 8, 0), why("is in shard 3 of 1"));
  EXPECT_EQ(one_record(0, 0, 10, 8, 0), why("has bytes 10 + 8 of shard 0, which holds 16"));
  EXPECT_EQ(one_record(1, 0, 0, 8, 0), why("is 8 bytes, its 2x1 raw pixels are 6"));
  EXPECT_EQ(one_record(0, 0, 0, 8, 1), why("has label 1 of 1 classes"));
  EXPECT_EQ(one_record(0, 0, 0, 8, -2), why("has label -2 of 1 classes"));
  EXPECT_EQ(one_record(0, 0, 8, 8, 0), "opened");
}

TEST(Pack, CorruptSourceImagesAreLeftOut) {
  std::string dir = SmallDataset("packskip");
  std::ofstream(dir + "/class_000/img_00002.jpg", std::ios::trunc) << "junk";
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  auto r = WritePack(dir, dst, PackOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->images, 23);
  EXPECT_EQ(r->skipped, 1);
}

// A shard cut short (a copy that stopped): the message names the shard and
// both sizes, the file's and the index's, as they are.
TEST(Pack, ATruncatedShardIsNamedWithBothSizes) {
  std::string dir = SmallDataset("packcut");
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  ASSERT_TRUE(WritePack(dir, dst, PackOptions{}).ok());
  std::string shard = (fs::path(dst) / "shard-00000.fbp").string();
  uintmax_t whole = fs::file_size(shard);
  ASSERT_GT(whole, 100u);
  fs::resize_file(shard, whole - 100);
  auto pack = PackReader::Open(dst);
  ASSERT_FALSE(pack.ok());
  EXPECT_EQ(pack.status().message(), "pack shard " + shard + " is " + std::to_string(whole - 100) +
                                         " bytes, the index expects " + std::to_string(whole) +
                                         " (truncated?): re-run fullburn pack");
}

TEST(Tokens, WindowsAreShiftedByOneAndReproducible) {
  std::string path = ::testing::TempDir() + "/fb_tokens.bin";
  SyntheticTokensOptions o;
  o.tokens = 10000;
  o.vocab = 50;
  ASSERT_TRUE(MakeSyntheticTokens(path, o).ok());
  EXPECT_EQ(fs::file_size(path), 20000u);
  auto t = TokenShards::Open({path}, 16);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->tokens(), 10000);
  std::vector<int32_t> x(4 * 16), y(4 * 16), x2(4 * 16), y2(4 * 16);
  (*t)->Batch(1, 5, 4, x.data(), y.data());
  (*t)->Batch(1, 5, 4, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i + 1 < 16; ++i) EXPECT_EQ(y[b * 16 + i], x[b * 16 + i + 1]);
  (*t)->Batch(1, 6, 4, x2.data(), y2.data());
  EXPECT_NE(x, x2);
  // Learnable: most tokens follow one fixed successor of their predecessor.
  std::map<int, std::map<int, int>> follow;
  for (size_t i = 0; i < x.size(); ++i) follow[x[i]][y[i]]++;
  int top = 0, all = 0;
  for (auto& [prev, nexts] : follow) {
    int best = 0;
    for (auto& [n, c] : nexts) best = std::max(best, c), all += c;
    top += best;
  }
  EXPECT_GT(static_cast<double>(top) / all, 0.7);
}

TEST(Tokens, ReadsLlmcHeaderAndRefusesTruncatedFiles) {
  std::string path = ::testing::TempDir() + "/fb_tokens_llmc.bin";
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 100;
  std::vector<uint16_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = static_cast<uint16_t>(i);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), 200);
  }
  auto t = TokenShards::Open({path}, 8);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)->tokens(), 100);
  std::vector<int32_t> x(8), y(8);
  (*t)->Batch(0, 0, 1, x.data(), y.data());
  EXPECT_EQ(y[0], x[0] + 1);  // the stored tokens count up
  fs::resize_file(path, 1024 + 150);
  auto cut = TokenShards::Open({path}, 8);
  ASSERT_FALSE(cut.ok());
  // The counts it names are the header's and the file's (150 bytes: 75 tokens).
  EXPECT_EQ(cut.status().message(), "token file " + path +
                                        " has an llm.c header for 100 tokens but holds 75 (truncated?): "
                                        "write it again");
  {
    header[1] = 2;  // another version: said so, not a count
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
  }
  EXPECT_EQ(TokenShards::Open({path}, 8).status().message(),
            "token file " + path + " has an llm.c header of version 2; this fullburn reads version 1 "
            "(uint16 tokens): write it again");
  std::string odd = ::testing::TempDir() + "/fb_tokens_odd.bin";
  std::ofstream(odd, std::ios::binary) << std::string(101, 'a');
  EXPECT_NE(TokenShards::Open({odd}, 8).status().message().find("has an odd size (101 bytes)"), std::string::npos);
  std::string even = ::testing::TempDir() + "/fb_tokens_even.bin";
  std::ofstream(even, std::ios::binary) << std::string(200, 'a');
  EXPECT_NE(TokenShards::Open({even}, 100).status().message().find(
                "holds 100 tokens, fewer than one window of seq_len + 1 = 101"),
            std::string::npos);
  EXPECT_NE(TokenShards::Open({odd + ".missing"}, 8).status().message().find("cannot open"),
            std::string::npos);
  EXPECT_NE(TokenShards::Open({odd}, 1000).status().message().find("has an odd size"),
            std::string::npos);
}

// The decisions come from scripted windows (below and in
// PrefetchDeepensForBurstyProduction): an earlier version timed real decodes
// and failed under stress-ng, where a starved worker measured its own
// slowness. The loader itself is held only to what no timing changes.
// A tuned ring's window: the consumer's wait share, the workers' worth of
// decoding it needs, one worker active of 4 started.
RingWindow TunedWindow(double wait_share, double needed) {
  RingWindow w;
  w.wait_share = wait_share;
  w.needed = needed;
  w.active = 1;
  w.started = 4;
  w.tune_threads = w.tune_depth = true;
  return w;
}

TEST(Loader, TunerAddsWorkersForAHungryConsumerOnly) {
  // A consumer that waits half the time for one worker that cannot keep up
  // (2.5 workers' worth of decoding): one more, up to the budget.
  RingWindow hungry = TunedWindow(0.5, 2.5);
  EXPECT_EQ(DecideRingTune(hungry), RingTune::kAddWorker);
  hungry.active = 3;
  EXPECT_EQ(DecideRingTune(hungry), RingTune::kAddWorker);
  // A slow consumer (a tenth of a worker's decoding, never waiting) keeps one.
  RingWindow slow = TunedWindow(0, 0.1);
  EXPECT_EQ(DecideRingTune(slow), RingTune::kKeep);
  slow.active = 3;  // more than it needs: they park one at a time
  EXPECT_EQ(DecideRingTune(slow), RingTune::kParkWorker);

  // The tuned loader starts with one worker, stays within its budget and
  // delivers the epoch whatever it decided.
  std::string dir = SmallDataset("tune", 4, 60, 240, 180);
  LoaderOptions o = Small(dir, 0);
  o.cpu_budget = 4;
  auto l = ImageLoader::Open(o);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->stats().threads, 1);
  EXPECT_EQ(Epoch(**l, 0, nullptr).size(), 60u);
  EXPECT_GE((*l)->stats().threads, 1);
  EXPECT_LE((*l)->stats().threads, 4);
}

// The tuner's decisions from scripted windows. (An earlier version paused a
// real consumer and decoded real JPEGs; on two busy cores the decode times,
// and so the decision, were the machine's, and it failed now and then.)
TEST(Loader, PrefetchDeepensForBurstyProduction) {
  RingWindow bursty;  // waits a third of the window, yet needs half a worker of two
  bursty.wait_share = 0.3;
  bursty.needed = 0.5;
  bursty.active = bursty.started = 2;
  bursty.tune_depth = true;
  EXPECT_EQ(DecideRingTune(bursty), RingTune::kDeepen);
  RingWindow deepest = bursty;
  deepest.depth = deepest.max_depth;
  EXPECT_EQ(DecideRingTune(deepest), RingTune::kKeep);
  RingWindow fixed = bursty;  // data.prefetch given: the depth stays
  fixed.tune_depth = false;
  EXPECT_EQ(DecideRingTune(fixed), RingTune::kKeep);
  // Workers that do not keep up on average get help, not a deeper queue.
  RingWindow slow = bursty;
  slow.needed = 1.9;
  slow.active = 2;
  slow.started = 4;
  slow.tune_threads = true;
  EXPECT_EQ(DecideRingTune(slow), RingTune::kAddWorker);
  slow.active = 4;  // all four keep up on average: what waits remain are bursts
  EXPECT_EQ(DecideRingTune(slow), RingTune::kDeepen);
  slow.needed = 3.5;  // and where even four do not, nothing is left to change
  EXPECT_EQ(DecideRingTune(slow), RingTune::kKeep);
  // Never waiting with workers to spare: one parks; with one to spare, none.
  RingWindow idle;
  idle.wait_share = 0.001;
  idle.needed = 1.2;
  idle.active = idle.started = 4;
  idle.tune_threads = true;
  EXPECT_EQ(DecideRingTune(idle), RingTune::kParkWorker);
  idle.active = 2;
  EXPECT_EQ(DecideRingTune(idle), RingTune::kKeep);

  // The loader starts a tuned queue at 3 and keeps a given one.
  std::string dir = SmallDataset("bursty", 4, 8, 64, 48);
  LoaderOptions o = Small(dir, 2);
  o.prefetch = 0;
  auto tuned = ImageLoader::Open(o);
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ((*tuned)->stats().prefetch, 3);
  o.prefetch = 2;
  auto given = ImageLoader::Open(o);
  ASSERT_TRUE(given.ok());
  Epoch(**given, 0, nullptr);
  EXPECT_EQ((*given)->stats().prefetch, 2);
}

TEST(Loader, ImagesSmallerThanTheOutputAreUpscaled) {
  std::string dir = SmallDataset("tiny", 2, 4, 12, 9);
  for (bool train : {true, false}) {
    LoaderOptions o = Small(dir, 2);
    o.out_w = o.out_h = 48;  // larger than every image
    o.train = train;
    o.eval_resize = 56;
    auto l = ImageLoader::Open(o);
    ASSERT_TRUE(l.ok());
    (*l)->StartEpoch(0);
    Batch b;
    int n = 0;
    while ((*l)->Next(&b)) {
      (*l)->Release(b);
      ++n;
    }
    EXPECT_EQ(n, 2);
    EXPECT_EQ((*l)->stats().skipped, 0);
  }
}

TEST(Png, DecodesLosslesslyAndRefusesDamage) {
  std::vector<uint8_t> ref = Smooth(40, 30);
  auto png = EncodePng(ref.data(), 40, 30);
  ASSERT_TRUE(png.ok()) << png.status().message();
  EXPECT_TRUE(IsPng(png->data(), png->size()));
  DecodedRegion d;
  ASSERT_TRUE(DecodePng(png->data(), png->size(), &d).ok());
  EXPECT_EQ(d.width, 40);
  EXPECT_EQ(d.rgb, ref);
  std::vector<uint8_t> cut(png->begin(), png->begin() + png->size() / 2);
  Status s = DecodePng(cut.data(), cut.size(), &d);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a decodable PNG"), std::string::npos);
}

TEST(Png, FoldersMayMixPngAndJpeg) {
  std::string dir = SmallDataset("png");
  std::vector<uint8_t> px = Smooth(64, 48);
  auto png = EncodePng(px.data(), 64, 48);
  for (const char* name : {"/class_000/extra.png", "/class_002/extra.PNG"}) {
    std::ofstream f(dir + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  }
  std::ofstream(dir + "/class_001/broken.png", std::ios::binary) << "\x89PNG\r\n\x1a\nbroken";
  auto l = ImageLoader::Open(Small(dir, 2));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->dataset_size(), 27);
  std::vector<int64_t> seen = EpochSamples(**l, 0);
  EXPECT_EQ(seen.size(), 24u);          // 27 images, 6 full batches of 4
  // The broken one, if it was drawn, and again if the read-ahead of epoch 1
  // (StartEpoch) drew it already.
  EXPECT_LE((*l)->stats().skipped, 2);
  // Packing turns them into JPEG records (or raw pixels).
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  auto r = WritePack(dir, dst, PackOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->images, 26);
  EXPECT_EQ(r->skipped, 1);
}

TEST(Loader, EmptyOrMissingFolderIsAnError) {
  std::string empty = ::testing::TempDir() + "/fb_pipe_empty";
  fs::create_directories(empty + "/cats");
  auto l = ImageLoader::Open(Small(empty, 1));
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("has no JPEG or PNG files"), std::string::npos);
  auto m = ImageLoader::Open(Small("/nonexistent/dataset", 1));
  EXPECT_NE(m.status().message().find("does not exist"), std::string::npos);
}

// ---- messages true to the input (issue 53) ----

// A JPEG of two components (no colour space libjpeg names): fullburn's
// refusal quotes the file's own count.
std::vector<uint8_t> EncodeTwoComponents() {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = 16;
  c.image_height = 16;
  c.input_components = 2;
  c.in_color_space = JCS_UNKNOWN;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  std::vector<uint8_t> row(16 * 2, 77);
  while (c.next_scanline < 16) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&c);
  free(buf);
  return out;
}

TEST(JpegMessages, ComponentsAndPrecisionAreTheFilesOwn) {
  DecodedRegion d;
  std::vector<uint8_t> two = EncodeTwoComponents();
  EXPECT_EQ(DecodeJpeg(two.data(), two.size(), &d).message(), "unsupported JPEG: 2 components");
  Result<JpegHeader> h = ReadJpegHeader(two.data(), two.size());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().message(), "unsupported JPEG: 2 components");
  // The same RGB file with its frame header's sample precision set to 12:
  // libjpeg-turbo 2 refuses it itself, 3 reads it and fullburn refuses it;
  // either way the message carries the file's 12.
  std::vector<uint8_t> twelve = EncodeSpecial(false);
  size_t sof = 0;
  for (size_t i = 2; i + 4 < twelve.size(); ++i)
    if (twelve[i] == 0xFF && twelve[i + 1] == 0xC0) {
      sof = i;
      break;
    }
  ASSERT_GT(sof, 0u);
  ASSERT_EQ(twelve[sof + 4], 8);
  twelve[sof + 4] = 12;
  std::string m = DecodeJpeg(twelve.data(), twelve.size(), &d).message();
  EXPECT_TRUE(m == "unsupported JPEG: 12-bit samples (only 8-bit)" ||
              m == "not a decodable JPEG: Unsupported JPEG data precision 12")
      << m;
}

// Every sample bad: the count of samples tried is the dataset's when it has
// fewer than 64 (it once said 64 whatever the size).
TEST(LoaderMessages, NoDecodableImageSaysHowManySamplesWereTried) {
  std::string dir = SmallDataset("allbad", 2, 3);
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) std::ofstream(e.path(), std::ios::trunc) << "not a jpeg";
  auto l = ImageLoader::Open(Small(dir, 1));
  ASSERT_TRUE(l.ok()) << l.status().message();
  (*l)->StartEpoch(0);
  Batch b;
  EXPECT_FALSE((*l)->Next(&b));
  EXPECT_EQ((*l)->status().message(), "no decodable image among 6 consecutive samples of " + dir);
}

// A damaged image inside a pack is named by the pack and its record number.
TEST(LoaderMessages, ABadRecordOfAPackIsNamedByItsNumber) {
  std::string dir = SmallDataset("packrecord");
  std::string dst = dir + ".pack";
  fs::remove_all(dst);
  ASSERT_TRUE(WritePack(dir, dst, PackOptions{}).ok());
  const size_t victim = 17;
  uint64_t offset = 0, size = 0;
  uint32_t shard = 0;
  {
    auto pack = PackReader::Open(dst);
    ASSERT_TRUE(pack.ok()) << pack.status().message();
    ASSERT_GT((*pack)->records().size(), victim);
    const PackRecord& r = (*pack)->records()[victim];
    offset = r.offset;
    size = r.size;
    shard = r.shard;
  }
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05u.fbp", shard);
  {
    std::fstream f(dst + "/" + name, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(static_cast<std::streamoff>(offset));
    std::string junk(size, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  LoaderOptions o = Small(dst, 2);
  o.on_bad_sample = BadSamplePolicy::kFail;
  auto l = ImageLoader::Open(o);
  ASSERT_TRUE(l.ok()) << l.status().message();
  (*l)->StartEpoch(0);
  Batch b;
  while ((*l)->Next(&b)) (*l)->Release(b);
  const std::string m = (*l)->status().message();
  EXPECT_EQ(m.rfind("bad sample " + dst + "#" + std::to_string(victim) + ": not a decodable JPEG", 0), 0u) << m;
}

}  // namespace
}  // namespace fullburn
