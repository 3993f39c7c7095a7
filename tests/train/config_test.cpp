#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "fullburn/train_settings.h"
#include "fullburn/config.h"
#include "replay_env.h"

namespace fullburn {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = testing::FreshTestDir("fb_config") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Config, DefaultsComeFromTheOptionTable) {
  Config c;
  EXPECT_EQ(c.Int("train.batch_size"), 64);
  EXPECT_DOUBLE_EQ(c.Float("optim.lr"), 0.1);
  EXPECT_EQ(c.Str("model.name"), "resnet18");
  EXPECT_TRUE(c.Bool("checkpoint.async"));
  for (const OptionDef& d : TrainOptions()) EXPECT_TRUE(c.ToJson().contains(std::string(d.key).substr(0, std::string(d.key).find('.')))) << d.key;
}

TEST(Config, FileThenArgumentsWithEnvironmentBelowBoth) {
  std::string path = WriteFile("a.toml",
                               "[train]\nbatch_size = 32\nprecision = \"bf16\"\n[optim]\nlr = 1\n");
  ::setenv("FULLBURN_OPTIM_MOMENTUM", "0.5", 1);
  ::setenv("FULLBURN_TRAIN_BATCH_SIZE", "16", 1);
  auto c = Config::Load(path, {"optim.lr=0.25", "train.batch_size=auto"});
  ::unsetenv("FULLBURN_OPTIM_MOMENTUM");
  ::unsetenv("FULLBURN_TRAIN_BATCH_SIZE");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->Float("optim.lr"), 0.25);       // argument over file
  EXPECT_DOUBLE_EQ(c->Float("optim.momentum"), 0.5);  // environment over default
  EXPECT_EQ(c->Str("train.precision"), "bf16");       // file over default
  EXPECT_TRUE(c->IsAuto("train.batch_size"));
  auto from_file = Config::Load(path, {});
  EXPECT_EQ(from_file->Int("train.batch_size"), 32);  // file over environment (unset now)
}

TEST(Config, UnknownKeysSuggestTheClosest) {
  auto c = Config::Load("", {"optim.lrr=0.1"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("did you mean 'optim.lr'"), std::string::npos) << c.status().message();
  auto bare = Config::Load("", {"batch_size=8"});
  EXPECT_NE(bare.status().message().find("'train.batch_size'"), std::string::npos) << bare.status().message();
  // A key in the wrong section, and the names other tools give these keys.
  struct Named {
    std::string arg, suggested;
  } named[] = {{"train.lr=0.1", "'optim.lr'"},
               {"num_workers=4", "'data.threads'"},
               {"max-steps=100", "'train.steps'"},
               {"data.batch=32", "'train.batch_size'"},
               {"gradient_accumulation_steps=4", "'train.accumulate'"},
               {"resume=last", "'--resume RUN|PATH'"}};
  for (const Named& n : named) {
    auto c = Config::Load("", {n.arg});
    ASSERT_FALSE(c.ok()) << n.arg;
    EXPECT_NE(c.status().message().find("did you mean " + n.suggested), std::string::npos)
        << n.arg << ": " << c.status().message();
  }
  auto far = Config::Load("", {"zzzzzz=1"});
  EXPECT_EQ(far.status().message().find("did you mean"), std::string::npos)
      << far.status().message();
  auto section = Config::Load("", {"model=resnet18"});
  ASSERT_FALSE(section.ok());
  EXPECT_NE(section.status().message().find("'model' is a section"), std::string::npos)
      << section.status().message();
  EXPECT_NE(section.status().message().find("model.name"), std::string::npos);
  std::string path = WriteFile("b.toml", "[model]\nname = \"mlp\"\nwidht = 2.0\n");
  auto f = Config::Load(path, {});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("model.widht"), std::string::npos);
  EXPECT_NE(f.status().message().find("line 3"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("model.width"), std::string::npos);
}

TEST(Config, WrongTypesAndImpossibleValuesAreRefused) {
  struct Case {
    std::string arg, expect;
  } cases[] = {{"train.batch_size=0", "must be >0"},
               {"optim.lr=-1", "must be >0"},
               {"train.batch_size=big", "is not an integer"},
               {"train.accumulate=auto", "'auto' is not allowed"},
               {"train.precision=fp8", "use one of fp32|bf16|fp16"},
               {"model.channels_last=maybe", "is not true or false"},
               {"optim.lr", "is not key=value"}};
  for (const Case& k : cases) {
    auto c = Config::Load("", {k.arg});
    ASSERT_FALSE(c.ok()) << k.arg;
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos) << c.status().message();
  }
  std::string path = WriteFile("c.toml", "[train]\nbatch_size = \"64\"\n");
  auto f = Config::Load(path, {});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("train.batch_size"), std::string::npos);
  EXPECT_NE(f.status().message().find("not an integer"), std::string::npos) << f.status().message();
}

