// safetensors files: atomic writes with a checksum, verified reads, and a
// background writer.
#include "fullburn/tensorfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>

#include "fullburn/atomic_file.h"

namespace fullburn {

void CopyToStage(void* stage, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(stage);
  const auto* s = static_cast<const char*>(src);
#if defined(__SSE2__)
  if (bytes >= 256) {
    size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    _mm_sfence();  // streamed stores are weakly ordered: visible before the job starts
  }
#endif
  std::memcpy(d, s, bytes);
}

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// crc32_z takes size_t lengths, so one call covers any tensor.
uLong Crc(uLong crc, const void* data, uint64_t n) {
  return crc32_z(crc, static_cast<const Bytef*>(data), static_cast<size_t>(n));
}

Status Corrupt(const std::string& path, const std::string& why) {
  return Status::Corruption(path + " is unusable (" + why +
                            "): it was not written completely or was damaged");
}

}  // namespace

int DtypeSize(const std::string& dtype) {
  static const std::pair<const char*, int> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  for (const auto& [name, size] : kSizes)
    if (dtype == name) return size;
  return 0;
}

Status WriteTensorFile(const std::string& path, const std::vector<TensorRecord>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       int64_t* bytes_written) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const TensorRecord& t : tensors) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    if (DtypeSize(t.dtype) == 0 || static_cast<uint64_t>(count * DtypeSize(t.dtype)) != t.bytes)
      return Status::InvalidArgument("tensor " + t.name + ": dtype " + t.dtype + " and shape do not match its " +
                                     std::to_string(t.bytes) + " bytes");
    if (header.contains(t.name)) return Status::InvalidArgument("tensor " + t.name + " is named twice");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    crc = Crc(crc, t.data, t.bytes);
    offset += t.bytes;
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  meta["crc32"] = std::to_string(crc);
  meta["data_bytes"] = std::to_string(offset);
  header["__metadata__"] = meta;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // safetensors pads the header to 8 bytes
  uint64_t hlen = h.size();

  Result<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path, Durability::kSurvivesCrash);
  if (!file.ok()) return file.status();
  (*file)->Append(&hlen, 8);
  (*file)->Append(h);
  for (const TensorRecord& t : tensors) (*file)->Append(t.data, t.bytes);
  if (Status s = (*file)->Commit(); !s.ok()) return s;
  if (bytes_written) *bytes_written = static_cast<int64_t>(8 + hlen + offset);
  return Status::Ok();
}

// The header's `__metadata__` as strings (others dumped as JSON).
static Status MetadataOf(const nlohmann::json& header, const std::string& path,
                  std::map<std::string, std::string>* out) {
  if (!header.contains("__metadata__")) return Status::Ok();
  const auto& meta = header["__metadata__"];
  if (!meta.is_object()) return Corrupt(path, "__metadata__ is not an object");
  for (const auto& [key, value] : meta.items())
    (*out)[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return Status::Ok();
}

Result<std::map<std::string, std::string>> ReadTensorFileMetadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  uint64_t hlen = 0;
  if (!in.read(reinterpret_cast<char*>(&hlen), 8)) return Corrupt(path, "shorter than its header");
  if (hlen > (uint64_t{100} << 20)) return Corrupt(path, "header larger than 100 MB");
  std::string text(static_cast<size_t>(hlen), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(hlen)))
    return Corrupt(path, "header runs past the end");
  auto header = nlohmann::json::parse(text, nullptr, false);
  if (!header.is_object()) return Corrupt(path, "header is not safetensors JSON");
  std::map<std::string, std::string> out;
  if (Status s = MetadataOf(header, path, &out); !s.ok()) return s;
  return out;
}

