// `fullburn train`: the step loop, its records and the progress line.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include "fullburn/diagnose.h"
#include "trainer_impl.h"

namespace fullburn {

torch::Tensor ForwardLoss(const StepContext& ctx, const TrainBatch& b) {
  AutocastGuard autocast(ctx.device.type(), ctx.autocast);
  return ctx.model->ForwardLoss(b.inputs, b.targets);
}

torch::Tensor ForwardBackward(const StepContext& ctx, const TrainBatch& b, int accumulate,
                              const LossScaler& scaler, bool timed, MicroTimes* times) {
  PhaseEvents* events = timed ? ctx.events.get() : nullptr;
  if (events) events->Mark("");  // the device may have idled for data until here
  double t0 = MonoNow();
  torch::Tensor loss = ForwardLoss(ctx, b);
  if (events) events->Mark("forward");
  double t1 = MonoNow();
  scaler.Scale(accumulate > 1 ? loss / accumulate : loss).backward();
  if (events) events->Mark("backward");
  if (times && !events) {
    times->forward_s += t1 - t0;
    times->backward_s += MonoNow() - t1;
  }
  return loss.detach();
}

Status Trainer::NextBatch(TrainBatch* b, double* wait_s) {
  auto traced = ProfileScope("fullburn.next_batch");  // a data-loader span to the analysis
  double w0 = MonoNow();
  Status s = input_.Next(b);
  *wait_s += MonoNow() - w0;
  return s;
}

Status Trainer::TrainStep(bool timed, StepRecord* rec) {
  if (set_.train.cuda_graphs) return GraphedTrainStep(timed, rec);
  double start = MonoNow();
  double wait = 0;
  MicroTimes mt;
  torch::Tensor loss_sum;
  int64_t samples = 0;
  PhaseEvents* events = timed ? model_.ctx().events.get() : nullptr;
  if (events) events->Start();
  for (int64_t micro = 0; micro < accumulate_; ++micro) {
    TrainBatch b;
    if (Status s = NextBatch(&b, &wait); !s.ok()) return s;
    if (dp_) dp_->SetSync(micro == accumulate_ - 1);  // no_sync until the last micro-batch
    torch::Tensor loss =
        ForwardBackward(model_.ctx(), b, static_cast<int>(accumulate_), model_.scaler(), timed, &mt);
    loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
    samples += b.samples;
  }
  double comm = 0;
  if (dp_)
    if (Status s = dp_->FinishGradients(&comm); !s.ok()) return s;
  double o0 = MonoNow();
  // From the end of backward until the reduced gradients are usable on the
  // device: the communication backward did not hide (NCCL's wait only
  // orders the streams, so the host's clock cannot see it).
  if (events) events->Mark(dp_ ? "comm" : "");
  // Averaged gradients are the same on every rank, so is the inf/NaN verdict.
  torch::Tensor found_inf = model_.scaler().UnscaleAndCheck(model_.optimizer().params(), model_.optimizer().options().foreach);
  // One host read per step, for the loss and the inf/NaN flag together (as
  // GradScaler's step does).
  torch::Tensor both =
      torch::stack({loss_sum.to(torch::kFloat) / accumulate_, found_inf.to(torch::kFloat)}).cpu();
  double loss = both[0].item<double>();
  bool bad = both[1].item<double>() != 0;
  {
    Result<bool> any = sharding_.AnyRank(bad);
    if (!any.ok()) return any.status();
    bad = *any;
  }
  bool skip = model_.scaler().Update(bad);
  double lr = model_.schedule().At(step_ + 1);
  if (!skip) {
    if (double clip = set_.train.clip_grad_norm; clip > 0)
      if (Status s = sharding_.ClipGradients(clip); !s.ok()) return s;
    checkpoints_->BeforeUpdate();
    auto traced = ProfileScope("Optimizer.step#" + set_.optim.name + ".step");
    if (Status s = sharding_.Update(lr); !s.ok()) return s;
  }
  sharding_.ReleaseOthers();
  if (dp_)
    dp_->ZeroGradients();  // in place: the gradients are views of the buckets
  else
    model_.optimizer().ZeroGrad();
  // Communication not hidden behind backward, as the host saw it: Gloo's
  // wait blocks until the sum is there, NCCL's does not (timed steps only).
  if (dp_ && dp_->backend() != "nccl") rec->comm_s = comm;
  if (events) {
    events->Mark("optimizer");
    std::map<std::string, double> spans = events->Collect();  // waits for the step
    if (dp_) rec->comm_s = spans["comm"];
    rec->forward_s = spans["forward"];
    rec->backward_s = spans["backward"];
    rec->optimizer_s = spans["optimizer"];
  } else if (timed) {
    rec->forward_s = mt.forward_s;
    rec->backward_s = mt.backward_s;
    rec->optimizer_s = MonoNow() - o0;
  }
  return CloseStep({start, wait, lr, loss, skip, samples}, rec);
}

Status Trainer::CloseStep(const StepOutcome& o, StepRecord* rec) {
  double end = MonoNow();
  ++step_;
  if (o.skipped) {
    ++skipped_;
    ++consecutive_skips_;
  } else {
    consecutive_skips_ = 0;
  }
  rec->rank = rank_.rank;
  rec->step = step_;
  rec->epoch = static_cast<int>(input_.epoch());
  rec->t = Env::Default()->UnixSeconds() - run_.start_time;
  rec->loss = o.loss;
  rec->lr = o.lr;
  if (model_.scaler().enabled()) rec->loss_scale = model_.scaler().scale();
  rec->samples = o.samples;
  rec->step_s = end - o.start;
  rec->skipped = o.skipped;
  rec->data_wait_s = o.wait_s;  // always measured: it costs two clock reads
  if (consecutive_skips_ >= set_.train.max_skipped_steps) {
    return Status::Aborted(fmt::format(
        "training diverged: the loss or gradients were inf/NaN for {} steps in a row (step {}){}; "
        "lower optim.lr, set train.clip_grad_norm, or use bf16 instead of fp16. Checkpoints before "
        "this point are intact",
        consecutive_skips_, step_,
        model_.scaler().enabled() ? fmt::format(", the loss scale fell to {:g}", model_.scaler().scale()) : ""));
  }
  return Status::Ok();
}

void Trainer::FlushSteps(bool force) {
  if (!records_) return;  // the run was not begun
  double now = MonoNow();
  if (!force && now - last_flush_ < 2.0) return;
  last_flush_ = now;
  // The loader's own view (workers, queue depth, stage times) every ~10 s,
  // so a data wait can be traced to decode, augment or too few workers.
  if (auto ls = input_.loader_stats(); ls && (force || now - last_loader_event_ >= 10)) {
    last_loader_event_ = now;
    nlohmann::json j{{"threads", ls->threads},
                     {"prefetch", ls->prefetch},
                     {"ready_batches", ls->ready_batches},
                     {"batches", ls->batches},
                     {"samples", ls->samples},
                     {"skipped", ls->skipped},
                     {"cache_hits", ls->cache_hits},
                     {"cache_bytes", ls->cache_bytes},
                     {"read_s", ls->stages.read_s},
                     {"decode_s", ls->stages.decode_s},
                     {"augment_s", ls->stages.augment_s},
                     {"wait_s", ls->consumer_wait_s}};
    if (ls->stages.dataset_s > 0) j["dataset_s"] = ls->stages.dataset_s;  // a program's Dataset
    if (rank_.world_size > 1) j["rank"] = rank_.rank;
    RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "loader", j.dump()});
  }
  if (dp_ && rank_.rank == 0) ApplyForwarded(false);
  if (records_->recorder().forwarding())
    SendForwarded(false);
  else
    records_->recorder().Flush();
}

