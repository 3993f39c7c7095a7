// The C++ API end to end, in process: a program's own network and tensors
// trained by RunTraining into a real run store, resumed from its program, and
// the mistakes such a program can make refused with one line each.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "fullburn/report.h"
#include "fullburn/store.h"
#include "fullburn/train.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;

// A network of the test's own, not one of fullburn's models.
class TwoLayers : public Model {
 public:
  TwoLayers()
      : hidden_(register_module("hidden", torch::nn::Linear(8, 32))),
        out_(register_module("out", torch::nn::Linear(32, 3))) {}
  torch::Tensor forward(torch::Tensor x) override {
    return out_->forward(torch::relu(hidden_->forward(x)));
  }

 private:
  torch::nn::Linear hidden_, out_;
};

// Features whose class is the largest of their first three.
TensorData Samples(int64_t n, uint64_t seed) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor x = torch::randn({n, 8}, gen);
  return {x, x.narrow(1, 0, 3).argmax(1)};
}

// The same task made sample by sample on the loader's threads, with a little
// noise drawn from the seed (augmentation); Get(throw_at) throws.
class FeatureSet : public Dataset {
 public:
  FeatureSet(int64_t n, uint64_t seed, int64_t throw_at = -1)
      : data_(Samples(n, seed)), throw_at_(throw_at) {}
  int64_t size() const override { return data_.inputs.size(0); }
  Sample Get(int64_t index, uint64_t seed) override {
    if (index == throw_at_)
      throw std::runtime_error("record " + std::to_string(index) + " is torn");
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
    torch::Tensor noise = torch::randn({8}, gen).mul_(0.01);
    return {data_.inputs[index] + noise, data_.targets[index]};
  }
  TensorData data_;
  int64_t throw_at_;
};

class CppApi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("fullburn-cpp-api-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainerOptions Options(std::vector<std::string> more = {}) {
    TrainerOptions o;
    o.store_path = dir_ + "/runs.db";
    o.quiet = true;
    torch::manual_seed(0);
    o.model = std::make_shared<TwoLayers>();
    o.model_name = "TwoLayers";
    o.train_data = Samples(1024, 1);
    o.val_data = Samples(300, 2);
    o.overrides = {"train.threads=1", "train.batch_size=32", "optim.lr=0.05",
                   "checkpoint.dir=" + dir_ + "/ckpt"};
    o.overrides.insert(o.overrides.end(), more.begin(), more.end());
    return o;
  }
  std::unique_ptr<RunStore> Store() { return std::move(RunStore::Open(dir_ + "/runs.db").value()); }
  std::vector<StepRecord> Steps(int64_t run) { return Store()->LoadSteps(run).value(); }
  // RunTraining's exit code and what it printed.
  std::pair<int, std::string> Train(const TrainerOptions& o) {
    ::testing::internal::CaptureStderr();
    int code = RunTraining(o);
    return {code, ::testing::internal::GetCapturedStderr()};
  }

  std::string dir_;
};

TEST_F(CppApi, TrainsAProgramsOwnNetworkOnItsOwnTensors) {
  auto [code, err] = Train(Options({"train.epochs=3"}));
  ASSERT_EQ(code, 0) << err;
  RunInfo run = Store()->GetRun("last").value();
  EXPECT_EQ(run.name, "TwoLayers on tensors");
  EXPECT_EQ(run.status, "finished");
  auto config = nlohmann::json::parse(run.config_json);
  EXPECT_EQ(config["model"]["name"], "custom");
  EXPECT_EQ(config["data"]["source"], "tensors");
  std::vector<StepRecord> steps = Steps(run.id);
  ASSERT_EQ(steps.size(), 3u * 1024 / 32);  // every sample once an epoch
  EXPECT_EQ(steps.back().epoch, 2);
  StepsSummary sum = SummarizeSteps(steps);
  EXPECT_LT(sum.final_loss, 0.5 * sum.first_loss) << sum.first_loss << " -> " << sum.final_loss;
  for (const StepRecord& r : steps) EXPECT_TRUE(r.forward_s && r.backward_s && r.optimizer_s);
  nlohmann::json eval;
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  for (const RunEvent& e : events)
    if (e.kind == "evaluation") eval = nlohmann::json::parse(e.data);
  EXPECT_EQ(eval.value("val_samples", 0), 300);  // the held-out tensors, each once
  EXPECT_GT(eval.value("val_accuracy", 0.0), 0.8) << eval.dump();  // 3 classes: chance is 1/3
  ASSERT_FALSE(Store()->LoadCheckpoints(run.id).value().empty());
}

