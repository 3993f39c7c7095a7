// Gradient buckets over a c10d process group (see dist_torch.h).
#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef FULLBURN_TORCH_NCCL
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fullburn/dist_torch.h"

namespace fullburn {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A rank that connected to MASTER_ADDR:MASTER_PORT yet got no rendezvous answer.
std::string NoRendezvousAnswer(const RankInfo& rank, const std::string& detail) {
  return fmt::format(
      "rank {} connected to {}:{} but no rendezvous answered there ({}): MASTER_ADDR and "
      "MASTER_PORT must be this job's rank 0 (is another service on that port?), or rank 0 "
      "stopped",
      rank.rank, rank.master_addr, rank.master_port, detail);
}

Status RendezvousFailed(const RankInfo& rank, const DistOptions& options, const std::string& why) {
  if (rank.rank == 0 && why.find("ddress already in use") != std::string::npos)
    return Status::Unavailable(
        fmt::format("port {} on {} is in use: choose another MASTER_PORT (fullburn launch "
                    "picks a free one)",
                    rank.master_port, rank.master_addr));
  return Status::Unavailable(
      fmt::format("rank {} cannot meet the other ranks at {}:{} within {} s ({}): check "
                  "MASTER_ADDR/MASTER_PORT, that rank 0 started, and the firewall",
                  rank.rank, rank.master_addr, rank.master_port, options.timeout_s, why));
}

// A TCPStore client that has connected waits for the server's answer to its
// check-in in a recv() with no timeout (libtorch 1.13's waitForWorkers): a
// port held by anything but this job's rank 0 would hang it for good. The
// watchdog ends the process with the reason instead. Nothing is stored
// before the rendezvous, so nothing is lost.
class RendezvousWatchdog {
 public:
  RendezvousWatchdog(double seconds, std::string message)
      : message_(std::move(message)), thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
            return;
          std::fprintf(stderr, "fullburn: %s\n", message_.c_str());
          std::fflush(stderr);
          ::_exit(1);
        }) {}
  ~RendezvousWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string message_;
  std::thread thread_;  // last: starts once the members it reads exist
};

// torch 2.0 split process groups from their backends: ProcessGroupGloo is a
// c10d::Backend there and a c10d::ProcessGroup in 1.x, with the same
// collectives (allreduce, broadcast) either way.
#if TORCH_VERSION_MAJOR >= 2
using Group = c10d::Backend;
#else
using Group = c10d::ProcessGroup;
#endif

// Sharded gradients: consecutive parameters of a bucket reduced to one rank
// (owner -1: all-reduced and kept everywhere, a parameter no optimizer owns).
struct Segment {
  int owner = -1;
  size_t first = 0, end = 0;  // slots in Bucket::params
  int64_t offset = 0, numel = 0;
};

struct Bucket {
  std::vector<size_t> params;    // indices into Impl::params
  std::vector<int64_t> offsets;  // of each parameter in `flat`
  int64_t numel = 0;
  torch::TensorOptions options;
  torch::Tensor flat;  // the gradients, side by side (sharded: only from backward to the reduce)
  torch::Tensor wire;  // what is sent (flat, or a 16-bit copy)
  size_t pending = 0;  // gradients not yet copied in
  std::vector<Segment> segments;  // sharded only, by owner
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
};

}  // namespace

struct DataParallel::Impl {
  RankInfo rank;
  DistOptions options;
  std::string backend;
  // Where the small coordination tensors live: NCCL reduces device memory only.
  torch::Device control_device = torch::kCPU;
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<int64_t> next_payload;  // rank 0: the next payload of each rank to take
  c10::intrusive_ptr<Group> group;
  std::vector<torch::Tensor> params;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive for their hooks
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;  // of each parameter's gradient in its bucket's `flat`
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  // ZeRO stage 2: the rank each gradient is reduced to and kept on; empty
  // while every gradient is all-reduced and kept everywhere.
  std::vector<int> grad_owner;
  size_t next_to_start = 0;
  size_t next_to_keep = 0;        // sharded: the oldest bucket whose reduces may still run
  std::exception_ptr hook_error;  // what failed inside backward (a collective, out of memory)
  bool sync = true;
  bool local = false;  // SetLocal: collectives keep this rank's values, send nothing
  bool in_finish = false;
  DistStats stats, stats_before_local;
  std::mutex mu;

