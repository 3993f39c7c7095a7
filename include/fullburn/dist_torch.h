// DataParallel: averages gradients across the processes of a job over a
// torch c10d process group (Gloo on CPU, NCCL for CUDA where libtorch has
// it), overlapping communication with backward like PyTorch's DDP.
//
// Contract
// - Connect rendezvouses over c10d's TCPStore at the RankInfo's master, checks
//   that every rank runs the same config (hashes compared at rendezvous) and
//   creates the process group. Every failure (unreachable master, port in
//   use, timeout, mismatched configs, backend missing) is a Status with one
//   line naming the cause and the fix; nothing waits past `timeout_s`.
// - Gradients are grouped into buckets in reverse registration order (the
//   order backward produces them): the first small (`first_bucket_mb`), then
//   up to `bucket_mb`. A post-hook on each parameter's gradient accumulator
//   marks the gradient ready; a full bucket's all-reduce starts at once,
//   during the rest of backward. Buckets start in index order on every rank,
//   so collectives never cross.
// - Gradients live in the buckets (PyTorch's gradient_as_bucket_view): after
//   the first FinishGradients each .grad is a view of its bucket slot, with
//   the parameter's strides, and autograd accumulates into it in place, so
//   the gradients take memory once and are never copied. Clear them with
//   ZeroGradients (in place); a .grad set to none or replaced is copied into
//   its slot at the next backward and the view restored (counted in
//   DistStats::grad_copies).
// - ShardGradients (ZeRO stage 2, after Attach) changes where gradients go:
//   each is reduced to the one rank that owns it (a bucket's parameters are
//   ordered by owner and each owner's part reduced to it: c10d's
//   reduce_scatter wants equal chunks and Gloo has none), the owner keeps it
//   in a compact buffer its .grad views, and every other rank sets that
//   .grad to none as soon as backward's value is copied into the bucket.
//   Buckets then exist only from a bucket's first gradient to its reduce,
//   and at most two reduces run at once: the hook that would start a third
//   waits for the oldest (as DeepSpeed's stage 2 does), so the gradients'
//   peak is a few buckets plus the rank's share, not every gradient.
//   After FinishGradients a rank holds only its owned gradients, which are
//   the mean over ranks; ZeroGradients sets every .grad to none.
// - SetSync(false) before a micro-batch's backward is DDP's no_sync: gradients
//   accumulate locally and nothing is sent. FinishGradients after the last
//   micro-batch waits for every bucket; .grad is then the average.
// - SetLocal(true) (the batch-size search's trials): every tensor
//   collective (the gradient buckets' reduces, the broadcasts, AnyRank,
//   MinOverRanks, SumOverRanks; not the store's ShareFromRankZero and
//   GatherToRankZero) returns at once with this rank's own values, sending
//   nothing, while holding the memory it would (the buckets, their kept
//   parts, a broadcast-from-owners' buffers, filled with zeros where another
//   rank's values would arrive). A failure there (an out-of-memory) is
//   thrown as it is, never reported as a lost rank, and leaves no other
//   rank waiting; ResetStep then drops what the step left (buckets in
//   flight, gradients). Gradients are sums, not means, and weights other
//   ranks own are zeros: for memory and time, not for training. stats()
//   after SetLocal(false) is what it was before SetLocal(true).
// - One training thread calls these methods; hooks may run on autograd's
//   threads and take an internal mutex. Not copyable.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "fullburn/dist.h"
#include "fullburn/status.h"
#include "fullburn/train_options.h"

namespace fullburn {


struct DistStats {
  int64_t buckets = 0;
  int64_t started_in_backward = 0;  // bucket all-reduces started before FinishGradients
  int64_t started_after = 0;
  double wait_s = 0;        // FinishGradients blocked on communication, in total
  int64_t grad_copies = 0;  // gradients copied into a bucket (not already a view of it)
  int64_t grad_bytes = 0;   // gradient bytes this rank holds after the last FinishGradients
};

class DataParallel {
 public:
  static Result<std::unique_ptr<DataParallel>> Connect(const RankInfo& rank,
                                                       const DistOptions& options,
                                                       torch::Device device);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const;
  int world_size() const;
  const std::string& backend() const;

