// A CPU allocator that counts live bytes and fails past a budget like an
// out-of-memory on a device would: the batch-size search and its OOM recovery
// run for real on a machine without a GPU.
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "fullburn/cpu_memory_budget.h"

namespace fullburn {
namespace {

std::atomic<int64_t> g_in_use{0}, g_peak{0}, g_budget{0};

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
};

// Keyed by the data pointer: oneDNN (behind CPU convolutions) requires a CPU
// DataPtr's context to be its data pointer, so the bookkeeping lives here.
std::mutex g_mu;
std::unordered_map<void*, Allocation>* g_live = new std::unordered_map<void*, Allocation>();

void Release(void* data) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_live->find(data);
    if (it == g_live->end()) return;
    a = std::move(it->second);
    g_live->erase(it);
  }
  g_in_use.fetch_sub(a.bytes, std::memory_order_relaxed);
}  // a.inner frees the memory through the original allocator

// Set on threads (or scopes) whose allocations are host memory even when
// training on the CPU: checkpoint staging (see NotCountedInBudget).
thread_local int t_uncounted = 0;

class BudgetAllocator : public c10::Allocator {
 public:
  explicit BudgetAllocator(c10::Allocator* base) : base_(base) {}
  // oneDNN frees its scratch memory through raw_deallocate(data).
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif

 private:
  c10::DataPtr Allocate(size_t n) const {
    if (t_uncounted > 0) {
      c10::DataPtr inner = base_->allocate(n);
      void* data = inner.get();
      c10::Device device = inner.device();
      std::lock_guard<std::mutex> lock(g_mu);
      (*g_live)[data] = Allocation{std::move(inner), 0};
      return {data, data, &Release, device};
    }
    int64_t bytes = static_cast<int64_t>(n);
    int64_t now = g_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t budget = g_budget.load(std::memory_order_relaxed);
    if (budget > 0 && now > budget) {
      g_in_use.fetch_sub(bytes, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU memory budget exceeded: tried to allocate ", n,
                       " bytes with ", now - bytes, " of ", budget,
                       " in use (train.memory_budget_mb)");
    }
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      (*g_live)[data] = Allocation{std::move(inner), bytes};
    }
    return {data, data, &Release, device};
  }
  c10::Allocator* base_;
};

void Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static BudgetAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
}

}  // namespace

NotCountedInBudget::NotCountedInBudget() { ++t_uncounted; }
NotCountedInBudget::~NotCountedInBudget() { --t_uncounted; }

void SetCpuMemoryBudget(int64_t budget_bytes) {
  Install();
  g_budget = budget_bytes;
}
int64_t CpuMemoryBudget() { return g_budget.load(); }
int64_t CpuBytesInUse() { return g_in_use.load(); }
int64_t CpuPeakBytes() { return g_peak.load(); }
void ResetCpuPeakBytes() {
  Install();
  g_peak = g_in_use.load();
}

}  // namespace fullburn