  // After a failed collective: survivors check in through the store; the
  // ranks that do not within a moment are named (all of them if the store,
  // which lives on rank 0, is gone too).
  Status Lost(const std::exception& e) {
    std::string missing;
    try {
      store->set("survivor/" + std::to_string(rank.rank), std::vector<uint8_t>{1});
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      for (int r = 0; r < rank.world_size; ++r)
        if (!store->check({"survivor/" + std::to_string(r)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    } catch (const std::exception&) {
      missing = "0 (the rendezvous host)";
    }
    return Status::Unavailable(
        fmt::format("rank {} lost contact with the other ranks ({}){}: a rank died or the network "
                    "failed; every rank stops "
                    "(dist timeout {} s)",
                    rank.rank, FirstLine(e.what()),
                    missing.empty() ? "" : "; not responding: rank " + missing, options.timeout_s));
  }

  bool sharded() const { return !grad_owner.empty(); }

  // Parameter `index`'s slot at `offset` of a flat buffer, shaped and strided
  // like the parameter (channels_last stays channels_last), so it can be the .grad.
  torch::Tensor SlotView(const torch::Tensor& flat, int64_t offset, size_t index) {
    const torch::Tensor& p = params[index];
    torch::Tensor slot = flat.narrow(0, offset, p.numel());
    if (p.is_non_overlapping_and_dense()) return slot.as_strided(p.sizes(), p.strides());
    return slot.view(p.sizes());
  }
  torch::Tensor BucketView(size_t index) {
    return SlotView(buckets[bucket_of[index]].flat, offset_of[index], index);
  }

  // Whether parameter `index`'s .grad already is its bucket slot.
  bool GradIsBucketSlot(size_t index) {
    const torch::Tensor& grad = params[index].grad();
    if (!grad.defined() || !buckets[bucket_of[index]].flat.defined()) return false;
    torch::Tensor view = BucketView(index);
    return grad.data_ptr() == view.data_ptr() && grad.strides() == view.strides();
  }

  void StartReadyBuckets() {
    while (next_to_start < buckets.size() && buckets[next_to_start].pending == 0) {
      Bucket& b = buckets[next_to_start++];
      // Before the sum: 16-bit sums of many ranks stay in range.
      if (!local) b.flat.div_(rank.world_size);
      if (options.compress == "none")
        b.wire = b.flat;
      else
        b.wire = b.flat.to(options.compress == "bf16" ? torch::kBFloat16 : torch::kHalf);
      if (!local) StartReduces(&b);
      (in_finish ? stats.started_after : stats.started_in_backward)++;
    }
    // Sharded: at most kBucketsInFlight buckets exist at once during
    // backward (DeepSpeed's stage 2 waits in the hook the same way), so the
    // gradients' peak is those buckets plus this rank's share.
    // A failed collective is reported by FinishGradients (a throw here would
    // surface from backward without the lost rank's name).
    try {
      while (sharded() && !in_finish && !hook_error &&
             next_to_start - next_to_keep > kBucketsInFlight)
        FinishBucket(&buckets[next_to_keep++]);
    } catch (const std::exception&) {
      hook_error = std::current_exception();
    }
  }

  static constexpr size_t kBucketsInFlight = 2;

  // The bucket's sum over ranks: all-reduced whole, or sharded a reduce of
  // each owner's part (c10d's reduce_scatter wants equal chunks, and Gloo's
  // has none in 1.13: a reduce to each owner moves the same bytes over a
  // ring).
  void StartReduces(Bucket* b) {
    if (!sharded()) {
      std::vector<torch::Tensor> tensors = {b->wire};
      b->works.push_back(group->allreduce(tensors));
    }
    for (const Segment& seg : b->segments) {
      std::vector<torch::Tensor> part = {b->wire.narrow(0, seg.offset, seg.numel)};
      if (seg.owner < 0) {
        b->works.push_back(group->allreduce(part));
      } else {
        c10d::ReduceOptions opts;
        opts.rootRank = seg.owner;
        b->works.push_back(group->reduce(part, opts));
      }
    }
  }

  // Sharded: waits for a started bucket, keeps this rank's part, frees it.
  void FinishBucket(Bucket* b) {
    for (auto& work : b->works) work->wait();
    b->works.clear();
    KeepOwnedGradients(b);
  }

  void SetGradientsToNone() {
    for (torch::Tensor& p : params)
      if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }

  // A parameter's gradient is final for this backward.
  void MarkReady(size_t index) {
    std::lock_guard<std::mutex> lock(mu);
    if (!sync || ready[index]) return;
    ready[index] = true;
    Bucket& b = buckets[bucket_of[index]];
    if (sharded()) {
      // The bucket lives from the first gradient to the reduce; the
      // parameter's own gradient is freed as soon as it is copied in.
      if (!b.flat.defined()) b.flat = torch::empty({b.numel}, b.options);
      torch::NoGradGuard no_grad;
      torch::Tensor view = BucketView(index);
      const torch::Tensor& grad = params[index].grad();
      if (grad.defined()) {
        view.copy_(grad);
        ++stats.grad_copies;
        params[index].mutable_grad() = torch::Tensor();
      } else {
        view.zero_();
      }
      if (--b.pending == 0 && (options.overlap || in_finish)) StartReadyBuckets();
      return;
    }
    // After the first step .grad is the bucket slot itself (DDP's
    // gradient_as_bucket_view): autograd accumulated into it in place.
    if (!b.flat.defined()) b.flat = torch::zeros({b.numel}, b.options);  // Attach made none
    if (!GradIsBucketSlot(index)) {
      const torch::Tensor& grad = params[index].grad();
      torch::Tensor view = BucketView(index);
      if (grad.defined()) {
        view.copy_(grad);
        ++stats.grad_copies;
      } else {
        view.zero_();
      }
    }
    if (--b.pending == 0 && (options.overlap || in_finish)) StartReadyBuckets();
  }

  // Sharded, after the bucket's reduces: this rank's segments move into a
  // compact buffer its .grads view, and the bucket is freed.
  void KeepOwnedGradients(Bucket* b) {
    for (const Segment& seg : b->segments) {
      if (seg.owner >= 0 && seg.owner != rank.rank) continue;
      torch::Tensor mine = b->wire.narrow(0, seg.offset, seg.numel)
                               .to(b->options.dtype(), /*non_blocking=*/false, /*copy=*/true);
      for (size_t slot = seg.first; slot < seg.end; ++slot) {
        size_t index = b->params[slot];
        params[index].mutable_grad() = SlotView(mine, b->offsets[slot] - seg.offset, index);
      }
    }
    b->flat = b->wire = torch::Tensor();
  }
};

namespace {

struct GradReadyHook : torch::autograd::FunctionPostHook {
  GradReadyHook(DataParallel::Impl* impl, size_t index) : impl(impl), index(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    impl->MarkReady(index);
    return outputs;
  }
  DataParallel::Impl* impl;
  size_t index;
};

// Every rank publishes its value under `key` and reads everyone's (rank
// order), so all ranks decide from the same list.
std::vector<std::string> ExchangeAll(c10d::Store& store, const RankInfo& rank,
                                     const std::string& key, const std::string& value) {
  store.set(key + "/" + std::to_string(rank.rank),
            std::vector<uint8_t>(value.begin(), value.end()));
  std::vector<std::string> all;
  for (int r = 0; r < rank.world_size; ++r) {
    std::vector<uint8_t> other = store.get(key + "/" + std::to_string(r));
    all.emplace_back(other.begin(), other.end());
  }
  return all;
}

Status CheckSameConfig(c10d::Store& store, const RankInfo& rank, const std::string& hash) {
  std::vector<std::string> hashes = ExchangeAll(store, rank, "config", hash);
  for (int r = 0; r < rank.world_size; ++r) {
    if (hashes[r] != hash)
      return Status::InvalidArgument(
          fmt::format("rank {}'s config differs from rank {}'s: every rank must run the same "
                      "config (compare the commands "
                      "and FULLBURN_* variables of both)",
                      r, rank.rank));
  }
  return Status::Ok();
}

#ifdef FULLBURN_TORCH_NCCL
// The GPU's UUID: the same physical GPU under any CUDA_VISIBLE_DEVICES.
std::string GpuUuid(const torch::Device& device) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(
      device.has_index() ? device.index() : c10::cuda::current_device());
  std::string out;
  for (char byte : p->uuid.bytes) out += fmt::format("{:02x}", static_cast<unsigned char>(byte));
  return out;
}
#endif

}  // namespace

DataParallel::DataParallel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataParallel::~DataParallel() = default;

Result<std::unique_ptr<DataParallel>> DataParallel::Connect(const RankInfo& rank,
                                                            const DistOptions& options,
                                                            torch::Device device) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->options = options;
  std::string backend = options.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend == "nccl") {
#ifdef FULLBURN_TORCH_NCCL
    if (!device.is_cuda())
      return Status::InvalidArgument(
          "dist.backend = nccl reduces CUDA tensors, but the device is " + device.str() +
          ": use dist.backend = gloo on CPU");
    impl->control_device = device;
#else
    if (options.backend == "auto") {
      backend = "gloo";  // this build has no NCCL process group: Gloo handles CUDA tensors too
    } else {
      return Status::InvalidArgument(
          "dist.backend = nccl, but fullburn was built without NCCL: use dist.backend = gloo");
    }
#endif
  }
  if (backend != "gloo" && backend != "nccl")
    return Status::InvalidArgument("dist.backend must be auto, gloo or nccl, not " + backend);
  if (options.compress != "none" && options.compress != "fp16" && options.compress != "bf16")
    return Status::InvalidArgument("dist.compress must be none, fp16 or bf16");
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(rank.master_port);
  so.isServer = rank.rank == 0;
  so.numWorkers = rank.world_size;
  so.waitWorkers = true;
  so.timeout = timeout;
  {
    // Rank 0 may wait the whole timeout for the others; then the margin.
    RendezvousWatchdog watchdog(
        options.timeout_s + 5,
        NoRendezvousAnswer(rank, fmt::format("none within {} s", options.timeout_s + 5)));
    for (double deadline = Now() + options.timeout_s;;) {
      try {
        impl->store = c10::make_intrusive<c10d::TCPStore>(rank.master_addr, so);
        break;
      } catch (const std::exception& e) {
        // A rank that reached the port before rank 0 listened there, through
        // something that accepted and hung up (a proxy, a load balancer, a
        // Kubernetes Service ahead of its pod), tries again until the timeout.
        double left = deadline - Now();
        if (rank.rank == 0 || left < 0.5)
          return RendezvousFailed(rank, options, FirstLine(e.what()));
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        so.timeout = std::chrono::milliseconds(static_cast<int64_t>((left - 0.25) * 1000));
      }
    }
  }
  // The first exchange: a rank that connected yet gets no answer reached
  // something other than this job's rank 0 (or rank 0 just stopped).
  if (!options.config_hash.empty()) {
    try {
      if (Status s = CheckSameConfig(*impl->store, rank, options.config_hash); !s.ok()) return s;
    } catch (const std::exception& e) {
      if (rank.rank == 0) return impl->Lost(e);
      return Status::Unavailable(NoRendezvousAnswer(rank, FirstLine(e.what())));
    }
  }
#ifdef FULLBURN_TORCH_NCCL
  if (backend == "nccl" && rank.world_size > 1) {
    std::optional<std::pair<int, int>> shared;
    try {
      shared = FirstSharedGpu(ExchangeAll(*impl->store, rank, "gpu", GpuUuid(device)));
    } catch (const std::exception& e) {
      return impl->Lost(e);
    }
    if (shared && options.backend != "auto")
      return Status::InvalidArgument(fmt::format(
          "dist.backend = nccl, but ranks {} and {} share one GPU, which NCCL refuses: start one "
          "rank per GPU, or set dist.backend = gloo",
          shared->first, shared->second));
    if (shared) {
      backend = "gloo";  // Gloo reduces CUDA tensors too, through host memory
      impl->control_device = torch::kCPU;
      if (rank.rank == 0)
        std::fprintf(stderr,
                     "fullburn: ranks %d and %d share one GPU, which NCCL refuses: Gloo instead "
                     "(one rank per GPU to use NCCL)\n",
                     shared->first, shared->second);
    }
  }
#endif
  impl->backend = backend;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(backend, impl->store);
#ifdef FULLBURN_TORCH_NCCL
    if (backend == "nccl") {
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = timeout;
      impl->group =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank.rank, rank.world_size, nccl);
    }