void Trainer::Progress(const StepRecord& r, bool force) {
  if (rank_.rank != 0) return;  // one progress line per job
  double now = MonoNow();
  // The job's rate: every rank takes the same batch and the all-reduce
  // keeps their steps in lock step. Exponential averages over about 20 steps
  // (steady, yet quick to move) of samples, step time and data wait, whose
  // ratios weigh each step by its time, as the summary and the diagnosis do:
  // an average of per-step shares would make light of a few long waits.
  const int world = dp_ ? dp_->world_size() : 1;
  double samples = static_cast<double>(r.samples) * world, wait = r.data_wait_s.value_or(0);
  bool first = recent_step_s_ == 0;
  recent_samples_ = first ? samples : 0.95 * recent_samples_ + 0.05 * samples;
  recent_step_s_ = first ? r.step_s : 0.95 * recent_step_s_ + 0.05 * r.step_s;
  recent_wait_s_ = first ? wait : 0.95 * recent_wait_s_ + 0.05 * wait;
  double rate = recent_step_s_ > 0 ? recent_samples_ / recent_step_s_ : 0;
  double wait_share = recent_step_s_ > 0 ? recent_wait_s_ / recent_step_s_ : 0;
  if (!force && now - last_progress_ < set_.train.log_every_s) return;
  last_progress_ = now;
  std::string util = "-", now_limits = records_->recorder().LiveFinding();
  if (std::optional<fullburn::Snapshot> latest = records_->recorder().Latest()) {
    if (!latest->gpus.empty() && latest->gpus[0].util)
      util = fmt::format("gpu {:.0f}%", *latest->gpus[0].util);
    else if (latest->proc && latest->proc->cpu_util)
      util = fmt::format("cpu {:.0f}%", *latest->proc->cpu_util);
  }
  double left_steps = static_cast<double>(total_steps_ - r.step);
  double eta = rate > 0 ? left_steps * (batch_ * accumulate_ * world) / rate : 0;
  std::string line = fmt::format(
      "step {}/{}  epoch {}  loss {:.4f}  {:.0f} samples/s  data-wait {:.0f}%  {}  ETA {}{}",
      r.step, total_steps_, r.epoch, r.loss, rate, wait_share * 100, util, FormatDuration(eta),
      now_limits);
  if (live_ && live_->active())
    live_->Draw(line);
  else if (!opt_.quiet && (force || now - last_plain_ >= 10)) {
    std::fprintf(stderr, "%s\n", line.c_str());
    last_plain_ = now;
  }
}

