// The slot ring: worker threads make an epoch's samples into batch slots.
//
// Batch k of an epoch lives in slot (base_ + k) % slots; the epoch read ahead
// (StartEpoch) continues the sequence after the current epoch's last batch,
// so a switch to it keeps the slots its batches are in. Workers claim samples
// one at a time in batch order, (k, 0), (k, 1), ..., so all threads work on
// the oldest unfinished batches first; a worker whose next sample belongs to
// a slot the consumer still holds waits for Release(). What a sample becomes
// depends only on (seed, epoch, position), never on the thread that made it:
// the maker (MakeSample) is handed the position, never the thread.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fullburn/env.h"
#include "fullburn/rng.h"
#include "fullburn/sample_ring.h"

namespace fullburn {

// Everything behind SampleRing's interface (sample_ring.h keeps it out of
// sight): mu_ guards what changes; options_, make_ and the lists of slots
// and workers are fixed once Open returns.
struct SampleRing::State {
  struct Slot {
    enum class State { kFree, kFilling, kReady, kInUse };
    State state = State::kFree;
    int64_t batch = -1;
    int epoch = -1;
    int filled = 0;
    std::vector<uint8_t> own;  // unless RingOptions::allocate
    uint8_t* data = nullptr;
    std::vector<int32_t> labels;
    std::vector<int64_t> samples;
  };

  // One epoch's share of this rank: its samples by position, and how many
  // of them its batches hold.
  struct EpochPlan {
    std::vector<int64_t> order;
    int64_t items = 0;
    int64_t skip = 0;  // the samples of the permutation read before (consumed_samples)
  };

  // SampleRing's interface (sample_ring.h).
  int64_t epoch_size() const;
  void StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples);
  LoaderPosition position() const;
  bool Next(Batch* batch);
  bool TryNext(Batch* batch);
  void Release(const Batch& batch);
  void HandOverMemory(const Batch& batch);
  Status status() const;
  LoaderStats stats() const;
  void CountSkipped();
  void Fail(const std::string& message);

  EpochPlan PlanEpoch(int epoch, int64_t consumed_samples) const;  // no lock needed
  bool HandOut(Slot& slot, Batch* out);           // with mu_ held
  int SlotIndex(int64_t in_sequence) const;       // batch k of this epoch: SlotIndex(base_ + k)
  Slot& SlotAt(int64_t in_sequence) { return *slots_[static_cast<size_t>(SlotIndex(in_sequence))]; }
  void Tune();                                    // with mu_ held
  bool Allocate(Slot& slot, std::string* error);  // with mu_ held
  bool MakeOrExplain(const SampleJob& job, std::string* error);
  void Worker(int id);
  // batch_size, or less for keep_last's last batch of an epoch of `items` samples.
  int64_t BatchSize(int64_t batch, int64_t items) const;
  void StopWorkers();

  RingOptions options_;
  MakeSample make_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::thread> workers_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  bool stop_ = false;
  Status error_;
  int epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t next_item_ = 0;     // next (batch, i) to claim, as batch * batch_size + i
  int64_t next_to_hand_ = 0;  // the batch Next() returns next
  int inflight_ = 0;          // samples being made outside the lock
  int active_ = 1;            // workers allowed to claim samples
  bool autotune_ = false;
  int depth_ = 3;          // batches workers may prepare ahead of the consumer
  bool gated_ = false;     // a worker waits because it is depth_ ahead
  bool draining_ = false;  // StartEpoch waits for samples in flight
  bool tune_depth_ = false;
  double window_start_ = -1, window_wait_ = 0, window_work_ = 0;
  double epoch_start_ = 0;
  int64_t epoch_first_batch_ = 0;
  // This epoch's batches: fewer than batches_per_epoch() after consumed samples.
  int64_t epoch_batches_ = 0;
  int64_t epoch_items_ = 0;  // samples of this rank in the epoch's batches
  int64_t epoch_skip_ = 0;   // the epoch's samples read before this start (consumed_samples)
  int64_t window_batches_ = 0, window_samples_ = 0;
  // Batch k of this epoch lives in slot (base_ + k) % slots: the batches of
  // the epoch read ahead follow this one's in the same sequence of slots.
  int64_t base_ = 0;
  // The loop did not start this epoch again (as evaluation does): it will
  // likely go on to the next, which the workers then begin once this one is
  // all claimed.
  bool advancing_ = false;
  struct ReadAhead {
    bool planned = false, planning = false;  // planning: a worker makes it, unlocked
    EpochPlan plan;                          // epoch_ + 1, from its first sample
    int64_t next_item = 0;
  } ahead_;
  LoaderStats stats_;
};

