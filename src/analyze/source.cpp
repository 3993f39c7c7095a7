#include "source.h"

#include <zlib.h>
#ifdef FULLBURN_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace fullburn::analyze {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;

class PlainSource : public ByteSource {
 public:
  PlainSource(File f, std::string path) : f_(std::move(f)), path_(std::move(path)) {}
  Result<size_t> Read(char* buf, size_t cap) override {
    size_t n = std::fread(buf, 1, cap, f_.get());
    if (n == 0 && std::ferror(f_.get()))
      return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
    return n;
  }

 private:
  File f_;
  std::string path_;
};

// The CRC-32 of a gzip member: libdeflate's (carry-less multiplication,
// about 10x zlib's here) where it was found, else zlib's; the same checksum.
uint32_t Crc32(uint32_t crc, const unsigned char* data, size_t n) {
#ifdef FULLBURN_LIBDEFLATE
  return libdeflate_crc32(crc, data, n);
#else
  return static_cast<uint32_t>(crc32_z(crc, data, n));
#endif
}

uint32_t Le32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Inflates member after member (a gzip file may be several concatenated).
// zlib inflates the raw deflate data; the gzip header and trailer are read
// here, so the checksum is computed once, by Crc32, and still verified.
class GzipSource : public ByteSource {
 public:
  GzipSource(File f, std::string path) : f_(std::move(f)), path_(std::move(path)), in_(1 << 20) {
    std::memset(&zs_, 0, sizeof zs_);
    ok_ = inflateInit2(&zs_, -15) == Z_OK;  // raw deflate: the wrapper is ours
    zs_.next_in = in_.data();
    zs_.avail_in = 0;
  }
  ~GzipSource() override {
    if (ok_) inflateEnd(&zs_);
  }

  Result<size_t> Read(char* buf, size_t cap) override {
    if (!ok_) return Status::Internal(path_ + ": zlib could not start");
    for (;;) {
      if (state_ == State::kEnd) return size_t{0};
      if (state_ == State::kHeader) {
        if (Status s = ReadHeader(); !s.ok()) return s;
        continue;
      }
      if (state_ == State::kBetween) {
        // After a member: another one, or the end (or padding to ignore).
        Result<bool> more = Need(1);
        if (!more.ok()) return more.status();
        state_ = *more && zs_.next_in[0] == 0x1f ? State::kHeader : State::kEnd;
        continue;
      }
      if (zs_.avail_in == 0) {
        Result<bool> more = Need(1);
        if (!more.ok()) return more.status();
        if (!*more) return Truncated();
      }
      zs_.next_out = reinterpret_cast<Bytef*>(buf);
      zs_.avail_out = static_cast<uInt>(cap);
      int ret = inflate(&zs_, Z_NO_FLUSH);
      size_t produced = cap - zs_.avail_out;
      crc_ = Crc32(crc_, reinterpret_cast<const unsigned char*>(buf), produced);
      size_ += produced;
      if (ret == Z_STREAM_END) {
        // Checked now, with the member's last bytes: the reader stops at the
        // text's closing brace and may never ask again.
        if (Status s = ReadTrailer(); !s.ok()) return s;
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        return Status::Corruption(path_ + ": not a valid gzip stream (" +
                                  (zs_.msg ? zs_.msg : "zlib error " + std::to_string(ret)) +
                                  "): copy or export it again");
      }
      if (produced > 0) return produced;
    }
  }

 private:
  enum class State { kHeader, kBody, kBetween, kEnd };