// Whether to stop before the next step: a SIGINT/SIGTERM, or
// train.time_limit_s. Ranks must stop at the same step, or one would wait in
// a gradient all-reduce the others never join: a signal may reach only some
// of them (a preempted node, a kill by hand) and each rank has its own clock.
// So with several ranks the decision is shared every kStopCheckSteps steps
// (one all-reduce of two numbers), at step numbers every rank counts alike,
// and a rank stops when any rank wants to.
Result<bool> Trainer::StopHere(double limit_s) {
  constexpr int64_t kStopCheckSteps = 5;
  double signalled = PendingStopSignal();
  double time_up = limit_s > 0 && MonoNow() - mono_start_ >= limit_s ? 1 : 0;
  if (dp_ && dp_->world_size() > 1) {
    if (step_ % kStopCheckSteps != 0) return false;
    auto sums = dp_->SumOverRanks({signalled > 0 ? 1.0 : 0.0, time_up});
    if (!sums.ok()) return sums.status();
    if ((*sums)[0] > 0 && signalled == 0) {
      interrupted_ = true;
      std::fprintf(stderr,
                   "\nfullburn: rank %d: stopping at step %lld with the ranks a signal reached; "
                   "checkpointing\n",
                   rank_.rank, static_cast<long long>(step_));
      return true;
    }
    time_up = (*sums)[1] > 0 ? 1 : 0;
  }
  if (signalled > 0) {
    interrupted_ = true;
    std::fprintf(stderr, "\nfullburn: stopped by signal %d at step %lld; checkpointing\n",
                 static_cast<int>(signalled), static_cast<long long>(step_));
    return true;
  }
  if (time_up > 0 && step_ > 0) {
    if (rank_.rank == 0)
      std::fprintf(stderr, "\nfullburn: train.time_limit_s reached at step %lld\n",
                   static_cast<long long>(step_));
    return true;
  }
  return false;
}

