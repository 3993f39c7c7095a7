// Tokens: token shards for language models, read through mmap, and a
// synthetic token file to train on.
//
// Contract
// - Ownership: a TokenShards owns its read-only mappings of the files (for
//   its lifetime); Batch writes into the caller's x and y (batch x seq_len
//   int32 each).
// - Threads: a TokenShards is immutable once open; Batch keeps no state, so
//   any number of threads may call it at once. A batch is a function of
//   (seed, step) only.
// - Errors: a Status (Result), never an exception. Open refuses a missing
//   file (NotFound), one it cannot map (IoError), one that is not a regular
//   file, too short for one window or with an llm.c header of another version
//   (InvalidArgument), and
//   a header or size that contradicts the file (Corruption). MakeSyntheticTokens
//   writes through an atomic rename: the file appears whole or not at all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

// Files of uint16 token ids: the nanoGPT layout (the bare array) or llm.c's
// (a 256 x int32 header: magic 20240520, version 1, token count; then the
// array). Several files form one stream, sampled in proportion to their size.
class TokenShards {
 public:
  static Result<std::unique_ptr<TokenShards>> Open(const std::vector<std::string>& paths,
                                                   int seq_len);
  ~TokenShards();
  int64_t tokens() const { return total_; }
  int seq_len() const { return seq_len_; }
  // Batch `step` of `batch` windows of seq_len + 1 tokens at random offsets
  // drawn from (seed, step): x = window[0, seq_len), y = window[1, seq_len].
  // The same step always gives the same batch, so a resumed run continues exactly.
  void Batch(uint64_t seed, int64_t step, int batch, int32_t* x, int32_t* y) const;

 private:
  struct File {
    const uint16_t* tokens;
    int64_t count;
    void* map;
    size_t map_size;
  };
  TokenShards() = default;
  std::vector<File> files_;
  int64_t total_ = 0;
  int seq_len_ = 0;
};

struct SyntheticTokensOptions {
  int64_t tokens = 1 << 20;
  int vocab = 256;
  uint64_t seed = 0;
};
// Writes a nanoGPT-layout token file with learnable structure: each token
// follows its predecessor by a fixed random transition 85% of the time.
Status MakeSyntheticTokens(const std::string& path, const SyntheticTokensOptions& opts);

}  // namespace fullburn
