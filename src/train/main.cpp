// fullburn-train: the libtorch half of fullburn as its own executable, so the
// monitoring commands never pay libtorch's start-up time and memory. The
// `fullburn` command hands it the commands that need libtorch.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "fullburn/torch_loader.h"
#include "fullburn/checkpoint.h"
#include "fullburn/trainer.h"
#include "fullburn/config.h"

namespace {

struct BenchOptions {
  std::string data, device = "cpu";
  int threads = 0, batch_size = 64, batches = 50, warmup = 3;
  bool json = false, channels_last = false;
  std::string dtype = "float";
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "fullburn: %s\n", message.c_str());
  return fullburn::kExitUsage;
}

// Batches resident on the device, normalized: what a training step consumes.
int BenchDeviceLoader(const BenchOptions& o) {
  fullburn::TorchLoaderOptions t;
  t.loader.root = o.data;
  t.loader.threads = o.threads;
  t.loader.batch_size = o.batch_size;
  try {
    t.device = torch::Device(o.device);
  } catch (const c10::Error&) {
    return Fail("--device '" + o.device + "' is not a torch device: use cpu or cuda[:N]");
  }
  t.dtype = o.dtype == "bf16" ? torch::kBFloat16 : o.dtype == "fp16" ? torch::kHalf : torch::kFloat;
  t.channels_last = o.channels_last;
  auto loader = fullburn::Loader::Open(t);
  if (!loader.ok()) return Fail(loader.status().message());
  fullburn::Loader& l = **loader;
  int epoch = 0;
  l.StartEpoch(epoch);
  fullburn::DeviceBatch b;
  double start = 0;
  double checksum = 0;
  for (int k = 0; k < o.warmup + o.batches; ++k) {
    if (k == o.warmup) {
      if (t.device.is_cuda()) torch::cuda::synchronize();
      start = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
    while (!l.Next(&b)) {
      if (!l.status().ok()) return Fail(l.status().message());
      l.StartEpoch(++epoch);
    }
    if (k == o.warmup + o.batches - 1) checksum = b.images.sum().item<double>();  // waits for the device
  }
  double end = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  double images = static_cast<double>(o.batches) * o.batch_size;
  fullburn::LoaderStats s = l.stats();
  nlohmann::json j{{"images_per_s", images / (end - start)},
                   {"threads", s.threads},
                   {"images_per_s_per_thread", images / (end - start) / s.threads},
                   {"device", t.device.str()},
                   {"pinned", l.uses_cuda()},
                   {"skipped", s.skipped},
                   {"data_wait_s", s.consumer_wait_s},
                   {"checksum", checksum}};
  if (o.json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    std::printf("%.0f img/s into %s (normalized, %s) with %d threads\n", images / (end - start),
                t.device.str().c_str(), o.dtype.c_str(), s.threads);
  return 0;
}

// `fullburn train` lands here (fullburn execs fullburn-train train ...).
int Train(const std::vector<std::string>& positionals, fullburn::TrainerOptions o, char** argv, int argc) {
  for (const std::string& p : positionals) {
    if (p.find('=') != std::string::npos) {
      o.overrides.push_back(p);
    } else if (o.config_path.empty()) {
      o.config_path = p;
    } else {
      return Fail("two config files given ('" + o.config_path + "' and '" + p +
                  "'): give one, and key=value for the rest");
    }
  }
  o.command = {"fullburn"};
  for (int i = 1; i < argc; ++i) o.command.push_back(argv[i]);
  return fullburn::RunTraining(o);
}

// Model weights of a checkpoint as a plain safetensors file (names without
// the "model." prefix), for torch.nn.Module.load_state_dict in Python.
int ExportWeights(const std::string& from, const std::string& to) {
  // dist.shard = full: the parameters are in each rank's part beside it.
  auto ckpt = fullburn::ReadCheckpointWithShards(from);
  if (!ckpt.ok()) return Fail(ckpt.status().message());
  fullburn::CheckpointState weights;
  for (auto& [name, t] : ckpt->tensors)
    if (name.rfind("model.", 0) == 0) weights.tensors.emplace_back(name.substr(6), t);
  weights.state_json = ckpt->state_json;
  if (weights.tensors.empty())
    return Fail(from + " holds no model weights: name a step's checkpoint file (step-N.safetensors)");
  int64_t bytes = 0;
  if (auto s = fullburn::WriteCheckpointFile(to, weights, &bytes); !s.ok()) return Fail(s.message());
  std::printf("wrote %zu tensors (%lld bytes) to %s\n", weights.tensors.size(), static_cast<long long>(bytes), to.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fullburn-train: the libtorch half of fullburn"};
  app.set_version_flag("--version", "fullburn-train " FULLBURN_VERSION " (" + fullburn::TorchDescription() + ")");
  app.require_subcommand(1);
  BenchOptions o;
  CLI::App* bench = app.add_subcommand("bench-loader", "Input pipeline into device memory (TorchLoader)");
  bench->add_option("DATA", o.data, "Image folder or pack")->required();
  bench->add_option("--device", o.device, "cpu or cuda[:N]")->capture_default_str();
  bench->add_option("--threads", o.threads, "Worker threads (0: tuned)")->capture_default_str();
  bench->add_option("--batch-size", o.batch_size, "Images per batch")->capture_default_str()->check(CLI::PositiveNumber);
  bench->add_option("--batches", o.batches, "Batches to time (after warm-up)")->capture_default_str()->check(CLI::PositiveNumber);
  bench->add_option("--dtype", o.dtype, "float, bf16 or fp16")->capture_default_str()->check(CLI::IsMember({"float", "bf16", "fp16"}));
  bench->add_flag("--channels-last", o.channels_last, "Channels-last memory format");
  bench->add_flag("--json", o.json, "JSON output");
  int code = 0;
  bench->callback([&] { code = BenchDeviceLoader(o); });

  fullburn::TrainerOptions to;
  std::vector<std::string> positionals;
  CLI::App* train = app.add_subcommand("train", "Train a model (see 'fullburn train --help')");
  train->add_option("ARGS", positionals, "CONFIG.toml and/or key=value overrides");
  using fullburn::TrainFlagHelp;
  train->add_option("--resume", to.resume, TrainFlagHelp("--resume"));
  train->add_option("--name", to.name, TrainFlagHelp("--name"));
  train->add_option("--parent", to.parent_run, TrainFlagHelp("--parent"));
  train->add_option("--store", to.store_path, TrainFlagHelp("--store"))->envname("FULLBURN_STORE");
  train->add_flag("-q,--quiet", to.quiet, TrainFlagHelp("-q,--quiet"));
  train->add_flag("--print-config", to.print_config, TrainFlagHelp("--print-config"));
  train->callback([&] { code = Train(positionals, to, argv, argc); });

  std::string export_from, export_to;
  CLI::App* exp = app.add_subcommand("export-weights", "A checkpoint's model weights as safetensors for Python");
  exp->add_option("CHECKPOINT", export_from, "A checkpoint file")->required();
  exp->add_option("OUT", export_to, "The .safetensors file to write")->required();
  exp->callback([&] { code = ExportWeights(export_from, export_to); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return Fail(std::string(e.what()) + " (see 'fullburn-train --help')");
  }
  return code;
}
