// `fullburn train` end to end: the real binaries, a real store, real
// checkpoints, SIGKILL and resume.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "fullburn/config.h"
#include "fullburn/pipeline.h"
#include "fullburn/report.h"
#include "fullburn/store.h"
#include "fullburn/train.h"
#include "process.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;
using testing::Background;
using testing::RunToEnd;

// These tests are the CPU tier (exact losses across runs, the CPU memory
// budget, CPU-only errors), pinned to the CPU through the option's variable so
// that a machine with a GPU runs them the same way; on a lent GPU machine,
// where train.device = auto took CUDA, a dozen of them failed for that alone.
// bench/gpu_session is the GPU tier.
class CpuTier : public ::testing::Environment {
 public:
  void SetUp() override { ::setenv("FULLBURN_TRAIN_DEVICE", "cpu", 1); }
};
[[maybe_unused]] ::testing::Environment* const kCpuTier =
    ::testing::AddGlobalTestEnvironment(new CpuTier);

// Small and deterministic: an MLP on in-memory synthetic data, one thread.
using testing::FreeLoopbackPort;

const std::vector<std::string> kTiny = {
    "model.name=mlp",   "data.source=synthetic", "data.synthetic_samples=2048",
    "data.features=32", "model.hidden=64",       "train.threads=1",
    "optim.lr=0.05",    "train.batch_size=32"};

class TrainE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_train");
    store_ = dir_ + "/runs.db";
    ::unsetenv("FULLBURN_STORE");
  }
  testing::Outcome Train(std::vector<std::string> args, bool tiny = true) {
    std::vector<std::string> argv = {FULLBURN_BIN, "train", "-q", "--store", store_};
    if (tiny) argv.insert(argv.end(), kTiny.begin(), kTiny.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, 300);
  }
  // A synthetic JPEG folder (fullburn make-dataset images); empty on failure.
  std::string MakeImages(const std::string& name, int classes, int per_class,
                         const std::string& size, int seed = 0) {
    std::string path = dir_ + "/" + name;
    auto o = RunToEnd({FULLBURN_BIN, "make-dataset", "images", path, "--classes",
                       std::to_string(classes), "--per-class", std::to_string(per_class), "--size",
                       size, "--seed", std::to_string(seed)});
    EXPECT_EQ(o.code, 0) << o.err;
    return o.code == 0 ? path : "";
  }
  std::unique_ptr<RunStore> Store() { return std::move(RunStore::Open(store_).value()); }
  // Waits up to 30 s for a training started in the background to store a
  // few steps.
  bool TrainingHasStepped() {
    for (int i = 0; i < 1500; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto runs = Store()->ListRuns().value();
      if (!runs.empty() && Store()->LoadSteps(runs.back().id).value().size() > 5) return true;
    }
    return false;
  }
  std::vector<StepRecord> Steps(int64_t run) { return Store()->LoadSteps(run).value(); }
  // The last evaluation event's data; {} when there is none.
  nlohmann::json Evaluation(int64_t run) {
    std::vector<nlohmann::json> all = Evaluations(run);
    return all.empty() ? nlohmann::json::object() : all.back();
  }
  std::vector<nlohmann::json> Evaluations(int64_t run) {
    std::vector<nlohmann::json> out;
    std::vector<RunEvent> events = Store()->LoadEvents(run).value();
    for (const RunEvent& e : events)
      if (e.kind == "evaluation") out.push_back(nlohmann::json::parse(e.data));
    return out;
  }
  std::string dir_, store_;
};

TEST_F(TrainE2E, MlpLearnsAndEveryStepIsRecorded) {
  auto o = Train({"train.steps=150", "checkpoint.every_steps=50"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto run = Store()->GetRun("last").value();
  EXPECT_EQ(run.status, "finished");
  auto config = nlohmann::json::parse(run.config_json);
  EXPECT_EQ(config["model"]["name"], "mlp");  // the effective config is stored
  auto steps = Steps(run.id);
  ASSERT_EQ(steps.size(), 150u);
  StepsSummary sum = SummarizeSteps(steps);
  EXPECT_LT(sum.final_loss, 0.6 * sum.first_loss) << sum.first_loss << " -> " << sum.final_loss;
  for (const StepRecord& r : steps) {
    EXPECT_TRUE(r.forward_s && r.backward_s && r.optimizer_s && r.data_wait_s);
    EXPECT_LE(*r.forward_s + *r.backward_s + *r.optimizer_s + *r.data_wait_s,
              r.step_s * 1.001 + 1e-4);
  }
  EXPECT_GT(Evaluation(run.id).value("val_accuracy", 0.0), 0.5);  // 10 classes: chance is 0.1
  EXPECT_EQ(Evaluation(run.id)["val_samples"], 256);              // the whole held-out draw
  auto cks = Store()->LoadCheckpoints(run.id).value();
  ASSERT_EQ(cks.size(), 3u);  // 50, 100, 150 (= the end)
  EXPECT_TRUE(fs::exists(cks.back().path));
  EXPECT_GT(Store()->LoadSamples(run.id).value().size(), 0u);  // telemetry alongside

  auto csv = RunToEnd({FULLBURN_BIN, "runs", "export", std::to_string(run.id), "--table", "steps",
                       "--store", store_});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 151);
  EXPECT_EQ(csv.out.rfind("rank,step,epoch,t,loss,lr", 0), 0u);
  auto js = RunToEnd({FULLBURN_BIN, "runs", "export", "last", "--table", "steps", "--format",
                      "json", "--store", store_});
  EXPECT_EQ(nlohmann::json::parse(js.out).size(), 150u);
  auto trace = RunToEnd({FULLBURN_BIN, "runs", "trace", "last", "--store", store_});
  ASSERT_EQ(trace.code, 0) << trace.err;
  EXPECT_GT(nlohmann::json::parse(trace.out)["traceEvents"].size(), 150u * 5);
}

// profile.steps: torch's profiler over the steps asked, its trace beside the
// store with a ProfilerStep#N per step, analysed at the end and by diagnose.
TEST_F(TrainE2E, ProfileStepsTracesTheStepsAskedAndTheRunIsAnalysedWithThem) {
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"train.steps=12", "profile.steps=4-6", "eval.at_end=false"});
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("from the profiler trace of steps 4-6"), std::string::npos) << o.err;
  auto run = Store()->GetRun("last").value();
  nlohmann::json profile;
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  for (const RunEvent& e : events)
    if (e.kind == "profile") profile = nlohmann::json::parse(e.data);
  ASSERT_FALSE(profile.empty());
  EXPECT_EQ(profile["first_step"], 4);
  EXPECT_EQ(profile["last_step"], 6);
  std::string path = profile["path"];
  EXPECT_EQ(path,
            fs::absolute(dir_ + "/traces/run-" + std::to_string(run.id) + "/rank0.pt.trace.json")
                .string());
  auto trace = nlohmann::json::parse(testing::ReadText(path));
  std::set<std::string> steps;
  size_t ops = 0, waits = 0, updates = 0;
  for (const auto& e : trace["traceEvents"]) {
    std::string name = e.value("name", "");
    if (name.rfind("ProfilerStep#", 0) == 0)
      steps.insert(name);
    else
      ++ops;
    waits += name == "fullburn.next_batch";  // read by the analysis as data-loader spans
    updates += name == "Optimizer.step#sgd.step";
  }
  EXPECT_EQ(waits, 3u);
  EXPECT_EQ(updates, 3u);
  // Steps 4-6, and the sliver of 7 that closes 6 (the analysis drops a last step).
  EXPECT_EQ(steps, (std::set<std::string>{"ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6",
                                          "ProfilerStep#7"}));
  EXPECT_GT(ops, 3u * 10);  // the MLP's forward, backward and optimizer ops
  auto analyzed = RunToEnd({FULLBURN_BIN, "analyze", path, "--json"});
  ASSERT_EQ(analyzed.code, 0) << analyzed.err;
  EXPECT_NE(analyzed.out.find("\"rank\""), std::string::npos);
  auto diag = RunToEnd({FULLBURN_BIN, "diagnose", "last", "--store", store_});
  ASSERT_EQ(diag.code, 0) << diag.err;
  EXPECT_NE(diag.out.find("from the profiler trace of steps 4-6"), std::string::npos) << diag.out;

  // Steps past the run's end: traced to its last step.
  auto short_run = Train({"train.steps=5", "profile.steps=4-50", "eval.at_end=false"});
  ASSERT_EQ(short_run.code, 0) << short_run.err;
  nlohmann::json cut;
  events = Store()->LoadEvents(Store()->GetRun("last").value().id).value();
  for (const RunEvent& e : events)
    if (e.kind == "profile") cut = nlohmann::json::parse(e.data);
  ASSERT_FALSE(cut.empty());
  EXPECT_EQ(cut["last_step"], 5);
}

// model.checkpoint = blocks recomputes each ResNet stage in backward: the
// same losses, step for step, as keeping the activations.
TEST_F(TrainE2E, ActivationCheckpointingTrainsToTheSameLosses) {
  std::vector<std::vector<double>> losses;
  for (const char* mode : {"model.checkpoint=none", "model.checkpoint=blocks"}) {
    auto o = Train({"model.name=resnet18", "model.width=0.125", "data.source=synthetic",
                    "data.image_size=32", "data.synthetic_samples=256", "train.steps=4",
                    "train.threads=1", "eval.at_end=false", "checkpoint.at_end=false", mode},
                   /*tiny=*/false);
    ASSERT_EQ(o.code, 0) << o.err;
    std::vector<double> run;
    for (const StepRecord& r : Steps(Store()->GetRun("last").value().id)) run.push_back(r.loss);
    losses.push_back(run);
  }
  ASSERT_EQ(losses[0].size(), 4u);
  EXPECT_EQ(losses[0], losses[1]);
}

TEST_F(TrainE2E, SmallResNetLearnsTheSyntheticImages) {
  std::string data = dir_ + "/images";
  ASSERT_FALSE(MakeImages("images/train", 4, 48, "48x48").empty());
  ASSERT_FALSE(MakeImages("images/val", 4, 15, "48x48", 9).empty());  // 60: not whole batches
  auto o =
      Train({"data.path=" + data + "/train", "data.val_path=" + data + "/val", "data.image_size=32",
             "model.width=0.125", "train.batch_size=16", "train.epochs=6", "optim.lr=0.05",
             "data.threads=1", "train.threads=1", "eval.every_epochs=2"},
            /*tiny=*/false);
  ASSERT_EQ(o.code, 0) << o.err;
  auto run = Store()->GetRun("last").value();
  // Every second epoch of 12 steps, the last one being the evaluation at the
  // end; each reads all 60 held-out images, the short last batch included.
  std::vector<nlohmann::json> evals = Evaluations(run.id);
  ASSERT_EQ(evals.size(), 3u) << o.err;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(evals[i]["step"], 24 * (i + 1));
    EXPECT_EQ(evals[i]["val_samples"], 60);
  }
  EXPECT_GT(evals.back().value("val_accuracy", 0.0), 0.5) << evals.back().dump();  // chance: 0.25
}

// What limits the job now (the diagnosis of its last minute) ends the
// progress line, as on `fullburn run`'s: here one loader thread decoding
// large JPEGs for a tiny model, so the loop waits for data. On a stderr that
// is not a terminal the line is printed every 10 s; the first diagnosis
// comes after 20 s of steps (LiveDiagnosis::kMinS). Time: 32 s of training,
// the least that holds 20 s of steps after start-up and a line after them.
TEST_F(TrainE2E, ProgressLineSaysWhatLimitsTheJobNow) {
  std::string data = MakeImages("big", 4, 50, "384x384");
  ASSERT_FALSE(data.empty());
  auto o = RunToEnd({FULLBURN_BIN, "train", "--store", store_, "data.path=" + data,
                     "data.image_size=32", "data.cache_mb=0", "data.threads=1", "train.threads=1",
                     "model.width=0.125", "train.steps=1000000", "train.time_limit_s=32"},
                    300);
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<std::string> now;  // the progress lines that say it
  std::istringstream lines(o.err);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("step ", 0) == 0 && line.find(" | now: ") != std::string::npos)
      now.push_back(line);
  ASSERT_FALSE(now.empty()) << o.err;
  // input_workers, or input_cpu when other work keeps the cores busy.
  EXPECT_NE(now.back().find(" | now: input_"), std::string::npos) << now.back();
}

