// Records of ranks that cannot write rank 0's run store. On one node every
// rank opens the same SQLite file and writes its own steps and samples; on
// several nodes each has its own disk, so ranks after 0 send their records
// to rank 0 through the rendezvous store, and rank 0 writes them.
#include <cmath>

#include "trainer.h"

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

void Trainer::RecordEvent(const RunEvent& event) {
  if (live_now_) {
    std::lock_guard<std::mutex> lock(latest_mu_);
    live_events_.push_back(event);
  }
  if (forward_) {
    forward_events_.push_back(event);
    return;
  }
  RunRecords r;
  r.events.push_back(event);
  Records()->Add(std::move(r));
}

AsyncRecordWriter* Trainer::Records() {
  if (!records_) records_ = std::make_unique<AsyncRecordWriter>(store_.get(), run_.id);
  return records_.get();
}

// On the training thread, so the line does not cut into the progress line
// half drawn. A store that refuses writes (locked past its busy timeout, a
// full disk) keeps the records to write them later: training goes on.
void Trainer::SayStoreChanges() {
  if (!records_) return;
  while (std::optional<AsyncRecordWriter::Change> c = records_->TakeChange()) {
    if (c->failing)
      std::fprintf(stderr,
                   "\nfullburn: %s; training goes on, and its step records are kept to be written "
                   "once the store takes writes again\n",
                   c->error.c_str());
    else
      std::fprintf(stderr, "\nfullburn: the run store takes step records again (%lld lost)\n",
                   static_cast<long long>(c->lost));
  }
}

void Trainer::SendForwarded(bool last) {
  nlohmann::json payload{{"steps", nlohmann::json::array()},
                         {"events", nlohmann::json::array()},
                         {"samples", nlohmann::json::array()}};
  for (const StepRecord& r : pending_steps_)
    payload["steps"].push_back(StepEventLine(r, run_.start_time));
  for (const RunEvent& e : forward_events_)
    payload["events"].push_back(RunEventLine(e, run_.start_time));
  {
    std::lock_guard<std::mutex> lock(latest_mu_);
    for (const NamedSample& s : forward_samples_) payload["samples"].push_back({s.name, s.t, s.v});
    forward_samples_.clear();
  }
  pending_steps_.clear();
  forward_events_.clear();
  bool empty = payload["steps"].empty() && payload["events"].empty() && payload["samples"].empty();
  Status s = empty ? Status::Ok() : dp_->Send(payload.dump());
  if (s.ok() && last) s = dp_->Done();
  if (!s.ok()) {
    std::fprintf(stderr, "\nfullburn: rank %d: %s; its records from now on are lost\n", rank_.rank,
                 s.message().c_str());
    forward_ = false;  // nothing to send them to
  }
}

void Trainer::ApplyForwarded(bool last) {
  if (senders_.empty()) return;
  if (last) dp_->WaitForSenders(senders_, 10.0);
  RunRecords got;
  for (const std::string& text : dp_->Receive(senders_)) {
    nlohmann::json payload = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (payload.is_discarded()) continue;
    for (const auto& line : payload.value("steps", nlohmann::json::array())) {
      auto m = ParseEventLine(line.get<std::string>(), run_.start_time);
      if (m.ok() && m->is_step) got.steps.push_back(m->step);
    }
    for (const auto& line : payload.value("events", nlohmann::json::array())) {
      auto m = ParseEventLine(line.get<std::string>(), run_.start_time);
      if (m.ok() && !m->is_step) got.events.push_back(m->event);
    }
    for (const auto& s : payload.value("samples", nlohmann::json::array()))
      if (s.is_array() && s.size() == 3)
        got.samples.push_back({s[0].get<std::string>(), s[1].get<double>(), s[2].get<double>()});
  }
  Records()->Add(std::move(got));
}

}  // namespace fullburn
