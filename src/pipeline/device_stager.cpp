#include "device_stager.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <thread>

namespace fullburn {

// A ring batch on its way to the device.
struct DeviceStager::InFlight {
  Batch core;
  std::vector<torch::Tensor> parts;    // on the device (or views of the slot on CPU)
  std::unique_ptr<c10::Event> copied;  // CUDA only
};

namespace {

// Blocks the host until a batch's copy to the device has completed (CUDA).
void WaitCopied(const c10::Event* copied) {
  while (copied && !copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace

DeviceStager::DeviceStager(torch::Device device, Split split)
    : device_(device), split_(std::move(split)), cuda_(device.is_cuda()) {}

DeviceStager::~DeviceStager() {
  for (auto& f : issued_) WaitCopied(f->copied.get());
  if (current_) WaitCopied(current_->copied.get());
  for (auto& f : copying_) WaitCopied(f->copied.get());
}

std::function<uint8_t*(size_t)> DeviceStager::Allocator() {
  if (!cuda_) return {};
  return [this](size_t bytes) {
    torch::Tensor pinned =
        torch::empty({static_cast<int64_t>(bytes)},
                     torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
    pinned_.push_back(pinned);
    return pinned.data_ptr<uint8_t>();
  };
}

void DeviceStager::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  Retire();
  ReleaseCompleted(false);
  while (!copying_.empty()) ReleaseCompleted(true);
  for (auto& f : issued_) {
    WaitCopied(f->copied.get());
    ring_->Release(f->core);
  }
  issued_.clear();
  handed_ = first_batch;
  ring_->StartEpoch(epoch, first_batch, consumed_samples);
}

void DeviceStager::ReleaseCompleted(bool wait_for_one) {
  while (!copying_.empty()) {
    InFlight& f = *copying_.front();
    if (f.copied && !f.copied->query()) {
      if (!wait_for_one) return;
      WaitCopied(f.copied.get());
    }
    ring_->Release(f.core);
    copying_.pop_front();
    wait_for_one = false;
  }
}

bool DeviceStager::Issue(bool wait) {
  auto f = std::make_unique<InFlight>();
  bool got = wait ? ring_->Next(&f->core) : ring_->TryNext(&f->core);
  if (!got) return false;
  std::vector<Part> parts = split_(f->core);
  if (cuda_) {
    if (!side_) {
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      side_ = std::make_unique<c10::Stream>(impl.getStreamFromGlobalPool(device_));
    }
    c10::StreamGuard guard(*side_);
    // From pinned slot memory the copy is asynchronous; from pageable memory
    // (the ring's labels) synchronous, so those come first and are tiny.
    for (const Part& p : parts)
      f->parts.push_back(p.host.to(device_, p.dtype, /*non_blocking=*/p.in_slot));
    f->copied = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
    f->copied->record(*side_);
  } else {
    for (const Part& p : parts)
      f->parts.push_back(p.host.scalar_type() == p.dtype ? p.host : p.host.to(p.dtype));
  }
  issued_.push_back(std::move(f));
  return true;
}

bool DeviceStager::Next(Batch* core, std::vector<torch::Tensor>* parts) {
  Retire();
  ReleaseCompleted(false);
  if (issued_.empty() && !Issue(/*wait=*/true)) return false;
  current_ = std::move(issued_.front());
  issued_.pop_front();
  if (current_->copied) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    current_->copied->block(
        impl.getStream(device_));  // the compute stream waits, the host does not
  }
  *core = current_->core;
  *parts = current_->parts;
  ++handed_;
  return true;
}

void DeviceStager::Retire() {
  if (!current_) return;
  if (cuda_) {
    copying_.push_back(std::move(current_));  // released once the copy has completed
  } else {
    ring_->Release(current_->core);  // the owner's tensors are its own now
    current_.reset();
  }
}

void DeviceStager::Done() {
  Retire();
  // Start the next copy now, so it overlaps the caller's step, if its batch
  // is ready: waiting for it here would hold back the batch just handed out
  // (and count the wait for the next batch as this one's).
  if (issued_.empty()) Issue(/*wait=*/false);
}

}  // namespace fullburn