// The pid of the `fullburn-train train` process whose environment has
// RANK=<rank> and whose command line names `store`; 0 when none (yet).
pid_t TrainerOfRank(int rank, const std::string& store) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd_file(e.path() / "cmdline"), env_file(e.path() / "environ");
    std::string cmd((std::istreambuf_iterator<char>(cmd_file)), std::istreambuf_iterator<char>());
    std::string env((std::istreambuf_iterator<char>(env_file)), std::istreambuf_iterator<char>());
    if (cmd.find("fullburn-train") == std::string::npos || cmd.find(store) == std::string::npos)
      continue;
    const std::string var = "RANK=" + std::to_string(rank) + std::string(1, '\0');
    if (env.rfind(var, 0) == 0 || env.find(std::string(1, '\0') + var) != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// Rank 0's progress line is diagnosed over every rank's steps (read back from
// the store), so a straggler shows while the job runs. Rank 1 is held
// stopped 60% of the time (SIGSTOP/SIGCONT), as a neighbour on its host
// would slow it, by a duty cycle the test sets: a busy process on rank 1's
// core, as before, slowed it by whatever share the scheduler gave, and
// outside load slowed rank 0 too (once, at 45a2159, too little to tell).
// Rank 0 waits for rank 1 in the all-reduce. Time: 30 s of training (20 s
// of steps before the first diagnosis); about 35-60 s in all.
TEST_F(TrainE2E, ProgressLineNamesAStragglerRank) {
  std::string train = std::string(FULLBURN_BIN) + " train --store " + store_;
  for (const std::string& kv : kTiny) train += " " + kv;
  // A step whose compute outweighs its all-reduce, so the time rank 1 is
  // held stopped falls mostly in its work, not its wait.
  train += " model.hidden=1024 train.batch_size=256 train.steps=1000000 train.time_limit_s=30";
  Background job;
  testing::Start(&job, {FULLBURN_BIN, "launch", "--nproc", "2", "--", "sh", "-c", "exec " + train},
                 "straggler_job");
  auto await = [&](const char* what) {
    for (int i = 0; i < 900 && job.Err().find(what) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  await("step 1/");
  // Rank 1 is stopped 60 ms of every 100 while the ranks train: slower by
  // a duty cycle the test sets, not by how busy the machine is.
  pid_t slow = 0;
  ASSERT_TRUE(testing::WaitFor([&] { return (slow = TrainerOfRank(1, store_)) > 0; }, 30))
      << job.Err();
  std::atomic<bool> done{false};
  std::thread duty([&] {
    while (!done) {
      ::kill(slow, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      ::kill(slow, SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
  });
  await("train.time_limit_s reached");
  done = true;
  duty.join();
  ::kill(slow, SIGCONT);
  ASSERT_EQ(job.Wait(60), 0) << job.Err();
  std::vector<std::string> now;  // the progress lines that say it
  std::istringstream lines(job.Err());
  for (std::string line; std::getline(lines, line);)
    if (line.find("step ") != std::string::npos && line.find(" | now: ") != std::string::npos)
      now.push_back(line);
  ASSERT_FALSE(now.empty()) << job.Err();
  // Rank 0's own steps alone would say communication: rank 1 is the reason.
  EXPECT_NE(now.back().find(" | now: uneven_ranks"), std::string::npos) << now.back();
}

// eval.max_samples: exactly that many, the last batch cut short, over ranks too;
// without it, every held-out sample, though they are not whole batches.
TEST_F(TrainE2E, EvaluationReadsMaxSamples) {
  ASSERT_EQ(Train({"train.steps=3", "eval.max_samples=40"}).code, 0);
  EXPECT_EQ(Evaluation(Store()->GetRun("last").value().id)["val_samples"], 40);
  // 2000 / 8 = 250 held-out samples: 7 batches of 32 and one of 26.
  ASSERT_EQ(Train({"train.steps=3", "data.synthetic_samples=2000"}).code, 0);
  EXPECT_EQ(Evaluation(Store()->GetRun("last").value().id)["val_samples"], 250);
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",       "--",
                                   FULLBURN_BIN, "train",  "-q",      "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"train.steps=3", "eval.max_samples=41"});
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Evaluation(Store()->GetRun("last").value().id)["val_samples"], 41);  // 21 + 20
  argv.back() = "data.synthetic_samples=2002";  // 250 held out: 125 per rank, not whole batches
  o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Evaluation(Store()->GetRun("last").value().id)["val_samples"], 250);
}

// checkpoint.keep_best: the checkpoint of the lowest held-out loss outlives
// the rotation that keeps only the newest.
TEST_F(TrainE2E, KeepBestKeepsTheLowestHeldOutLossCheckpoint) {
  std::string ckdir = dir_ + "/ck";
  auto o = Train({"train.steps=60", "optim.lr=0.8", "optim.warmup_steps=0", "eval.every_steps=5",
                  "checkpoint.every_steps=5", "checkpoint.keep=1", "checkpoint.keep_best=true",
                  "checkpoint.dir=" + ckdir});
  ASSERT_EQ(o.code, 0) << o.err;
  std::vector<nlohmann::json> evals = Evaluations(Store()->GetRun("last").value().id);
  ASSERT_EQ(evals.size(), 12u);
  const nlohmann::json* best = &evals[0];
  double lowest = INFINITY;
  for (const nlohmann::json& e : evals) {
    double loss = e["val_loss"].get<double>();
    EXPECT_EQ(e.value("best", false), loss < lowest) << e.dump();  // marked when it improves
    if (loss < lowest) lowest = loss, best = &e;
  }
  std::set<std::string> files;
  for (const auto& f : fs::directory_iterator(ckdir)) files.insert(f.path().filename().string());
  char name[64];
  std::snprintf(name, sizeof name, "step-%08d.safetensors", (*best)["step"].get<int>());
  std::set<std::string> want = {name, "step-00000060.safetensors"};
  EXPECT_EQ(files, want);
  EXPECT_EQ((*best)["checkpoint"], ckdir + "/" + name);
  // Resumed for 30 more steps: the best so far comes with the checkpoint, so
  // only losses below it are marked (and checkpointed) as the best.
  auto more = Train({"--resume", "last", "train.steps=90"});
  ASSERT_EQ(more.code, 0) << more.err;
  std::vector<nlohmann::json> later = Evaluations(Store()->GetRun("last").value().id);
  ASSERT_EQ(later.size(), 6u);
  for (const nlohmann::json& e : later) {
    double loss = e["val_loss"].get<double>();
    EXPECT_EQ(e.value("best", false), loss < lowest) << e.dump() << " after " << lowest;
    if (loss < lowest) lowest = loss, best = &e;
  }
  // The same folder: the best checkpoint of either run survives, beside the newest.
  files.clear();
  for (const auto& f : fs::directory_iterator(ckdir)) files.insert(f.path().filename().string());
  std::string best_path = (*best)["checkpoint"];
  EXPECT_EQ(files, std::set<std::string>(
                       {fs::path(best_path).filename().string(), "step-00000090.safetensors"}));
  auto none = Train({"train.steps=5", "checkpoint.keep_best=true", "eval.at_end=false"});
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("checkpoint.keep_best needs evaluations"), std::string::npos) << none.err;
}

// Evaluating during training changes nothing in it: eval mode leaves the
// BatchNorm statistics and every random stream alone, so the losses are
// those of a run that never evaluated, step for step.
TEST_F(TrainE2E, EvaluationDuringTrainingChangesNothingInTraining) {
  std::vector<std::string> args = {
      "model.name=resnet18", "data.source=synthetic",  "data.synthetic_samples=256",
      "data.image_size=16",  "data.classes=4",         "model.width=0.125",
      "train.batch_size=16", "train.steps=12",         "train.threads=1",
      "optim.lr=0.05",       "checkpoint.at_end=false"};
  auto plain = Train(args, /*tiny=*/false);
  ASSERT_EQ(plain.code, 0) << plain.err;
  int64_t plain_run = Store()->GetRun("last").value().id;
  args.insert(args.end(), {"eval.every_steps=4", "eval.at_end=false"});
  auto evaluated = Train(args, /*tiny=*/false);
  ASSERT_EQ(evaluated.code, 0) << evaluated.err;
  int64_t eval_run = Store()->GetRun("last").value().id;
  std::vector<nlohmann::json> evals = Evaluations(eval_run);
  ASSERT_EQ(evals.size(), 3u);  // steps 4, 8 and 12 (no extra one at the end)
  EXPECT_EQ(evals[2]["step"], 12);
  EXPECT_TRUE(Evaluations(plain_run).size() == 1u);  // eval.at_end (the default) only
  auto a = Steps(plain_run), b = Steps(eval_run);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
}

// Images generated in device memory (what the GPU throughput runs use), kept
// channels_last: the model learns them like a folder's.
TEST_F(TrainE2E, ResNetLearnsSyntheticImagesHeldInDeviceMemory) {
  auto o = Train(
      {"model.name=resnet18", "data.source=synthetic", "data.synthetic_samples=384",
       "data.image_size=16", "data.classes=4", "model.width=0.125", "model.channels_last=true",
       "train.batch_size=16", "train.epochs=3", "optim.lr=0.05", "train.threads=1"},
      /*tiny=*/false);
  ASSERT_EQ(o.code, 0) << o.err;
  auto run = Store()->GetRun("last").value();
  EXPECT_EQ(Steps(run.id).size(), 3u * 384 / 16);
  EXPECT_GT(Evaluation(run.id).value("val_accuracy", 0.0), 0.5)
      << Evaluation(run.id).dump();  // chance: 0.25
}

// kill -9 in the middle, resume, and the remaining losses are those of an
// uninterrupted run, step for step.
TEST_F(TrainE2E, WrappedTrainerSendsTheSameStepEventsAsThePythonMarkers) {
  // fullburn run -- fullburn train: the outer run gets the trainer's steps
  // through $FULLBURN_EVENTS, the line format python/fullburn_markers.py writes.
  std::vector<std::string> argv = {FULLBURN_BIN, "run",     "-q",  "--interval", "0.5",
                                   "--store",    store_,    "--",  FULLBURN_BIN, "train",
                                   "-q",         "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.push_back("train.steps=40");
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  auto runs = Store()->ListRuns().value();
  ASSERT_EQ(runs.size(), 2u);
  int64_t outer = 0, inner = 0;
  for (const RunInfo& r : runs)
    (nlohmann::json::parse(r.config_json).contains("train") ? inner : outer) = r.id;
  ASSERT_TRUE(outer && inner);
  auto outer_steps = Steps(outer), inner_steps = Steps(inner);
  ASSERT_EQ(outer_steps.size(), 40u);
  ASSERT_EQ(inner_steps.size(), 40u);
  RunInfo outer_run = Store()->GetRun(std::to_string(outer)).value(),
          inner_run = Store()->GetRun(std::to_string(inner)).value();
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(outer_steps[i].step, inner_steps[i].step);
    EXPECT_DOUBLE_EQ(outer_steps[i].loss, inner_steps[i].loss);
    EXPECT_DOUBLE_EQ(*outer_steps[i].forward_s, *inner_steps[i].forward_s);
    // Same moment, each on its own run's clock.
    EXPECT_NEAR(outer_steps[i].t + outer_run.start_time, inner_steps[i].t + inner_run.start_time,
                1e-3);
  }
  bool evaluation = false;
  std::vector<RunEvent> events = Store()->LoadEvents(outer).value();
  for (const RunEvent& e : events) evaluation |= e.kind == "evaluation";
  EXPECT_TRUE(evaluation);
}

// The final checkpoint's model weights, by name.
std::map<std::string, torch::Tensor> CheckpointWeights(RunStore* store, int64_t run) {
  std::vector<CheckpointRecord> cks = store->LoadCheckpoints(run).value();
  std::map<std::string, torch::Tensor> out;
  if (cks.empty()) return out;
  auto state = ReadCheckpointFile(cks.back().path);
  EXPECT_TRUE(state.ok()) << state.status().message();
  if (state.ok())
    for (auto& [name, t] : state->tensors)
      if (name.rfind("model.", 0) == 0) out[name] = t;
  return out;
}

// Runs of `fullburn launch` with the data-parallel test's settings.
class ShardedE2E : public TrainE2E {
 protected:
  int64_t Launch(int ranks, const std::vector<std::string>& base, std::vector<std::string> args) {
    std::vector<std::string> argv = {FULLBURN_BIN, "launch",     "--nproc", std::to_string(ranks),
                                     "--",         FULLBURN_BIN, "train",   "-q",
                                     "--store",    store_};
    argv.insert(argv.end(), base.begin(), base.end());
    argv.insert(argv.end(), args.begin(), args.end());
    auto o = RunToEnd(argv, 300);
    EXPECT_EQ(o.code, 0) << o.err;
    return Store()->GetRun("last").value().id;
  }
  std::vector<double> Rank0Losses(int64_t run) {
    std::vector<double> out;
    for (const StepRecord& r : Steps(run))
      if (r.rank == 0) out.push_back(r.loss);
    return out;
  }
  std::map<std::string, torch::Tensor> LastCheckpoint(int64_t run) {
    std::vector<CheckpointRecord> cks = Store()->LoadCheckpoints(run).value();
    std::map<std::string, torch::Tensor> out;
    if (cks.empty()) return out;
    auto state = ReadCheckpointWithShards(cks.back().path);  // a sharded run's parts too
    if (state.ok())
      for (auto& [name, t] : state->tensors) out[name] = t;
    return out;
  }
  // The sharded run's weights and optimizer state equal the plain run's.
  void ExpectSameState(int64_t plain, int64_t sharded) {
    auto ca = LastCheckpoint(plain), cb = LastCheckpoint(sharded);
    size_t optim_tensors = 0;
    for (auto& [name, t] : ca) {
      if (name.rfind("model.", 0) != 0 && name.rfind("optim.", 0) != 0) continue;
      ASSERT_TRUE(cb.count(name)) << name << ": the sharded checkpoint lacks it";
      EXPECT_LT((t - cb[name]).abs().max().item<double>(), 1e-5) << name;
      optim_tensors += name.rfind("optim.", 0) == 0;
    }
    EXPECT_GT(optim_tensors, 0u);
  }
  // A small GPT (blocks, a tied head, dropout) on a token file made here.
  std::vector<std::string> TinyGpt() {
    std::string tokens = dir_ + "/tokens.bin";
    auto made = RunToEnd({FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "20000"}, 120);
    EXPECT_EQ(made.code, 0) << made.err;
    return {"model.name=gpt",  "data.source=tokens", "data.path=" + tokens, "data.seq_len=32",
            "model.hidden=32", "model.layers=2",     "model.heads=4",       "model.dropout=0.1",
            "train.threads=1", "train.batch_size=4", "optim.name=adamw",    "optim.lr=0.003",
            "train.steps=5"};
  }
  // What each rank held at the end, from its optimizer_state event.
  std::map<int, nlohmann::json> Held(int64_t run) {
    std::map<int, nlohmann::json> held;
    std::vector<RunEvent> events = Store()->LoadEvents(run).value();
    for (const RunEvent& e : events)
      if (e.kind == "optimizer_state") {
        auto j = nlohmann::json::parse(e.data);
        held[j["rank"].get<int>()] = j;
      }
    return held;
  }
};

// dist.shard = optimizer, gradients and full (ZeRO stages 1, 2 and 3): each
// of 3 ranks keeps a third of AdamW's state (and of the gradients, and of
// the parameters) and updates its parameters; losses, weights and the state
// the checkpoint gathers
// equal plain data parallel's with the gradient norm clipped, and a run
// saved by 3 sharded ranks resumes on 2 with the same losses as the plain
// run's does.
TEST_F(ShardedE2E, ShardedStatesTrainLikeDataParallelAndResumeOnTwoRanks) {
  std::vector<std::string> base = kTiny;
  for (const char* a : {"optim.name=adamw", "optim.lr=0.01", "train.batch_size=16",
                        "eval.at_end=false", "train.clip_grad_norm=0.05", "checkpoint.every_steps=2",
                        "checkpoint.keep=2"})
    base.push_back(a);
  int64_t plain = Launch(3, base, {"train.steps=6", "dist.shard=none"});
  std::vector<double> a = Rank0Losses(plain);
  ASSERT_EQ(a.size(), 6u);
  // AdamW's state: 8 bytes per element; gradients 4.
  int64_t params = 0, largest = 0;
  for (auto& [name, t] : LastCheckpoint(plain))
    if (name.rfind("model.", 0) == 0) {
      params += t.numel();
      largest = std::max<int64_t>(largest, t.numel());
    }
  for (const char* shard : {"optimizer", "gradients", "full"}) {
    SCOPED_TRACE(shard);
    const bool full = std::string(shard) == "full", grads = full || std::string(shard) == "gradients";
    int64_t sharded = Launch(3, base, {"train.steps=6", std::string("dist.shard=") + shard});
    std::vector<double> b = Rank0Losses(sharded);
    ASSERT_EQ(b.size(), 6u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;
    ExpectSameState(plain, sharded);
    // Each rank's share: a third of the whole, within the largest parameter's.
    std::map<int, nlohmann::json> held = Held(sharded);
    ASSERT_EQ(held.size(), 3u);
    int64_t state_sum = 0, grad_sum = 0, param_sum = 0;
    for (auto& [rank, j] : held) {
      EXPECT_TRUE(j["sharded"].get<bool>());
      int64_t state = j["state_bytes"].get<int64_t>(), g = j["grad_bytes"].get<int64_t>();
      int64_t weights = j["param_bytes"].get<int64_t>();
      EXPECT_LE(state, 8 * (params / 3 + largest)) << "rank " << rank;
      if (grads) {
        EXPECT_LE(g, 4 * (params / 3 + largest)) << "rank " << rank;
      } else {
        EXPECT_EQ(g, 4 * params) << "rank " << rank;  // stage 1 keeps every gradient
      }
      if (full) {
        EXPECT_LE(weights, 4 * (params / 3 + largest)) << "rank " << rank;
      } else {
        EXPECT_EQ(weights, 4 * params) << "rank " << rank;
      }
      state_sum += state;
      grad_sum += g;
      param_sum += weights;
    }
    EXPECT_EQ(state_sum, 8 * params);
    if (grads) {
      EXPECT_EQ(grad_sum, 4 * params);
    }
    if (full) {
      EXPECT_EQ(param_sum, 4 * params);
    }
    // On disk: the step's file without optimizer state (nor, with full,
    // parameters), and beside it each rank's own part, at most a third plus
    // one parameter's.
    std::string main = Store()->LoadCheckpoints(sharded).value().back().path;
    auto alone = ReadCheckpointFile(main);
    ASSERT_TRUE(alone.ok()) << alone.status().message();
    for (auto& [name, t] : alone->tensors) {
      EXPECT_NE(name.rfind("optim.", 0), 0u) << name;
      if (full) EXPECT_NE(name.rfind("model.", 0), 0u) << name;
    }
    for (int r = 0; r < 3; ++r) {
      auto part = ReadCheckpointFile(OptimizerShardPath(main, r, 3));
      ASSERT_TRUE(part.ok()) << part.status().message();
      int64_t bytes = 0;
      for (auto& [name, t] : part->tensors) bytes += t.numel() * t.element_size();
      EXPECT_LE(bytes, (full ? 12 : 8) * (params / 3 + largest)) << "rank " << r;
      EXPECT_GT(bytes, 0) << "rank " << r;
    }
    // Checkpoints at steps 2, 4, 6, the newest 2 kept: step 2's parts went
    // with its file, and nothing else is left in the folder.
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(fs::path(main).parent_path()))
      files.insert(e.path().filename().string());
    std::set<std::string> expected;
    for (const char* step : {"00000004", "00000006"}) {
      expected.insert(std::string("step-") + step + ".safetensors");
      for (int r = 0; r < 3; ++r)
        expected.insert(std::string("step-") + step + ".optim-" + std::to_string(r) +
                        "-of-3.safetensors");
    }
    EXPECT_EQ(files, expected);

    // Saved by 3 ranks, resumed on 2: the gathered state re-shards.
    int64_t plain2 = Launch(2, base, {"--resume", std::to_string(plain), "train.steps=10"});
    int64_t sharded2 = Launch(2, base,
                              {"--resume", std::to_string(sharded), "train.steps=10",
                               std::string("dist.shard=") + shard});
    std::vector<double> a2 = Rank0Losses(plain2), b2 = Rank0Losses(sharded2);
    ASSERT_EQ(a2.size(), 4u);
    ASSERT_EQ(b2.size(), 4u);
    for (size_t i = 0; i < a2.size(); ++i) EXPECT_NEAR(a2[i], b2[i], 1e-5) << "step " << i + 7;
  }

  // A part missing beside a checkpoint named by hand: a one-line error that
  // names the rank and the files to keep; nothing trains.
  std::string main = Store()->LoadCheckpoints(Launch(3, base, {"train.steps=2",
                                                               "dist.shard=gradients"}))
                         .value()
                         .back()
                         .path;
  fs::remove(OptimizerShardPath(main, 1, 3));
  std::vector<std::string> resume = {FULLBURN_BIN, "launch", "--nproc", "2", "--", FULLBURN_BIN,
                                     "train", "-q", "--store", store_, "--resume", main};
  resume.insert(resume.end(), base.begin(), base.end());
  resume.insert(resume.end(), {"dist.shard=gradients", "train.steps=4"});
  auto broken = RunToEnd(resume, 300);
  EXPECT_NE(broken.code, 0);
  EXPECT_NE(broken.err.find("was saved by 3 ranks, and rank 1's optimizer state is unusable"),
            std::string::npos)
      << broken.err;

  // Checkpoints by the clock would need the ranks to agree on the moment.
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",       "--",
                                   FULLBURN_BIN, "train",  "-q",      "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"dist.shard=gradients", "checkpoint.every_minutes=5"});
  auto refused = RunToEnd(argv, 300);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("use checkpoint.every_steps instead of checkpoint.every_minutes"),
            std::string::npos)
      << refused.err;
}

// Bad input: a shard setting on one rank says it does nothing and trains;
// and a checkpoint saved by 2 sharded ranks resumes there (its parts read
// together, the state whole again).
TEST_F(ShardedE2E, OneRankSaysShardingDoesNothingAndResumesAShardedCheckpoint) {
  std::vector<std::string> base = kTiny;
  base.insert(base.end(), {"optim.name=adamw", "eval.at_end=false", "dist.shard=gradients"});
  int64_t sharded = Launch(2, base, {"train.steps=2"});
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "--store", store_, "--resume",
                                   std::to_string(sharded)};
  argv.insert(argv.end(), base.begin(), base.end());
  argv.push_back("train.steps=4");
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("dist.shard = gradients does nothing on one rank"), std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("resuming from"), std::string::npos) << o.err;
  EXPECT_EQ(Rank0Losses(Store()->GetRun("last").value().id).size(), 2u);  // steps 3 and 4
}

