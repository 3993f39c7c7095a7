// The C++ ImageLoader's batches as raw bytes, for the Python module's tests
// to hold fullburn.ImageLoader to: per batch its uint8 images, then its
// labels as int32.
//   dump_batches ROOT BATCH CROP SEED EPOCH TRAIN(0|1) CHANNELS_LAST(0|1) BATCHES OUT
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fullburn/pipeline.h"

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: dump_batches ROOT BATCH CROP SEED EPOCH TRAIN CHANNELS_LAST BATCHES OUT\n");
    return 2;
  }
  fullburn::LoaderOptions o;
  o.root = argv[1];
  o.batch_size = std::atoi(argv[2]);
  o.out_w = o.out_h = std::atoi(argv[3]);
  o.eval_resize = o.out_w * 256 / 224;
  o.seed = std::strtoull(argv[4], nullptr, 10);
  int epoch = std::atoi(argv[5]);
  o.train = std::atoi(argv[6]) != 0;
  o.layout = std::atoi(argv[7]) ? fullburn::Layout::kNHWC : fullburn::Layout::kNCHW;
  int batches = std::atoi(argv[8]);
  o.threads = 2;
  auto loader = fullburn::ImageLoader::Open(o);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().message().c_str());
    return 1;
  }
  FILE* out = std::fopen(argv[9], "wb");
  if (!out) return 1;
  (*loader)->StartEpoch(epoch);
  size_t image_bytes = static_cast<size_t>(o.out_w) * o.out_h * 3;
  fullburn::Batch b;
  for (int i = 0; i < batches && (*loader)->Next(&b); ++i) {
    std::fwrite(b.images, 1, image_bytes * static_cast<size_t>(b.size), out);
    std::fwrite(b.labels, sizeof(int32_t), static_cast<size_t>(b.size), out);
    (*loader)->Release(b);
  }
  std::fclose(out);
  return (*loader)->status().ok() ? 0 : 1;
}
