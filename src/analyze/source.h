// Internal to analyze: a trace file's text, block by block, inflated on the
// way when it is gzip.
#pragma once

#include <memory>
#include <string>

#include "fullburn/status.h"

namespace fullburn::analyze {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `cap` bytes of text into `buf`; 0 once the text has ended. A gzip
  // stream that ends before its end marker is an error (a truncated file).
  virtual Result<size_t> Read(char* buf, size_t cap) = 0;
};

// Which library inflates gzip: ISA-L's igzip where the build found it (else
// zlib), or zlib (the tests read every gzip case with both).
enum class Inflater { kFastest, kZlib };

// gzip is recognized by its magic bytes (1f 8b), whatever the file's name.
Result<std::unique_ptr<ByteSource>> OpenSource(const std::string& path,
                                               Inflater inflater = Inflater::kFastest);

}  // namespace fullburn::analyze