// The parts are written in the background: rank 1's part of step 4 cannot
// be (a directory squats its name), so step 4's file is never written and
// its other part is removed, the run says which rank failed and trains on,
// and the checkpoints before and after are whole and resume.
TEST_F(ShardedE2E, APartThatCannotBeWrittenLosesOnlyItsStep) {
  std::string dir = testing::FreshTestDir("fb_parts_fail");
  std::string main4 = CheckpointPath(dir, 4);
  fs::create_directories(OptimizerShardPath(main4, 1, 2));
  fs::create_directories(OptimizerShardPath(main4, 1, 2) + "/x");  // not removable by a rename
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",       "--",
                                   FULLBURN_BIN, "train",  "-q",      "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"optim.name=adamw", "eval.at_end=false", "dist.shard=optimizer",
                           "checkpoint.every_steps=2", "checkpoint.keep=5", "train.steps=6",
                           "checkpoint.dir=" + dir});
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("rank 1: this rank's part of the checkpoint at step 4 failed"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("checkpoint at step 4 not written: rank 1 could not write its part"),
            std::string::npos)
      << o.err;
  int64_t run = Store()->GetRun("last").value().id;
  std::vector<int64_t> steps;
  std::vector<CheckpointRecord> cks = Store()->LoadCheckpoints(run).value();
  for (const CheckpointRecord& c : cks) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 6}));
  EXPECT_FALSE(fs::exists(main4));
  EXPECT_FALSE(fs::exists(OptimizerShardPath(main4, 0, 2)));
  EXPECT_FALSE(fs::exists(OptimizerShardPath(main4, 1, 2) + ".failed"));
  for (int64_t step : {2, 6}) {
    auto whole = ReadCheckpointWithShards(CheckpointPath(dir, step));
    EXPECT_TRUE(whole.ok()) << whole.status().message();
  }
  // The newest checkpoint resumes on 2 ranks.
  int64_t resumed = Launch(2, kTiny,
                           {"optim.name=adamw", "eval.at_end=false", "dist.shard=optimizer",
                            "train.steps=8", "--resume", std::to_string(run)});
  EXPECT_EQ(Rank0Losses(resumed).size(), 2u);  // steps 7 and 8
}

// A small GPT (token file, dropout, two micro-batches a step) on 3 and 2
// ranks: 5 steps with each stage give the plain run's losses and weights.
TEST_F(ShardedE2E, ShardedGptTrainsLikeDataParallelOnThreeAndTwoRanks) {
  std::vector<std::string> base = TinyGpt();
  base.insert(base.end(), {"eval.at_end=false", "train.accumulate=2"});
  // 3 ranks first, so the 2-rank plain run's checkpoint is the one compared below.
  int64_t plain = 0;
  for (int ranks : {3, 2}) {
    plain = Launch(ranks, base, {"dist.shard=none"});
    std::vector<double> a = Rank0Losses(plain);
    ASSERT_EQ(a.size(), 5u);
    // full twice: with the next block's gather started while one computes
    // (dist.prefetch), and each block gathered when used (the default; the
    // last run, for export-weights below).
    for (std::string shard : {"optimizer", "gradients", "full:prefetch", "full"}) {
      SCOPED_TRACE(shard + " on " + std::to_string(ranks) + " ranks");
      const bool prefetch = shard == "full:prefetch";
      std::vector<std::string> args = {"dist.shard=" + shard.substr(0, shard.find(':'))};
      if (prefetch) args.push_back("dist.prefetch=true");
      int64_t sharded = Launch(ranks, base, args);
      std::vector<double> b = Rank0Losses(sharded);
      ASSERT_EQ(b.size(), 5u);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;
      ExpectSameState(plain, sharded);
      if (shard.rfind("full", 0) != 0) continue;
      // 5 steps of 2 micro-batches, each gathering both blocks twice
      // (forward 0, 1; backward's recomputes 1, 0): with prefetch the second
      // of each pass was already filled, 2 (blocks - 1) per micro-batch.
      auto held = Held(sharded);
      ASSERT_EQ(held.size(), static_cast<size_t>(ranks));
      for (auto& [rank, j] : held) {
        EXPECT_EQ(j["block_gathers"].get<int64_t>(), 5 * 2 * 4) << "rank " << rank;
        EXPECT_EQ(j["prefetched_gathers"].get<int64_t>(), prefetch ? 5 * 2 * 2 : 0)
            << "rank " << rank;
      }
    }
  }
  // With full, the weights are only in the ranks' parts: export-weights
  // reads them together, every tensor the plain run's.
  int64_t full = Store()->GetRun("last").value().id;
  std::string out = dir_ + "/weights.safetensors";
  auto e = RunToEnd({FULLBURN_BIN, "export-weights",
                     Store()->LoadCheckpoints(full).value().back().path, out});
  ASSERT_EQ(e.code, 0) << e.err;
  auto exported = ReadCheckpointFile(out);
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  std::map<std::string, torch::Tensor> weights(exported->tensors.begin(), exported->tensors.end());
  size_t compared = 0;
  for (auto& [name, t] : LastCheckpoint(plain))
    if (name.rfind("model.", 0) == 0) {
      ASSERT_TRUE(weights.count(name.substr(6))) << name;
      EXPECT_LT((t - weights[name.substr(6)]).abs().max().item<double>(), 1e-5) << name;
      ++compared;
    }
  EXPECT_EQ(compared, weights.size());

  // A model without blocks to gather: one line naming the settings that work,
  // before a batch-size search would spend minutes.
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2", "--", FULLBURN_BIN,
                                   "train", "-q", "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"model.name=lstm", "dist.shard=full", "train.batch_size=auto"});
  auto refused = RunToEnd(argv, 300);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("lstm has no blocks to gather: use dist.shard = gradients"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("searching for the largest micro-batch"), std::string::npos)
      << refused.err;
}

// dist.shard = full with model.checkpoint = every_2 on a 4-block GPT: the
// model gathers 2 blocks at a time, and dist.prefetch fills the next pair
// while one computes: losses and state equal plain data parallel's, and of
// 4 pair gathers per micro-batch (forward 0-1, 2-3; backward 2-3, 0-1) the
// second of each pass was filled by a prefetch.
TEST_F(ShardedE2E, StageThreePrefetchesTheNextSegmentOfBlocks) {
  std::vector<std::string> base = TinyGpt();
  base.insert(base.end(), {"eval.at_end=false", "train.accumulate=2", "model.layers=4",
                           "model.checkpoint=every_2"});
  int64_t plain = Launch(2, base, {"dist.shard=none"});
  int64_t sharded = Launch(2, base, {"dist.shard=full", "dist.prefetch=true"});
  std::vector<double> a = Rank0Losses(plain), b = Rank0Losses(sharded);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;
  ExpectSameState(plain, sharded);
  auto held = Held(sharded);
  ASSERT_EQ(held.size(), 2u);
  for (auto& [rank, j] : held) {
    EXPECT_EQ(j["block_gathers"].get<int64_t>(), 5 * 2 * 4) << "rank " << rank;
    EXPECT_EQ(j["prefetched_gathers"].get<int64_t>(), 5 * 2 * 2) << "rank " << rank;
  }
}

