// Python: the native half of `import fullburn` (fullburn._native, pybind11),
// a thin layer over the pipeline and tensorfile components. The Python
// package python/fullburn/ wraps it in PyTorch's idiom (DataLoader-like
// iteration, state_dict, torch tensors); docs/python.md is its user guide.
//
// Contract
// - No libtorch and no torch ABI: batches leave as NumPy arrays over memory
//   this layer owns (the buffer protocol), which torch.from_numpy wraps
//   without a copy. torch is imported lazily, by the Python side only.
// - Hand-off: every batch's memory is handed over by its slot
//   (SampleRing::HandOverMemory) and owned by the array made from it; when
//   the last array (and tensor) over it goes, it returns to a BatchMemory
//   pool that the slots draw from. So a slot never writes memory a tensor
//   still reads, a program may keep any number of batches (each costs one
//   batch of memory), and the loader never waits for the program to drop one.
// - Threads: the loader's workers are C++ threads and never take the GIL;
//   waiting for a batch releases it. A loader is used from one Python thread
//   (as a DataLoader iterator is); the pool may be given memory back from any.
// - Errors: expected failures are Python exceptions with one line, never a
//   crash: fullburn.DataError for the data (a bad sample under
//   on_bad_sample="fail", an unreadable or empty dataset), ValueError for
//   arguments, OSError for files, MemoryError for memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace fullburn {

// Blocks of batch memory, reused by size: the slots' memory and, once handed
// over, the arrays'. Blocks stay in the process until the pool goes (the
// loader and every array from it). Thread-safe.
//
// Device registration (device="cuda": cudaHostRegister through torch, so the
// copy to the GPU reads a block directly): a block is registered whole, once,
// and unregistered before it is freed, so no registered range outlives its
// memory and a later block at an overlapping address registers cleanly.
class BatchMemory : public std::enable_shared_from_this<BatchMemory> {
 public:
  // A block of `bytes` (64-byte aligned; a freed one of that size when there
  // is one); null when the memory cannot be had.
  uint8_t* Take(size_t bytes);
  // Gives a block from Take back for reuse.
  void Give(uint8_t* block, size_t bytes);
  // Every block made so far (tests: a batch's array lies in one of them).
  std::vector<uintptr_t> Blocks() const;

  // What registers and unregisters a block (address, bytes) with a device.
  using BlockHook = std::function<void(uintptr_t block, size_t bytes)>;
  void SetDeviceHooks(BlockHook register_block, BlockHook unregister_block);
  // Registers the block that starts at `block` unless it is already; false
  // when no block starts there or no hooks were set. Throws what the hook throws.
  bool RegisterBlock(uintptr_t block);
  // Blocks registered now (tests).
  size_t RegisteredBlocks() const;
  ~BatchMemory();

 private:
  struct Block {
    uint8_t* data;
    size_t bytes;
    bool registered;
  };
  mutable std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;
  std::vector<Block> all_;
  BlockHook register_, unregister_;
};

}  // namespace fullburn
