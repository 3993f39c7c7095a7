// Small allocation-free parsers for /proc text. iostreams cost more than the
// kernel's own work here (locale look-ups per field), and this runs up to 20
// times a second.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace fullburn::parse {

inline const char* SkipSpaces(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t')) ++p;
  return p;
}

// Reads an unsigned decimal at *p (after spaces); false if there is none.
inline bool U64(const char** p, const char* end, uint64_t* out) {
  const char* s = SkipSpaces(*p, end);
  if (s >= end || *s < '0' || *s > '9') return false;
  uint64_t v = 0;
  while (s < end && *s >= '0' && *s <= '9') v = v * 10 + static_cast<uint64_t>(*s++ - '0');
  *p = s;
  *out = v;
  return true;
}

// Reads a whitespace-delimited word at *p (after spaces).
inline bool Word(const char** p, const char* end, const char** word, size_t* len) {
  const char* s = SkipSpaces(*p, end);
  const char* w = s;
  while (s < end && *s != ' ' && *s != '\t' && *s != '\n') ++s;
  if (s == w) return false;
  *word = w;
  *len = static_cast<size_t>(s - w);
  *p = s;
  return true;
}

inline const char* NextLine(const char* p, const char* end) {
  const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
  return nl ? nl + 1 : end;
}

// Value after "\n<key> " in text shaped like /proc/vmstat ("key value" lines).
inline bool KeyValue(const std::string& text, const char* key, uint64_t* out) {
  size_t klen = std::strlen(key);
  size_t pos = 0;
  while ((pos = text.find(key, pos)) != std::string::npos) {
    bool at_line_start = pos == 0 || text[pos - 1] == '\n';
    if (at_line_start && pos + klen < text.size() && text[pos + klen] == ' ') {
      const char* p = text.data() + pos + klen;
      return U64(&p, text.data() + text.size(), out);
    }
    pos += klen;
  }
  return false;
}

}  // namespace fullburn::parse
