// Small SQLite helpers shared by the store's files (internal to src/store).
#pragma once

#include <sqlite3.h>

#include <string>

namespace fullburn {

// A text column, "" for NULL.
inline std::string ColumnText(sqlite3_stmt* st, int col) {
  const unsigned char* t = sqlite3_column_text(st, col);
  return t ? reinterpret_cast<const char*>(t) : "";
}

}  // namespace fullburn