namespace {

constexpr int kStartDepth = 3, kMaxDepth = 8;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t RankShare(int64_t samples, int rank, int world_size, bool pad, bool keep_last) {
  const int64_t w = world_size;
  if (keep_last) return samples > rank ? (samples - rank + w - 1) / w : 0;
  return pad ? (samples + w - 1) / w : samples / w;
}

Result<std::unique_ptr<SampleRing>> SampleRing::Open(const RingOptions& options, MakeSample make) {
  if (options.batch_size < 1) return Status::InvalidArgument("batch size must be at least 1");
  if (options.prefetch < 0)
    return Status::InvalidArgument("prefetch must be at least 1 (0: tuned)");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return Status::InvalidArgument("rank " + std::to_string(options.rank) + " is not in 0.." +
                                   std::to_string(options.world_size - 1) + " (world size " +
                                   std::to_string(options.world_size) + ")");
  std::unique_ptr<SampleRing> ring(new SampleRing());
  ring->state_ = std::make_unique<State>();
  State* r = ring->state_.get();
  r->options_ = options;
  r->make_ = std::move(make);
  if (r->epoch_size() < (options.keep_last ? 1 : options.batch_size))
    return Status::InvalidArgument("the dataset has " + std::to_string(options.dataset_size) +
                                   " samples (" + std::to_string(r->epoch_size()) +
                                   " for this rank), fewer than one batch of " +
                                   std::to_string(options.batch_size) + ": lower the batch size");
  int budget = options.cpu_budget > 0 ? options.cpu_budget
                                      : std::max(1, RankCpus(ReadCpuView(Env::Default()), 1) - 1);
  int threads = options.threads > 0 ? options.threads : budget;
  r->autotune_ = options.threads <= 0;
  r->active_ = r->autotune_ ? 1 : threads;
  r->stats_.threads = r->active_;
  // The consumer holds one slot; up to `depth_` more are prepared ahead of it.
  r->tune_depth_ = options.prefetch == 0;
  r->depth_ = r->tune_depth_ ? kStartDepth : options.prefetch;
  int slots = (r->tune_depth_ ? kMaxDepth : options.prefetch) + 1;
  r->stats_.prefetch = r->depth_;
  for (int i = 0; i < slots; ++i) {
    auto slot = std::make_unique<State::Slot>();  // its memory comes with its first batch
    slot->labels.resize(static_cast<size_t>(options.batch_size));
    slot->samples.resize(static_cast<size_t>(options.batch_size));
    r->slots_.push_back(std::move(slot));
  }
  for (int i = 0; i < threads; ++i) r->workers_.emplace_back(&State::Worker, r, i);
  return ring;
}

SampleRing::SampleRing() = default;

SampleRing::~SampleRing() {
  if (state_) state_->StopWorkers();
}

// Out of memory here (a slot of pinned memory the driver refuses, a batch too
// big for the host) is an error of the run, never std::terminate on a worker.
bool SampleRing::State::Allocate(Slot& s, std::string* error) {
  std::string why = "no memory";
  try {
    if (options_.allocate) {
      s.data = options_.allocate(options_.batch_bytes);
    } else {
      s.own.resize(options_.batch_bytes);
      s.data = s.own.data();
    }
  } catch (const std::exception& e) {
    s.data = nullptr;
    why = FirstLine(e.what());
  }
  if (s.data) return true;
  *error = "could not allocate a batch slot of " + std::to_string(options_.batch_bytes) +
           " bytes (" + why + "): lower the batch size or data.prefetch";
  return false;
}

void SampleRing::State::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
}

