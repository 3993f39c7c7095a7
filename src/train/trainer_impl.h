// The trainer's internals shared by its files (train component only).
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "cuda_graph.h"
#include "fullburn/diagnose.h"
#include "fullburn/dist_torch.h"
#include "fullburn/recorder.h"
#include "fullburn/report.h"
#include "fullburn/spill.h"
#include "fullburn/store.h"
#include "fullburn/store_layout.h"
#include "fullburn/train.h"
#include "memory_model.h"
#include "run_checkpoints.h"
#include "run_evaluation.h"
#include "run_input.h"
#include "run_recording.h"
#include "run_memory.h"
#include "run_model.h"
#include "run_sharding.h"
#include "sharded_params.h"
#include "sources.h"
#include "step_context.h"
#include "fullburn/train_settings.h"

namespace fullburn {

inline double MonoNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One micro-batch: forward and loss (divided by `accumulate`), backward.
// Returns the undivided loss as a 0-dim tensor on the device (no sync).
// Timed on CPU with clocks into `times`; on CUDA with ctx.events marks that
// the caller collects at the step's end.
// Forward under autocast and the float32 cross-entropy (per position for a
// language model); no backward.
torch::Tensor ForwardLoss(const StepContext& ctx, const TrainBatch& b);
struct MicroTimes {
  double forward_s = 0, backward_s = 0;
};
torch::Tensor ForwardBackward(const StepContext& ctx, const TrainBatch& b, int accumulate,
                              const LossScaler& scaler, bool timed, MicroTimes* times);

// The largest micro-batch that fits and trains fastest (train.batch_size =
// auto): doubles from 1 until an out-of-memory or max_batch, bisects between
// the last fit and the first failure, then keeps the fitting size with the
// best measured samples/s among those at most 90% of the limit (headroom for
// what a trial does not hold). Every trial is reported through `trial`.
struct BatchTrial {
  int64_t batch = 0;
  bool fits = false;
  double samples_per_s = 0;
  int64_t peak_bytes = 0;
  std::string error;
};
// What a batch-size trial does besides forward, backward and the update,
// so that it holds what the run's step holds (data parallel's buckets,
// stage 3's gathers). An out-of-memory from these is the trial's, as one
// from forward is; other exceptions end the search (at batch 1 they are
// taken for "cannot train at batch 1", as one from forward is).
struct TrialShape {
  virtual ~TrialShape() = default;
  virtual void Begin() {}          // before the first trial, after the weights are saved
  virtual void AfterBackward() {}  // before the update
  virtual void AfterUpdate() {}
  // After each step, and after one that failed: clears the gradients (in
  // place of the optimizer's zero_grad) and what else the step left.
  virtual void EndStep() = 0;
  // After the last trial, before the weights are put back: a parameter the
  // trials released is allocated again then, at its saved shape.
  virtual void End() {}
};

struct BatchSearchOptions {
  int64_t max_batch = 4096;  // also capped by the samples in one epoch
  int steps = 3;             // timed steps per trial after one warm-up step
  double min_seconds = 0.3;  // and at least this long, so small batches are not timed on a blip
  OptimizerOptions optimizer;
  // Sharded (dist.shard): which of the optimizer's parameters this rank
  // updates, so a trial holds the optimizer state the run's rank will;
  // empty: every one.
  std::vector<bool> owned;
  // Unset: a trial steps the model alone (forward, backward, update, zero_grad).
  std::shared_ptr<TrialShape> shape;
};
// The fastest trial that fit, leaving out sizes within 10% of an
// out-of-memory limit (`first_fail` > 0): the run holds more than a trial.
// A search stopped by max_batch found no limit, so its last size counts.
int64_t PickSearchedBatch(const std::vector<BatchTrial>& fits, int64_t first_fail);
// `batch` samples drawn at random from `probe` (the batch search's trials,
// the memory probe), channels_last where the model takes it.
TrainBatch SampleBatch(const StepContext& ctx, const TrainBatch& probe, int64_t batch);
// Trials run on batches drawn from `probe` (real samples, so shapes and
// values are the data's) and leave the model's weights as they found them.
Result<int64_t> SearchBatchSize(StepContext* ctx, const TrainBatch& probe,
                                const BatchSearchOptions& o,
                                const std::function<void(const BatchTrial&)>& trial);


// The signal (SIGINT/SIGTERM) that asked training to stop, or 0.
int PendingStopSignal();

// `fullburn train`, its files split by seam: trainer.cpp (the store and
// --resume, ranks, the run's start and end), trainer_setup.cpp (device,
// data, model, optimizer, batch), trainer_loop.cpp (the step loop),
// trainer_checkpoint.cpp (writers, snapshot, restore), trainer_eval.cpp,
// trainer_records.cpp (through the Recorder, to rank 0), trainer_graph.cpp
// (CUDA graphs), trainer_profile.cpp; and its parts: run_recording.h,
// run_checkpoints.h, run_sharding.h (dist.shard, dist.offload), run_evaluation.h,
// run_input.h (the training data), run_memory.h (the memory model), run_model.h
// (the model, optimizer, loss scaler and schedule).
constexpr int kExitFailed = 1, kExitInterrupted = 130;  // and kExitUsage (status.h)
// The one place a run's outcome becomes its exit code (trainer.h's
// contract): every failure is a Status, and a signal's stop is not one.
// `started`: the step loop began.
int TrainingExitCode(const Status& s, bool interrupted, bool started);

struct Resume {
  std::string path;
  CheckpointState state;
  nlohmann::json meta;
};

class Trainer {
 public:
  // The parts with threads of their own (the recording, the checkpoint
  // writers) stop them in their own destructors and share what those
  // threads read, so the order of the fields below is free.
  explicit Trainer(const TrainerOptions& o) : opt_(o) {}
  Status Run();
  // Run, with any exception that escaped it as a Status (the run stored as failed).
  Status RunCatchingEverything();
  // A signal stopped the loop at a step's end (checkpointed, not a failure).
  bool interrupted() const { return interrupted_; }
  bool started() const { return started_; }  // the step loop began

