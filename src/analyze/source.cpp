#include "source.h"

#include <zlib.h>
#ifdef FULLBURN_LIBDEFLATE
#include <libdeflate.h>
#endif
#ifdef FULLBURN_ISAL
#include <isa-l/igzip_lib.h>
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

// Raw deflate data into text. The input cursor is the caller's.
class RawInflater {
 public:
  enum class Result { kOk, kEnd, kError };
  virtual ~RawInflater() = default;
  virtual bool ok() const = 0;
  virtual void Reset() = 0;
  // Inflates from *in into out; *in and *avail_in move past what was used.
  virtual Result Inflate(const unsigned char** in, size_t* avail_in, char* out, size_t cap,
                         size_t* produced, std::string* error) = 0;
  // After kEnd: the bytes read past the deflate data (at most 8), in order.
  virtual size_t TakeReadAhead(unsigned char* out) = 0;
};

class ZlibInflater : public RawInflater {
 public:
  ZlibInflater() {
    std::memset(&zs_, 0, sizeof zs_);
    ok_ = inflateInit2(&zs_, -15) == Z_OK;  // raw deflate: the wrapper is ours
  }
  ~ZlibInflater() override {
    if (ok_) inflateEnd(&zs_);
  }
  ZlibInflater(const ZlibInflater&) = delete;
  ZlibInflater& operator=(const ZlibInflater&) = delete;
  bool ok() const override { return ok_; }
  void Reset() override { inflateReset(&zs_); }
  Result Inflate(const unsigned char** in, size_t* avail_in, char* out, size_t cap,
                 size_t* produced, std::string* error) override {
    zs_.next_in = const_cast<Bytef*>(*in);
    zs_.avail_in = static_cast<uInt>(*avail_in);
    zs_.next_out = reinterpret_cast<Bytef*>(out);
    zs_.avail_out = static_cast<uInt>(cap);
    int ret = inflate(&zs_, Z_NO_FLUSH);
    *produced = cap - zs_.avail_out;
    *in = zs_.next_in;
    *avail_in = zs_.avail_in;
    if (ret == Z_STREAM_END) return Result::kEnd;
    if (ret == Z_OK || ret == Z_BUF_ERROR) return Result::kOk;
    *error = zs_.msg ? zs_.msg : "zlib error " + std::to_string(ret);
    return Result::kError;
  }
  // zlib stops exactly at the deflate data's end: nothing to give back.
  size_t TakeReadAhead(unsigned char*) override { return 0; }

 private:
  z_stream zs_;
  bool ok_ = false;
};

#ifdef FULLBURN_ISAL
// ISA-L's igzip: about 2x zlib here (inflating was a fifth of `fullburn
// analyze` on a real trace).
class IsalInflater : public RawInflater {
 public:
  IsalInflater() { Reset(); }
  bool ok() const override { return true; }
  void Reset() override {
    isal_inflate_init(&st_);
    st_.crc_flag = ISAL_DEFLATE;
  }
  // At the deflate data's end igzip may have read on into the gzip trailer:
  // those whole bytes are the top of its bit buffer (TakeReadAhead).
  Result Inflate(const unsigned char** in, size_t* avail_in, char* out, size_t cap,
                 size_t* produced, std::string* error) override {
    st_.next_in = const_cast<uint8_t*>(*in);
    st_.avail_in = static_cast<uint32_t>(*avail_in);
    st_.next_out = reinterpret_cast<uint8_t*>(out);
    st_.avail_out = static_cast<uint32_t>(cap);
    int ret = isal_inflate(&st_);
    *produced = cap - st_.avail_out;
    *in = st_.next_in;
    *avail_in = st_.avail_in;
    if (ret < 0) {
      *error = "igzip error " + std::to_string(ret);
      return Result::kError;
    }
    if (st_.block_state != ISAL_BLOCK_FINISH) return Result::kOk;
    if (st_.tmp_in_size != 0) {
      *error = "igzip kept input past the end of the data";
      return Result::kError;
    }
    return Result::kEnd;
  }
  size_t TakeReadAhead(unsigned char* out) override {
    size_t n = static_cast<size_t>(st_.read_in_length) / 8;
    uint64_t bits = st_.read_in >> (st_.read_in_length % 8);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(bits >> (8 * i));
    st_.read_in = 0;
    st_.read_in_length = 0;
    return n;
  }

 private:
  inflate_state st_;
};
#endif

std::unique_ptr<RawInflater> MakeInflater(Inflater which) {
#ifdef FULLBURN_ISAL
  if (which == Inflater::kFastest) return std::make_unique<IsalInflater>();
#endif
  (void)which;
  return std::make_unique<ZlibInflater>();
}

