#include <chrono>

#include "fullburn/spill.h"
#include "fullburn/store.h"

namespace fullburn {

AsyncRecordWriter::AsyncRecordWriter(RunStore* store, int64_t run_id, size_t max_kept,
                                     double retry_s, SpillFile* spill)
    : writer_(store, run_id, max_kept),
      store_(store),
      spill_(spill),
      retry_s_(retry_s),
      thread_([this] { Loop(); }) {}

namespace {
double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

AsyncRecordWriter::~AsyncRecordWriter() { (void)Finish(); }

void AsyncRecordWriter::Add(RunRecords more) {
  if (more.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.Append(std::move(more));
    ++added_;
  }
  wake_.notify_one();
}

void AsyncRecordWriter::Sync() {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t target = added_;
  written_.wait(lock, [&] { return tried_ >= target || done_; });
}

std::optional<AsyncRecordWriter::Change> AsyncRecordWriter::TakeChange() {
  std::lock_guard<std::mutex> lock(mu_);
  if (changes_.empty()) return std::nullopt;
  Change c = changes_.front();
  changes_.erase(changes_.begin());
  return c;
}

Status AsyncRecordWriter::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  return last_status_;
}

// Takes what Add queued under the lock and writes it without: Add never waits
// for a write, however long the store keeps this thread.
void AsyncRecordWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto ready = [this] { return stop_ || !queued_.empty(); };
    if (failing_)
      wake_.wait_for(lock, std::chrono::duration<double>(retry_s_), ready);
    else
      wake_.wait(lock, ready);
    RunRecords batch;
    std::swap(batch, queued_);
    int64_t taken = added_;
    bool last = stop_;
    bool was_failing = failing_;
    double since = failing_since_;
    lock.unlock();
    writer_.Add(std::move(batch));
    Status s = writer_.empty() ? Status::Ok() : writer_.Flush();
    // Refused long enough, or at the end: to the spill, not memory.
    if (!s.ok() && spill_ && (last || (was_failing && SteadySeconds() - since >= kSpillAfterS)))
      writer_.SpillKept(spill_, s.message());
    int64_t restored = 0;
    if (s.ok() && spill_ && !spill_->empty()) {
      // Taking writes again: what went to the spill meanwhile comes back.
      Status drained = spill_->DrainInto(store_, &restored);
      if (!drained.ok()) s = drained;
    }
    lock.lock();
    NoteLocked(s);
    if (!changes_.empty() && !changes_.back().failing && restored > 0)
      changes_.back().restored += restored;
    tried_ = taken;
    written_.notify_all();
    if (last && queued_.empty()) {
      done_ = true;  // what Add queues from now on is not written
      return;
    }
  }
}

void AsyncRecordWriter::NoteLocked(const Status& s) {
  last_status_ = s;
  if (s.ok() == !failing_) return;
  failing_ = !s.ok();
  if (failing_) failing_since_ = SteadySeconds();
  Change c;
  c.failing = failing_;
  if (failing_) {
    c.error = s.message();
  } else {
    c.lost = writer_.dropped() - dropped_said_;
    dropped_said_ = writer_.dropped();
  }
  changes_.push_back(c);
}

}  // namespace fullburn