#endif
    if (backend == "gloo") {
      auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo->devices.push_back(rank.master_addr == "127.0.0.1" || rank.master_addr == "localhost"
                                  ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                  : c10d::ProcessGroupGloo::createDefaultDevice());
      impl->group =
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank.rank, rank.world_size, gloo);
    }
  } catch (const std::exception& e) {
    return impl->Lost(e);
  }
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(impl)));
}

int DataParallel::rank() const { return impl_->rank.rank; }
int DataParallel::world_size() const { return impl_->rank.world_size; }
const std::string& DataParallel::backend() const { return impl_->backend; }
size_t DataParallel::bucket_count() const { return impl_->buckets.size(); }
const DistStats& DataParallel::stats() const { return impl_->stats; }
void DataParallel::SetSync(bool sync) { impl_->sync = sync; }
void DataParallel::SetLocal(bool local) {
  // Local steps leave the run's statistics as they were.
  if (local && !impl_->local) impl_->stats_before_local = impl_->stats;
  if (!local && impl_->local) impl_->stats = impl_->stats_before_local;
  impl_->local = local;
}

void DataParallel::ResetStep() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (Bucket& b : m.buckets) {
      b.works.clear();  // (a local step starts none)
      b.pending = b.params.size();
      if (m.sharded()) b.flat = torch::Tensor();
      b.wire = torch::Tensor();
    }
    std::fill(m.ready.begin(), m.ready.end(), false);
    m.next_to_start = m.next_to_keep = 0;
    m.hook_error = nullptr;
    m.in_finish = false;
  }
  ZeroGradients();
}