// Inflates member after member (a gzip file may be several concatenated).
// The gzip header and trailer are read here, so the checksum is computed
// once, by Crc32, and still verified.
class GzipSource : public ByteSource {
 public:
  GzipSource(File f, std::string path, Inflater which)
      : f_(std::move(f)),
        path_(std::move(path)),
        in_(1 << 18),
        next_in_(in_.data()),
        inflater_(MakeInflater(which)) {}

  Result<size_t> Read(char* buf, size_t cap) override {
    if (!inflater_->ok()) return Status::Internal(path_ + ": the gzip inflater could not start");
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
        state_ = *more && next_in_[0] == 0x1f ? State::kHeader : State::kEnd;
        continue;
      }
      if (avail_in_ == 0) {
        Result<bool> more = Need(1);
        if (!more.ok()) return more.status();
        if (!*more) return Truncated();
      }
      size_t produced = 0;
      std::string error;
      RawInflater::Result ret = inflater_->Inflate(&next_in_, &avail_in_, buf, cap, &produced, &error);
      crc_ = Crc32(crc_, reinterpret_cast<const unsigned char*>(buf), produced);
      size_ += produced;
      if (ret == RawInflater::Result::kEnd) {
        unsigned char ahead[8];
        PutBack(ahead, inflater_->TakeReadAhead(ahead));
        // Checked now, with the member's last bytes: the reader stops at the
        // text's closing brace and may never ask again.
        if (Status s = ReadTrailer(); !s.ok()) return s;
      } else if (ret == RawInflater::Result::kError) {
        return Status::Corruption(path_ + ": not a valid gzip stream (" + error +
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
  // Puts bytes back in front of the input cursor.
  void PutBack(const unsigned char* bytes, size_t n) {
    if (n == 0) return;
    size_t front = static_cast<size_t>(next_in_ - in_.data());
    if (front < n) {
      if (in_.size() < avail_in_ + n) in_.resize(avail_in_ + n);
      std::memmove(in_.data() + n, in_.data() + front, avail_in_);
      front = n;
    }
    std::memcpy(in_.data() + front - n, bytes, n);
    next_in_ = in_.data() + front - n;
    avail_in_ += n;
  }
  void Consume(size_t n) {
    next_in_ += n;
    avail_in_ -= n;
  }
  // At least `n` bytes (n <= the buffer) side by side at next_in; false at
  // the end of the file before them.
  Result<bool> Need(size_t n) {
    if (avail_in_ >= n) return true;
    std::memmove(in_.data(), next_in_, avail_in_);
    next_in_ = in_.data();
    while (avail_in_ < n) {
      size_t got = std::fread(in_.data() + avail_in_, 1, in_.size() - avail_in_, f_.get());
      if (got == 0) {
        if (std::ferror(f_.get()))
          return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
        return false;
      }
      avail_in_ += got;
    }
    return true;
  }
  // Skips a zero-terminated field (file name, comment).
  Status SkipString() {
    for (;;) {
      Result<bool> more = Need(1);
      if (!more.ok()) return more.status();
      if (!*more) return Truncated();
      const void* zero = std::memchr(next_in_, 0, avail_in_);
      if (zero) {
        Consume(static_cast<const unsigned char*>(zero) - next_in_ + 1);
        return Status::Ok();
      }
      Consume(avail_in_);
    }
  }
  // RFC 1952's member header: magic, method 8 (deflate), flags, then the
  // optional extra field, name, comment and header CRC.
  Status ReadHeader() {
    Result<bool> more = Need(10);
    if (!more.ok()) return more.status();
    if (!*more) return Truncated();
    const unsigned char* h = next_in_;
    if (h[0] != 0x1f || h[1] != 0x8b || h[2] != 8)
      return Status::Corruption(path_ +
                                ": not a valid gzip stream (bad member header): copy or "
                                "export it again");
    const unsigned flags = h[3];
    Consume(10);
    if (flags & 4) {  // FEXTRA
      if (more = Need(2); !more.ok() || !*more) return more.ok() ? Truncated() : more.status();
      size_t xlen = next_in_[0] | (next_in_[1] << 8);
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
    inflater_->Reset();
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
    uint32_t crc = Le32(next_in_), isize = Le32(next_in_ + 4);
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
  const unsigned char* next_in_;
  size_t avail_in_ = 0;
  std::unique_ptr<RawInflater> inflater_;
  State state_ = State::kHeader;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
};

}  // namespace

Result<std::unique_ptr<ByteSource>> OpenSource(const std::string& path, Inflater inflater) {
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
    return std::unique_ptr<ByteSource>(new GzipSource(std::move(f), path, inflater));
  return std::unique_ptr<ByteSource>(new PlainSource(std::move(f), path));
}

}  // namespace fullburn::analyze