Status Trainer::Loop() {
  int64_t every_steps = set_.checkpoint.every_steps;
  double every_s = set_.checkpoint.every_minutes * 60;
  double limit_s = set_.train.time_limit_s;
  int64_t time_every = set_.train.time_every;
  // A resumed run continues after the samples its checkpoint's run read,
  // whatever world size and batch that run had.
  input_.StartAtPosition();
  model_.ctx().model->train();
  memory_.StartCount();
  StepRecord last;
  while (step_ < total_steps_) {
    Result<bool> stop = StopHere(limit_s);
    if (!stop.ok()) {
      return stop.status();
    }
    if (*stop) break;
    StepRecord rec;
    bool timed = (step_ + 1) % time_every == 0 || step_ == 0;
    Status s;
    try {
      ProfileBeforeStep();
      auto profiled_step = ProfileStepScope();
      s = TrainStep(timed, &rec);
    } catch (const std::exception& e) {
      if (IsOutOfMemory(e)) {
        for (torch::Tensor& p : model_.ctx().model->parameters()) p.mutable_grad() = torch::Tensor();
        nlohmann::json event;
        std::string advice = memory_.OutOfMemoryAdvice(&event);
        if (!event.is_null())
          RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "memory", event.dump()});
        if (advice.empty())
          advice =
              ": lower train.batch_size (or use auto) and raise train.accumulate to keep the "
              "effective batch";
        return Status::ResourceExhausted(
            fmt::format("out of memory at step {} with micro-batch {}{}; checkpoints so far are "
                        "intact",
                        step_ + 1, batch_, advice));
      }
      std::string what = e.what();
      return Status::Internal("step " + std::to_string(step_ + 1) +
                              " failed: " + what.substr(0, what.find('\n')));
    }
    if (!s.ok()) return s;
    records_->recorder().AddStep(rec);
    last = rec;
    ProfileAfterStep(false);
    Progress(rec, false);
    FlushSteps(false);
    // Evaluation first, so a checkpoint of this step holds its best-so-far.
    if (evaluation_.Due(step_, total_steps_)) {
      nlohmann::json eval;
      if (Status e = Evaluate(&eval); !e.ok()) {
        return e;
      }
      if (!eval.empty() && rank_.rank == 0 && !opt_.quiet)
        std::fprintf(stderr, "fullburn: %s\n", EvaluationLine(eval).c_str());
    }
    double now = MonoNow();
    if ((every_steps > 0 && step_ % every_steps == 0) ||
        (every_s > 0 && now - last_ckpt_time_ >= every_s))
      Checkpoint(false);
  }
  ProfileAfterStep(true);  // the loop ended (steps, signal, time limit) before step B
  model_.optimizer().WaitForUpdate();
  if (std::optional<nlohmann::json> j = memory_.MeasuredEvent())
    RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "memory", j->dump()});
  if (dp_) {  // what each rank holds: 1/N of the state (and gradients) when sharded
    const ShardedParameters* own = sharding_.parameters();
    nlohmann::json j{
        {"rank", rank_.rank},
        {"state_bytes", model_.optimizer().StateBytes()},
        {"grad_bytes", dp_->stats().grad_bytes},
        // the gradient hooks fired: buckets reduced during backward
        {"buckets_in_backward", dp_->stats().started_in_backward},
        {"buckets_after_backward", dp_->stats().started_after},
        // between steps: every parameter, or with dist.shard =
        // full the rank's own (the largest gather on top while used)
        {"param_bytes", own ? own->held_bytes() : TensorBytes(model_.ctx().model->parameters())},
        {"largest_gather_bytes", own ? own->largest_gather_bytes() : 0},
        {"block_gathers", own ? own->block_gathers() : 0},
        {"prefetched_gathers", own ? own->prefetched_gathers() : 0},
        {"shard", set_.dist.shard},
        {"offloaded", model_.optimizer().offloaded()},                   // state_bytes then in host memory
        {"shard_write_s", checkpoints_->part_blocked_s()},     // the loop blocked for its parts
        {"shard_part_write_s", checkpoints_->part_write_s()},  // their writer
        {"sharded", sharding_.optimizer_sharded()}};
    RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "optimizer_state", j.dump()});
  }
  if (last.step > 0) Progress(last, true);
  return Status::Ok();
}

}  // namespace fullburn