TEST_F(CppApi, TrainsOnAProgramsOwnDatasetMadeOnTheLoadersThreads) {
  TrainerOptions o = Options({"train.epochs=3", "data.threads=2"});
  o.train_data.reset();
  o.val_data.reset();
  o.dataset = std::make_shared<FeatureSet>(1024, 1);
  o.val_dataset = std::make_shared<FeatureSet>(300, 2);
  auto [code, err] = Train(o);
  ASSERT_EQ(code, 0) << err;
  RunInfo run = Store()->GetRun("last").value();
  EXPECT_EQ(run.name, "TwoLayers on dataset");
  EXPECT_EQ(nlohmann::json::parse(run.config_json)["data"]["source"], "dataset");
  std::vector<StepRecord> steps = Steps(run.id);
  ASSERT_EQ(steps.size(), 3u * 1024 / 32);
  StepsSummary sum = SummarizeSteps(steps);
  EXPECT_LT(sum.final_loss, 0.5 * sum.first_loss) << sum.first_loss << " -> " << sum.final_loss;
  nlohmann::json eval, loader;
  std::vector<RunEvent> events = Store()->LoadEvents(run.id).value();
  for (const RunEvent& e : events) {
    if (e.kind == "evaluation") eval = nlohmann::json::parse(e.data);
    if (e.kind == "loader") loader = nlohmann::json::parse(e.data);
  }
  EXPECT_EQ(eval.value("val_samples", 0), 300);
  EXPECT_GT(eval.value("val_accuracy", 0.0), 0.8) << eval.dump();
  EXPECT_EQ(loader.value("samples", 0), 3 * 1024);                // the loader's own count
  EXPECT_GT(loader.value("dataset_s", 0.0), 0) << loader.dump();  // time in Get
}

// A built-in model on a program's tensors: no network of its own needed.
TEST_F(CppApi, ABuiltInModelTrainsOnAProgramsTensors) {
  TrainerOptions o = Options({"model.name=mlp", "model.hidden=32", "train.epochs=2"});
  o.model.reset();
  auto [code, err] = Train(o);
  ASSERT_EQ(code, 0) << err;
  RunInfo run = Store()->GetRun("last").value();
  EXPECT_EQ(run.name, "mlp on tensors");
  StepsSummary sum = SummarizeSteps(Steps(run.id));
  EXPECT_LT(sum.final_loss, 0.5 * sum.first_loss) << sum.first_loss << " -> " << sum.final_loss;
}

// Resumed from a mid-run checkpoint by the program (same network class, same
// tensors), the steps after it repeat the uninterrupted run's losses.
TEST_F(CppApi, AProgramResumesItsRunStepForStep) {
  for (bool dataset : {false, true}) {
    SCOPED_TRACE(dataset ? "dataset" : "tensors");
    std::vector<std::string> job = {"train.steps=40", "checkpoint.every_steps=20",
                                    "checkpoint.keep=5", "data.threads=2"};
    auto options = [&] {
      TrainerOptions o = Options(job);
      if (dataset) {
        o.train_data.reset();
        o.val_data.reset();
        o.dataset = std::make_shared<FeatureSet>(1024, 1);
      }
      return o;
    };
    auto [code, err] = Train(options());
    ASSERT_EQ(code, 0) << err;
    RunInfo whole = Store()->GetRun("last").value();
    std::vector<StepRecord> ref = Steps(whole.id);
    auto cks = Store()->LoadCheckpoints(whole.id).value();
    ASSERT_EQ(cks.front().step, 20);

    TrainerOptions o = options();  // fresh weights: the checkpoint's replace them
    o.resume = cks.front().path;
    auto [rcode, rerr] = Train(o);
    ASSERT_EQ(rcode, 0) << rerr;
    std::vector<StepRecord> rest = Steps(Store()->GetRun("last").value().id);
    ASSERT_EQ(rest.size(), 20u);
    EXPECT_EQ(rest.front().step, 21);
    for (const StepRecord& r : rest)
      EXPECT_NEAR(r.loss, ref[r.step - 1].loss,
                  1e-5 * std::max(1.0, std::fabs(ref[r.step - 1].loss)))
          << "step " << r.step;

    // Without its program the run cannot be resumed: `fullburn train --resume`.
    TrainerOptions cli;
    cli.store_path = o.store_path;
    cli.quiet = true;
    cli.resume = std::to_string(whole.id);
    auto [ccode, cerr] = Train(cli);
    EXPECT_EQ(ccode, 2);
    EXPECT_NE(cerr.find("trained by a program through the C++ API (model.name = custom): resume "
                        "it from that program"),
              std::string::npos)
        << cerr;
  }
}

