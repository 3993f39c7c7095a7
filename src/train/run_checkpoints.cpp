#include "run_checkpoints.h"

#include <cstdio>

#include "fullburn/env.h"

namespace fullburn {

RunCheckpoints::RunCheckpoints(CheckpointPlan plan, std::shared_ptr<RunRecording> records)
    : plan_(std::move(plan)), records_(std::move(records)) {
  RunRecording* into = records_.get();
  const double start = plan_.run_start;
  whole_ = std::make_unique<CheckpointWriter>(
      plan_.dir, plan_.keep, plan_.async, [into, start](const CheckpointWriter::Written& w) {
        if (!w.status.ok()) {
          std::fprintf(stderr, "\nfullburn: %s\n", w.status.message().c_str());
          return;
        }
        RunRecords r;
        r.checkpoints.push_back(
            {w.step, Env::Default()->UnixSeconds() - start, w.path, w.bytes, w.stall_s, w.write_s});
        if (into) into->recorder().AddRecords(std::move(r));
      });
  if (!plan_.parts) return;
  // Each rank's part in the background; the loop waits only for the copy
  // of what the next forward changes (buffers, RNG: in rank 0's file).
  part_ = std::make_unique<CheckpointWriter>(
      plan_.dir, -1, plan_.async, [this](const CheckpointWriter::Written& w) {
        part_write_us_ += static_cast<int64_t>(w.write_s * 1e6);
        if (!w.status.ok()) PartFailed(w.step, w.path, w.status.message());
      });
  part_->SetPath([this](int64_t step) { return PartPath(step); });
  if (plan_.rank == 0) {
    // As long as the ranks wait for each other anywhere: a part later than
    // that is a rank gone or a folder the ranks do not share.
    whole_->SetBeforeWrite([this](int64_t step) {
      return WaitForOptimizerShards(CheckpointPath(plan_.dir, step), PartIdentity(step), cancel_,
                                    plan_.part_wait_s);
    });
  }
}

RunCheckpoints::~RunCheckpoints() {
  // Both threads read this object (a part's identity, the cancel flag), and
  // the whole file's waits for the parts.
  part_.reset();
  whole_.reset();
}

void RunCheckpoints::SavePart(int64_t step, CheckpointState state) {
  try {
    part_blocked_s_ += part_->Save(step, std::move(state));
  } catch (const std::exception& e) {  // staging ran out of memory, say
    std::string what = e.what();
    PartFailed(step, PartPath(step), what.substr(0, what.find('\n')));
  }
}

void RunCheckpoints::SaveWhole(int64_t step, CheckpointState state) {
  whole_->Save(step, std::move(state));
}

void RunCheckpoints::BeforeUpdate() {
  whole_->BeforeUpdate();
  if (part_) part_->BeforeUpdate();
}

void RunCheckpoints::WaitPart() {
  if (part_) part_->Wait();
}

void RunCheckpoints::Wait() { whole_->Wait(); }

Status RunCheckpoints::last_status() const { return whole_->last_status(); }

void RunCheckpoints::Protect(int64_t step) { whole_->Protect(step); }

// This rank's part of the checkpoint at `step` was not written: the marker
// rank 0 waits for, and a line here.
void RunCheckpoints::PartFailed(int64_t step, const std::string& path, const std::string& why) {
  ShardIdentity id = PartIdentity(step);  // may run on the writer's thread
  MarkOptimizerShardFailed(path, id, why);
  std::fprintf(stderr, "\nfullburn: rank %d: this rank's part of the checkpoint at step %lld failed (%s)\n",
               id.rank, static_cast<long long>(step), why.c_str());
}

std::string RunCheckpoints::PartPath(int64_t step) const {
  return OptimizerShardPath(CheckpointPath(plan_.dir, step), plan_.rank, plan_.world);
}

ShardIdentity RunCheckpoints::PartIdentity(int64_t step) const {
  ShardIdentity id;
  id.step = step;
  id.run_id = plan_.run_id;
  id.rank = plan_.rank;
  id.world = plan_.world;
  return id;
}

}  // namespace fullburn
