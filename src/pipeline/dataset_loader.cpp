// DatasetLoader: a program's own Dataset made into the slot ring's batches.
// A slot holds the batch's inputs side by side, then (64-byte aligned) its
// targets, so each is one tensor view of the slot: nothing is collated. On
// CPU the slot's memory is a tensor handed to the consumer with its batch
// (SampleRing::HandOverMemory): nothing is copied after the workers wrote it.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>

#include "device_stager.h"
#include "fullburn/torch_loader.h"

namespace fullburn {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Shape(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// A class index (an integer scalar) becomes a 0-dim int64; other integer
// targets int64, floating ones as they are.
torch::Tensor StoredTarget(const torch::Tensor& t) {
  bool integral = !t.is_floating_point() && !t.is_complex();
  torch::Tensor out = integral ? t.to(torch::kLong) : t;
  if (integral && t.numel() == 1 && t.dim() <= 1) out = out.reshape({});
  return out.contiguous();
}

}  // namespace

// Batch memory on CPU, handed to the consumer with its batch and recycled
// when the consumer's last tensor of it dies. A fresh allocation per batch
// faults in every page on first touch (glibc gives freed multi-MB blocks
// back to the kernel): that cost the loader a third of its speed on small
// samples. Shared with the tensors' deleters, so it outlives the loader as
// long as the caller keeps a batch.
class DatasetLoader::MemoryPool {
 public:
  explicit MemoryPool(size_t bytes) : bytes_((bytes + 63) / 64 * 64) {}
  ~MemoryPool() {
    for (void* p : free_) std::free(p);
    for (void* p : in_ring_) std::free(p);
  }
  uint8_t* Take() {  // for a ring slot
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
      }
    }
    if (!p) p = std::aligned_alloc(64, bytes_);
    if (!p) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mu_);
    in_ring_.insert(p);
    return static_cast<uint8_t*>(p);
  }
  // The slot memory at `p` as a tensor the consumer owns; it comes back here
  // when that tensor and every view of it are gone.
  static torch::Tensor HandOver(const std::shared_ptr<MemoryPool>& pool, uint8_t* p) {
    {
      std::lock_guard<std::mutex> lock(pool->mu_);
      FB_CHECK(pool->in_ring_.erase(p) == 1);
    }
    return torch::from_blob(
        p, {static_cast<int64_t>(pool->bytes_)}, [pool](void* q) { pool->Give(q); }, torch::kUInt8);
  }

 private:
  static constexpr size_t kKeepFree = 16;  // more than the ring's slots (kMaxDepth + 1)
  void Give(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKeepFree) {
      free_.push_back(p);
    } else {
      std::free(p);
    }
  }
  const size_t bytes_;
  std::mutex mu_;
  std::vector<void*> free_;
  std::set<void*> in_ring_;  // a slot's memory: freed with the pool unless handed over
};

Result<std::unique_ptr<DatasetLoader>> DatasetLoader::Open(std::shared_ptr<Dataset> dataset,
                                                           const DatasetLoaderOptions& options) {
  if (!dataset) return Status::InvalidArgument("no dataset given");
  if (options.device.is_cuda() && !torch::cuda::is_available())
    return Status::Unavailable("device " + options.device.str() +
                               " requested but this libtorch has no usable CUDA device: use cpu");
  if (dataset->size() <= 0)
    return Status::InvalidArgument("the dataset is empty (Dataset::size() is " +
                                   std::to_string(dataset->size()) + ")");
  std::unique_ptr<DatasetLoader> l(new DatasetLoader());
  l->dataset_ = std::move(dataset);
  l->options_ = options;
  try {
    torch::NoGradGuard no_grad;
    Sample s = l->dataset_->Get(0, options.seed);
    if (!s.input.defined() || !s.target.defined())
      return Status::InvalidArgument(
          "dataset sample 0 has no input or no target: Dataset::Get must give both");
    l->first_.input = s.input.to(torch::kCPU).contiguous();
    l->first_.target = StoredTarget(s.target.to(torch::kCPU));
  } catch (const std::exception& e) {
    return Status::InvalidArgument("dataset sample 0: " + FirstLine(e.what()));
  }
  l->input_bytes_ = l->first_.input.nbytes();
  l->target_bytes_ = l->first_.target.nbytes();
  const size_t batch = static_cast<size_t>(std::max(1, options.batch_size));
  l->targets_at_ = (batch * l->input_bytes_ + 63) / 64 * 64;

  const std::vector<int64_t> in_shape = l->first_.input.sizes().vec();
  const std::vector<int64_t> target_shape = l->first_.target.sizes().vec();
  const torch::ScalarType in_type = l->first_.input.scalar_type();
  const torch::ScalarType target_type = l->first_.target.scalar_type();
  const size_t targets_at = l->targets_at_;
  l->stager_ = std::make_unique<DeviceStager>(options.device, [=](const Batch& b) {
    std::vector<int64_t> in = {b.size}, tg = {b.size};
    in.insert(in.end(), in_shape.begin(), in_shape.end());
    tg.insert(tg.end(), target_shape.begin(), target_shape.end());
    auto* slot = const_cast<uint8_t*>(b.images);
    return std::vector<DeviceStager::Part>{
        {torch::from_blob(slot, in, in_type), in_type},
        {torch::from_blob(slot + targets_at, tg, target_type), target_type}};
  });
  RingOptions r = RingOptionsOf(options);
  r.dataset_size = l->dataset_->size();
  r.batch_bytes = l->targets_at_ + batch * l->target_bytes_;
  r.allocate = l->stager_->Allocator();
  if (!l->stager_->cuda()) {
    l->memory_ = std::make_shared<MemoryPool>(r.batch_bytes);
    r.allocate = [pool = l->memory_.get()](size_t) { return pool->Take(); };
  }
  DatasetLoader* self = l.get();
  auto ring = SampleRing::Open(
      r, [self](const SampleJob& job, std::string* error) { return self->Make(job, error); });
  if (!ring.ok()) return ring.status();
  l->ring_ = std::move(*ring);
  l->stager_->Attach(l->ring_.get());
  return l;
}