// dist.shard = full without a probe never holds the model whole on the
// device: the model waits in host memory and each rank moves only its own
// parameters there; sharded gradients have no buckets between steps. On the
// CPU, host and device are one budget, so what shows is that no rank holds
// every weight and every gradient at once: 2 ranks train an 8-block GPT
// (plain SGD) under a budget below the two together, where a start that
// allocated every gradient's bucket ran out of memory; unsharded, the
// start's error names dist.shard = full.
TEST_F(ShardedE2E, StageThreeStartsWhereEveryWeightAndGradientDoNotFitTogether) {
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",   "--",
                                   FULLBURN_BIN, "train",  "--store", store_};
  for (const std::string& a : TinyGpt()) argv.push_back(a);
  const int64_t budget_mb = 36;
  argv.insert(argv.end(),
              {"model.hidden=256", "model.layers=8", "model.dropout=0", "optim.name=sgd",
               "optim.momentum=0", "optim.lr=0.01", "train.steps=3", "eval.at_end=false",
               "checkpoint.at_end=false", "dist.bucket_mb=1", "dist.shard=full",
               "train.memory_budget_mb=" + std::to_string(budget_mb)});
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("dist.shard = full: each rank moved only its own parameters to cpu"),
            std::string::npos)
      << o.err;
  int64_t run = Store()->GetRun("last").value().id;
  EXPECT_EQ(Rank0Losses(run).size(), 3u);
  auto held = Held(run);
  ASSERT_EQ(held.size(), 2u);
  int64_t weights = 0, grads = 0;
  for (auto& [rank, j] : held) {
    weights += j["param_bytes"].get<int64_t>();
    grads += j["grad_bytes"].get<int64_t>();
    // The hooks attached after the move fire during backward.
    EXPECT_GT(j["buckets_in_backward"].get<int64_t>(), 0) << "rank " << rank;
  }
  // The budget holds the weights but not the weights and gradients together.
  EXPECT_GT(weights + grads, budget_mb << 20);
  EXPECT_LT(weights, budget_mb << 20);

  // A memory report's probe needs them whole: it is left out, said on one
  // line, and the run starts from the shares as without it (before, the
  // model went whole to the device first: on a GPU that is the run's end).
  std::vector<std::string> report = argv;
  report.push_back("train.memory_report=true");
  auto reported = RunToEnd(report, 300);
  ASSERT_EQ(reported.code, 0) << reported.err;
  EXPECT_NE(reported.err.find("dist.shard = full: no memory report: the probe needs the model "
                              "whole on each device, and it does not fit (gradients beside the "
                              "weights"),
            std::string::npos)
      << reported.err;
  EXPECT_NE(reported.err.find("each rank moved only its own parameters to cpu"), std::string::npos)
      << reported.err;
  EXPECT_EQ(Rank0Losses(Store()->GetRun("last").value().id).size(), 3u);
  // The search cannot run from the shares: refused before it starts.
  report.back() = "train.batch_size=auto";
  auto searched = RunToEnd(report, 300);
  EXPECT_EQ(searched.code, 2) << searched.err;
  EXPECT_NE(searched.err.find("train.batch_size = auto with dist.shard = full searches with the "
                              "model whole on each device, and it does not fit"),
            std::string::npos)
      << searched.err;
  EXPECT_NE(searched.err.find("set train.batch_size to a number"), std::string::npos)
      << searched.err;

  // Unsharded, the ranks hold both from the start: out of memory before
  // training, with the setting that shares them named.
  *std::find(argv.begin(), argv.end(), "dist.shard=full") = "dist.shard=none";
  auto plain = RunToEnd(argv, 300);
  EXPECT_NE(plain.code, 0);
  EXPECT_NE(plain.err.find("do not fit (one allocation of"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("dist.shard = full gives each of the 2 ranks a share of the weights, "
                           "gradients and optimizer state"),
            std::string::npos)
      << plain.err;
}

// dist.offload = optimizer: the state and the update on the host copy give
// the same losses, weights and state as the update in place, alone and with
// ZeRO stage 2 on 2 ranks; an offloaded checkpoint resumes like a plain one;
// a host without room for it is refused before training with the amounts.
TEST_F(ShardedE2E, OffloadedOptimizerTrainsLikeTheUpdateInPlace) {
  std::vector<std::string> base = kTiny;
  for (const char* a : {"optim.name=adamw", "optim.lr=0.01", "eval.at_end=false",
                        "checkpoint.every_steps=3", "train.clip_grad_norm=0.05"})
    base.push_back(a);
  int64_t plain = Launch(1, base, {"train.steps=6"});
  int64_t offloaded = Launch(1, base, {"train.steps=6", "dist.offload=optimizer"});
  std::vector<double> a = Rank0Losses(plain), b = Rank0Losses(offloaded);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << "step " << i + 1;
  ExpectSameState(plain, offloaded);
  std::vector<double> a2 = Rank0Losses(Launch(1, base, {"--resume", std::to_string(plain),
                                                        "train.steps=9"}));
  std::vector<double> b2 = Rank0Losses(Launch(
      1, base, {"--resume", std::to_string(offloaded), "train.steps=9", "dist.offload=optimizer"}));
  ASSERT_EQ(a2.size(), 3u);
  ASSERT_EQ(b2.size(), 3u);
  for (size_t i = 0; i < a2.size(); ++i) EXPECT_NEAR(a2[i], b2[i], 1e-6) << "step " << i + 7;

  // A GPT (blocks, the tied head) whose next forward overlaps the host
  // update, each block waiting for its own parameters.
  std::vector<std::string> gpt = TinyGpt();
  gpt.push_back("eval.at_end=true");
  int64_t gpt_plain = Launch(1, gpt, {});
  int64_t gpt_offloaded = Launch(1, gpt, {"dist.offload=optimizer"});
  std::vector<double> c = Rank0Losses(gpt_plain), d = Rank0Losses(gpt_offloaded);
  ASSERT_EQ(c.size(), 5u);
  ASSERT_EQ(d.size(), 5u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], d[i], 1e-6) << "gpt step " << i + 1;
  ExpectSameState(gpt_plain, gpt_offloaded);

  int64_t sharded = Launch(2, base, {"train.steps=6", "dist.shard=gradients"});
  int64_t both = Launch(2, base, {"train.steps=6", "dist.shard=gradients", "dist.offload=optimizer"});
  ExpectSameState(sharded, both);
  for (auto& [rank, j] : Held(both)) EXPECT_TRUE(j.value("offloaded", false)) << j.dump();
  for (auto& [rank, j] : Held(sharded)) EXPECT_FALSE(j.value("offloaded", true)) << j.dump();

  // 4.3M parameters: 65 MiB on the host for the offload, 44 MiB left of 60.
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "-q", "--store", store_,
                                   "model.name=mlp", "data.source=synthetic",
                                   "data.synthetic_samples=256", "data.features=32",
                                   "model.hidden=2048", "model.layers=2", "train.threads=1",
                                   "optim.name=adamw", "train.steps=2",
                                   "train.memory_budget_mb=60", "dist.offload=optimizer"};
  auto refused = RunToEnd(argv, 120);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("dist.offload = optimizer needs 65.4 MiB of host memory on this rank"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("step 1"), std::string::npos) << "it trained: " << refused.err;
}

// The memory model (docs/memory.md) against the counting allocator: each
// rank's predicted peak within 15% of the measured one, for every
// dist.shard setting on 2 ranks and for checkpointing on one; and sharding
// the gradients lowers both the prediction and the measurement.
TEST_F(ShardedE2E, MemoryModelPredictsEachRanksPeakWithin15Percent) {
  std::string tokens = dir_ + "/tokens.bin";
  auto made = RunToEnd({FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "40000"}, 120);
  ASSERT_EQ(made.code, 0) << made.err;
  std::vector<std::string> base = {
      "model.name=gpt",     "data.source=tokens",     "data.path=" + tokens,
      "data.seq_len=64",    "model.hidden=128",       "model.layers=3",
      "model.heads=4",      "train.threads=1",        "train.batch_size=8",
      "optim.name=adamw",   "eval.at_end=false",      "train.steps=3",
      "dist.bucket_mb=0.1", "train.memory_report=true"};
  auto memory_events = [&](int64_t run) {
    std::vector<nlohmann::json> out;
    std::vector<RunEvent> events = Store()->LoadEvents(run).value();
    for (const RunEvent& e : events)
      if (e.kind == "memory") out.push_back(nlohmann::json::parse(e.data));
    return out;
  };
  std::map<std::string, std::pair<int64_t, int64_t>> by_setting;  // predicted, measured
  auto check = [&](int64_t run, size_t ranks, const std::string& label) {
    std::vector<nlohmann::json> events = memory_events(run);
    ASSERT_EQ(events.size(), ranks) << label;
    for (const nlohmann::json& j : events) {
      int64_t predicted = j["predicted"]["total"].get<int64_t>();
      int64_t measured = j["measured_peak_bytes"].get<int64_t>();
      ASSERT_GT(measured, 0) << label;
      double ratio = static_cast<double>(predicted) / measured;
      EXPECT_NEAR(ratio, 1.0, 0.15) << label << " rank " << j["rank"] << ": predicted "
                                    << predicted << ", measured " << measured << "\n"
                                    << j.dump();
      by_setting[label] = {predicted, measured};
    }
  };
  for (const char* shard : {"none", "optimizer", "gradients", "full"}) {
    SCOPED_TRACE(shard);
    check(Launch(2, base, {std::string("dist.shard=") + shard}), 2, shard);
  }
  EXPECT_LT(by_setting["full"].first, by_setting["gradients"].first);
  EXPECT_LT(by_setting["full"].second, by_setting["gradients"].second);
  EXPECT_LT(by_setting["gradients"].first, by_setting["none"].first);
  EXPECT_LT(by_setting["gradients"].second, by_setting["none"].second);
  EXPECT_LT(by_setting["optimizer"].second, by_setting["none"].second);
  for (const char* ckpt : {"none", "blocks"}) {
    SCOPED_TRACE(ckpt);
    std::vector<std::string> argv = {FULLBURN_BIN, "train", "-q", "--store", store_};
    argv.insert(argv.end(), base.begin(), base.end());
    argv.push_back(std::string("model.checkpoint=") + ckpt);
    auto o = RunToEnd(argv, 300);
    ASSERT_EQ(o.code, 0) << o.err;
    check(Store()->GetRun("last").value().id, 1, std::string("one rank, ") + ckpt);
  }
  EXPECT_LT(by_setting["one rank, blocks"].second, 0.7 * by_setting["one rank, none"].second);
  // The same narrow activations on 2 ranks with stage 2: after the update
  // the owners broadcast the new weights, which once took a copy of every
  // weight at once (the peak, 25% over the prediction at GPT-2's shape).
  check(Launch(2, base,
               {"model.hidden=384", "data.seq_len=32", "train.batch_size=2",
                "model.checkpoint=blocks", "dist.shard=gradients"}),
        2, "stage 2, the broadcast after the update");
  // Wider and with few activations (checkpointed, 2 x 32 tokens), the
  // multi-tensor AdamW's temporary (a denominator for every parameter at
  // once) is the peak, after backward: on an H200 the model missed it by 16%.
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "-q", "--store", store_};
  argv.insert(argv.end(), base.begin(), base.end());
  for (const char* o : {"model.hidden=384", "data.seq_len=32", "train.batch_size=2",
                        "model.checkpoint=blocks", "optim.foreach=true"})
    argv.push_back(o);
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  check(Store()->GetRun("last").value().id, 1, "one rank, the update's peak");
  std::vector<nlohmann::json> events = memory_events(Store()->GetRun("last").value().id);
  ASSERT_EQ(events.size(), 1u);
  const nlohmann::json& parts = events[0]["predicted"];
  EXPECT_GT(parts["update"].get<int64_t>(),
            parts["gradients"].get<int64_t>() + parts["activations"].get<int64_t>())
      << parts.dump();
}

// train.batch_size = auto with dist.shard = full on 2 ranks: each trial
// steps as the run's rank will, alone (DataParallel::SetLocal: no rank waits
// in a collective for one that ran out of memory), so it holds the rank's
// share of the weights, gradients and optimizer state. Under the same
// 100 MiB, unsharded data parallel's trials, which hold all of them, fit up
// to 15 (out of memory at 16); stage 3's fit up to 58 (60 does not; the
// memory model's largest for the share is 54, with its 10% headroom), and
// the run trains at the size chosen, under the budget.
TEST_F(ShardedE2E, SearchTrialsHoldTheRanksShare) {
  std::string tokens = dir_ + "/tokens.bin";
  auto made = RunToEnd({FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "100000"}, 120);
  ASSERT_EQ(made.code, 0) << made.err;
  std::vector<std::string> base = {
      "model.name=gpt",         "data.source=tokens",  "data.path=" + tokens,
      "data.seq_len=32",        "model.hidden=256",    "model.layers=4",
      "model.heads=4",          "train.threads=1",     "optim.name=adamw",
      "eval.at_end=false",      "train.steps=2",       "train.batch_size=auto",
      "train.memory_budget_mb=100"};
  struct Search {
    std::map<int, int64_t> largest_fit, first_oom, chosen;
    std::map<int, nlohmann::json> memory;
  };
  auto search = [&](int64_t run) {
    Search out;
    std::vector<RunEvent> events = Store()->LoadEvents(run).value();
    for (const RunEvent& e : events) {
      auto j = nlohmann::json::parse(e.data, nullptr, false);
      if (e.kind == "batch_size_trial") {
        int r = j.value("rank", 0);
        int64_t batch = j["batch"].get<int64_t>();
        if (j["fits"].get<bool>()) out.largest_fit[r] = std::max(out.largest_fit[r], batch);
        if (j["error"] == "out of memory" && (!out.first_oom.count(r) || batch < out.first_oom[r]))
          out.first_oom[r] = batch;
      } else if (e.kind == "batch_size_chosen") {
        out.chosen[j["rank"].get<int>()] = j["batch"].get<int64_t>();
      } else if (e.kind == "memory") {
        out.memory[j["rank"].get<int>()] = j;
      }
    }
    return out;
  };
  int64_t run = Launch(2, base, {"dist.shard=full"});
  Search full = search(run);
  Search whole = search(Launch(2, base, {"dist.shard=none"}));
  ASSERT_EQ(full.chosen.size(), 2u);
  EXPECT_EQ(full.chosen[0], full.chosen[1]);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_TRUE(full.first_oom.count(r) && whole.first_oom.count(r))
        << "a search did not run out of memory: the budget is too loose";
    // (Memory decides these; which size that fits ran fastest is the
    // machine's, so the chosen one is only checked against them.)
    EXPECT_GE(full.largest_fit[r], 3 * whole.largest_fit[r]);
    EXPECT_LE(full.chosen[r], full.largest_fit[r]);
    ASSERT_TRUE(full.memory.count(r));
    EXPECT_EQ(full.memory[r]["batch"].get<int64_t>(), full.chosen[r]);
    EXPECT_EQ(full.memory[r]["limit_bytes"].get<int64_t>(), int64_t{100} << 20);
  }
  // 2 steps on each rank at the chosen size: no step ran out of memory.
  EXPECT_EQ(Steps(run).size(), 4u);

  // At 54 with train.memory_report: the probe, which runs before the model
  // is sharded and so holds every weight and gradient whole, runs out of
  // memory; read at a quarter of it, each rank's prediction is within 15% of
  // its measured peak.
  std::vector<std::string> fixed = base;
  std::replace(fixed.begin(), fixed.end(), std::string("train.batch_size=auto"),
               std::string("train.batch_size=54"));
  fixed.push_back("train.memory_report=true");
  int64_t again = Launch(2, fixed, {"dist.shard=full"});
  int reports = 0;
  std::vector<RunEvent> again_events = Store()->LoadEvents(again).value();
  for (const RunEvent& e : again_events) {
    if (e.kind != "memory") continue;
    auto j = nlohmann::json::parse(e.data);
    ++reports;
    EXPECT_EQ(j["probed_at"][1].get<int64_t>(), 54 / 4) << j.dump();  // the retry's size
    double ratio = j["predicted"]["total"].get<double>() / j["measured_peak_bytes"].get<double>();
    EXPECT_NEAR(ratio, 1.0, 0.15) << j.dump();
  }
  EXPECT_EQ(reports, 2);

  // At 43 MiB not even batch 1 fits a trial: on a CPU the search's copy of
  // the weights (12.3 MiB, to put them back afterwards) takes from the same
  // budget. The message names the way out, which trains.
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2", "--", FULLBURN_BIN,
                                   "train",      "-q",     "--store", store_};
  argv.insert(argv.end(), base.begin(), base.end());
  argv.push_back("train.memory_budget_mb=43");
  argv.push_back("dist.shard=full");
  auto tight = RunToEnd(argv, 300);
  EXPECT_NE(tight.code, 0);
  EXPECT_NE(tight.err.find("or set train.batch_size by hand (the search holds a copy of the "
                           "weights, 12.3 MiB, in the same train.memory_budget_mb"),
            std::string::npos)
      << tight.err;
  std::replace(argv.begin(), argv.end(), std::string("train.batch_size=auto"),
               std::string("train.batch_size=4"));
  auto by_hand = RunToEnd(argv, 300);
  EXPECT_EQ(by_hand.code, 0) << by_hand.err;
}