int SampleRing::State::SlotIndex(int64_t in_sequence) const {
  return static_cast<int>(in_sequence % static_cast<int64_t>(slots_.size()));
}

int64_t SampleRing::State::BatchSize(int64_t batch, int64_t items) const {
  return std::min<int64_t>(options_.batch_size, items - batch * options_.batch_size);
}

int64_t SampleRing::State::epoch_size() const {
  return RankShare(options_.dataset_size, options_.rank, options_.world_size, options_.shard_pad,
                   options_.keep_last);
}

LoaderPosition SampleRing::State::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LoaderPosition{epoch_, next_to_hand_};
}

SampleRing::State::EpochPlan SampleRing::State::PlanEpoch(int epoch, int64_t consumed_samples) const {
  // This rank's samples: every world_size-th of the (padded) permutation,
  // after the samples every rank together already read.
  const int64_t n = options_.dataset_size, w = options_.world_size;
  const int64_t skip = std::max<int64_t>(0, std::min(consumed_samples, n));
  std::vector<int64_t> perm = EpochPermutation(n, options_.seed, epoch, options_.shuffle);
  const int64_t per_rank = RankShare(n - skip, options_.rank, options_.world_size,
                                     options_.shard_pad, options_.keep_last);
  EpochPlan plan;
  plan.skip = skip;
  plan.order.resize(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i)
    plan.order[static_cast<size_t>(i)] =
        perm[static_cast<size_t>((skip + options_.rank + i * w) % n)];
  const int64_t b = options_.batch_size;
  plan.items = options_.keep_last ? per_rank : per_rank / b * b;
  return plan;
}

void SampleRing::State::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  std::unique_lock<std::mutex> lock(mu_);
  // Samples in flight finish first (no worker claims more meanwhile).
  draining_ = true;
  ready_cv_.wait(lock, [this] { return inflight_ == 0 || stop_; });
  draining_ = false;
  // Stopped (an error, or the ring going away): samples may still be in
  // flight, reading the orders below; the epoch stays as it is, and Next()
  // says there is nothing more.
  if (stop_) return;
  const bool first = epoch_ < 0, follows = !first && epoch == epoch_ + 1;
  const bool read_ahead = follows && ahead_.planned && first_batch == 0 && consumed_samples == 0;
  // Slots of other epochs are freed; the read-ahead's batches stay when it is
  // the epoch asked for.
  for (auto& s : slots_)
    if (s->state != Slot::State::kInUse && !(read_ahead && s->epoch == epoch)) {
      s->state = Slot::State::kFree;
      s->batch = -1;
    }
  const int64_t b = options_.batch_size;
  EpochPlan plan = read_ahead ? std::move(ahead_.plan) : PlanEpoch(epoch, consumed_samples);
  if (read_ahead) {  // (first_batch is 0)
    base_ += epoch_batches_;
    next_item_ = ahead_.next_item;
  }
  order_.swap(plan.order);
  epoch_items_ = plan.items;
  epoch_skip_ = plan.skip;
  ahead_.planned = false;
  ahead_.plan = EpochPlan();
  ahead_.next_item = 0;
  // Only a loop that starts the same epoch again (evaluation) stops reading
  // ahead; its first pass costs the read-ahead's batches once. A jump (the
  // trainer's probe draws from the epoch after, then starts its own) is not
  // a restart.
  advancing_ = first || epoch != epoch_;
  epoch_ = epoch;
  epoch_batches_ = (epoch_items_ + b - 1) / b;
  first_batch = std::max<int64_t>(0, std::min(first_batch, epoch_batches_));
  if (!read_ahead) next_item_ = first_batch * b;
  next_to_hand_ = first_batch;
  window_start_ = -1;  // the tuner does not count the pause between epochs
  epoch_start_ = Seconds();
  epoch_first_batch_ = first_batch;
  lock.unlock();
  work_cv_.notify_all();
}

