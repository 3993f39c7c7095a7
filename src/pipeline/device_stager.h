// DeviceStager: a SampleRing's batches on their way to the training device
// (internal to the pipeline's libtorch side: TorchLoader, DatasetLoader).
//
// On CUDA the ring's slots are pinned host memory (Allocator()); each batch
// is copied on a side stream with its own event, the consumer's stream waits
// on that event (the host does not), and the slot goes back to the ring only
// once the copy has completed, so no slot is refilled while it is read. One
// batch is copied ahead when it is ready as the last is handed out: its copy
// overlaps the caller's step. Next() never waits for more than its batch. On CPU the
// parts stay views of the slot until the owner has made its own tensors of
// them (Done()). One consumer thread.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <memory>

#include "fullburn/pipeline.h"

namespace c10 {
class Event;
class Stream;
}  // namespace c10

namespace fullburn {

class DeviceStager {
 public:
  // A batch's host tensors, views of its slot (or of the ring's labels), in
  // the order they are copied, each with the dtype it should have on the device.
  struct Part {
    torch::Tensor host;
    torch::ScalarType dtype;
    bool in_slot = true;  // slot memory (pinned on CUDA: copied asynchronously), or pageable
  };
  using Split = std::function<std::vector<Part>(const Batch& batch)>;

  DeviceStager(torch::Device device, Split split);
  ~DeviceStager();  // waits for copies in flight (they read pinned slots)
  bool cuda() const { return cuda_; }
  // RingOptions::allocate: pinned host memory on CUDA, kept as long as the
  // stager; empty on CPU (the ring's own memory).
  std::function<uint8_t*(size_t)> Allocator();
  void Attach(SampleRing* ring) { ring_ = ring; }

  void StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples);
  // The next batch's parts on the device (CUDA: the compute stream waits for
  // their copy) or as slot views (CPU); false at the epoch's end or on error.
  bool Next(Batch* core, std::vector<torch::Tensor>* parts);
  // The owner made its own tensors of the last batch's parts: on CPU its slot
  // goes back now; on CUDA once its copy has completed.
  void Done();
  int64_t handed() const { return handed_; }  // batches handed out this epoch, resumed ones counted

 private:
  struct InFlight;
  // Takes the ring's next batch (waiting for it, or only if it is ready) and
  // starts its copy.
  bool Issue(bool wait);
  void Retire();  // the handed-out batch: its slot back (CPU) or to copying_ (CUDA)
  void ReleaseCompleted(bool wait_for_one);

  torch::Device device_;
  Split split_;
  bool cuda_ = false;
  SampleRing* ring_ = nullptr;
  std::vector<torch::Tensor> pinned_;              // keeps slot memory alive
  std::unique_ptr<c10::Stream> side_;              // the copy stream (CUDA)
  std::deque<std::unique_ptr<InFlight>> issued_;   // copies started, not yet handed out
  std::unique_ptr<InFlight> current_;              // handed out, not yet Done()
  std::deque<std::unique_ptr<InFlight>> copying_;  // Done(), slot not yet released
  int64_t handed_ = 0;
};

}  // namespace fullburn