Status DataParallel::Broadcast(const std::vector<torch::Tensor>& tensors) {
  if (impl_->local) return Status::Ok();
  try {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& t : tensors) {
      std::vector<torch::Tensor> one = {t.detach()};
      impl_->group->broadcast(one)->wait();
    }
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
  return Status::Ok();
}

std::vector<int> DataParallel::ShardOwners(const std::vector<torch::Tensor>& params,
                                           int world_size) {
  // Largest first, each to the rank holding the fewest elements so far: the
  // ranks end within one parameter of each other.
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> held(std::max(1, world_size), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    int r = static_cast<int>(std::min_element(held.begin(), held.end()) - held.begin());
    owner[i] = r;
    held[r] += params[i].numel();
  }
  return owner;
}

struct DataParallel::PendingBroadcast {
  struct Part {
    std::vector<torch::Tensor> group;  // filled from `flat` unless this rank is the root
    torch::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
    bool mine = false;
  };
  std::vector<Part> parts;
  std::string error;  // starting failed (a rank lost): FinishBroadcast reports it
};

std::unique_ptr<DataParallel::PendingBroadcast, void (*)(DataParallel::PendingBroadcast*)>
DataParallel::StartBroadcastFromOwners(const std::vector<torch::Tensor>& tensors,
                                       const std::vector<int>& owner) {
  std::unique_ptr<PendingBroadcast, void (*)(PendingBroadcast*)> pending(
      new PendingBroadcast, [](PendingBroadcast* p) { delete p; });
  try {
    torch::NoGradGuard no_grad;
    const int me = rank();
    for (int root = 0; root < world_size(); ++root) {
      std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;
      for (size_t i = 0; i < tensors.size(); ++i)
        if (owner[i] == root) by_type[tensors[i].scalar_type()].push_back(tensors[i]);
      for (auto& [type, group] : by_type) {
        PendingBroadcast::Part part;
        part.mine = me == root;
        int64_t total = 0;
        for (const torch::Tensor& t : group) total += t.numel();
        if (part.mine) {
          std::vector<torch::Tensor> pieces;
          for (const torch::Tensor& t : group) pieces.push_back(t.detach().reshape(-1));
          part.flat = torch::cat(pieces);
        } else if (impl_->local) {  // the same memory, values that compute like any
          part.flat = torch::zeros({total}, group[0].options());
        } else {
          part.flat = torch::empty({total}, group[0].options());
        }
        if (!impl_->local) {
          std::vector<torch::Tensor> one = {part.flat};
          c10d::BroadcastOptions opts;
          opts.rootRank = root;
          part.work = impl_->group->broadcast(one, opts);
        }
        part.group = std::move(group);
        pending->parts.push_back(std::move(part));
      }
    }
  } catch (const std::exception& e) {
    if (impl_->local) throw;  // nothing started elsewhere: an out-of-memory stays one
    pending->error = e.what();
  }
  return pending;
}

