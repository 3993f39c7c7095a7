// A CPU memory budget that stands in for a GPU's memory: the batch-size
// search and the memory probe find their limits against it on a machine
// without a GPU, and tests plant out-of-memory errors with it (train
// component, links libtorch).
//
// Contract
// - Process-wide and thread-safe: the allocator is installed on first use
//   and stays; a budget of 0 is no limit. An allocation past the budget
//   throws c10::OutOfMemoryError ("CPU memory budget exceeded"), as a GPU's
//   allocator does when its memory runs out.
#pragma once

#include <cstdint>

namespace fullburn {

// For tests and the batch-size search: a CPU allocator that fails like an
// out-of-memory once more than `budget_bytes` are live (0: no limit).
// Installed process-wide on first use; thread-safe.
void SetCpuMemoryBudget(int64_t budget_bytes);
// Allocations made by this thread while one lives are not counted: host
// memory a GPU run would hold outside the device (checkpoint staging).
struct NotCountedInBudget {
  NotCountedInBudget();
  ~NotCountedInBudget();
  NotCountedInBudget(const NotCountedInBudget&) = delete;
  NotCountedInBudget& operator=(const NotCountedInBudget&) = delete;
};
int64_t CpuMemoryBudget();  // 0: no limit
int64_t CpuBytesInUse();
int64_t CpuPeakBytes();
void ResetCpuPeakBytes();

}  // namespace fullburn