// Out of memory in a step under a budget: the error and the diagnosis give
// the memory model's parts and name the setting that fits; with
// train.batch_size = auto the search prints the largest micro-batch by
// setting and the diagnosis says which one would raise it.
// model.fused_loss where the logits are what fills the memory: a GPT with a
// vocabulary of 8,192 runs out of a 240 MiB budget at micro-batch 32 (its
// fp32 log-softmax and gradient, 128 MiB each); the error and the diagnosis
// name model.fused_loss (the probe measured it), and with the loss fused
// into the output layer it trains.
TEST_F(ShardedE2E, FusedLossTrainsWhereTheLogitsRanOutOfMemory) {
  std::string tokens = dir_ + "/tokens8k.bin";
  auto made = RunToEnd(
      {FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "200000", "--vocab", "8192"}, 120);
  ASSERT_EQ(made.code, 0) << made.err;
  std::vector<std::string> argv = {FULLBURN_BIN,         "train",           "-q",
                                   "--store",            store_,            "model.name=gpt",
                                   "data.source=tokens", "data.path=" + tokens, "data.vocab=8192",
                                   "data.seq_len=128",   "model.hidden=64", "model.layers=2",
                                   "model.heads=4",      "train.threads=1", "optim.name=adamw",
                                   "eval.at_end=false",  "train.steps=2",   "train.batch_size=32",
                                   "train.memory_budget_mb=240"};
  auto plain = RunToEnd(argv, 300);
  EXPECT_EQ(plain.code, 1);
  EXPECT_NE(plain.err.find("out of memory at step 1 with micro-batch 32"), std::string::npos)
      << plain.err;
  EXPECT_NE(plain.err.find("model.fused_loss = true fits"), std::string::npos) << plain.err;
  auto d = RunToEnd({FULLBURN_BIN, "diagnose", "--store", store_, "last"}, 60);
  EXPECT_NE(d.out.find("fix: model.fused_loss = true (predicted"), std::string::npos) << d.out;
  argv.push_back("model.fused_loss=true");
  auto fused = RunToEnd(argv, 300);
  EXPECT_EQ(fused.code, 0) << fused.err;
}

// The memory model with model.fused_loss: the loss holds one chunk's logits
// (1,024 rows on a CPU at a vocabulary of 8,192: 8 samples of 128 positions)
// however large the batch, so the activation line bends there. Fitted at
// micro-batch 4 (and probed at 16), it predicts micro-batch 32's measured
// peak within 15%; a straight line through 2 and 4 would predict about 3x.
TEST_F(ShardedE2E, FusedLossMemoryModelBendsAtOneChunk) {
  std::string tokens = dir_ + "/tokens8k.bin";
  auto made = RunToEnd(
      {FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "100000", "--vocab", "8192"}, 120);
  ASSERT_EQ(made.code, 0) << made.err;
  auto report = [&](int batch) {
    std::vector<std::string> argv = {
        FULLBURN_BIN,        "train",           "-q",
        "--store",           store_,            "model.name=gpt",
        "data.source=tokens", "data.path=" + tokens, "data.vocab=8192",
        "data.seq_len=128",  "model.hidden=64", "model.layers=2",
        "model.heads=4",     "train.threads=1", "optim.name=adamw",
        "eval.at_end=false", "train.steps=2",   "model.fused_loss=true",
        "train.memory_report=true", "train.batch_size=" + std::to_string(batch)};
    auto o = RunToEnd(argv, 300);
    EXPECT_EQ(o.code, 0) << o.err;
    std::vector<RunEvent> events =
        Store()->LoadEvents(Store()->GetRun("last").value().id).value();
    for (const RunEvent& e : events)
      if (e.kind == "memory") return nlohmann::json::parse(e.data);
    return nlohmann::json();
  };
  nlohmann::json small = report(4), large = report(32);
  ASSERT_TRUE(small.is_object() && large.is_object());
  const nlohmann::json& fit = small["activation_fit"]["none"];
  EXPECT_EQ(fit["knee"].get<int64_t>(), 8) << fit.dump();
  EXPECT_LT(fit["per_sample_above"].get<double>(), fit["per_sample"].get<double>() / 4)
      << fit.dump();
  const nlohmann::json& parts = small["predicted"];
  double at32 = parts["weights"].get<double>() + parts["gradients"].get<double>() +
                parts["optimizer"].get<double>() + fit["fixed"].get<double>() +
                fit["per_sample"].get<double>() * 8 + fit["per_sample_above"].get<double>() * 24;
  double measured = large["measured_peak_bytes"].get<double>();
  EXPECT_NEAR(at32 / measured, 1.0, 0.15) << small.dump() << "\n" << large.dump();
}

TEST_F(ShardedE2E, OutOfMemoryNamesTheSettingThatFits) {
  std::string tokens = dir_ + "/tokens.bin";
  auto made = RunToEnd({FULLBURN_BIN, "make-dataset", "tokens", tokens, "--tokens", "40000"}, 120);
  ASSERT_EQ(made.code, 0) << made.err;
  std::vector<std::string> argv = {FULLBURN_BIN,       "train",          "-q",
                                   "--store",          store_,           "model.name=gpt",
                                   "data.source=tokens", "data.path=" + tokens, "data.seq_len=128",
                                   "model.hidden=128", "model.layers=4", "model.heads=4",
                                   "train.threads=1",  "optim.name=adamw", "eval.at_end=false",
                                   "train.steps=2",    "train.memory_budget_mb=80"};
  std::vector<std::string> fixed = argv;
  fixed.push_back("train.batch_size=16");
  auto o = RunToEnd(fixed, 300);
  EXPECT_EQ(o.code, 1);
  EXPECT_NE(o.err.find("out of memory at step 1 with micro-batch 16 (memory model: "),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("model.checkpoint = blocks fits"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("train.batch_size = 8 with train.accumulate = 2 keeps the effective batch"),
            std::string::npos)
      << o.err;
  auto d = RunToEnd({FULLBURN_BIN, "diagnose", "--store", store_, "last"}, 60);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("[memory_pressure] Out of memory at micro-batch 16"), std::string::npos)
      << d.out;
  EXPECT_NE(d.out.find("fix: model.checkpoint = blocks (predicted"), std::string::npos) << d.out;

  std::vector<std::string> search = argv;
  search.push_back("train.batch_size=auto");
  search.erase(std::find(search.begin(), search.end(), "-q"));
  auto a = RunToEnd(search, 300);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("the largest micro-batch by memory setting"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("model.checkpoint = blocks"), std::string::npos) << a.err;
  d = RunToEnd({FULLBURN_BIN, "diagnose", "--store", store_, "last"}, 60);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("held down by memory"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("fix: model.checkpoint = blocks: micro-batch up to"), std::string::npos)
      << d.out;
}

// Two "nodes": the ranks are started by hand (torchrun's variables) with
// stores on different paths, as on machines that share no disk. Rank 1's
// steps and process telemetry reach rank 0's run through the rendezvous.
TEST_F(TrainE2E, RanksWithTheirOwnStoreSendTheirRecordsToRankZero) {
  std::string port = FreeLoopbackPort();
  ASSERT_FALSE(port.empty());
  std::string other = dir_ + "/node1";
  fs::create_directories(other);
  // Node 1 has a GPU (the fake NVML, the hardware boundary); node 0 has none.
  std::string nvml_script = other + "/nvml.json";
  std::ofstream(nvml_script)
      << R"({"gpus": [{"name": "Node1 GPU", "uuid": "GPU-node1", "util": [40],
    "mem_util": [5], "mem_used": [1073741824], "mem_total": 8589934592, "power_mw": [200000], "temp": [60],
    "throttle": [0]}]})";
  testing::Background ranks[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {
        "env",          "RANK=" + std::to_string(r), "WORLD_SIZE=2",
        "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1",     "MASTER_PORT=" + port};
    if (r == 1) {
      argv.push_back(std::string("FULLBURN_NVML_LIBRARY=") + FAKE_NVML);
      argv.push_back("FAKE_NVML_SCRIPT=" + nvml_script);
    }
    for (const std::string& a : {std::string(FULLBURN_BIN), std::string("train"), std::string("-q"),
                                 std::string("--store"), r == 0 ? store_ : other + "/runs.db"})
      argv.push_back(a);
    argv.insert(argv.end(), kTiny.begin(), kTiny.end());
    argv.push_back("train.steps=300");
    testing::Start(&ranks[r], argv,
                   "fwd_rank" + std::to_string(r) + "_" + std::to_string(::getpid()));
  }
  ASSERT_EQ(ranks[1].Wait(300), 0) << ranks[1].Err();
  ASSERT_EQ(ranks[0].Wait(60), 0) << ranks[0].Err();
  EXPECT_NE(ranks[1].Err().find("records go to rank 0"), std::string::npos) << ranks[1].Err();
  auto store = Store();
  RunData data = store->LoadRun("last").value();
  int per_rank[2] = {0, 0};
  for (const StepRecord& r : data.steps) per_rank[r.rank == 1]++;
  EXPECT_EQ(per_rank[0], 300);
  EXPECT_EQ(per_rank[1], 300);
  EXPECT_TRUE(data.samples.count("proc.rss_bytes"));
  EXPECT_TRUE(data.samples.count("rank1.proc.rss_bytes"));
  // Rank 1 is the first rank of its node (LOCAL_RANK=0): it samples that
  // node's host too, under its rank, and the report charts it. (Memory, not
  // CPU: CPU shares need two samples, and this run may last one second.)
  EXPECT_FALSE(data.samples["rank1.host.mem_used_bytes"].empty());
  EXPECT_FALSE(data.samples["rank1.host.mem_total_bytes"].empty());
  EXPECT_FALSE(data.samples["host.mem_used_bytes"].empty());
  // Node 1's GPU is sampled under rank 1 and named in the run with its rank;
  // node 0 has none and none is invented.
  ASSERT_FALSE(data.samples["rank1.gpu0.util"].empty());
  EXPECT_DOUBLE_EQ(data.samples["rank1.gpu0.util"].front().v, 40);
  EXPECT_EQ(data.samples.count("gpu0.util"), 0u);
  nlohmann::json gpus = nlohmann::json::parse(data.run.gpus_json);
  ASSERT_EQ(gpus.size(), 1u) << data.run.gpus_json;
  EXPECT_EQ(gpus[0].value("uuid", ""), "GPU-node1");
  EXPECT_EQ(gpus[0].value("rank", -1), 1);
  std::string html = dir_ + "/nodes.html";
  auto report = RunToEnd(
      {FULLBURN_BIN, "report", std::to_string(data.run.id), "--store", store_, "-o", html});
  ASSERT_EQ(report.code, 0) << report.err;
  EXPECT_NE(testing::ReadText(html).find("\"rank1.host.mem_used_bytes\""), std::string::npos);
  // Rank 1's own store holds no run: nothing was written into a run it does not have.
  auto own = RunStore::Open(other + "/runs.db");
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE((*own)->ListRuns().value().empty());
}