Status DataParallel::FinishBroadcast(PendingBroadcast* pending) {
  try {
    if (!pending->error.empty()) throw std::runtime_error(pending->error);
    torch::NoGradGuard no_grad;
    for (PendingBroadcast::Part& part : pending->parts) {
      if (part.work) part.work->wait();
      if (part.mine) continue;
      int64_t offset = 0;
      for (torch::Tensor& t : part.group) {
        t.detach().copy_(part.flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  } catch (const std::exception& e) {
    if (impl_->local) throw;
    return impl_->Lost(e);
  }
  return Status::Ok();
}

Status DataParallel::BroadcastFromOwners(const std::vector<torch::Tensor>& tensors,
                                         const std::vector<int>& owner) {
  // In pieces of about a bucket, two in flight while the next is flattened:
  // one piece for the whole model would add the weights' size again to the
  // step's peak, which ZeRO's stages 1 and 2 are there to lower (GPT 124M
  // shape on 2 CPU ranks: 1,195 MB measured against 891 predicted). Every
  // rank cuts at the same tensors: the sizes are the same everywhere.
  const double piece_bytes = std::max(1.0, impl_->options.bucket_mb * 1e6);
  std::deque<std::unique_ptr<PendingBroadcast, void (*)(PendingBroadcast*)>> in_flight;
  std::vector<torch::Tensor> piece;
  std::vector<int> piece_owner;
  double bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    piece.push_back(tensors[i]);
    piece_owner.push_back(owner[i]);
    bytes += static_cast<double>(tensors[i].numel() * tensors[i].element_size());
    if (bytes < piece_bytes && i + 1 < tensors.size()) continue;
    in_flight.push_back(StartBroadcastFromOwners(piece, piece_owner));
    piece.clear();
    piece_owner.clear();
    bytes = 0;
    if (in_flight.size() > 2) {
      if (Status s = FinishBroadcast(in_flight.front().get()); !s.ok()) return s;
      in_flight.pop_front();
    }
  }
  for (auto& pending : in_flight)
    if (Status s = FinishBroadcast(pending.get()); !s.ok()) return s;
  return Status::Ok();
}

Status DataParallel::Attach(const std::vector<torch::Tensor>& params, bool allocate_buckets) {
  Impl& m = *impl_;
  if (!m.params.empty()) return Status::InvalidArgument("DataParallel::Attach called twice");
  m.params = params;
  m.bucket_of.assign(params.size(), 0);
  m.offset_of.assign(params.size(), 0);
  m.ready.assign(params.size(), false);
  // Reverse registration order: roughly the order backward finishes them.
  std::vector<Bucket> buckets(1);
  double cap = m.options.first_bucket_mb * 1e6, bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    if (!params[i].requires_grad()) continue;
    double size = static_cast<double>(params[i].numel() * params[i].element_size());
    if (!buckets.back().params.empty() && bytes + size > cap) {
      buckets.emplace_back();
      bytes = 0;
      cap = m.options.bucket_mb * 1e6;
    }
    Bucket& b = buckets.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params[b.params.back()].numel());
    b.params.push_back(i);
    bytes += size;
  }
  for (Bucket& b : buckets) {
    if (b.params.empty()) continue;
    b.numel = b.offsets.back() + params[b.params.back()].numel();
    b.options = params[b.params.front()].options().requires_grad(false);
    if (allocate_buckets) b.flat = torch::zeros({b.numel}, b.options);
    b.pending = b.params.size();
    m.buckets.push_back(std::move(b));
  }
  for (size_t k = 0; k < m.buckets.size(); ++k)
    for (size_t slot = 0; slot < m.buckets[k].params.size(); ++slot) {
      m.bucket_of[m.buckets[k].params[slot]] = k;
      m.offset_of[m.buckets[k].params[slot]] = m.buckets[k].offsets[slot];
    }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad()) continue;
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<GradReadyHook>(&m, i));
    m.accumulators.push_back(acc);
  }
  m.stats.buckets = static_cast<int64_t>(m.buckets.size());
  return Status::Ok();
}