 private:
  Status OpenStoreAndResume();
  Status SetupCatching();
  // The memory probe and dist.shard / dist.offload, in the order stage 3 needs.
  Status SetupMemoryAndSharding();
  void PrintStart() const;
  void PrintSummary(const nlohmann::json& eval) const;
  // trainer_setup.cpp
  Status Setup();
  Status SetupDevice();
  Status SetupData();
  Status ChooseBatch(const OptimizerOptions& oo);
  Status BuildModel(const BatchSource& source);
  Status SearchBatch(const OptimizerOptions& oo);
  Status BeginRun();
  Status ConnectRanks();
  Status JoinRun();
  Status GatherGpus();
  Status GatherSenders();
  Status OpenCheckpoints();
  Status Loop();
  // profile.steps (trainer_profile.cpp): torch's profiler over steps A-B.
  Status SetupProfile();
  void ProfileBeforeStep();
  // The step's ProfilerStep#N scope while the profiler runs, else null.
  std::unique_ptr<at::RecordFunction> ProfileStepScope() const;
  // A named span in the trace while the profiler runs (the batch wait, the
  // optimizer step, under the names the analysis reads), else null.
  std::unique_ptr<at::RecordFunction> ProfileScope(const std::string& name) const;
  // Stops the profiler after step B, or when the loop ended before it, and
  // writes the trace and its `profile` event.
  void ProfileAfterStep(bool loop_ended);
  int64_t profile_first_ = 0, profile_last_ = 0;  // 0: off
  // Sharded: this rank's optimizer state (and, with full, its parameters)
  // for its part beside the step's checkpoint (checkpoints_'s part writer).
  CheckpointState PartState();
  // The memory model applied to the run (run_memory.h, docs/memory.md),
  // attached once the optimizer and the micro-batch exist.
  RunMemory memory_;
  void AttachMemory();
  // dist.shard = full: the probe and the search need the whole model on
  // each device; where it does not fit, the run goes without the report.
  Status ProbeOrShare();
  bool batch_searched_ = false;    // train.batch_size = auto (the config then holds the size)
  // dist.shard and dist.offload (run_sharding.h), set up once the optimizer
  // and the memory probe are done.
  RunSharding sharding_;
  // dist.shard = full without a probe (a fixed micro-batch, no memory
  // report): the model waits in host memory until sharding_ moves each
  // rank's own parameters to the device, so no rank holds it whole there.
  bool share_to_device_ = false;
  bool profiling_ = false;
  Result<bool> StopHere(double limit_s);
  Status TrainStep(bool timed, StepRecord* rec);
  struct StepOutcome {
    double start, wait_s, lr, loss;
    bool skipped;
    int64_t samples;
  };
  // The step's common record fields, step and skip counts, the divergence stop.
  Status CloseStep(const StepOutcome& o, StepRecord* rec);
  // train.cuda_graphs (trainer_graph.cpp): the step replayed from a CUDA graph.
  Status CheckCudaGraphs();
  Status GraphedTrainStep(bool timed, StepRecord* rec);
  Status NextBatch(TrainBatch* b, double* wait_s);
  void StepBody(const std::vector<TrainBatch>& micro);
  // The final one (final_one) is waited for: an error says which earlier
  // checkpoint holds the work. A periodic one's failure is told and training
  // goes on (Ok).
  Status Checkpoint(bool final_one);
  Status FinalCheckpointLost();
  Status Restore();
  void FlushSteps(bool force);
  void Progress(const StepRecord& r, bool force);
  // trainer_eval.cpp: held-out loss and accuracy (every rank its share).
  Status SetupEval();
  Status Evaluate(nlohmann::json* out);  // out: empty when there was nothing to evaluate
  Status EvaluateShare(nlohmann::json* out);
  // What the run records goes through records_ (run_recording.h): the store,
  // the sampler, the live finding, the steps' flushes (trainer_records.cpp).
  void StartRecording();
  // Records of a rank whose store is not rank 0's (another node's disk) go
  // through the rendezvous store.
  void DecideForwarding();
  std::vector<int> senders_;  // rank 0: the ranks that forward their records to it
  void SendForwarded(bool last);
  void ApplyForwarded(bool last);
  // Into the run: rank 0's store, or sent to rank 0 by a forwarding rank;
  // before the run is begun, kept for it (pending_events_).
  void RecordEvent(const RunEvent& event, bool to_events_file = false);
  std::string DatasetsDir() const;
  // The model's name in the run's name: a program's own network by the name
  // it gave (TrainerOptions::model_name), else model.name.
  std::string ModelLabel() const;
  // model.name = custom and data.source = tensors need what a program hands
  // over; a built-in model needs tensors of the kind it takes.
  // Keeps what the program's data look like (program_first_).
  Status CheckProgramParts();
  // The program's tensors, or its dataset's sample 0 as a batch of one.
  std::optional<TensorData> program_first_;
  void Finish(const std::string& status, int code);
  CheckpointState Snapshot();
  // cfg_.Set, and set_ read again from it.
  Status SetOption(const std::string& key, const std::string& value, const std::string& origin);

