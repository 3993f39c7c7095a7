// Pack: packed datasets (docs/formats.md): an image folder preprocessed once
// (resized, JPEG or raw pixels) into large shard files plus a checksummed
// index, written by WritePack and read through mmap by PackReader.
//
// Contract
// - Ownership: WritePack owns nothing after it returns; DST is an empty (or
//   new) folder that becomes the pack. A PackReader owns its read-only
//   mappings of the shards; the pointers Data() returns are valid while the
//   reader lives.
// - Threads: WritePack prepares images on its own threads (PackOptions::threads),
//   joined before it returns, and writes shards and index from the calling
//   thread; the index goes last, atomically and fsynced, so a pack without one
//   is not a pack. A PackReader is immutable once open: any number of threads
//   read it at once.
// - Errors: a Status (Result), never an exception. Bad options or nothing
//   decodable to pack are InvalidArgument; a write that fails is IoError, and
//   the partial pack is removed. Unreadable images are skipped, counted
//   (PackReport::skipped) and named on stderr. PackReader::Open refuses a
//   missing, truncated or corrupt pack (NotFound, Corruption; another format
//   version InvalidArgument), so none fails mid-epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fullburn/image_folder.h"
#include "fullburn/status.h"

namespace fullburn {

enum class PackFormat : uint32_t { kJpeg = 0, kRaw = 1 };

struct PackOptions {
  PackFormat format = PackFormat::kJpeg;
  int max_side = 0;  // resize so neither side exceeds this (0: keep the size)
  int quality = 90;  // for kJpeg
  int threads = 0;   // 0: one per CPU this process may use (RankCpus)
};
// Writes an image folder as a pack: DST/index.fbpx plus DST/shard-NNNNN.fbp
// files, in the folder's order. Unreadable images are left out and counted.
struct PackReport {
  int64_t images = 0, skipped = 0, bytes = 0;
};
Result<PackReport> WritePack(const std::string& src, const std::string& dst, const PackOptions& o);
// The same for a folder already scanned (from `src`), so a caller that
// needed its file list first does not walk a large tree twice.
Result<PackReport> WritePack(const ImageFolder& folder, const std::string& src,
                             const std::string& dst, const PackOptions& o);

struct PackRecord {
  uint32_t shard;
  uint64_t offset;
  uint32_t size;
  uint16_t width, height;
  int32_t label;
};

// A pack opened for reading: shards are mapped read-only and shared by all
// threads; Data() points into the mapping (valid while the reader lives).
class PackReader {
 public:
  static bool IsPack(const std::string& dir);
  // Checks the index's magic, version and checksum and that every record lies
  // inside its shard: a truncated or corrupt pack is refused here, not mid-epoch.
  static Result<std::unique_ptr<PackReader>> Open(const std::string& dir);
  ~PackReader();
  PackFormat format() const { return format_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<PackRecord>& records() const { return records_; }
  const uint8_t* Data(const PackRecord& r) const { return maps_[r.shard] + r.offset; }

 private:
  PackReader() = default;
  PackFormat format_ = PackFormat::kJpeg;
  std::vector<std::string> classes_;
  std::vector<PackRecord> records_;
  std::vector<const uint8_t*> maps_;
  std::vector<size_t> map_sizes_;
};

}  // namespace fullburn