TEST_F(TrainE2E, TwoRanksTrainLikeOneProcessOnTheGlobalBatch) {
  // One process, batch 32 vs two ranks of 16 (fullburn launch, Gloo on loopback).
  ASSERT_EQ(Train({"train.steps=20", "train.batch_size=32"}).code, 0);
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",   "--",
                                   FULLBURN_BIN, "train",  "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  for (const char* a : {"train.steps=20", "train.batch_size=16", "dist.bucket_mb=0.004",
                        "dist.first_bucket_mb=0.002"})
    argv.push_back(a);
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  // Rank 0's summary is the job's, and it waited for rank 1's last records.
  EXPECT_NE(o.err.find("steps:   20 on 2 ranks (640 samples)"), std::string::npos) << o.err;
  auto store = Store();
  std::vector<RunInfo> runs = store->ListRuns().value();
  ASSERT_EQ(runs.size(), 2u) << "the ranks record into one run";
  int64_t single = std::min(runs[0].id, runs[1].id), ddp = std::max(runs[0].id, runs[1].id);
  auto steps = Steps(ddp);
  ASSERT_EQ(steps.size(), 40u);  // 20 per rank
  int per_rank[2] = {0, 0};
  for (const StepRecord& r : steps) {
    ASSERT_TRUE(r.rank == 0 || r.rank == 1);
    per_rank[r.rank]++;
    EXPECT_TRUE(r.comm_s.has_value());
    EXPECT_EQ(r.samples, 16);
  }
  EXPECT_EQ(per_rank[0], 20);
  // Telemetry per rank: rank 0 samples the host and its process, rank 1 only
  // its own process (the host's series are not doubled).
  RunData data = store->LoadRun(std::to_string(ddp)).value();
  ASSERT_TRUE(data.samples.count("proc.rss_bytes")) << "rank 0's process";
  ASSERT_TRUE(data.samples.count("rank1.proc.rss_bytes")) << "rank 1's process";
  EXPECT_EQ(data.samples.count("rank0.proc.rss_bytes"), 0u);
  EXPECT_EQ(data.samples["host.mem_used_bytes"].size(), data.samples["proc.rss_bytes"].size());
  EXPECT_EQ(data.samples.count("rank1.host.mem_used_bytes"), 0u) << "rank 1 shares rank 0's node";
  auto a = CheckpointWeights(store.get(), single), b = CheckpointWeights(store.get(), ddp);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_LT((t - b[name]).abs().max().item<double>(), 1e-4) << name;
  }
  // Each rank evaluates its half of the held-out set and the sums are
  // all-reduced: one evaluation, over the same samples as one process reads.
  ASSERT_EQ(Evaluations(ddp).size(), 1u);
  EXPECT_EQ(Evaluation(single)["val_samples"], 256);
  nlohmann::json one = Evaluation(single), two = Evaluation(ddp);
  EXPECT_EQ(one["val_samples"], two["val_samples"]);
  EXPECT_NEAR(one["val_loss"].get<double>(), two["val_loss"].get<double>(), 1e-3);
  EXPECT_NEAR(one["val_accuracy"].get<double>(), two["val_accuracy"].get<double>(), 0.01);
  auto trained =
      RunToEnd({FULLBURN_BIN, "diagnose", std::to_string(ddp), "--json", "--store", store_});
  EXPECT_EQ(trained.code, 0) << trained.err;
}

TEST_F(TrainE2E, ASignalToOneRankStopsEveryRankAtOneStep) {
  // A preempted node's ranks get SIGTERM, the others do not. Every rank must
  // stop at the same step and rank 0 must write the checkpoint; before, rank
  // 1 left and rank 0 failed with "lost contact", its progress unsaved.
  std::string port = FreeLoopbackPort();
  ASSERT_FALSE(port.empty());
  testing::Background ranks[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {"env",
                                     "RANK=" + std::to_string(r),
                                     "WORLD_SIZE=2",
                                     "LOCAL_RANK=" + std::to_string(r),
                                     "MASTER_ADDR=127.0.0.1",
                                     "MASTER_PORT=" + port,
                                     FULLBURN_BIN,
                                     "train",
                                     "-q",
                                     "--store",
                                     store_,
                                     "train.steps=1000000",
                                     "dist.timeout_s=30"};
    argv.insert(argv.end(), kTiny.begin(), kTiny.end());
    testing::Start(&ranks[r], argv,
                   "sig_rank" + std::to_string(r) + "_" + std::to_string(::getpid()));
  }
  // Signal once rank 1 has trained a while.
  auto rank1_steps = [&] {
    auto run = Store()->GetRun("last");
    if (!run.ok()) return size_t{0};
    auto steps = Store()->LoadSteps(run->id);
    return steps.ok()
               ? static_cast<size_t>(std::count_if(steps->begin(), steps->end(),
                                                   [](const StepRecord& r) { return r.rank == 1; }))
               : size_t{0};
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (rank1_steps() < 20 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(rank1_steps(), 20u) << ranks[0].Err() << ranks[1].Err();
  ASSERT_EQ(::kill(ranks[1].pid, SIGTERM), 0);
  EXPECT_EQ(ranks[1].Wait(60), 130) << ranks[1].Err();
  EXPECT_EQ(ranks[0].Wait(60), 130) << ranks[0].Err();
  EXPECT_NE(ranks[0].Err().find("with the ranks a signal reached"), std::string::npos)
      << ranks[0].Err();
  RunData data = Store()->LoadRun("last").value();
  int64_t last[2] = {0, 0};
  for (const StepRecord& r : data.steps) last[r.rank] = std::max(last[r.rank], r.step);
  EXPECT_EQ(last[0], last[1]);
  ASSERT_FALSE(data.checkpoints.empty());
  EXPECT_EQ(data.checkpoints.back().step, last[0]);
  EXPECT_TRUE(fs::exists(data.checkpoints.back().path));
  EXPECT_EQ(data.run.exit_code.value_or(-1), 130);
}

TEST_F(TrainE2E, RanksAgreeOnTheSearchedBatchSize) {
  // Rank 1 has less memory than rank 0: both must train with rank 1's size.
  std::vector<std::string> argv = {
      FULLBURN_BIN,
      "launch",
      "--nproc",
      "2",
      "--",
      "sh",
      "-c",
      std::string(FULLBURN_BIN) + " train -q --store " + store_ +
          " model.name=mlp data.source=synthetic data.synthetic_samples=2048 "
          "data.features=256 model.hidden=256 train.threads=1 train.steps=4 "
          "train.batch_size=auto train.memory_budget_mb=$((5 + 8 * (1 - RANK)))"};
  auto o = RunToEnd(argv, 300);
  ASSERT_EQ(o.code, 0) << o.err;
  // Each rank records its own trials and choice. Alone, rank 0 (13 MB) fits
  // a larger size than rank 1 (5 MB); which fitting size is fastest is timing.
  auto run = Store()->GetRun("last").value();
  int64_t largest_fit[2] = {0, 0}, searched[2] = {0, 0}, agreed[2] = {0, 0};
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  for (const RunEvent& e : events) {
    nlohmann::json d = nlohmann::json::parse(e.data);
    if (e.kind == "batch_size_trial" && d["fits"].get<bool>()) {
      int r = d.at("rank").get<int>();
      largest_fit[r] = std::max(largest_fit[r], d["batch"].get<int64_t>());
    } else if (e.kind == "batch_size_chosen") {
      int r = d.at("rank").get<int>();
      searched[r] = d["searched"].get<int64_t>();
      agreed[r] = d["batch"].get<int64_t>();
    }
  }
  EXPECT_GT(largest_fit[0], largest_fit[1]) << "the budgets should lead to different limits";
  ASSERT_GT(searched[0], 0) << o.err;
  ASSERT_GT(searched[1], 0) << o.err;
  int64_t common = std::min(searched[0], searched[1]);
  EXPECT_EQ(agreed[0], common);
  EXPECT_EQ(agreed[1], common);
  EXPECT_EQ(nlohmann::json::parse(run.config_json)["train"]["batch_size"].get<int64_t>(), common)
      << "the stored config holds the size every rank trained with";
  auto steps = Steps(run.id);
  ASSERT_EQ(steps.size(), 8u);
  for (const StepRecord& r : steps) EXPECT_EQ(r.samples, common) << "rank " << r.rank;
}

TEST_F(TrainE2E, RanksOfAFirstRunMakeTheDefaultDatasetOnce) {
  // Every rank finds the default images missing. Made side by side, their
  // renames of the same temporary files collided and ranks failed with
  // "cannot write"; now one rank makes each split and the others wait.
  auto o = RunToEnd(
      {FULLBURN_BIN, "launch", "--nproc", "3", "--", FULLBURN_BIN, "train", "-q", "--store", store_,
       "data.source=images", "model.name=mlp", "train.threads=1", "train.steps=1"},
      300);
  ASSERT_EQ(o.code, 0) << o.err;
  auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = o.err.find(text); at != std::string::npos; at = o.err.find(text, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("creating the synthetic training images"), 1u) << o.err;
  EXPECT_EQ(count("creating the synthetic held-out images"), 1u) << o.err;
  size_t images = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ + "/datasets")) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    EXPECT_TRUE(ext == ".jpg" || e.path().filename() == ".complete" ||
                e.path().filename() == ".lock")
        << e.path();
    images += ext == ".jpg";
  }
  EXPECT_EQ(images, 10u * (260 + 50));
}

TEST_F(TrainE2E, TwoRankRunResumesInOneProcess) {
  // Rank 0's checkpoint holds the one set of weights every rank had: a
  // single process (a different world size) continues from it.
  std::vector<std::string> argv = {FULLBURN_BIN, "launch", "--nproc", "2",       "--",
                                   FULLBURN_BIN, "train",  "-q",      "--store", store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.push_back("train.steps=10");
  auto two = RunToEnd(argv, 300);
  ASSERT_EQ(two.code, 0) << two.err;
  int64_t ddp = Store()->GetRun("last").value().id;
  auto o = Train({"--resume", std::to_string(ddp), "train.steps=60"}, /*tiny=*/false);
  ASSERT_EQ(o.code, 0) << o.err;
  auto steps = Steps(Store()->GetRun("last").value().id);
  ASSERT_EQ(steps.size(), 50u);
  EXPECT_EQ(steps.front().step, 11);
  EXPECT_TRUE(std::isfinite(steps.back().loss));
  // Two ranks of 32 read 640 of the epoch's 2048 samples; one process of 32
  // reads the other 1408 (44 steps: 11..54), none twice, then epoch 1 begins.
  for (const StepRecord& r : steps) EXPECT_EQ(r.epoch, r.step <= 54 ? 0 : 1) << "step " << r.step;
}

TEST_F(TrainE2E, KilledRunResumesWithTheSameLosses) {
  // 600 steps: a window of 470 for the poller to see a checkpoint in and
  // kill the run, wide enough for a busy machine's late wake-ups.
  std::vector<std::string> job = {"train.steps=600", "checkpoint.every_steps=10",
                                  "model.dropout=0.1"};
  ASSERT_EQ(Train(job).code, 0);
  int64_t reference = Store()->GetRun("last").value().id;

  Background b;
  std::vector<std::string> argv = {FULLBURN_BIN,
                                   "train",
                                   "-q",
                                   "--store",
                                   store_,
                                   "train.steps=600",
                                   "checkpoint.every_steps=10",
                                   "model.dropout=0.1",
                                   "train.log_every_s=0.01"};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  testing::Start(&b, argv, "train_killed");
  int64_t killed = 0;
  for (int i = 0; i < 3000 && killed == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto runs = Store()->ListRuns().value();
    if (runs.size() < 2) continue;
    auto cks = Store()->LoadCheckpoints(runs.back().id).value();
    if (!cks.empty() && cks.back().step >= 30 && cks.back().step < 500) {
      ::kill(b.pid, SIGKILL);
      b.Wait(10);
      killed = runs.back().id;
    }
  }
  ASSERT_GT(killed, 0) << "no checkpoint between steps 30 and 500 was seen";
  EXPECT_EQ(Store()->GetRun(std::to_string(killed)).value().status, "interrupted");

  auto resumed = Train({"--resume", std::to_string(killed)}, /*tiny=*/false);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  auto ref = Steps(reference), rest = Steps(Store()->GetRun("last").value().id);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().step, 600);
  for (const StepRecord& r : rest)
    EXPECT_NEAR(r.loss, ref[r.step - 1].loss, 1e-5 * std::max(1.0, std::fabs(ref[r.step - 1].loss)))
        << "step " << r.step;
}

TEST_F(TrainE2E, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  ASSERT_EQ(Train({"train.steps=40", "checkpoint.every_steps=10", "checkpoint.at_end=false"}).code,
            0);
  int64_t run = Store()->GetRun("last").value().id;
  auto cks = Store()->LoadCheckpoints(run).value();
  ASSERT_EQ(cks.size(), 4u);  // all are listed; keep = 3 left 20, 30, 40 on disk
  EXPECT_FALSE(fs::exists(cks[0].path));
  EXPECT_TRUE(fs::exists(cks[1].path));
  fs::resize_file(cks.back().path, fs::file_size(cks.back().path) / 2);
  auto o = Train({"--resume", std::to_string(run), "train.steps=45"}, /*tiny=*/false);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("step-00000040.safetensors is unusable"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("resuming from"), std::string::npos);
  EXPECT_NE(o.err.find("step-00000030"), std::string::npos) << o.err;
  EXPECT_EQ(Steps(Store()->GetRun("last").value().id).front().step, 31);
  auto missing = Train({"--resume", dir_ + "/nope.safetensors"}, false);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("no such checkpoint file"), std::string::npos) << missing.err;
}

// `fullburn train --help` is answered without the training half; its flags
// come from the table fullburn-train parses with, so the two cannot drift.
TEST_F(TrainE2E, HelpListsTheFlagsTheTrainerParses) {
  std::string bin = FULLBURN_BIN;
  std::string trainer = bin.substr(0, bin.rfind('/') + 1) + "fullburn-train";
  auto help = RunToEnd({bin, "train", "--help"});
  auto parser = RunToEnd({trainer, "train", "--help"});
  ASSERT_EQ(help.code, 0) << help.err;
  ASSERT_EQ(parser.code, 0) << parser.err;
  for (const TrainFlag& f : TrainFlags()) {
    EXPECT_NE(help.out.find(f.help), std::string::npos) << f.names;
    if (std::string(f.names) != "--help-config") {  // answered by fullburn alone
      EXPECT_NE(parser.out.find(f.help), std::string::npos) << f.names << "\n" << parser.out;
    }
  }
  EXPECT_NE(help.out.find("train.batch_size = 64"), std::string::npos);  // then every config key
  EXPECT_THROW(TrainFlagHelp("--no-such-flag"), std::out_of_range);
}

