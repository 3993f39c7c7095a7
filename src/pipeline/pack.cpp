// Packed datasets: images preprocessed once (resized, optionally decoded to
// raw pixels) into large shard files read through mmap, with a checksummed
// index. The format is written down in docs/formats.md.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "fullburn/atomic_file.h"
#include "fullburn/codec.h"
#include "fullburn/crop.h"
#include "fullburn/env.h"
#include "fullburn/image_folder.h"
#include "fullburn/pack.h"

namespace fullburn {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'F', 'B', 'P', 'A', 'C', 'K', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kShardBytes = 1ull << 30;
const char* const kIndexName = "index.fbpx";

constexpr uint64_t kFnvBasis = 14695981039346656037ull;
// Packs written before 2026-11-23 used this mistyped offset basis (a digit
// short); readers accept both so those packs need no re-packing.
constexpr uint64_t kFnvBasisV1Early = 1469598103934665603ull;

uint64_t Fnv1a(const uint8_t* p, size_t n, uint64_t basis = kFnvBasis) {
  uint64_t h = basis;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string ShardName(uint32_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05u.fbp", i);
  return buf;
}

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof v);
}

// Bounds-checked reads of the index.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  template <typename T>
  bool Get(T* v) {
    if (end - p < static_cast<ptrdiff_t>(sizeof(T))) return false;
    std::memcpy(v, p, sizeof(T));
    p += sizeof(T);
    return true;
  }
};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// Every shard reaches the disk before the index that names it is written;
// a full disk shows here, as a failed flush, sync or close.
bool SyncAndClose(File* f) {
  FILE* raw = f->release();
  bool ok = std::fflush(raw) == 0 && ::fsync(fileno(raw)) == 0;
  return std::fclose(raw) == 0 && ok;
}

struct Payload {
  bool ok = false;
  std::vector<uint8_t> bytes;
  int width = 0, height = 0;
};

// One image of the pack: validated by a full decode, resized if asked.
Payload Prepare(const std::string& path, const PackOptions& o) {
  Payload out;
  std::vector<uint8_t> file;
  if (!ReadWholeFile(path, &file).ok() || file.empty()) return out;
  const bool png = IsPng(file.data(), file.size());
  DecodedRegion region;
  int w = 0, h = 0;
  if (png) {
    if (!DecodePng(file.data(), file.size(), &region).ok()) return out;
    w = region.width;
    h = region.height;
  } else {
    Result<JpegHeader> header = ReadJpegHeader(file.data(), file.size());
    if (!header.ok()) return out;
    w = header->width;
    h = header->height;
  }
  double r = 1.0;
  if (o.max_side > 0 && std::max(w, h) > o.max_side) r = static_cast<double>(o.max_side) / std::max(w, h);
  int tw = std::max(1, static_cast<int>(std::lround(w * r)));
  int th = std::max(1, static_cast<int>(std::lround(h * r)));
  BoxF all{0, 0, double(w), double(h)};
  if (!png && !DecodeJpegRegion(file.data(), file.size(), all, tw, th, &region).ok()) return out;
  std::vector<uint8_t> pixels;
  const std::vector<uint8_t>* rgb = &region.rgb;
  if (tw != region.width || th != region.height) {
    pixels.resize(static_cast<size_t>(tw) * th * 3);
    ResizeInto(region, all, tw, th, false, Layout::kNHWC, pixels.data());
    rgb = &pixels;
  }
  if (o.format == PackFormat::kRaw) {
    out.bytes = *rgb;
  } else if (!png && r == 1.0) {
    out.bytes = std::move(file);  // already a valid JPEG of the right size
  } else {
    Result<std::vector<uint8_t>> jpeg = EncodeJpeg(rgb->data(), tw, th, o.quality);
    if (!jpeg.ok()) return out;
    out.bytes = std::move(*jpeg);
  }
  out.width = tw;
  out.height = th;
  out.ok = true;
  return out;
}

}  // namespace

