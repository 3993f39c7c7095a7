#include "fullburn/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace fullburn {

Result<std::string> Env::ReadFile(const std::string& path) const {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::IoError("cannot read " + path + ": " + std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::vector<std::string>> Env::ListDir(const std::string& path) const {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return Status::IoError("cannot list " + path + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

double Env::MonotonicSeconds() const {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

double Env::UnixSeconds() const {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

long Env::ClockTicksPerSecond() const { return ::sysconf(_SC_CLK_TCK); }
long Env::PageSize() const { return ::sysconf(_SC_PAGESIZE); }

const Env* Env::Default() {
  static const Env* env = new Env();
  return env;
}

Result<std::string> RootedEnv::ReadFile(const std::string& path) const {
  return Env::ReadFile(root_ + path);
}

Result<std::vector<std::string>> RootedEnv::ListDir(const std::string& path) const {
  return Env::ListDir(root_ + path);
}

}  // namespace fullburn