Result<TensorFile> ReadTensorFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound(Errno("cannot open " + path));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + " is not a file");
  }
  TensorFile out;
  try {
    out.bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return Status::ResourceExhausted("not enough memory to read " + path);
  }
  size_t got = 0;
  while (got < out.bytes.size()) {
    ssize_t r = ::pread(fd, out.bytes.data() + got, out.bytes.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got != out.bytes.size()) return Corrupt(path, "short read");
  if (out.bytes.size() < 8) return Corrupt(path, "shorter than its header");
  uint64_t hlen;
  std::memcpy(&hlen, out.bytes.data(), 8);
  if (hlen > out.bytes.size() - 8) return Corrupt(path, "header runs past the end");
  auto header = nlohmann::json::parse(out.bytes.begin() + 8,
                                      out.bytes.begin() + 8 + static_cast<long>(hlen), nullptr, false);
  if (!header.is_object()) return Corrupt(path, "header is not safetensors JSON");
  out.data_start = 8 + hlen;
  uint64_t data_bytes = out.bytes.size() - out.data_start;
  if (Status s = MetadataOf(header, path, &out.metadata); !s.ok()) return s;
  if (out.metadata.count("data_bytes") && out.metadata["data_bytes"] != std::to_string(data_bytes))
    return Corrupt(path, std::to_string(data_bytes) + " bytes of data, the header says " +
                             out.metadata["data_bytes"]);
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    TensorFileEntry e;
    e.name = name;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      return Corrupt(path, "tensor " + name + " has no dtype, shape or offsets");
    try {
      e.dtype = info["dtype"].get<std::string>();
      e.shape = info["shape"].get<std::vector<int64_t>>();
      uint64_t begin = info["data_offsets"][0].get<uint64_t>(), end = info["data_offsets"][1].get<uint64_t>();
      if (begin > end || end > data_bytes) return Corrupt(path, "tensor " + name + " lies outside the file");
      e.offset = begin;
      e.size = end - begin;
    } catch (const nlohmann::json::exception&) {
      return Corrupt(path, "tensor " + name + " has a malformed entry");
    }
    int64_t count = 1;
    for (int64_t d : e.shape) count = d < 0 ? -1 : count * d;
    if (DtypeSize(e.dtype) == 0) return Corrupt(path, "tensor " + name + " has dtype " + e.dtype);
    if (count < 0 || static_cast<uint64_t>(count * DtypeSize(e.dtype)) != e.size)
      return Corrupt(path, "tensor " + name + " has the wrong size for its shape");
    out.tensors.push_back(std::move(e));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const TensorFileEntry& a, const TensorFileEntry& b) { return a.offset < b.offset; });
  if (out.metadata.count("crc32") &&
      std::to_string(Crc(crc32(0L, Z_NULL, 0), out.bytes.data() + out.data_start, data_bytes)) !=
          out.metadata["crc32"])
    return Corrupt(path, "checksum mismatch");
  return out;
}

bool SaveJob::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

Status SaveJob::Wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return finished_ || !started_; });
  if (!started_) return Status::InvalidArgument("the save of " + path_ + " was never started");
  return status_;
}

TensorFileSaver::TensorFileSaver() : thread_(&TensorFileSaver::Loop, this) {}

TensorFileSaver::~TensorFileSaver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<std::shared_ptr<SaveJob>> TensorFileSaver::NewJob(const std::string& path,
                                                         std::vector<TensorRecord> records,
                                                         std::map<std::string, std::string> metadata) {
  auto job = std::make_shared<SaveJob>();
  job->path_ = path;
  job->metadata_ = std::move(metadata);
  size_t total = 0;
  for (const TensorRecord& r : records) {
    job->offsets_.push_back(total);
    total += (r.bytes + 63) / 64 * 64;  // each stage 64-byte aligned, as a tensor's memory is
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(total);
    if (it != free_.end()) {
      job->memory_ = std::move(it->second);
      free_.erase(it);
    }
  }
  if (!job->memory_) {
    job->memory_.reset(new (std::nothrow) uint8_t[std::max<size_t>(total, 1)]);
    if (!job->memory_)
      return Status::ResourceExhausted("not enough host memory to stage " + std::to_string(total) +
                                       " bytes for " + path);
  }
  job->memory_bytes_ = total;
  for (size_t i = 0; i < records.size(); ++i) records[i].data = job->memory_.get() + job->offsets_[i];
  job->records_ = std::move(records);
  return job;
}

void TensorFileSaver::Start(const std::shared_ptr<SaveJob>& job) {
  {
    std::lock_guard<std::mutex> job_lock(job->mu_);
    job->started_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  cv_.notify_all();
}

void TensorFileSaver::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
}

void TensorFileSaver::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and every started job written
    std::shared_ptr<SaveJob> job = queue_.front();
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    Status s = WriteTensorFile(job->path_, job->records_, job->metadata_);
    std::unique_ptr<uint8_t[]> memory;
    {
      std::lock_guard<std::mutex> job_lock(job->mu_);
      job->status_ = s;
      job->finished_ = true;
      memory = std::move(job->memory_);  // back now, not when the last handle goes
      for (TensorRecord& r : job->records_) r.data = nullptr;
    }
    job->cv_.notify_all();
    lock.lock();
    if (memory) {
      free_.emplace(job->memory_bytes_, std::move(memory));
      while (free_.size() > kKeptBlocks) free_.erase(free_.begin());  // the smallest go first
    }
    --busy_;
    cv_.notify_all();
  }
}

}  // namespace fullburn