  TrainerOptions opt_;
  bool interrupted_ = false, started_ = false, finished_ = false;
  Config cfg_;  // what the run stores and a checkpoint keeps
  TrainSettings set_;  // cfg_ typed, read again whenever SetOption changes cfg_
  std::shared_ptr<RunStore> store_;  // shared with records_, whose sampler writes it
  std::optional<Resume> resume_;
  RunInfo run_;
  double mono_start_ = 0;
  // The model on its device, the optimizer, the loss scaler and the
  // learning-rate schedule (run_model.h).
  RunModel model_;
  SourceSpec spec_;
  // The training source and the run's position in it (run_input.h).
  RunInput input_;
  // The held-out source, the evaluations' schedule and the best loss so far
  // (run_evaluation.h).
  RunEvaluation evaluation_;
  void KeepIfBest(nlohmann::json* eval);
  std::shared_ptr<GpuSource> gpus_;  // shared with records_, whose sampler reads it
  // Every record of the run goes through it; the training loop never waits
  // on the store. Null until the run is begun.
  std::shared_ptr<RunRecording> records_;
  // Rank 0's checkpoint files and, sharded, this rank's parts beside them,
  // written in the background. Null until the run is begun.
  std::unique_ptr<RunCheckpoints> checkpoints_;
  std::unique_ptr<LiveStatus> live_;
  RankInfo rank_;                            // world_size 1 without a launcher
  std::unique_ptr<DataParallel> dp_;         // only when world_size > 1
  std::unique_ptr<DeviceStep> device_step_;  // train.cuda_graphs only
  std::unique_ptr<CudaGraph> graph_;
  std::vector<TrainBatch> static_batches_;  // what the graph reads
  int graph_warmups_ = 0;
  bool graph_captured_ = false;
  std::vector<RunEvent> pending_events_;  // before the run is begun
  bool forward_ = false;                  // a rank after 0 that cannot write rank 0's store
  double last_flush_ = 0, last_progress_ = 0, last_ckpt_time_ = 0, last_plain_ = 0,
         last_loader_event_ = 0;
  int64_t batch_ = 0, accumulate_ = 1, total_steps_ = 0, step_ = 0;
  int64_t consecutive_skips_ = 0, skipped_ = 0, last_ckpt_step_ = -1;
  double recent_samples_ = 0, recent_step_s_ = 0, recent_wait_s_ = 0;  // Progress's averages
};

// "held-out at step N: loss L, accuracy A% (S samples, T s)".
std::string EvaluationLine(const nlohmann::json& eval);

}  // namespace fullburn
