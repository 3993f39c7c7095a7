#include "fullburn/report.h"

#include <sys/ioctl.h>
#include <unistd.h>

namespace fullburn {
namespace {

int Rows(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0) return 0;
  return ws.ws_row;
}

int Cols(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return 80;
  return ws.ws_col;
}

// One write() per update, so the command's output cannot land inside it.
void Put(int fd, const std::string& s) {
  ssize_t ignored = ::write(fd, s.data(), s.size());
  (void)ignored;
}

}  // namespace

LiveStatus::LiveStatus(int fd) : fd_(fd) {
  if (!::isatty(fd) || Rows(fd) < 3) return;
  Reserve();
}

void LiveStatus::Reserve() {
  rows_ = Rows(fd_);
  // A newline first so the last row is free, then the scroll region above it.
  Put(fd_, "\n\0337\033[1;" + std::to_string(rows_ - 1) + "r\0338\033[1A");
}

void LiveStatus::Draw(const std::string& line) {
  if (!active()) return;
  if (Rows(fd_) != rows_) Reserve();  // the window was resized
  std::string text = line.substr(0, static_cast<size_t>(Cols(fd_) - 1));
  Put(fd_, "\0337\033[" + std::to_string(rows_) + ";1H\033[2K\033[7m" + text + "\033[0m\0338");
}

LiveStatus::~LiveStatus() {
  if (!active()) return;
  Put(fd_, "\0337\033[r\033[" + std::to_string(rows_) + ";1H\033[2K\0338");
}

}  // namespace fullburn
