// JPEG and PNG seeds for jpeg_fuzz and png_fuzz, made with the project's
// own encoders (no image tools needed): small images of a few shapes,
// qualities and sizes that are not multiples of the 8x8 blocks.
#include <cstdio>
#include <string>
#include <vector>

#include "fullburn/pipeline.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_image_seeds CORPUS_DIR (fuzz/corpus)\n");
    return 2;
  }
  std::string dir = argv[1];
  struct Shape {
    int w, h, quality;
  };
  for (Shape s : {Shape{16, 16, 90}, Shape{33, 17, 50}, Shape{1, 1, 75}, Shape{64, 9, 10}}) {
    std::vector<uint8_t> rgb(static_cast<size_t>(s.w) * s.h * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 + i / 3);
    std::string name = std::to_string(s.w) + "x" + std::to_string(s.h);
    auto jpeg = fullburn::EncodeJpeg(rgb.data(), s.w, s.h, s.quality);
    auto png = fullburn::EncodePng(rgb.data(), s.w, s.h);
    if (!jpeg.ok() || !png.ok()) return 1;
    for (auto [sub, bytes] : {std::pair{"jpeg", &*jpeg}, std::pair{"png", &*png}}) {
      std::string path = dir + "/" + sub + "/" + name + (sub[0] == 'j' ? ".jpg" : ".png");
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(bytes->data(), 1, bytes->size(), f) != bytes->size()) return 1;
      std::fclose(f);
    }
  }
  return 0;
}
