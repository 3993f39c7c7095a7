// A packed dataset (fullburn pack): the input is the index without its
// checksum, up to a "----" line, then shard 0. The harness appends the
// index's FNV-1a as the writer does, so the fuzzer gets past the checksum to
// the tables behind it. Every record the reader accepts is read whole.
#include <cstring>

#include "fullburn/pipeline.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts = fuzz::SplitParts(data, size, 2);
  std::string index = parts[0];
  std::string shard = parts.size() > 1 ? parts[1] : std::string();
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : index) h = (h ^ c) * 1099511628211ull;
  char sum[8];
  std::memcpy(sum, &h, 8);
  index.append(sum, 8);
  fuzz::WriteScratch("index.fbpx", reinterpret_cast<const uint8_t*>(index.data()), index.size());
  fuzz::WriteScratch("shard-00000.fbp", reinterpret_cast<const uint8_t*>(shard.data()), shard.size());
  auto reader = fullburn::PackReader::Open(fuzz::ScratchDir());
  if (reader.ok()) {
    volatile uint8_t sum_bytes = 0;
    for (const fullburn::PackRecord& r : (*reader)->records())
      for (uint32_t i = 0; i < r.size; ++i) sum_bytes = sum_bytes + (*reader)->Data(r)[i];
  }
  return 0;
}
