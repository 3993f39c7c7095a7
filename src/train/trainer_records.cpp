// Records of ranks that cannot write rank 0's run store. On one node every
// rank opens the same SQLite file and writes its own steps and samples; on
// several nodes each has its own disk, so ranks after 0 send their records
// to rank 0 through the rendezvous store, and rank 0 writes them.
#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "trainer_impl.h"

namespace fullburn {

// The same file is recognised by the run rank 0 created in it: its id and
// start time, which came through the rendezvous.
void Trainer::DecideForwarding() {
  auto local = store_->GetRun(std::to_string(run_.id));
  forward_ = !(local.ok() && std::abs(local->start_time - run_.start_time) < 1e-3);
  if (forward_)
    std::fprintf(stderr,
                 "fullburn: rank %d: %s is not rank 0's store; this rank's records go to rank 0\n",
                 rank_.rank, store_->path().c_str());
}

// Rank 0 learns once which ranks forward, so it polls only those (a job
// with a shared store polls none).
Status Trainer::GatherSenders() {
  Result<std::vector<std::string>> flags = dp_->GatherToRankZero("forwards", forward_ ? "1" : "0");
  if (!flags.ok()) return flags.status();
  for (size_t r = 1; r < flags->size(); ++r)
    if ((*flags)[r] == "1") senders_.push_back(static_cast<int>(r));
  return Status::Ok();
}

// Rank 0 samples its node's host and GPUs and its own process tree. The
// first rank of every other node (local rank 0) does the same for its node,
// stored as rankR.host.* and rankR.gpuN.*; every other rank samples only its
// own process tree (rankR.proc.*). So no host is counted twice, and each
// rank's CPU and memory can be told apart.
void Trainer::StartRecording() {
  bool samples_node = rank_.rank == 0 || rank_.local_rank == 0;
  Recorder::Options o;
  o.sampler.interval_s = 1.0;
  o.sampler.root_pid = static_cast<int>(::getpid());
  o.sampler.host = samples_node;
  o.sampler.rank = rank_.rank;
  o.rank = rank_.rank;
  o.world_size = rank_.world_size;
  o.forward = forward_;
  o.live_diagnosis = !opt_.quiet && rank_.rank == 0;
  // An enclosing `fullburn run` gets the same step events a Python job's
  // markers would write.
  if (const char* events = std::getenv(kEventsEnvVar); events && *events && rank_.rank == 0)
    o.events_path = events;
  // A rank that writes a store keeps what it refuses (a full disk, a lock
  // held past the retry time) in a spill, as fullburn run does.
  records_ = std::make_shared<RunRecording>(store_, samples_node ? gpus_ : nullptr, run_,
                                            std::move(o), /*keep_refused=*/!forward_);
  Recorder& recorder = records_->recorder();
  for (const RunEvent& e : pending_events_) recorder.AddEvent(e);
  pending_events_.clear();
  recorder.Start();
}

void Trainer::RecordEvent(const RunEvent& event, bool to_events_file) {
  if (records_)
    records_->recorder().AddEvent(event, to_events_file);
  else
    pending_events_.push_back(event);
}

void Trainer::SendForwarded(bool last) {
  std::string payload = records_->recorder().TakeForwarded();
  Status s = payload.empty() ? Status::Ok() : dp_->Send(payload);
  if (s.ok() && last) s = dp_->Done();
  if (!s.ok()) {
    std::fprintf(stderr, "\nfullburn: rank %d: %s; its records from now on are lost\n", rank_.rank,
                 s.message().c_str());
    records_->recorder().StopForwarding();  // nothing to send them to
  }
}

void Trainer::ApplyForwarded(bool last) {
  if (senders_.empty()) return;
  if (last) dp_->WaitForSenders(senders_, 10.0);
  for (const std::string& text : dp_->Receive(senders_)) records_->recorder().AddForwarded(text);
}

}  // namespace fullburn