namespace {

// Shards, then the index, into `dst` (an empty directory).
Result<PackReport> WritePackFiles(const ImageFolder* folder, const std::string& src,
                                  const std::string& dst, const PackOptions& o) {
  int threads = o.threads > 0 ? o.threads : RankCpus(ReadCpuView(Env::Default()), 1);
  const size_t n = folder->files.size();
  PackReport report;
  std::vector<PackRecord> records;
  std::vector<uint64_t> shard_sizes;
  File shard;  // closed on every early return, so no error path leaks it
  uint64_t shard_used = kShardBytes;  // forces the first shard open
  // Images are prepared in parallel, a chunk at a time, and written in order.
  const size_t chunk = static_cast<size_t>(threads) * 16;
  std::vector<Payload> ready(chunk);
  for (size_t base = 0; base < n; base += chunk) {
    size_t count = std::min(chunk, n - base);
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < count;) ready[i] = Prepare(folder->files[base + i], o);
      });
    for (std::thread& t : pool) t.join();
    for (size_t i = 0; i < count; ++i) {
      Payload& p = ready[i];
      if (!p.ok) {
        ++report.skipped;
        std::fprintf(stderr, "fullburn: pack: skipping %s (not a decodable JPEG)\n",
                     folder->files[base + i].c_str());
        continue;
      }
      if (shard_used + p.bytes.size() > kShardBytes && shard_used > 0) {
        if (shard && !SyncAndClose(&shard)) return Status::IoError("cannot write a shard in " + dst + " (disk full?)");
        shard.reset(std::fopen((fs::path(dst) / ShardName(static_cast<uint32_t>(shard_sizes.size()))).c_str(), "wb"));
        if (!shard) return Status::IoError("cannot create a shard in " + dst);
        shard_sizes.push_back(0);
        shard_used = 0;
      }
      if (std::fwrite(p.bytes.data(), 1, p.bytes.size(), shard.get()) != p.bytes.size())
        return Status::IoError("cannot write a shard in " + dst + " (disk full?)");
      records.push_back(PackRecord{static_cast<uint32_t>(shard_sizes.size() - 1), shard_used,
                                   static_cast<uint32_t>(p.bytes.size()), static_cast<uint16_t>(p.width),
                                   static_cast<uint16_t>(p.height), folder->labels[base + i]});
      shard_used += p.bytes.size();
      shard_sizes.back() = shard_used;
      report.bytes += static_cast<int64_t>(p.bytes.size());
      ++report.images;
      p = Payload();
    }
  }
  if (shard && !SyncAndClose(&shard))
    return Status::IoError("cannot write a shard in " + dst + " (disk full?)");
  if (records.empty()) return Status::InvalidArgument("no decodable image in " + src + ": nothing to pack");

  std::vector<uint8_t> index(kMagic, kMagic + 8);
  Put(&index, kVersion);
  Put(&index, static_cast<uint32_t>(o.format));
  Put(&index, static_cast<uint64_t>(records.size()));
  Put(&index, static_cast<uint32_t>(folder->classes.size()));
  Put(&index, static_cast<uint32_t>(shard_sizes.size()));
  for (const std::string& c : folder->classes) {
    Put(&index, static_cast<uint32_t>(c.size()));
    index.insert(index.end(), c.begin(), c.end());
  }
  for (uint64_t s : shard_sizes) Put(&index, s);
  for (const PackRecord& r : records) {
    Put(&index, r.shard);
    Put(&index, r.offset);
    Put(&index, r.size);
    Put(&index, r.width);
    Put(&index, r.height);
    Put(&index, r.label);
  }
  Put(&index, Fnv1a(index.data(), index.size()));
  // The index goes last and atomically: a pack without one is not a pack.
  Status written = WriteFileAtomically(
      (fs::path(dst) / kIndexName).string(),
      std::string_view(reinterpret_cast<const char*>(index.data()), index.size()),
      Durability::kSurvivesCrash);
  if (!written.ok()) return written;
  return report;
}

}  // namespace

Result<PackReport> WritePack(const std::string& src, const std::string& dst, const PackOptions& o) {
  Result<ImageFolder> folder = ScanImageFolder(src);
  if (!folder.ok()) return folder.status();
  return WritePack(*folder, src, dst, o);
}

Result<PackReport> WritePack(const ImageFolder& folder, const std::string& src,
                             const std::string& dst, const PackOptions& o) {
  if (o.quality < 1 || o.quality > 100)
    return Status::InvalidArgument("--quality must be 1 to 100");
  if (o.max_side < 0 || o.max_side > 65535)
    return Status::InvalidArgument("--max-side must be 0 to 65535");
  std::error_code ec;
  bool existed = fs::exists(dst, ec);
  if (existed && !fs::is_empty(dst, ec))
    return Status::InvalidArgument(
        dst + " exists and is not empty: remove it or choose another destination");
  fs::create_directories(dst, ec);
  if (ec) return Status::IoError("cannot create " + dst + ": " + ec.message());
  Result<PackReport> report = WritePackFiles(&folder, src, dst, o);
  if (report.ok()) return report;
  // A half-written pack is gigabytes of no use: dst was empty, so all of it goes.
  if (existed)
    for (const auto& entry : fs::directory_iterator(dst, ec)) fs::remove_all(entry.path(), ec);
  else
    fs::remove_all(dst, ec);
  if (report.status().code() != Status::Code::kIoError) return report;
  return Status::IoError(report.status().message() + "; the partial pack was removed");
}

bool PackReader::IsPack(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kIndexName, ec);
}

namespace {

// What is wrong with one index record, in words that name its numbers; empty
// when it is sound.
std::string BadRecord(const PackRecord& rec, const std::vector<uint64_t>& shard_sizes,
                      uint32_t classes, PackFormat format) {
  if (rec.shard >= shard_sizes.size())
    return "is in shard " + std::to_string(rec.shard) + " of " +
           std::to_string(shard_sizes.size());
  uint64_t shard_size = shard_sizes[rec.shard];
  // offset + size could wrap around: compared without the sum.
  if (rec.offset > shard_size || rec.size > shard_size - rec.offset)
    return "has bytes " + std::to_string(rec.offset) + " + " + std::to_string(rec.size) +
           " of shard " + std::to_string(rec.shard) + ", which holds " +
           std::to_string(shard_size);
  uint64_t raw_bytes = uint64_t{rec.width} * rec.height * 3;
  if (format == PackFormat::kRaw && rec.size != raw_bytes)
    return "is " + std::to_string(rec.size) + " bytes, its " + std::to_string(rec.width) + "x" +
           std::to_string(rec.height) + " raw pixels are " + std::to_string(raw_bytes);
  if (rec.label < 0 || static_cast<uint32_t>(rec.label) >= classes)
    return "has label " + std::to_string(rec.label) + " of " + std::to_string(classes) +
           " classes";
  return "";
}

}  // namespace

