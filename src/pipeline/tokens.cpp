// Token shards for language models, read through mmap.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fullburn/atomic_file.h"
#include "fullburn/rng.h"
#include "fullburn/tokens.h"

namespace fullburn {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeader = 256 * sizeof(int32_t);

}  // namespace

Result<std::unique_ptr<TokenShards>> TokenShards::Open(const std::vector<std::string>& paths,
                                                       int seq_len) {
  if (paths.empty()) return Status::InvalidArgument("no token files given");
  if (seq_len < 1) return Status::InvalidArgument("seq_len must be at least 1");
  std::unique_ptr<TokenShards> t(new TokenShards());
  t->seq_len_ = seq_len;
  for (const std::string& path : paths) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      return Status::NotFound("cannot open token file " + path +
                              "; make one with 'fullburn make-dataset tokens FILE'");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::InvalidArgument("token file " + path +
                                     " is not a regular file (a folder?): give a file of uint16 "
                                     "tokens, e.g. from 'fullburn make-dataset tokens FILE'");
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* map = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    int map_errno = errno;
    ::close(fd);
    if (map == MAP_FAILED)
      return Status::IoError("cannot map token file " + path + ": " + std::strerror(map_errno));
    File f{static_cast<const uint16_t*>(map), 0, map, size};
    t->files_.push_back(f);  // unmapped by the destructor from here on
    const auto* bytes = static_cast<const uint8_t*>(map);
    int32_t header[3] = {0, 0, 0};
    if (size >= kLlmcHeader) std::memcpy(header, bytes, sizeof header);
    if (header[0] == kLlmcMagic) {
      int64_t expect = header[2];
      if (header[1] != 1)
        return Status::InvalidArgument("token file " + path + " has an llm.c header of version " +
                                       std::to_string(header[1]) +
                                       "; this fullburn reads version 1 (uint16 tokens): write it again");
      if (expect < 0 || kLlmcHeader + static_cast<size_t>(expect) * 2 != size)
        return Status::Corruption("token file " + path + " has an llm.c header for " +
                                  std::to_string(expect) + " tokens but holds " +
                                  std::to_string((size - kLlmcHeader) / 2) +
                                  " (truncated?): write it again");
      t->files_.back().tokens = reinterpret_cast<const uint16_t*>(bytes + kLlmcHeader);
      t->files_.back().count = expect;
    } else {
      if (size % 2 != 0)
        return Status::Corruption("token file " + path + " has an odd size (" + std::to_string(size) +
                                  " bytes), so it is truncated: write it again");
      t->files_.back().count = static_cast<int64_t>(size / 2);
    }
    if (t->files_.back().count < seq_len + 1)
      return Status::InvalidArgument("token file " + path + " holds " +
                                     std::to_string(t->files_.back().count) +
                                     " tokens, fewer than one window of seq_len + 1 = " +
                                     std::to_string(seq_len + 1));
    t->total_ += t->files_.back().count;
  }
  return t;
}

TokenShards::~TokenShards() {
  for (const File& f : files_)
    if (f.map) ::munmap(f.map, f.map_size);
}

void TokenShards::Batch(uint64_t seed, int64_t step, int batch, int32_t* x, int32_t* y) const {
  const int64_t windows_total = total_;  // for picking a file by size
  for (int b = 0; b < batch; ++b) {
    SplitMix rng{seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^ static_cast<uint64_t>(b)};
    // A file in proportion to its tokens, then an offset inside it.
    int64_t pick = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(windows_total));
    size_t k = 0;
    while (pick >= files_[k].count) pick -= files_[k++].count;
    const File& f = files_[k];
    int64_t start = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(f.count - seq_len_));
    const uint16_t* w = f.tokens + start;
    int32_t* xo = x + static_cast<size_t>(b) * seq_len_;
    int32_t* yo = y + static_cast<size_t>(b) * seq_len_;
    for (int i = 0; i < seq_len_; ++i) {
      xo[i] = w[i];
      yo[i] = w[i + 1];
    }
  }
}

Status MakeSyntheticTokens(const std::string& path, const SyntheticTokensOptions& o) {
  if (o.tokens < 2 || o.vocab < 2 || o.vocab > 65536)
    return Status::InvalidArgument("make-dataset tokens needs at least 2 tokens and a vocabulary of 2 to 65536");
  SplitMix rng{o.seed + 17};
  std::vector<uint16_t> next(static_cast<size_t>(o.vocab));
  for (uint16_t& n : next) n = static_cast<uint16_t>(rng.Next() % static_cast<uint64_t>(o.vocab));
  Result<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path, Durability::kVisible);
  if (!file.ok()) return file.status();
  std::vector<uint16_t> buf;
  buf.reserve(1 << 16);
  uint16_t cur = 0;
  for (int64_t i = 0; i < o.tokens; ++i) {
    cur = rng.Uniform() < 0.85 ? next[cur] : static_cast<uint16_t>(rng.Next() % static_cast<uint64_t>(o.vocab));
    buf.push_back(cur);
    if (buf.size() == buf.capacity() || i + 1 == o.tokens) {
      if (!(*file)->Append(buf.data(), buf.size() * sizeof(uint16_t))) break;
      buf.clear();
    }
  }
  return (*file)->Commit();
}

}  // namespace fullburn
