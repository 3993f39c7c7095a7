#include <chrono>

#include "fullburn/store.h"

namespace fullburn {

AsyncRecordWriter::AsyncRecordWriter(RunStore* store, int64_t run_id, size_t max_kept,
                                     double retry_s)
    : writer_(store, run_id, max_kept), retry_s_(retry_s), thread_([this] { Loop(); }) {}

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
    lock.unlock();
    writer_.Add(std::move(batch));
    Status s = writer_.empty() ? Status::Ok() : writer_.Flush();
    lock.lock();
    NoteLocked(s);
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