Result<std::unique_ptr<PackReader>> PackReader::Open(const std::string& dir) {
  std::string path = (fs::path(dir) / kIndexName).string();
  std::vector<uint8_t> index;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return Status::NotFound("cannot open " + path);
    std::fseek(f, 0, SEEK_END);
    long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    index.resize(size > 0 ? static_cast<size_t>(size) : 0);
    bool ok = std::fread(index.data(), 1, index.size(), f) == index.size();
    std::fclose(f);
    if (!ok) return Status::IoError("cannot read " + path);
  }
  auto corrupt = [&](const std::string& why) {
    return Status::Corruption("pack index " + path + " is corrupt (" + why + "): re-run fullburn pack");
  };
  if (index.size() < 8 + 8 || std::memcmp(index.data(), kMagic, 8) != 0) return corrupt("not a fullburn pack index");
  uint64_t stored;
  std::memcpy(&stored, index.data() + index.size() - 8, 8);
  if (Fnv1a(index.data(), index.size() - 8) != stored &&
      Fnv1a(index.data(), index.size() - 8, kFnvBasisV1Early) != stored)
    return corrupt("checksum mismatch");
  Cursor c{index.data() + 8, index.data() + index.size() - 8};
  uint32_t version = 0, format = 0, classes = 0, shards = 0;
  uint64_t count = 0;
  if (!c.Get(&version) || version != kVersion)
    return Status::InvalidArgument(path + " is pack format v" + std::to_string(version) +
                                   "; this fullburn reads v1: re-run fullburn pack");
  std::unique_ptr<PackReader> r(new PackReader());
  if (!c.Get(&format) || format > 1 || !c.Get(&count) || !c.Get(&classes) || !c.Get(&shards))
    return corrupt("bad header");
  r->format_ = static_cast<PackFormat>(format);
  for (uint32_t i = 0; i < classes; ++i) {
    uint32_t len;
    if (!c.Get(&len) || c.end - c.p < static_cast<ptrdiff_t>(len)) return corrupt("bad class name");
    r->classes_.emplace_back(reinterpret_cast<const char*>(c.p), len);
    c.p += len;
  }
  // The counts are checked against the bytes left before anything is sized
  // by them: a damaged count would otherwise ask for terabytes.
  constexpr uint64_t kRecordBytes = 4 + 8 + 4 + 2 + 2 + 4;
  uint64_t left = static_cast<uint64_t>(c.end - c.p);
  if (shards > left / 8 || count > (left - uint64_t{shards} * 8) / kRecordBytes)
    return corrupt("it lists " + std::to_string(shards) + " shards and " + std::to_string(count) +
                   " records, more than its " + std::to_string(left) + " bytes of tables hold");
  std::vector<uint64_t> sizes(shards);
  for (uint64_t& s : sizes)
    if (!c.Get(&s)) return corrupt("bad shard table");
  r->records_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    PackRecord& rec = r->records_[i];
    if (!c.Get(&rec.shard) || !c.Get(&rec.offset) || !c.Get(&rec.size) || !c.Get(&rec.width) ||
        !c.Get(&rec.height) || !c.Get(&rec.label))
      return corrupt("record table cut short");
    std::string bad = BadRecord(rec, sizes, classes, r->format_);
    if (!bad.empty()) return corrupt("record " + std::to_string(i) + " " + bad);
  }
  for (uint32_t i = 0; i < shards; ++i) {
    std::string shard = (fs::path(dir) / ShardName(i)).string();
    int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      return Status::NotFound("pack shard " + shard + " is missing: re-run fullburn pack");
    }
    if (static_cast<uint64_t>(st.st_size) != sizes[i]) {
      ::close(fd);
      return Status::Corruption("pack shard " + shard + " is " + std::to_string(st.st_size) +
                                " bytes, the index expects " + std::to_string(sizes[i]) +
                                " (truncated?): re-run fullburn pack");
    }
    void* map = sizes[i] ? ::mmap(nullptr, sizes[i], PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    ::close(fd);
    if (map == MAP_FAILED) return Status::IoError("cannot map " + shard);
    r->maps_.push_back(static_cast<const uint8_t*>(map));
    r->map_sizes_.push_back(sizes[i]);
  }
  return r;
}

PackReader::~PackReader() {
  for (size_t i = 0; i < maps_.size(); ++i)
    if (maps_[i]) ::munmap(const_cast<uint8_t*>(maps_[i]), map_sizes_[i]);
}

}  // namespace fullburn