void SampleRing::State::Fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = Status::Corruption(message);
    stop_ = true;
  }
  // One error wakes everyone: workers stop, the consumer's Next() returns false.
  work_cv_.notify_all();
  ready_cv_.notify_all();
}

Status SampleRing::State::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

LoaderStats SampleRing::State::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s = stats_;
  for (const auto& slot : slots_) s.ready_batches += slot->state == Slot::State::kReady;
  return s;
}

void SampleRing::State::CountSkipped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.skipped;
}

// A maker that throws (out of memory, a bug in a program's own code) stops
// the run with its message instead of terminating the process.
bool SampleRing::State::MakeOrExplain(const SampleJob& job, std::string* error) {
  std::string what;
  try {
    return make_(job, error);
  } catch (const std::exception& e) {
    what = FirstLine(e.what());
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  *error =
      "sample " + std::to_string((*job.order)[static_cast<size_t>(job.position)]) + ": " + what;
  return false;
}

void SampleRing::State::Worker(int id) {
  const int b = options_.batch_size;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    int64_t batch = -1, in_sequence = -1;
    bool ahead = false, plan_ahead = false;
    std::string error;
    work_cv_.wait(lock, [&] {
      if (stop_) return true;
      if (id >= active_ || draining_ || epoch_ < 0) return false;  // parked by the tuner
      ahead = next_item_ >= epoch_items_;
      if (ahead) {  // this epoch is all claimed: the next one, if the loop advances
        if (!advancing_ || ahead_.planning) return false;
        if (!ahead_.planned) return plan_ahead = true;
        if (ahead_.next_item >= ahead_.plan.items) return false;
      }
      batch = (ahead ? ahead_.next_item : next_item_) / b;
      in_sequence = base_ + (ahead ? epoch_batches_ : 0) + batch;
      // Up to depth_ batches ready ahead of the consumer, plus one being filled.
      if (in_sequence > base_ + next_to_hand_ + depth_) {
        gated_ = true;
        return false;
      }
      const int epoch = ahead ? epoch_ + 1 : epoch_;
      Slot& s = SlotAt(in_sequence);
      if (s.state == Slot::State::kFree && !s.data && !Allocate(s, &error)) return true;
      if (s.state == Slot::State::kFree) {
        s.state = Slot::State::kFilling;
        s.batch = batch;
        s.epoch = epoch;
        s.filled = 0;
      }
      return s.state == Slot::State::kFilling && s.batch == batch && s.epoch == epoch;
    });
    if (stop_) return;
    if (!error.empty()) {
      lock.unlock();
      Fail(error);
      return;
    }
    if (plan_ahead) {  // the permutation is O(dataset): made outside the lock
      const int next_epoch = epoch_ + 1;
      ahead_.planning = true;
      lock.unlock();
      EpochPlan plan = PlanEpoch(next_epoch, 0);
      lock.lock();
      ahead_.planning = false;
      if (epoch_ + 1 == next_epoch && !ahead_.planned) {  // not overtaken by a StartEpoch
        ahead_.plan = std::move(plan);
        ahead_.next_item = 0;
        ahead_.planned = true;
      }
      work_cv_.notify_all();
      continue;
    }
    // Neither plan changes while a sample is in flight (StartEpoch waits).
    const int64_t items = ahead ? ahead_.plan.items : epoch_items_;
    int64_t& next_item = ahead ? ahead_.next_item : next_item_;
    Slot* slot = &SlotAt(in_sequence);
    const int i = static_cast<int>(next_item % b);
    StageTimes t;
    SampleJob job;
    job.epoch = ahead ? epoch_ + 1 : epoch_;
    job.position = next_item;
    job.place =
        (ahead ? ahead_.plan.skip : epoch_skip_) + options_.rank + next_item * options_.world_size;
    job.index_in_batch = i;
    job.order = ahead ? &ahead_.plan.order : &order_;
    job.slot = slot->data;
    job.label = &slot->labels[static_cast<size_t>(i)];
    job.sample = &slot->samples[static_cast<size_t>(i)];
    job.times = &t;
    ++next_item;
    ++inflight_;
    lock.unlock();
    bool ok = MakeOrExplain(job, &error);
    lock.lock();
    --inflight_;
    stats_.stages.read_s += t.read_s;
    stats_.stages.decode_s += t.decode_s;
    stats_.stages.augment_s += t.augment_s;
    stats_.stages.dataset_s += t.dataset_s;
    window_work_ += t.read_s + t.decode_s + t.augment_s + t.dataset_s;
    ++window_samples_;
    if (!ok) {
      lock.unlock();
      Fail(error);
      return;
    }
    // The consumer waits for a whole batch (StartEpoch, for no sample in
    // flight): waking it for every sample costs small samples their speed.
    bool ready = ++slot->filled == BatchSize(batch, items);
    if (ready) slot->state = Slot::State::kReady;
    if (ready || (draining_ && inflight_ == 0)) ready_cv_.notify_all();
  }
}

