// A token shard (nanoGPT's bare uint16 array or llm.c's header + array),
// opened and sampled as fullburn train's language-model loader does.
#include "fullburn/pipeline.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the window length, so short shards meet long windows.
  if (size < 1) return 0;
  int seq_len = 1 + data[0] % 64;
  std::string path = fuzz::WriteScratch("shard.bin", data + 1, size - 1);
  auto shards = fullburn::TokenShards::Open({path}, seq_len);
  if (shards.ok()) {
    const int batch = 2;
    std::vector<int32_t> x(static_cast<size_t>(batch) * seq_len), y(x.size());
    for (int64_t step = 0; step < 3; ++step) (*shards)->Batch(7, step, batch, x.data(), y.data());
  }
  return 0;
}