// ring_ goes first (its workers stop calling Get and writing slots), then
// stager_ (it waits for copies in flight and frees the pinned memory).
DatasetLoader::~DatasetLoader() = default;

bool DatasetLoader::uses_cuda() const { return stager_->cuda(); }

LoaderPosition DatasetLoader::position() const {
  LoaderPosition p = ring_->position();
  p.next_batch = stager_->handed();  // batches issued but not handed out are not consumed
  return p;
}

void DatasetLoader::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  stager_->StartEpoch(epoch, first_batch, consumed_samples);
}

bool DatasetLoader::Make(const SampleJob& job, std::string* error) {
  const int64_t index = (*job.order)[static_cast<size_t>(job.position)];
  SplitMix mix{(options_.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(job.epoch) << 40) ^
               static_cast<uint64_t>(job.place)};
  const double t0 = Seconds();
  torch::Tensor input, target;
  try {
    torch::NoGradGuard no_grad;
    Sample s = dataset_->Get(index, mix.Next());
    if (!s.input.defined() || !s.target.defined()) {
      *error = "dataset sample " + std::to_string(index) +
               " has no input or no target: Dataset::Get must give both";
      return false;
    }
    input = s.input.to(torch::kCPU, first_.input.scalar_type()).contiguous();
    target = StoredTarget(s.target.to(torch::kCPU)).to(first_.target.scalar_type());
  } catch (const std::exception& e) {
    *error = "dataset sample " + std::to_string(index) + ": " + FirstLine(e.what());
    return false;
  }
  if (!input.sizes().equals(first_.input.sizes()) ||
      !target.sizes().equals(first_.target.sizes())) {
    bool inputs = !input.sizes().equals(first_.input.sizes());
    *error =
        "dataset sample " + std::to_string(index) + " has " +
        (inputs ? "an input of shape " + Shape(input) + ", sample 0 " + Shape(first_.input)
                : "a target of shape " + Shape(target) + ", sample 0 " + Shape(first_.target)) +
        ": the samples of a batch need one shape (resize, crop or pad them in Get)";
    return false;
  }
  const size_t i = static_cast<size_t>(job.index_in_batch);
  std::memcpy(job.slot + i * input_bytes_, input.data_ptr(), input_bytes_);
  std::memcpy(job.slot + targets_at_ + i * target_bytes_, target.data_ptr(), target_bytes_);
  *job.sample = index;
  job.times->dataset_s += Seconds() - t0;
  return true;
}

namespace {

// `part`, a view of the slot, as a view of the slot's memory tensor, which
// keeps that memory alive as long as the caller keeps the view.
torch::Tensor OwnView(const torch::Tensor& memory, const torch::Tensor& part) {
  const auto* base = static_cast<const uint8_t*>(memory.data_ptr());
  const int64_t at = static_cast<const uint8_t*>(part.data_ptr()) - base;
  return memory.narrow(0, at, static_cast<int64_t>(part.nbytes()))
      .view(part.scalar_type())
      .view(part.sizes());
}

}  // namespace

bool DatasetLoader::Next(TensorBatch* out) {
  Batch core;
  std::vector<torch::Tensor> parts;  // inputs, targets
  if (!stager_->Next(&core, &parts)) return false;
  if (stager_->cuda()) {
    out->inputs = parts[0];
    out->targets = parts[1];
  } else {  // the slot's memory becomes the batch's
    torch::Tensor memory = MemoryPool::HandOver(memory_, const_cast<uint8_t*>(core.images));
    ring_->HandOverMemory(core);
    out->inputs = OwnView(memory, parts[0]);
    out->targets = OwnView(memory, parts[1]);
  }
  if (options_.channels_last && out->inputs.dim() == 4)
    out->inputs = out->inputs.contiguous(torch::MemoryFormat::ChannelsLast);
  out->index = core.index;
  out->epoch = core.epoch;
  stager_->Done();
  return true;
}

}  // namespace fullburn
