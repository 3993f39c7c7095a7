#include "fullburn/store_layout.h"

#include <zlib.h>

#include <cstdio>

namespace fullburn {

StoreLayout::StoreLayout(std::string store_path) : store_(std::move(store_path)) {
  size_t slash = store_.rfind('/');
  folder_ = slash == std::string::npos ? "." : slash == 0 ? "/" : store_.substr(0, slash);
}

std::string StoreLayout::Traces(int64_t run_id) const {
  return folder_ + "/traces/run-" + std::to_string(run_id);
}

std::string StoreLayout::Stacks(int64_t run_id) const {
  return folder_ + "/stacks/run-" + std::to_string(run_id) + ".pyspy";
}

std::string StoreLayout::Checkpoints(int64_t run_id) const {
  return folder_ + "/checkpoints/run-" + std::to_string(run_id);
}

std::string StoreLayout::Datasets() const { return folder_ + "/datasets"; }

std::string StoreLayout::TuneLogs(int64_t tuning_id) const {
  return folder_ + "/tune-" + std::to_string(tuning_id);
}

std::string StoreLayout::TrialLog(int64_t tuning_id, int trial) const {
  return TuneLogs(tuning_id) + "/trial-" + std::to_string(trial) + ".log";
}

std::string StoreLayout::TunePack(int64_t tuning_id) const { return TuneLogs(tuning_id) + "/pack"; }

std::string StoreLayout::SpillPrefix(int64_t run_id) const {
  uint32_t hash = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(store_.data()), static_cast<uInt>(store_.size())));
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", hash);
  return std::string("spill-") + hex + "-run" + std::to_string(run_id);
}

std::string StoreLayout::SpillName(int64_t run_id, int n) const {
  return SpillPrefix(run_id) + (n > 0 ? "-" + std::to_string(n) : "") + ".fbspill";
}

}  // namespace fullburn
