// Helpers for the targets whose parser takes a path, not bytes: the input is
// written to a file in a directory of this process's own, each run
// overwriting the last.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace fuzz {

inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/fullburn-fuzz-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) std::abort();
    return std::string(buf.data());
  }();
  return dir;
}

inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = ScratchDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Splits an input into parts at each line "----" (the seeds' format for
// targets that read several files or strings).
inline std::vector<std::string> SplitParts(const uint8_t* data, size_t size, size_t max_parts) {
  std::vector<std::string> parts(1);
  std::string text(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  while (parts.size() < max_parts) {
    size_t at = text.find("\n----\n", pos);
    if (at == std::string::npos) break;
    parts.back() = text.substr(pos, at + 1 - pos);
    parts.emplace_back();
    pos = at + 6;
  }
  parts.back() = text.substr(pos);
  return parts;
}

}  // namespace fuzz