// Found by fuzz/config_fuzz (fuzz/regressions/config/): a checkpoint's
// config with a value of another type threw out of Load (resume crashed).
TEST(Config, ACheckpointConfigOfTheWrongTypesIsRefused) {
  auto message = [](const char* text) {
    nlohmann::json base = nlohmann::json::parse(text);
    return Config::Load("", {}, false, &base).status().message();
  };
  EXPECT_EQ(message(R"({"model":{"name":{"x":1}}})"),
            R"(model.name = {"x":1} (checkpoint config): must be a string)");
  EXPECT_EQ(message(R"({"train":{"epochs":2.5}})"),
            "train.epochs = 2.5 (checkpoint config): must be an integer");
  EXPECT_EQ(message(R"({"optim":{"lr":"x"}})"), "optim.lr = x (checkpoint config): must be a number");
  EXPECT_EQ(message(R"({"checkpoint":{"async":1}})"),
            "checkpoint.async = 1 (checkpoint config): must be true or false");
  nlohmann::json good = Config().ToJson();
  EXPECT_TRUE(Config::Load("", {}, false, &good).ok());
}

TEST(Config, BrokenOrMissingFilesNameTheFile) {
  std::string path = WriteFile("d.toml", "[train]\nbatch_size = = 3\n");
  auto c = Config::Load(path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path + " line 2"), std::string::npos) << c.status().message();
  auto m = Config::Load("/nonexistent/x.toml", {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cannot be read"), std::string::npos);
}

TEST(Config, TomlOutputLoadsBackEqual) {
  auto c = Config::Load("", {"optim.lr=0.0003", "train.batch_size=auto", "model.name=gpt",
                             "data.path=/tmp/a \"b\"", "train.clip_grad_norm=1"});
  ASSERT_TRUE(c.ok());
  std::string path = WriteFile("e.toml", c->ToToml());
  auto back = Config::Load(path, {}, /*read_environment=*/false);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), c->ToJson());
}

TEST(Config, DocsAreTheGeneratedTable) {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/config.md");
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(doc, ConfigMarkdown()) << "regenerate: fullburn train --help-config --markdown > docs/config.md";
}

// Messages true to the input (issue 53): the key, the value as written and
// the file's line. A float once showed as std::to_string's six decimals
// (1e-07 as "0.000000").
TEST(ConfigMessages, QuoteTheKeyTheValueAndTheLine) {
  auto message = [](const std::string& name, const std::string& text) {
    std::string path = WriteFile(name, text);
    auto c = Config::Load(path, {});
    return std::make_pair(path, c.ok() ? std::string("ok") : c.status().message());
  };
  auto [p1, m1] = message("m1.toml", "[train]\n\nbatch_size = 2.5\n");
  EXPECT_EQ(m1, "train.batch_size (" + p1 + " line 3): 2.5 is not an integer");
  auto [p2, m2] = message("m2.toml", "[train]\nbatch_size = 1e-7\n");
  EXPECT_EQ(m2, "train.batch_size (" + p2 + " line 2): 1e-07 is not an integer");
  auto [p3, m3] = message("m3.toml", "# a comment\n[train]\nbatch_size = inf\n");
  EXPECT_EQ(m3, "train.batch_size (" + p3 + " line 3): inf is not an integer");
  auto [p4, m4] = message("m4.toml", "[optim]\nlr = 0.1\n[train]\nbatch_size = 0\n");
  EXPECT_EQ(m4, "train.batch_size = 0 (" + p4 + " line 4): must be >0");
  auto [p5, m5] = message("m5.toml", "[optim]\nlr = -0.25\n");
  EXPECT_EQ(m5, "optim.lr = -0.25 (" + p5 + " line 2): must be >0");
}

// Every option has its typed field and every field its option, of its type.
TEST(TrainSettings, OneFieldPerOptionOfItsType) { EXPECT_EQ(SettingsTableProblems(), ""); }