  // Every rank's tensors take rank 0's values (parameters and buffers at start).
  Status Broadcast(const std::vector<torch::Tensor>& tensors);
  // Registers the gradient hooks; `params` in registration order. The
  // buckets (every gradient, whole) are allocated now, so what a batch-size
  // search measures holds them; `allocate_buckets` false when ShardGradients
  // follows, which keeps none between steps: a rank then never holds every
  // gradient at once.
  Status Attach(const std::vector<torch::Tensor>& params, bool allocate_buckets = true);
  size_t bucket_count() const;
  // ZeRO stage 2: `owner[i]` (ShardOwners) keeps the gradient of `params[i]`;
  // an attached parameter not in `params` is all-reduced and kept everywhere.
  Status ShardGradients(const std::vector<torch::Tensor>& params, const std::vector<int>& owner);
  void SetSync(bool sync);
  // See the contract: collectives without communication, for trials.
  void SetLocal(bool local);
  // After a local step, failed or not: no bucket in flight, gradients cleared.
  void ResetStep();
  // After the synced backward: waits for the buckets, .grad = mean over ranks.
  // `wait_s` (optional): time blocked on communication in this call.
  Status FinishGradients(double* wait_s = nullptr);
  // The optimizer's zero_grad for attached parameters: zeroes the buckets,
  // keeping .grad a view of them (set_to_none would free them each step).
  void ZeroGradients();
  // ZeRO stage 1 (dist.shard = optimizer): the rank that keeps the optimizer
  // state of each of `params` and updates it, the same on every rank: the
  // largest first, each to the rank holding the fewest elements so far.
  static std::vector<int> ShardOwners(const std::vector<torch::Tensor>& params, int world_size);
  // Every rank's `tensors` take the values of their owner's (`owner[i]`):
  // in pieces of about `bucket_mb` (two in flight), each one broadcast per
  // owner rank and dtype with its tensors flattened into one buffer, so it
  // holds a few buckets at a time, not a copy of every tensor. After each
  // rank updated the parameters it owns.
  Status BroadcastFromOwners(const std::vector<torch::Tensor>& tensors,
                             const std::vector<int>& owner);
  // The same, started and not waited for (dist.shard = full's prefetch):
  // every rank starts the same ones in the same order, and FinishBroadcast
  // (which every started one needs, on every rank) fills `tensors`, each
  // held at its full shape. The owners' values are copied when it starts.
  struct PendingBroadcast;
  std::unique_ptr<PendingBroadcast, void (*)(PendingBroadcast*)> StartBroadcastFromOwners(
      const std::vector<torch::Tensor>& tensors, const std::vector<int>& owner);
  Status FinishBroadcast(PendingBroadcast* pending);
  // True on every rank if `local` is true on any (inf/NaN found, out of memory).
  Result<bool> AnyRank(bool local);
  // The smallest value over ranks (a batch size every rank can hold).
  Result<int64_t> MinOverRanks(int64_t local);
  // Element-wise sums over ranks, on every rank (evaluation counts and losses).
  Result<std::vector<double>> SumOverRanks(const std::vector<double>& local);
  const DistStats& stats() const;
  // Rank 0's `value` for `key`, on every rank (the run id every rank records into).
  Result<std::string> ShareFromRankZero(const std::string& key, const std::string& value);
  // Every rank's `value` for `key`, in rank order, on rank 0 (empty on the
  // others). Every rank must call it; rank 0 waits for all of them.
  Result<std::vector<std::string>> GatherToRankZero(const std::string& key,
                                                    const std::string& value);

  // Records for rank 0 from ranks that cannot write its run store (another
  // node's disk), through the rendezvous store: a rank after 0 sends
  // payloads in order and then Done(); rank 0 takes what has arrived from
  // the ranks `from` (Receive, never blocking) and at the end waits up to
  // `timeout_s` for each of their Done (WaitForSenders) before taking the
  // rest. Rank 0 learns who sends at start (GatherToRankZero), so it polls
  // only them. Training thread only.
  Status Send(const std::string& payload);
  Status Done();
  std::vector<std::string> Receive(const std::vector<int>& from);
  void WaitForSenders(const std::vector<int>& from, double timeout_s);

  struct Impl;

 private:
  explicit DataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fullburn
