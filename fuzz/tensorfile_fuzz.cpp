// A safetensors file (checkpoints, save_async): the header alone, then the
// whole file with every tensor's extent and checksum.
#include "fullburn/tensorfile.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::WriteScratch("t.safetensors", data, size);
  (void)fullburn::ReadTensorFileMetadata(path);
  fullburn::Result<fullburn::TensorFile> f = fullburn::ReadTensorFile(path);
  if (f.ok()) {
    // Touch every tensor's bytes: an extent past the file shows up here under ASan.
    volatile uint8_t sum = 0;
    for (const fullburn::TensorFileEntry& e : f->tensors)
      for (uint64_t i = 0; i < e.size; ++i) sum = sum + f->Data(e)[i];
  }
  return 0;
}