TEST_F(TrainE2E, BadConfigsAreOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"optim.lrr=0.1"}, "did you mean 'optim.lr'"},
      {{"train.batch_size=0"}, "must be >0"},
      {{"optim.lr=-1"}, "must be >0"},
      {{"model.name=gpt"}, "does not train on data.source = synthetic"},
      {{"train.precision=fp16"}, "needs a CUDA device"},
      {{"train.cuda_graphs=true"}, "train.cuda_graphs needs CUDA"},
      {{"profile.steps=6-2"}, "profile.steps = '6-2'"},
      {{"profile.steps=0-3"}, "profile.steps = '0-3': the steps count from 1"},
      {{"profile.steps=4-6x"}, "digits only"},
      {{dir_ + "/missing.toml"}, "cannot be read"},
  };
  for (const Case& c : cases) {
    auto o = Train(c.args);
    EXPECT_EQ(o.code, 2) << c.expect << "\n" << o.err;
    EXPECT_NE(o.err.find(c.expect), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
  EXPECT_TRUE(Store()->ListRuns().value().empty());  // nothing half-made in the store
}

TEST_F(TrainE2E, DivergenceStopsWithTheLastGoodCheckpointIntact) {
  auto o = Train({"optim.lr=1e12", "optim.warmup_steps=0", "train.steps=100",
                  "train.max_skipped_steps=3", "checkpoint.every_steps=1"});
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("training diverged"), std::string::npos) << o.err;
  auto run = Store()->GetRun("last").value();
  EXPECT_EQ(run.status, "failed");
  ASSERT_FALSE(Store()->LoadCheckpoints(run.id).value().empty());
  // The newest checkpoint on disk reads back whole (checksum verified).
  auto check = RunToEnd({FULLBURN_BIN, "train", "--store", store_, "--resume",
                         std::to_string(run.id), "--print-config"});
  EXPECT_EQ(check.code, 0) << check.err;
  EXPECT_EQ(check.err.find("unusable"), std::string::npos) << check.err;
  EXPECT_NE(check.out.find("[optim]"), std::string::npos);
}

