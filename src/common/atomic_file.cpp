#include "fullburn/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace fullburn {
namespace {

std::string FolderOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string tmp, int fd, Durability durability)
    : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd), durability_(durability) {}

Result<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path,
                                                       Durability durability) {
  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::IoError("cannot write " + path + ": " + std::strerror(errno) +
                           "; check the folder exists and is writable");
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, std::move(tmp), fd, durability));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

bool AtomicFile::Append(const void* data, size_t size) {
  if (write_errno_ != 0 || fd_ < 0) return false;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      write_errno_ = n < 0 ? errno : EIO;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
    size_ += static_cast<size_t>(n);
  }
  return true;
}

Status AtomicFile::Fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  std::string fix = err == ENOSPC || err == EFBIG || err == EDQUOT
                        ? "; free space, then try again (the file there before is untouched)"
                        : "; check the folder is writable and its disk healthy (the file there "
                          "before is untouched)";
  return Status::IoError(what + " " + path_ + ": " + std::strerror(err) + fix);
}

Status AtomicFile::Commit() {
  if (committed_ || fd_ < 0) return Status::Internal("AtomicFile::Commit called twice on " + path_);
  if (write_errno_ != 0) return Fail("cannot write", write_errno_);
  if (durability_ == Durability::kSurvivesCrash && ::fsync(fd_) != 0) return Fail("cannot write", errno);
  // close() is where NFS and some FUSE file systems report a failed write.
  int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) return Fail("cannot write", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Fail("cannot rename the new file into", errno);
  committed_ = true;
  if (durability_ == Durability::kSurvivesCrash) {
    // The rename is in the folder's data: it too must reach the disk.
    int dir = ::open(FolderOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes,
                           Durability durability) {
  Result<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path, durability);
  if (!file.ok()) return file.status();
  (*file)->Append(bytes);
  return (*file)->Commit();
}

}  // namespace fullburn