TEST_F(CppApi, DataAProgramCannotTrainOnIsAOneLineError) {
  struct Case {
    std::function<void(TrainerOptions*)> spoil;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](TrainerOptions* o) { o->train_data->targets = o->train_data->targets.narrow(0, 0, 10); },
       "TensorData holds 1024 inputs but 10 targets: give one target"},
      {[](TrainerOptions* o) { o->train_data->targets = o->train_data->targets.to(torch::kFloat); },
       "TensorData's targets are Float: give class indices as integers (torch::kLong)"},
      {[](TrainerOptions* o) { o->val_data->targets[3] = -1; },
       "held-out data: TensorData's targets hold the class index -1"},
      {[](TrainerOptions* o) { o->train_data.reset(); },
       "TrainerOptions::val_data is held out from the program's own samples"},
      {[](TrainerOptions* o) {
         o->model.reset();
         o->overrides.push_back("model.name=resnet18");
       },
       "model.name = resnet18 takes float images [N, 3, H, W]; the tensors handed over are inputs "
       "Float 1024x8"},
      {[](TrainerOptions* o) { o->overrides.push_back("train.batch_size=2048"); },
       "the tensors handed over hold 1024 samples, fewer than one batch of 2048"},
      {[](TrainerOptions* o) {
         o->model.reset();
         o->train_data.reset();
         o->val_data.reset();
         o->overrides.push_back("model.name=custom");
       },
       "model.name = custom names a network a program hands over through the C++ API"},
      {[](TrainerOptions* o) {
         o->train_data.reset();
         o->val_data.reset();
         o->overrides.push_back("data.source=tensors");
       },
       "data.source = tensors names the samples a program hands over through the C++ API"},
      {[](TrainerOptions* o) {
         o->model.reset();
         torch::Tensor tokens = torch::arange(64 * 16).reshape({64, 16});
         o->train_data = TensorData{tokens, tokens};
         o->val_data.reset();
         o->overrides.push_back("model.name=gpt");
       },
       "the tensors hold token 1023, beyond data.vocab = 256: set data.vocab = 1024"},
      {[](TrainerOptions* o) { o->dataset = std::make_shared<FeatureSet>(64, 1); },
       "TrainerOptions has both train_data and a dataset: hand over one of them"},
      {[](TrainerOptions* o) {
         o->train_data.reset();
         o->val_data.reset();
         o->val_dataset = std::make_shared<FeatureSet>(64, 1);
       },
       "TrainerOptions::val_dataset is held out from the program's own samples"},
      {[](TrainerOptions* o) {
         struct FloatTargets : FeatureSet {
           FloatTargets() : FeatureSet(64, 1) {}
           Sample Get(int64_t index, uint64_t seed) override {
             Sample s = FeatureSet::Get(index, seed);
             return {s.input, s.target.to(torch::kFloat)};
           }
         };
         o->train_data.reset();
         o->val_data.reset();
         o->dataset = std::make_shared<FloatTargets>();
       },
       "dataset sample 0 has a target of Float: give class indices as integers"},
      {[](TrainerOptions* o) {
         o->train_data.reset();
         o->val_data.reset();
         o->overrides.push_back("data.source=dataset");
       },
       "data.source = dataset names a Dataset a program hands over through the C++ API"},
  };
  for (const Case& c : cases) {
    TrainerOptions o = Options({"train.steps=2"});
    c.spoil(&o);
    auto [code, err] = Train(o);
    EXPECT_EQ(code, 2) << err;
    EXPECT_NE(err.find(c.message), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  EXPECT_TRUE(Store()->ListRuns().value().empty());  // refused before any run began
}

// A Get that throws mid-epoch stops the run with the sample named; the
// checkpoints before it stand.
TEST_F(CppApi, ADatasetThatFailsMidRunStopsItNamingTheSample) {
  TrainerOptions o = Options({"train.epochs=1", "data.threads=2", "checkpoint.every_steps=5"});
  o.train_data.reset();
  o.val_data.reset();
  auto data = std::make_shared<FeatureSet>(1024, 1);
  // The sample at place 300 of epoch 0's order, so that it fails after step 5.
  std::vector<int64_t> order = EpochPermutation(1024, 0, 0);
  data->throw_at_ = order[300];
  o.dataset = data;
  auto [code, err] = Train(o);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("dataset sample " + std::to_string(order[300]) + ": record " +
                     std::to_string(order[300]) + " is torn"),
            std::string::npos)
      << err;
  RunInfo run = Store()->GetRun("last").value();
  EXPECT_EQ(run.status, "failed");
  auto cks = Store()->LoadCheckpoints(run.id).value();
  ASSERT_FALSE(cks.empty());
  EXPECT_TRUE(ReadCheckpointFile(cks.back().path).ok());
}

}  // namespace
}  // namespace fullburn