TEST_F(TrainE2E, BatchSizeAutoUnderAMemoryBudget) {
  auto o = Train({"train.batch_size=auto", "train.memory_budget_mb=2", "train.steps=5"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto run = Store()->GetRun("last").value();
  auto config = nlohmann::json::parse(run.config_json);
  ASSERT_TRUE(config["train"]["batch_size"].is_number()) << config.dump();
  int trials = 0, chosen = 0;
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  for (const RunEvent& e : events) {
    trials += e.kind == "batch_size_trial";
    if (e.kind == "batch_size_chosen") chosen = nlohmann::json::parse(e.data)["batch"];
  }
  EXPECT_GE(trials, 3);
  EXPECT_NE(o.err.find("out of memory"), std::string::npos)
      << o.err;  // the budget was hit and survived
  EXPECT_EQ(chosen, config["train"]["batch_size"].get<int>());
  EXPECT_EQ(Steps(run.id).front().samples, chosen);
  EXPECT_EQ(Steps(run.id).size(), 5u);  // and training went on at that size
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

TEST_F(TrainE2E, WeightsExportForPythonAndLoaderStatsAreRecorded) {
  std::string data = MakeImages("imgs", 2, 16, "40x40");
  ASSERT_FALSE(data.empty());
  auto o = Train({"data.path=" + data, "data.image_size=32", "model.width=0.125",
                  "train.batch_size=8", "train.steps=4", "data.threads=1", "train.threads=1"},
                 false);
  ASSERT_EQ(o.code, 0) << o.err;
  auto run = Store()->GetRun("last").value();
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  bool loader = false;
  for (const RunEvent& e : events)
    if (e.kind == "loader") loader = nlohmann::json::parse(e.data)["batches"].get<int>() >= 4;
  EXPECT_TRUE(loader);
  auto cks = Store()->LoadCheckpoints(run.id).value();
  ASSERT_FALSE(cks.empty());
  std::string out = dir_ + "/weights.safetensors";
  auto e = RunToEnd({FULLBURN_BIN, "export-weights", cks.back().path, out});
  ASSERT_EQ(e.code, 0) << e.err;
  std::ifstream in(out, std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  std::string header(hlen, ' ');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  auto j = nlohmann::json::parse(header);
  EXPECT_TRUE(j.contains("fc.weight"));  // torchvision's names, no "model." prefix
  EXPECT_TRUE(j.contains("layer1.0.bn1.running_var"));
  EXPECT_FALSE(j.contains("optim.fc.weight.momentum"));
  auto bad = RunToEnd({FULLBURN_BIN, "export-weights", dir_ + "/none", out});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("cannot open checkpoint"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

// SIGTERM (a scheduler's preemption): the step in progress ends, a checkpoint
// is written, the run is recorded, the exit code says it was stopped.
TEST_F(TrainE2E, SigtermCheckpointsAndExits130) {
  Background b;
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "-q",
                                   "--store",    store_,  "train.steps=100000"};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  testing::Start(&b, argv, "train_sigterm");
  ASSERT_TRUE(TrainingHasStepped()) << b.Err();
  ::kill(b.pid, SIGTERM);
  EXPECT_EQ(b.Wait(60), 130) << b.Err();
  auto run = Store()->GetRun("last").value();
  EXPECT_EQ(run.status, "finished");
  EXPECT_EQ(run.exit_code.value_or(-1), 130);
  auto steps = Steps(run.id);
  auto cks = Store()->LoadCheckpoints(run.id).value();
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].step, steps.back().step);  // nothing trained is lost
  EXPECT_TRUE(fs::exists(cks[0].path));
}

// The store locked by another process past its busy timeout while training:
// the loop trains on at its pace, and the step records the store refused are
// kept and written once it takes writes again, so the run's steps have no
// hole. Time: 20 s of training, a lock held 12.5 s (past the store's 5 s
// busy timeout, which is what is tested).
TEST_F(TrainE2E, AStoreLockedForAWhileCostsNoStepRecords) {
  Background b;
  std::vector<std::string> argv = {FULLBURN_BIN,
                                   "train",
                                   "--store",
                                   store_,
                                   "train.steps=100000",
                                   "train.time_limit_s=20",
                                   "checkpoint.at_end=false"};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  testing::Start(&b, argv, "train_locked");
  ASSERT_TRUE(TrainingHasStepped()) << b.Err();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(store_.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  // Past two busy timeouts: the sampler's write and the steps' both fail.
  std::this_thread::sleep_for(std::chrono::milliseconds(12500));
  ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  ASSERT_EQ(b.Wait(120), 0) << b.Err();
  std::string err = b.Err();
  // One voice with `fullburn run`'s (the Recorder's), for snapshots and steps.
  EXPECT_NE(err.find("its samples and steps are kept"), std::string::npos) << err;
  EXPECT_NE(err.find("the run store takes writes again (nothing lost)"), std::string::npos) << err;
  auto steps = Steps(Store()->GetRun("last").value().id);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front().step, 1);
  EXPECT_EQ(static_cast<int64_t>(steps.size()), steps.back().step) << "a hole in the steps";
  // The loop never waited on the store: no pause as long as its busy
  // timeout (5 s) between two steps, which are a few ms each.
  double longest = 0;
  for (size_t i = 1; i < steps.size(); ++i)
    longest = std::max(longest, steps[i].t - steps[i - 1].t);
  EXPECT_LT(longest, 4.5) << "the training loop waited on the locked store";
}

// The store's disk fills while fullburn train trains (issue 67): the loop
// trains on, what the store refuses goes to a spill on another file system
// (named with its import), the run reads as finished, not interrupted, and
// the import stores every step. Skipped where a small tmpfs cannot be mounted.
TEST_F(TrainE2E, ADiskThatFillsMidTrainingLosesNoStep) {
  const std::string disk = dir_ + "/disk", spills = dir_ + "/spills";
  fs::create_directories(disk);
  fs::create_directories(spills);
  if (RunToEnd({"mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk}).code != 0)
    GTEST_SKIP() << "mount -t tmpfs was refused (needs root): no small disk to fill";
  struct Unmount {
    std::string dir;
    ~Unmount() { RunToEnd({"umount", "-l", dir}); }
  } unmount{disk};
  ::setenv("XDG_RUNTIME_DIR", spills.c_str(), 1);  // the spill's folder, on another file system
  const std::string store = disk + "/runs.db";
  Background b;
  std::vector<std::string> argv = {FULLBURN_BIN, "train", "--store", store, "train.steps=100000",
                                   "train.time_limit_s=10", "checkpoint.at_end=false"};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  testing::Start(&b, argv, "train_disk_full");
  auto stored = [&] {
    auto s = RunStore::Open(store);
    if (!s.ok()) return size_t{0};
    auto run = (*s)->GetRun("last");
    return run.ok() ? (*s)->LoadSteps(run->id).value().size() : size_t{0};
  };
  ASSERT_TRUE(testing::WaitFor([&] { return fs::exists(store) && stored() > 20; }, 60)) << b.Err();
  {
    std::ofstream filler(disk + "/filler", std::ios::binary);
    std::string mib(1 << 20, 'x');
    for (int i = 0; i < 4 && filler; ++i) filler.write(mib.data(), static_cast<std::streamsize>(mib.size()));
  }
  int code = b.Wait(120);
  ASSERT_EQ(code, 0) << b.Err();
  std::string err = b.Err();
  EXPECT_NE(err.find("database or disk is full"), std::string::npos) << err;
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(spills))
    if (e.path().extension() == ".fbspill") files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u) << err;
  EXPECT_NE(err.find("fullburn runs import " + files[0]), std::string::npos) << err;
  auto list = RunToEnd({FULLBURN_BIN, "runs", "list", "--json", "--store", store});
  ASSERT_EQ(list.code, 0) << list.err;
  // The run's end is in the spill, where runs list looks (XDG_RUNTIME_DIR still set).
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["status"], "finished") << list.out;
  ::unsetenv("XDG_RUNTIME_DIR");
  fs::remove(disk + "/filler");
  auto imported = RunToEnd({FULLBURN_BIN, "runs", "import", "--store", store, files[0]});
  ASSERT_EQ(imported.code, 0) << imported.err;
  auto s = RunStore::Open(store);
  ASSERT_TRUE(s.ok());
  auto steps = (*s)->LoadSteps((*s)->GetRun("last")->id).value();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front().step, 1);
  EXPECT_EQ(static_cast<int64_t>(steps.size()), steps.back().step) << "a hole in the steps";
}

TEST_F(TrainE2E, ResumingWithADifferentModelShapeIsRefused) {
  ASSERT_EQ(Train({"train.steps=5"}).code, 0);
  auto o = Train({"--resume", "last", "data.features=16", "train.steps=10"}, false);
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("differs from the checkpoint's"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;  // one line
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

// Every checkpoint of the run damaged: nothing to resume from, said in one
// line per refused file plus the verdict, and the files are left as they were.
TEST_F(TrainE2E, NoUsableCheckpointIsAClearError) {
  ASSERT_EQ(Train({"train.steps=20", "checkpoint.every_steps=10"}).code, 0);
  int64_t run = Store()->GetRun("last").value().id;
  std::vector<std::string> paths;
  std::vector<CheckpointRecord> cks = Store()->LoadCheckpoints(run).value();
  for (const CheckpointRecord& c : cks) {
    fs::resize_file(c.path, 100);
    paths.push_back(c.path);
  }
  ASSERT_EQ(paths.size(), 2u);
  auto o = Train({"--resume", std::to_string(run)}, false);
  EXPECT_NE(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("no usable checkpoint to resume from"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 3) << o.err;
  for (const std::string& p : paths) EXPECT_EQ(fs::file_size(p), 100u);
  EXPECT_EQ(Store()->ListRuns().value().size(), 1u);  // no half-made run
  // One file named by hand: its own reason, on one line, and nothing else.
  auto named = Train({"--resume", paths.back()}, false);
  EXPECT_NE(named.code, 0);
  EXPECT_NE(named.err.find(paths.back()), std::string::npos) << named.err;
  EXPECT_EQ(named.err.find("trying the one before it"), std::string::npos) << named.err;
  EXPECT_EQ(std::count(named.err.begin(), named.err.end(), '\n'), 1) << named.err;
}

// model.loss_kernel = cuda, model.norm_kernel = cuda and optim.fused = true
// where they cannot run (a CPU run; here also a build without the kernels
// and a libtorch without the fused AdamW): one line at start each says why
// and what runs instead, and the run trains as without them. A model the
// kernels do not apply to is refused with the setting to change.
TEST_F(TrainE2E, TheCudaKernelsSayWhatRunsInsteadWhereTheyCannotRun) {
  std::vector<std::string> gpt = {"model.name=gpt",   "data.source=tokens", "model.hidden=32",
                                  "model.heads=4",    "data.seq_len=16",    "train.batch_size=4",
                                  "train.steps=3",    "train.threads=1",    "train.seed=5",
                                  "eval.at_end=false"};
  auto with = [&](const std::vector<std::string>& kernels) {
    std::vector<std::string> args = gpt;
    args.insert(args.end(), kernels.begin(), kernels.end());
    auto o = Train(args, /*tiny=*/false);
    EXPECT_EQ(o.code, 0) << o.err;
    return std::make_pair(o, Store()->GetRun("last").value().id);
  };
  auto lines = [](const std::string& err) { return std::count(err.begin(), err.end(), '\n'); };
  auto losses = [&](int64_t run) {
    std::vector<double> out;
    for (const StepRecord& r : Store()->LoadSteps(run).value()) out.push_back(r.loss);
    return out;
  };
  auto [aten, aten_run] = with({"model.loss_kernel=aten", "model.norm_kernel=aten"});
  EXPECT_EQ(aten.err.find("_kernel"), std::string::npos) << aten.err;
  ASSERT_EQ(losses(aten_run).size(), 3u);

  auto [loss, loss_run] = with({"model.loss_kernel=cuda"});
  EXPECT_NE(loss.err.find("fullburn: model.loss_kernel = cuda: "), std::string::npos) << loss.err;
  EXPECT_NE(loss.err.find(": the ATen cross-entropy runs instead\n"), std::string::npos)
      << loss.err;
  EXPECT_EQ(lines(loss.err), lines(aten.err) + 1) << "one line more than aten's run:\n" << loss.err;
  EXPECT_EQ(losses(loss_run), losses(aten_run));

  auto [both, both_run] = with({"model.loss_kernel=cuda", "model.norm_kernel=cuda"});
  EXPECT_NE(both.err.find("fullburn: model.norm_kernel = cuda: "), std::string::npos) << both.err;
  EXPECT_NE(both.err.find(": ATen's layer norms run instead\n"), std::string::npos) << both.err;
  EXPECT_EQ(lines(both.err), lines(aten.err) + 2) << "two lines more than aten's run:\n"
                                                  << both.err;
  EXPECT_EQ(losses(both_run), losses(aten_run));

  // optim.fused = true: the same one line, and the update it names runs.
  auto [fused, fused_run] = with({"optim.name=adamw", "optim.fused=true"});
  EXPECT_NE(fused.err.find("fullburn: optim.fused = true: "), std::string::npos) << fused.err;
  EXPECT_NE(fused.err.find(": the per-parameter update runs instead\n"), std::string::npos)
      << fused.err;
  auto [adamw, adamw_run] = with({"optim.name=adamw"});
  EXPECT_EQ(lines(fused.err), lines(adamw.err) + 1) << fused.err;
  EXPECT_EQ(losses(fused_run), losses(adamw_run));
  EXPECT_EQ(losses(fused_run).size(), 3u);

  for (const char* kernel : {"loss_kernel", "norm_kernel"}) {
    auto refused = Train({std::string("model.") + kernel + "=cuda", "train.steps=1"});
    EXPECT_EQ(refused.code, 2) << refused.err;
    EXPECT_NE(refused.err.find(std::string("set model.") + kernel + " = aten"), std::string::npos)
        << refused.err;
  }
}

// Mistakes found before the first step, each a one-line error naming the
// setting to change, and no run left in the store.
TEST_F(TrainE2E, DataAndMemoryMistakesStopBeforeTraining) {
  std::string data = MakeImages("images", 2, 8, "40x40");
  ASSERT_FALSE(data.empty());
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string expect;
  } cases[] = {
      {{"data.path=" + data, "data.val_path=" + dir_ + "/no-such-val"}, 2, "data.val_path = "},
      {{"model.name=gpt", "data.source=tokens", "data.path=" + data}, 2, "not a regular file"},
      {{"data.path=" + data, "train.memory_budget_mb=1"}, 1, "raise train.memory_budget_mb"},
      {{"model.name=gpt", "data.source=tokens", "eval.every_steps=1"}, 2, "set data.val_path"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(),
                {"data.image_size=32", "train.batch_size=8", "train.steps=2", "train.threads=1"});
    auto o = Train(args, /*tiny=*/false);
    EXPECT_EQ(o.code, c.code) << c.expect << "\n" << o.err;
    EXPECT_NE(o.err.find(c.expect), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
  // A model past the machine's memory (an address-space limit makes the
  // allocator fail the same way everywhere): the size, not an allocator trace.
  std::vector<std::string> argv = {"bash",
                                   "-c",
                                   "ulimit -v 8000000; exec \"$0\" \"$@\"",
                                   FULLBURN_BIN,
                                   "train",
                                   "-q",
                                   "--store",
                                   store_,
                                   "model.name=mlp",
                                   "data.source=synthetic",
                                   "model.hidden=200000"};
  auto o = RunToEnd(argv, 300);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("do not fit (one allocation of 149.0 GiB failed): use a smaller model"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(o.err.find("enforce fail"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  EXPECT_TRUE(Store()->ListRuns().value().empty());
}

// A disk that fills up: RLIMIT_FSIZE (SIGXFSZ ignored) fails every write past
// 6 MiB the way ENOSPC would. The ~9 MiB checkpoints cannot be written, the
// small store can; training goes on, but a run whose final state is not on
// disk fails and says so, and no partial file is left.
TEST_F(TrainE2E, FinalCheckpointThatCannotBeWrittenFailsTheRun) {
  std::string ckdir = dir_ + "/ck";
  std::vector<std::string> argv = {
      "bash",       "-c",    "trap '' XFSZ; ulimit -f 6144; exec \"$0\" \"$@\"",
      FULLBURN_BIN, "train", "-q",
      "--store",    store_};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), {"model.hidden=1024", "train.steps=20", "checkpoint.every_steps=5",
                           "checkpoint.dir=" + ckdir});
  auto o = RunToEnd(argv, 300);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("File too large"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("the final checkpoint (step 20) was not written"), std::string::npos)
      << o.err;
  EXPECT_TRUE(fs::is_empty(ckdir));  // no temporary or partial file left
  auto run = Store()->GetRun("last").value();
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(Steps(run.id).size(), 20u);  // the store took every step
}

// A corrupt JPEG under the default data.bad_samples = fail stops training
// with the file and the setting that lets it go on; skip trains past it.
TEST_F(TrainE2E, CorruptImageNamesTheFileAndTheSettingThatSkipsIt) {
  std::string data = MakeImages("images", 2, 16, "40x40");
  ASSERT_FALSE(data.empty());
  std::string bad = data + "/class_001/img_00003.jpg";
  std::ofstream(bad, std::ios::trunc) << "not a jpeg";
  std::vector<std::string> args = {"data.path=" + data,  "data.image_size=32", "model.width=0.125",
                                   "train.batch_size=8", "train.steps=4",      "data.threads=1",
                                   "train.threads=1"};
  auto o = Train(args, /*tiny=*/false);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find(bad), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("data.bad_samples = skip"), std::string::npos) << o.err;
  args.push_back("data.bad_samples=skip");
  auto skipped = Train(args, /*tiny=*/false);
  EXPECT_EQ(skipped.code, 0) << skipped.err;
  EXPECT_NE(skipped.err.find("skipping " + bad), std::string::npos) << skipped.err;
  // A corrupt held-out image, found by the evaluation at step 2: a one-line
  // error naming the file and the held-out data, exit 1, the run failed.
  std::string val = MakeImages("val", 2, 4, "40x40", 5);
  ASSERT_FALSE(val.empty());
  std::string bad_val = val + "/class_000/img_00001.jpg";
  std::ofstream(bad_val, std::ios::trunc) << "not a jpeg";
  args.pop_back();
  args.insert(args.end(), {"data.val_path=" + val, "eval.every_steps=2"});
  std::ofstream(bad, std::ios::trunc) << testing::ReadText(val + "/class_000/img_00000.jpg");
  auto held_out = Train(args, /*tiny=*/false);
  EXPECT_EQ(held_out.code, 1) << held_out.err;
  EXPECT_NE(held_out.err.find("held-out data (data.val_path): bad sample " + bad_val),
            std::string::npos)
      << held_out.err;
  std::string last_line =
      held_out.err.substr(held_out.err.rfind('\n', held_out.err.size() - 2) + 1);
  EXPECT_EQ(last_line.rfind("fullburn: held-out data", 0), 0u) << held_out.err;  // one line
  EXPECT_EQ(Store()->GetRun("last").value().status, "failed");
}

}  // namespace
}  // namespace fullburn

namespace fullburn {
namespace {

// fullburn tune on the demo's images (at 32 px, a narrower ResNet-18, so a
// trial is short) from a deliberately bad start: one loader thread and
// micro-batch 8 (x 8 accumulated). Every trial is a run of the tuning with
// enough steps to measure; the result follows the verdicts (a kept value is
// the best, its speed-up over the start is the one reported); the config
// written is one fullburn train takes as is, with the effective batch kept;
// and the report lists every trial. How much faster it gets is measured by
// bench/tune_demo, not here. Time: at least 4 trials of 8 s (longer on a
// machine too busy for the start to measure: the tuner lengthens them).
TEST(TuneTrainE2E, TuningFromABadStartWritesAConfigTrainTakes) {
  std::string dir = testing::FreshTestDir("fb_tune_train"), store = dir + "/runs.db",
              toml = dir + "/tuned.toml";
  ::unsetenv("FULLBURN_STORE");
  auto o = testing::RunToEnd(
      {FULLBURN_BIN, "tune", "--store", store, "train.batch_size=8", "train.accumulate=8",
       "data.threads=1", "model.width=0.125", "data.image_size=32", "--knobs",
       "batch,loader_threads", "--trial", "8s", "--budget", "5m", "-o", toml},
      600);
  ASSERT_EQ(o.code, 0) << o.err;
  auto db = std::move(RunStore::Open(store).value());
  RunInfo tuning = db->GetRun("1").value();
  EXPECT_FALSE(tuning.parent_id);
  std::vector<nlohmann::json> trials;
  nlohmann::json result;
  std::vector<RunEvent> events = db->LoadEvents(tuning.id).value();
  for (const RunEvent& e : events) {
    if (e.kind == "tune_trial") trials.push_back(nlohmann::json::parse(e.data));
    if (e.kind == "tune_result") result = nlohmann::json::parse(e.data);
  }
  ASSERT_GE(trials.size(), 4u) << o.out;
  // A start too short to measure on a busy machine is run again, longer.
  size_t first = 0;
  while (first + 1 < trials.size() && trials[first]["status"] == "failed" &&
         trials[first]["knob"] == "start")
    ++first;
  ASSERT_LT(first, 3u) << o.err;
  EXPECT_EQ(trials[first]["knob"], "start");
  EXPECT_EQ(trials[first + 1]["value"], "again");  // the start twice: run-to-run noise
  bool kept = false;
  for (size_t i = first; i < trials.size(); ++i) {
    const auto& t = trials[i];
    kept |= t["verdict"].get<std::string>().rfind("kept", 0) == 0;
    if (t["status"] == "skipped") continue;
    // How many steps fit in a trial is the machine's speed, which this test
    // does not control: a trial too short on a busy machine is recorded as
    // such (and the tuner lengthens the next ones); any other failure is not.
    // Both of the tuner's wordings: the measure's ("too few to measure") and
    // the one it records before running a too-short trial again, longer
    // ("too few steps in 16.0s: tried again at 48.0s", or "no step in ...");
    // under a CPU burner the second one came and this test failed on it.
    const std::string reason = t["status"] == "failed" ? t["reason"].get<std::string>() : "";
    if (reason.find("too few to measure") != std::string::npos ||
        reason.find("too few steps in ") != std::string::npos || reason.find("no step in ") != std::string::npos)
      continue;
    EXPECT_EQ(t["status"], "ok") << t.dump();
    RunInfo run = db->GetRun(std::to_string(t["run_id"].get<int64_t>())).value();
    EXPECT_EQ(run.parent_id, tuning.id);
    // Measured from the run's stored steps (how many fit in a trial is the
    // machine's speed: a slow setting is measured roughly, from 3).
    EXPECT_GE(db->LoadSteps(run.id).value().size(), std::max<size_t>(3, t["steps"].get<size_t>()))
        << t.dump();
  }
  // A kept value beat the start beyond the noise; with none kept the start
  // (or a value tied with it) is the result.
  if (kept)
    EXPECT_GT(result.value("ratio", 0.0), 1.0) << o.out;
  else
    EXPECT_EQ(trials[result["best_trial"].get<int>() - 1]["knob"], "start") << o.out;
  // The winner is a config fullburn train accepts as is, with the effective batch kept.
  auto printed = testing::RunToEnd({FULLBURN_BIN, "train", toml, "--print-config"});
  ASSERT_EQ(printed.code, 0) << printed.err;
  auto config = nlohmann::json::parse(
      db->GetRun(
            std::to_string(trials[result["best_trial"].get<int>() - 1]["run_id"].get<int64_t>()))
          .value()
          .config_json);
  EXPECT_EQ(
      config["train"]["batch_size"].get<int64_t>() * config["train"]["accumulate"].get<int64_t>(),
      64);
  EXPECT_NE(printed.out.find("batch_size = " +
                             std::to_string(config["train"]["batch_size"].get<int64_t>())),
            std::string::npos)
      << printed.out;
  std::string html = dir + "/tuning.html";
  auto report = testing::RunToEnd({FULLBURN_BIN, "report", "1", "--store", store, "-o", html});
  ASSERT_EQ(report.code, 0) << report.err;
  std::string page = testing::ReadText(html);
  size_t rows = 0;
  for (size_t pos = 0; (pos = page.find("<tr class=trial>", pos)) != std::string::npos; ++pos)
    ++rows;
  EXPECT_EQ(rows, trials.size());
}

// Large JPEGs into a tiny model through one loader thread: the diagnosis names
// the input pipeline, so the tuner packs the images and trains on the pack.
TEST(TuneTrainE2E, PacksTheImagesWhenTheLoaderIsTheBottleneck) {
  std::string dir = testing::FreshTestDir("fb_tune_pack"), store = dir + "/runs.db",
              toml = dir + "/tuned.toml";
  ::unsetenv("FULLBURN_STORE");
  auto made = testing::RunToEnd({FULLBURN_BIN, "make-dataset", "images", dir + "/big", "--classes",
                                 "4", "--per-class", "60", "--size", "640x480"});
  ASSERT_EQ(made.code, 0) << made.err;
  auto o = testing::RunToEnd({FULLBURN_BIN, "tune", "--store", store, "model.name=mlp",
                              "optim.lr=0.01", "train.batch_size=32", "data.threads=1",
                              "data.image_size=24", "data.classes=4", "data.path=" + dir + "/big",
                              "--knobs", "pack", "--trial", "6s", "--budget", "3m", "-o", toml},
                             400);
  ASSERT_EQ(o.code, 0) << o.err;
  auto db = std::move(RunStore::Open(store).value());
  nlohmann::json pack_trial;
  std::vector<RunEvent> events = db->LoadEvents(1).value();
  for (const RunEvent& e : events)
    if (e.kind == "tune_trial" && nlohmann::json::parse(e.data)["knob"] == "pack")
      pack_trial = nlohmann::json::parse(e.data);
  ASSERT_FALSE(pack_trial.is_null()) << o.err;
  ASSERT_EQ(pack_trial["status"], "ok") << pack_trial.dump() << "\n" << o.err;
  EXPECT_EQ(pack_trial["value"], "raw, max side 48");
  // The trial trained on the pack the tuner wrote, with every image in it.
  std::string pack = dir + "/tune-1/pack";
  RunInfo run = db->GetRun(std::to_string(pack_trial["run_id"].get<int64_t>())).value();
  EXPECT_EQ(nlohmann::json::parse(run.config_json)["data"]["path"], pack);
  auto reader = PackReader::Open(pack);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  EXPECT_EQ((*reader)->format(), PackFormat::kRaw);
  EXPECT_EQ((*reader)->records().size(), 240u);
  for (const PackRecord& r : (*reader)->records()) EXPECT_LE(std::max(r.width, r.height), 48);
  EXPECT_GE(db->LoadSteps(run.id).value().size(),
            std::max<size_t>(3, pack_trial["steps"].get<size_t>()));
  // Kept or not, the config written is one fullburn train takes.
  auto printed = testing::RunToEnd({FULLBURN_BIN, "train", toml, "--print-config"});
  EXPECT_EQ(printed.code, 0) << printed.err;
  if (pack_trial["verdict"].get<std::string>().rfind("kept", 0) == 0) {
    EXPECT_NE(testing::ReadText(toml).find("fullburn pack " + dir + "/big " + pack),
              std::string::npos);
  }
}

}  // namespace
}  // namespace fullburn