bool SampleRing::State::Next(Batch* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (epoch_ < 0 || next_to_hand_ >= epoch_batches_) return false;
  Slot& s = SlotAt(base_ + next_to_hand_);
  double t0 = Seconds();
  ready_cv_.wait(lock, [&] {
    return stop_ ||
           (s.state == Slot::State::kReady && s.batch == next_to_hand_ && s.epoch == epoch_);
  });
  double waited = Seconds() - t0;
  stats_.consumer_wait_s += waited;
  window_wait_ += waited;
  bool ok = HandOut(s, out);
  if (ok && (autotune_ || tune_depth_)) Tune();
  bool wake = gated_;  // a worker waits for room ahead of the consumer
  gated_ = false;
  lock.unlock();
  if (wake) work_cv_.notify_all();
  return ok;
}

RingTune DecideRingTune(const RingWindow& w) {
  bool keeps_up = w.needed < 0.8 * w.active;  // on average the workers are fast enough
  if (w.wait_share > 0.05 && keeps_up && w.tune_depth && w.depth < w.max_depth)
    return RingTune::kDeepen;
  if (w.wait_share > 0.05 && w.tune_threads && w.active < w.started) return RingTune::kAddWorker;
  if (w.wait_share < 0.005 && w.tune_threads && w.active > 1 && w.needed < w.active - 1.5)
    return RingTune::kParkWorker;
  return RingTune::kKeep;
}

void SampleRing::State::Tune() {
  constexpr int kWindow = 4;  // batches per decision
  double now = Seconds();
  if (window_start_ < 0) {
    window_start_ = now;
    window_wait_ = window_work_ = 0;
    window_batches_ = window_samples_ = 0;
    return;
  }
  if (++window_batches_ < kWindow) return;
  double wall = now - window_start_;
  double wait_share = wall > 0 ? window_wait_ / wall : 0;
  // Workers needed to match the consumer: per-sample work x samples per second
  // consumed, the latter over the whole epoch so far, so a consumer's pauses
  // count (a burst after a pause is what a deeper queue is for).
  double per_sample = window_samples_ ? window_work_ / window_samples_ : 0;
  double epoch_wall = now - epoch_start_;
  double consumed_per_s =
      epoch_wall > 0 ? (next_to_hand_ - epoch_first_batch_) * options_.batch_size / epoch_wall : 0;
  RingWindow w;
  w.wait_share = wait_share;
  w.needed = per_sample * consumed_per_s;
  w.active = active_;
  w.started = static_cast<int>(workers_.size());
  w.depth = depth_;
  w.max_depth = kMaxDepth;
  w.tune_depth = tune_depth_;
  w.tune_threads = autotune_;
  switch (DecideRingTune(w)) {
    case RingTune::kDeepen:
      ++depth_;
      work_cv_.notify_all();
      break;
    case RingTune::kAddWorker:
      ++active_;
      work_cv_.notify_all();
      break;
    case RingTune::kParkWorker:
      --active_;  // parks the highest-numbered worker after its current sample
      break;
    case RingTune::kKeep:
      break;
  }
  stats_.threads = active_;
  stats_.prefetch = depth_;
  window_start_ = now;
  window_wait_ = window_work_ = 0;
  window_batches_ = window_samples_ = 0;
}

