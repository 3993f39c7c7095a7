// The live status line of `fullburn run`, kept on the terminal's last row.
// The command shares the terminal, so its output must not be overwritten: like
// apt's progress bar, the rows above are made a scroll region (DECSTBM) and the
// status is drawn below it with the cursor saved and restored around it.
#pragma once

#include <string>

namespace fullburn::cli {

class LiveStatus {
 public:
  // Active only when `fd` is a terminal of at least 3 rows.
  explicit LiveStatus(int fd);
  ~LiveStatus();  // gives the row back and resets the scroll region
  bool active() const { return rows_ > 0; }
  void Draw(const std::string& line);

 private:
  void Reserve();
  int fd_;
  int rows_ = 0;
};

}  // namespace fullburn::cli