Status DataParallel::ShardGradients(const std::vector<torch::Tensor>& params,
                                    const std::vector<int>& owner) {
  Impl& m = *impl_;
  if (m.params.empty())
    return Status::InvalidArgument("DataParallel::ShardGradients before Attach");
  std::map<const void*, int> owner_of;
  for (size_t i = 0; i < params.size() && i < owner.size(); ++i)
    owner_of[params[i].unsafeGetTensorImpl()] = owner[i];
  m.grad_owner.assign(m.params.size(), -1);
  for (size_t i = 0; i < m.params.size(); ++i) {
    auto it = owner_of.find(m.params[i].unsafeGetTensorImpl());
    if (it != owner_of.end()) m.grad_owner[i] = it->second;
  }
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < m.buckets.size(); ++k) {
    Bucket& b = m.buckets[k];
    // Each owner's parameters side by side: one reduce per owner.
    std::stable_sort(b.params.begin(), b.params.end(),
                     [&](size_t x, size_t y) { return m.grad_owner[x] < m.grad_owner[y]; });
    b.segments.clear();
    int64_t offset = 0;
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      size_t index = b.params[slot];
      b.offsets[slot] = offset;
      m.offset_of[index] = offset;
      int who = m.grad_owner[index];
      if (b.segments.empty() || b.segments.back().owner != who)
        b.segments.push_back({who, slot, slot, offset, 0});
      b.segments.back().end = slot + 1;
      b.segments.back().numel += m.params[index].numel();
      offset += m.params[index].numel();
    }
    b.flat = b.wire = torch::Tensor();
  }
  m.SetGradientsToNone();  // views of the old buckets
  return Status::Ok();
}