bool SampleRing::State::TryNext(Batch* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch_ < 0 || next_to_hand_ >= epoch_batches_) return false;
  Slot& s = SlotAt(base_ + next_to_hand_);
  if (s.state != Slot::State::kReady || s.batch != next_to_hand_ || s.epoch != epoch_) return false;
  bool ok = HandOut(s, out);
  if (gated_) {
    gated_ = false;
    work_cv_.notify_all();
  }
  return ok;
}

bool SampleRing::State::HandOut(Slot& s, Batch* out) {
  if (!error_.ok() || s.state != Slot::State::kReady) return false;
  s.state = Slot::State::kInUse;
  out->index = next_to_hand_;
  out->epoch = epoch_;
  out->size = static_cast<int>(BatchSize(next_to_hand_, epoch_items_));
  out->images = s.data;
  out->labels = s.labels.data();
  out->samples = s.samples.data();
  out->slot = SlotIndex(base_ + next_to_hand_);
  ++next_to_hand_;
  ++stats_.batches;
  stats_.samples += out->size;
  return true;
}

void SampleRing::State::HandOverMemory(const Batch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = *slots_[static_cast<size_t>(batch.slot)];
  FB_CHECK(options_.allocate && s.state == Slot::State::kInUse && s.batch == batch.index);
  s.data = nullptr;  // Allocate() gives the slot new memory with its next batch
}

void SampleRing::State::Release(const Batch& batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = *slots_[static_cast<size_t>(batch.slot)];
    FB_CHECK(s.state == Slot::State::kInUse && s.batch == batch.index);
    s.state = Slot::State::kFree;
    s.batch = -1;
  }
  work_cv_.notify_all();
}

// ---- SampleRing: its interface, on its State --------------------------------

int64_t SampleRing::epoch_size() const { return state_->epoch_size(); }

int64_t SampleRing::batches_per_epoch() const {
  const RingOptions& o = state_->options_;
  return o.keep_last ? (epoch_size() + o.batch_size - 1) / o.batch_size
                     : epoch_size() / o.batch_size;
}

const RingOptions& SampleRing::options() const { return state_->options_; }

void SampleRing::StartEpoch(int epoch, int64_t first_batch, int64_t consumed_samples) {
  state_->StartEpoch(epoch, first_batch, consumed_samples);
}

LoaderPosition SampleRing::position() const { return state_->position(); }
bool SampleRing::Next(Batch* batch) { return state_->Next(batch); }
bool SampleRing::TryNext(Batch* batch) { return state_->TryNext(batch); }
void SampleRing::Release(const Batch& batch) { state_->Release(batch); }
void SampleRing::HandOverMemory(const Batch& batch) { state_->HandOverMemory(batch); }
Status SampleRing::status() const { return state_->status(); }
LoaderStats SampleRing::stats() const { return state_->stats(); }
void SampleRing::CountSkipped() { state_->CountSkipped(); }
void SampleRing::Fail(const std::string& message) { state_->Fail(message); }

}  // namespace fullburn