TEST(TrainSettings, ReadOnceFromTheConfigTheyType) {
  auto c = Config::Load("", {"optim.lr=0.25", "model.name=gpt", "checkpoint.async=false",
                             "data.seq_len=512", "train.batch_size=auto"},
                        /*read_environment=*/false);
  ASSERT_TRUE(c.ok()) << c.status().message();
  TrainSettings s = ReadSettings(*c);
  EXPECT_DOUBLE_EQ(s.optim.lr, 0.25);
  EXPECT_EQ(s.model.name, "gpt");
  EXPECT_FALSE(s.checkpoint.async);
  EXPECT_EQ(s.data.seq_len, 512);
  EXPECT_TRUE(s.train.batch_size.automatic);
  EXPECT_EQ(s.train.batch_size.value, 0);
  EXPECT_DOUBLE_EQ(s.optim.beta2, c->Float("optim.beta2"));  // a default
  ASSERT_TRUE(c->Set("train.batch_size", "48", "test").ok());
  TrainSettings again = ReadSettings(*c);
  EXPECT_FALSE(again.train.batch_size.automatic);
  EXPECT_EQ(again.train.batch_size.value, 48);
}

// The parts take their sections as they are (train_options.h): what a
// part's struct takes from another section is filled by the reader too.
TEST(TrainSettings, EachPartsSectionIsItsOwnOptionsStruct) {
  auto c = Config::Load("", {"data.vocab=50257", "data.seq_len=64", "train.precision=fp16",
                             "amp.growth_interval=7", "optim.foreach=true", "optim.momentum=0.8",
                             "dist.bucket_mb=5", "model.hidden=96"},
                        /*read_environment=*/false);
  ASSERT_TRUE(c.ok()) << c.status().message();
  TrainSettings s = ReadSettings(*c);
  const ModelSpec& model = s.model;
  EXPECT_EQ(model.vocab, 50257);
  EXPECT_EQ(model.seq_len, 64);
  EXPECT_EQ(model.hidden, 96);
  const LossScalerOptions& amp = s.amp;
  EXPECT_TRUE(amp.enabled);
  EXPECT_EQ(amp.growth_interval, 7);
  const OptimizerOptions& optim = s.optim;
  EXPECT_DOUBLE_EQ(optim.momentum, 0.8);
  EXPECT_EQ(s.optim.foreach_setting, "true");
  EXPECT_FALSE(optim.foreach);  // the trainer's verdict for its device, not the reader's
  const DistOptions& dist = s.dist;
  EXPECT_DOUBLE_EQ(dist.bucket_mb, 5);
  EXPECT_EQ(dist.config_hash, "");
  ASSERT_TRUE(c->Set("train.precision", "bf16", "test").ok());
  EXPECT_FALSE(ReadSettings(*c).amp.enabled);
}

// What a run stored is read back through the same table: diagnose and tune
// see the run's values, the defaults where it left one out, and no
// "resolved" (what the trainer chose at run time, no option).
TEST(TrainSettings, AStoredConfigReadsBackToTheSettingsItWasWrittenFrom) {
  auto c = Config::Load("", {"train.precision=bf16", "data.threads=3", "checkpoint.async=false"},
                        /*read_environment=*/false);
  ASSERT_TRUE(c.ok());
  nlohmann::json stored = c->ToJson();
  stored["resolved"] = {{"device", "cpu"}, {"threads", 2}};
  stored["train"].erase("seed");  // an older run's config may lack an option
  auto s = ReadStoredSettings(stored.dump());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->train.precision, "bf16");
  EXPECT_EQ(s->data.threads, 3);
  EXPECT_FALSE(s->checkpoint.async);
  EXPECT_EQ(s->train.seed, DefaultSettings().train.seed);
  EXPECT_EQ(SettingsJson(ReadSettings(*c)), c->ToJson());  // the table writes what Config writes

  EXPECT_FALSE(ReadStoredSettings(R"({"command": ["python3", "train.py"]})").ok());  // a wrapped job
  EXPECT_FALSE(ReadStoredSettings("not json").ok());
  auto wrong = ReadStoredSettings(R"({"train": {"precision": 16}})");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("train.precision"), std::string::npos);
}

// Ranks compare a hash of JobIdentity: a rank's machine may differ, its job may not.
TEST(TrainSettings, JobIdentityLeavesOutWhatDescribesARanksMachine) {
  TrainSettings a = DefaultSettings(), b = a;
  b.train.device = "cuda:1";
  b.train.threads = 7;
  b.train.memory_budget_mb = 1000;
  b.data.threads = 5;
  b.data.prefetch = 9;
  b.data.cache_mb = 64;
  EXPECT_EQ(JobIdentity(a), JobIdentity(b));
  b.optim.lr = a.optim.lr * 2;
  EXPECT_NE(JobIdentity(a), JobIdentity(b));
  b = a;
  b.train.batch_size = AutoInt{0, !a.train.batch_size.automatic};
  EXPECT_NE(JobIdentity(a), JobIdentity(b));
}

}  // namespace
}  // namespace fullburn