Status DataParallel::FinishGradients(double* wait_s) {
  Impl& m = *impl_;
  double start = Now();
  try {
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.in_finish = true;
    }
    // Parameters backward did not reach (unused this step) count as zeros.
    for (size_t i = 0; i < m.params.size(); ++i)
      if (m.params[i].requires_grad() && !m.ready[i]) m.MarkReady(i);
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.StartReadyBuckets();
    }
    if (m.hook_error) std::rethrow_exception(m.hook_error);
    torch::NoGradGuard no_grad;
    int64_t held = 0;
    if (m.sharded()) {
      while (m.next_to_keep < m.buckets.size()) m.FinishBucket(&m.buckets[m.next_to_keep++]);
      for (const torch::Tensor& p : m.params)
        if (p.grad().defined()) held += p.grad().numel() * p.grad().element_size();
    } else {
      for (Bucket& b : m.buckets) {
        for (auto& work : b.works) work->wait();
        held += b.flat.numel() * b.flat.element_size();
        if (b.wire.data_ptr() != b.flat.data_ptr()) b.flat.copy_(b.wire);
        // The averages stay where they are: .grad becomes the bucket slot, and
        // a separate gradient tensor (after set-to-none) is freed.
        for (size_t index : b.params)
          if (!m.GradIsBucketSlot(index)) m.params[index].mutable_grad() = m.BucketView(index);
      }
    }
    m.stats.grad_bytes = held;
  } catch (const c10::OutOfMemoryError&) {
    // Stage 2 allocates buckets and kept parts here: out of memory is the
    // step's, reported with the memory model's advice, not a lost rank.
    throw;
  } catch (const std::exception& e) {
    if (m.local) throw;  // no other rank took part
    return m.Lost(e);
  }
  std::lock_guard<std::mutex> lock(m.mu);
  for (Bucket& b : m.buckets) {
    b.pending = b.params.size();
    b.works.clear();
  }
  std::fill(m.ready.begin(), m.ready.end(), false);
  m.next_to_start = m.next_to_keep = 0;
  m.hook_error = nullptr;
  m.in_finish = false;
  double waited = Now() - start;
  m.stats.wait_s += waited;
  if (wait_s) *wait_s = waited;
  return Status::Ok();
}

void DataParallel::ZeroGradients() {
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  if (m.sharded()) {  // no buckets between steps
    m.SetGradientsToNone();
    return;
  }
  for (Bucket& b : m.buckets) {
    if (b.flat.defined()) b.flat.zero_();
    for (size_t index : b.params)  // a .grad that is not its bucket slot: set to none
      if (m.params[index].grad().defined() && !m.GradIsBucketSlot(index))
        m.params[index].mutable_grad() = torch::Tensor();
  }
}

