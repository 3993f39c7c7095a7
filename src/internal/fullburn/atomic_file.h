// AtomicFile: a file that appears whole or not at all.
//
// Contract: Create opens a temporary beside the destination (same folder, so
// the rename stays on one file system; named with the process id and a
// counter, so two writers of one path never share it). Append writes through;
// the first failure is kept and every later Append is a no-op. Commit renames
// the temporary over the destination: a reader sees the old file or the new
// one, never part of one. With Durability::kSurvivesCrash the data is fsynced
// before the rename and the folder after it, so a power cut after Commit
// cannot leave an empty or short file behind (checkpoints, pack indexes,
// tensor files). An AtomicFile destroyed without a successful Commit removes
// its temporary: an error or an exception leaves the old file untouched and
// no fragment beside it. Errors name the destination and the system's
// reason. One thread at a time per object; objects are independent.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "fullburn/status.h"

namespace fullburn {

enum class Durability {
  kVisible,         // whole to every reader; a crash may lose it (reports, generated data)
  kSurvivesCrash,   // also on the disk before Commit returns
};

class AtomicFile {
 public:
  static Result<std::unique_ptr<AtomicFile>> Create(const std::string& path,
                                                    Durability durability);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // False once any write failed (disk full, file too large).
  bool Append(const void* data, size_t size);
  bool Append(std::string_view bytes) { return Append(bytes.data(), bytes.size()); }
  // The bytes appended so far.
  size_t size() const { return size_; }
  // "cannot write PATH: REASON": the first failure, or the flush, fsync or
  // rename's; the temporary is gone either way.
  Status Commit();
  const std::string& path() const { return path_; }

 private:
  AtomicFile(std::string path, std::string tmp, int fd, Durability durability);
  Status Fail(const std::string& what, int err);

  std::string path_, tmp_;
  int fd_;
  Durability durability_;
  size_t size_ = 0;
  int write_errno_ = 0;
  bool committed_ = false;
};

// The whole file in one call.
Status WriteFileAtomically(const std::string& path, std::string_view bytes,
                           Durability durability = Durability::kVisible);

}  // namespace fullburn