  Status Truncated() const {
    return Status::Corruption(path_ +
                              ": truncated gzip (the file ends inside the compressed stream): "
                              "copy or export it again");
  }
  void Consume(size_t n) {
    zs_.next_in += n;
    zs_.avail_in -= static_cast<uInt>(n);
  }
  // At least `n` bytes (n <= the buffer) side by side at next_in; false at
  // the end of the file before them.
  Result<bool> Need(size_t n) {
    if (zs_.avail_in >= n) return true;
    std::memmove(in_.data(), zs_.next_in, zs_.avail_in);
    zs_.next_in = in_.data();
    while (zs_.avail_in < n) {
      size_t got = std::fread(in_.data() + zs_.avail_in, 1, in_.size() - zs_.avail_in, f_.get());
      if (got == 0) {
        if (std::ferror(f_.get()))
          return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
        return false;
      }
      zs_.avail_in += static_cast<uInt>(got);
    }
    return true;
  }
  // Skips a zero-terminated field (file name, comment).
  Status SkipString() {
    for (;;) {
      Result<bool> more = Need(1);
      if (!more.ok()) return more.status();
      if (!*more) return Truncated();
      const void* zero = std::memchr(zs_.next_in, 0, zs_.avail_in);
      if (zero) {
        Consume(static_cast<const unsigned char*>(zero) - zs_.next_in + 1);
        return Status::Ok();
      }
      Consume(zs_.avail_in);
    }
  }
  // RFC 1952's member header: magic, method 8 (deflate), flags, then the
  // optional extra field, name, comment and header CRC.
  Status ReadHeader() {
    Result<bool> more = Need(10);
    if (!more.ok()) return more.status();
    if (!*more) return Truncated();
    const unsigned char* h = zs_.next_in;
    if (h[0] != 0x1f || h[1] != 0x8b || h[2] != 8)
      return Status::Corruption(path_ +
                                ": not a valid gzip stream (bad member header): copy or "
                                "export it again");
    const unsigned flags = h[3];
    Consume(10);
    if (flags & 4) {  // FEXTRA
      if (more = Need(2); !more.ok() || !*more) return more.ok() ? Truncated() : more.status();
      size_t xlen = zs_.next_in[0] | (zs_.next_in[1] << 8);
      Consume(2);
      if (more = Need(xlen); !more.ok() || !*more) return more.ok() ? Truncated() : more.status();
      Consume(xlen);
    }
    if (flags & 8)
      if (Status s = SkipString(); !s.ok()) return s;  // FNAME
    if (flags & 16)
      if (Status s = SkipString(); !s.ok()) return s;  // FCOMMENT
    if (flags & 2) {                                   // FHCRC
      if (more = Need(2); !more.ok() || !*more) return more.ok() ? Truncated() : more.status();
      Consume(2);
    }
    inflateReset(&zs_);
    crc_ = 0;
    size_ = 0;
    state_ = State::kBody;
    return Status::Ok();
  }
  // The member's CRC-32 and length (mod 2^32) of its text.
  Status ReadTrailer() {
    Result<bool> more = Need(8);
    if (!more.ok()) return more.status();
    if (!*more) return Truncated();
    uint32_t crc = Le32(zs_.next_in), isize = Le32(zs_.next_in + 4);
    Consume(8);
    if (crc != crc_ || isize != static_cast<uint32_t>(size_))
      return Status::Corruption(path_ +
                                ": gzip checksum mismatch (the file is damaged): copy or "
                                "export it again");
    state_ = State::kBetween;
    return Status::Ok();
  }

  File f_;
  std::string path_;
  std::vector<unsigned char> in_;
  z_stream zs_;
  bool ok_ = false;
  State state_ = State::kHeader;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
};

}  // namespace

Result<std::unique_ptr<ByteSource>> OpenSource(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    int err = errno;
    std::string msg = path + ": " + std::strerror(err);
    if (err == ENOENT) return Status::NotFound(msg);
    return Status::IoError(msg);
  }
  unsigned char magic[2] = {0, 0};
  size_t n = std::fread(magic, 1, 2, f.get());
  if (std::fseek(f.get(), 0, SEEK_SET) != 0)
    return Status::IoError(path + ": cannot seek: " + std::strerror(errno));
  if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b)
    return std::unique_ptr<ByteSource>(new GzipSource(std::move(f), path));
  return std::unique_ptr<ByteSource>(new PlainSource(std::move(f), path));
}

}  // namespace fullburn::analyze