Result<std::string> DataParallel::ShareFromRankZero(const std::string& key,
                                                    const std::string& value) {
  try {
    if (impl_->rank.rank == 0)
      impl_->store->set("share/" + key, std::vector<uint8_t>(value.begin(), value.end()));
    std::vector<uint8_t> v = impl_->store->get("share/" + key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
}

Result<std::vector<std::string>> DataParallel::GatherToRankZero(const std::string& key,
                                                                const std::string& value) {
  std::vector<std::string> all;
  try {
    impl_->store->set("gather/" + key + "/" + std::to_string(impl_->rank.rank),
                      std::vector<uint8_t>(value.begin(), value.end()));
    if (impl_->rank.rank != 0) return all;
    for (int r = 0; r < impl_->rank.world_size; ++r) {
      std::vector<uint8_t> v = impl_->store->get("gather/" + key + "/" + std::to_string(r));
      all.emplace_back(v.begin(), v.end());
    }
    return all;
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
}

// Keys: fwd/R/n counts rank R's payloads, fwd/R/K holds payload K (from 1),
// fwd/R/done is set after R's last one.
Status DataParallel::Send(const std::string& payload) {
  std::string prefix = "fwd/" + std::to_string(impl_->rank.rank) + "/";
  try {
    int64_t seq = impl_->store->add(prefix + "n", 1);
    impl_->store->set(prefix + std::to_string(seq),
                      std::vector<uint8_t>(payload.begin(), payload.end()));
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::IoError(std::string("cannot send records to rank 0: ") + e.what());
  }
}

Status DataParallel::Done() {
  try {
    impl_->store->set("fwd/" + std::to_string(impl_->rank.rank) + "/done", std::vector<uint8_t>{1});
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::IoError(std::string("cannot reach rank 0: ") + e.what());
  }
}

std::vector<std::string> DataParallel::Receive(const std::vector<int>& from) {
  std::vector<std::string> out;
  Impl& m = *impl_;
  if (m.rank.rank != 0) return out;
  m.next_payload.resize(static_cast<size_t>(m.rank.world_size), 1);
  try {
    for (int r : from) {
      if (r <= 0 || r >= m.rank.world_size) continue;
      std::string prefix = "fwd/" + std::to_string(r) + "/";
      for (;;) {
        std::string key = prefix + std::to_string(m.next_payload[r]);
        if (!m.store->check({key})) break;
        std::vector<uint8_t> v = m.store->get(key);
        m.store->deleteKey(key);
        out.emplace_back(v.begin(), v.end());
        ++m.next_payload[r];
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nfullburn: records of other ranks lost: %s\n", e.what());
  }
  return out;
}

void DataParallel::WaitForSenders(const std::vector<int>& from, double timeout_s) {
  Impl& m = *impl_;
  if (m.rank.rank != 0) return;
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  try {
    for (int r : from) {
      std::string prefix = "fwd/" + std::to_string(r) + "/";
      while (!m.store->check({prefix + "done"}) && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
  }
}

Result<bool> DataParallel::AnyRank(bool local) {
  if (impl_->local) return local;
  try {
    std::vector<torch::Tensor> t = {
        torch::full({1}, local ? 1.0f : 0.0f, torch::TensorOptions(impl_->control_device))};
    impl_->group->allreduce(t, {c10d::ReduceOp::MAX})->wait();
    return t[0].item<float>() > 0;
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
}

Result<int64_t> DataParallel::MinOverRanks(int64_t local) {
  if (impl_->local) return local;
  try {
    std::vector<torch::Tensor> t = {
        torch::full({1}, static_cast<double>(local),
                    torch::TensorOptions(impl_->control_device).dtype(torch::kDouble))};
    impl_->group->allreduce(t, {c10d::ReduceOp::MIN})->wait();
    return static_cast<int64_t>(t[0].item<double>());
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
}

Result<std::vector<double>> DataParallel::SumOverRanks(const std::vector<double>& local) {
  if (impl_->local) return local;
  try {
    std::vector<torch::Tensor> t = {
        torch::tensor(local, torch::TensorOptions().dtype(torch::kDouble))
            .to(impl_->control_device)};
    impl_->group->allreduce(t, {c10d::ReduceOp::SUM})->wait();
    torch::Tensor sums = t[0].cpu();
    return std::vector<double>(sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel());
  } catch (const std::exception& e) {
    return impl_->Lost(e);
  }
}

}  // namespace fullburn
