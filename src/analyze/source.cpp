#include "source.h"

#include <zlib.h>

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

// Inflates member after member (a gzip file may be several concatenated).
class GzipSource : public ByteSource {
 public:
  GzipSource(File f, std::string path) : f_(std::move(f)), path_(std::move(path)), in_(1 << 20) {
    std::memset(&zs_, 0, sizeof zs_);
    ok_ = inflateInit2(&zs_, 15 + 16) == Z_OK;  // 15 + 16: gzip wrapper only
  }
  ~GzipSource() override {
    if (ok_) inflateEnd(&zs_);
  }

  Result<size_t> Read(char* buf, size_t cap) override {
    if (!ok_) return Status::Internal(path_ + ": zlib could not start");
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    zs_.avail_out = static_cast<uInt>(cap);
    while (zs_.avail_out == cap) {
      if (zs_.avail_in == 0) {
        Result<bool> more = FillInput();
        if (!more.ok()) return more.status();
        if (!*more) {
          if (member_done_) return cap - zs_.avail_out;
          return Status::Corruption(path_ +
                                    ": truncated gzip (the file ends inside the compressed "
                                    "stream): copy or export it again");
        }
      }
      if (member_done_) {
        // Bytes after a complete member: another member, or padding to ignore.
        if (zs_.next_in[0] != 0x1f) return cap - zs_.avail_out;
        inflateReset(&zs_);
        member_done_ = false;
      }
      int ret = inflate(&zs_, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) {
        member_done_ = true;
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        return Status::Corruption(path_ + ": not a valid gzip stream (" +
                                  (zs_.msg ? zs_.msg : "zlib error " + std::to_string(ret)) +
                                  "): copy or export it again");
      }
    }
    return cap - zs_.avail_out;
  }

 private:
  Result<bool> FillInput() {
    size_t n = std::fread(in_.data(), 1, in_.size(), f_.get());
    if (n == 0 && std::ferror(f_.get()))
      return Status::IoError(path_ + ": read failed: " + std::strerror(errno));
    zs_.next_in = in_.data();
    zs_.avail_in = static_cast<uInt>(n);
    return n > 0;
  }

  File f_;
  std::string path_;
  std::vector<unsigned char> in_;
  z_stream zs_;
  bool ok_ = false;
  bool member_done_ = false;
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
