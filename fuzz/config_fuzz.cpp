// fullburn train's config: a TOML file, then (after a "----" line) key=value
// overrides one a line, then (after another) a checkpoint's config as JSON,
// which a resumed run starts from.
#include <nlohmann/json.hpp>
#include <sstream>

#include "fullburn/config.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts = fuzz::SplitParts(data, size, 3);
  std::string path = fuzz::WriteScratch(
      "train.toml", reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size());
  std::vector<std::string> overrides;
  if (parts.size() > 1) {
    std::istringstream lines(parts[1]);
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  nlohmann::json base;
  bool have_base = false;
  if (parts.size() > 2) {
    base = nlohmann::json::parse(parts[2], nullptr, /*allow_exceptions=*/false);
    have_base = !base.is_discarded();
  }
  auto config = fullburn::Config::Load(path, overrides, /*read_environment=*/false,
                                       have_base ? &base : nullptr);
  (void)config;
  return 0;
}
