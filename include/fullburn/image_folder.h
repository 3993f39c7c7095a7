// Image folder: the pipeline's image datasets on disk: a folder scanned into
// files and labels, a whole file read, and a synthetic folder written.
//
// Contract
// - Plain functions: what they return (an ImageFolder, the bytes read) is the
//   caller's; nothing is kept between calls.
// - Threads: no shared state; ReadWholeFile is called by every loader worker
//   at once. MakeSyntheticImages writes each image through an atomic rename,
//   so a reader never sees part of one.
// - Errors: a Status (Result) with a one-line message, never an exception: a
//   missing or empty folder is NotFound, one that cannot be read or written
//   IoError, bad synthetic options InvalidArgument. ReadWholeFile's IoError
//   says only what failed ("cannot open"): the caller names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

struct ImageFolder {
  std::vector<std::string> classes;  // sorted subfolder names
  std::vector<std::string> files;    // sorted by class, then name
  std::vector<int32_t> labels;
};
// Scans root/<class>/*.{jpg,jpeg,png} (any case). An empty or unreadable folder is an error.
Result<ImageFolder> ScanImageFolder(const std::string& root);

// A whole file, read with pread (shared by the loader, pack and bench).
Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out);

struct SyntheticImagesOptions {
  int classes = 10, per_class = 100, width = 500, height = 375, quality = 90;
  uint64_t seed = 0;
};
// Writes a learnable, photo-like JPEG folder: each class has its own shape,
// palette and texture frequency on a smooth background with noise.
Status MakeSyntheticImages(const std::string& dir, const SyntheticImagesOptions& opts);

}  // namespace fullburn
