// How long a checkpoint blocks the training loop: fullburn's asynchronous
// checkpoint (snapshot to host memory, write on a thread) next to a
// synchronous torch::save of the same state, for a ResNet-50-sized model with
// SGD momentum (~51M tensors' worth of float32, ~205 MB).
//
// usage: fullburn-bench-checkpoint [--dir DIR] [--repeats N] [--json]
// Goal (training-runtime issue): async blocked time <= 10% of torch::save's.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include "fullburn/train.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/fullburn-bench-checkpoint";
  int repeats = 3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--repeats N] [--json]\n", argv[0]);
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  // As fullburn train sets it (train.threads = 0 on a CPU run without images).
  torch::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
  fullburn::ModelSpec spec;
  spec.name = "resnet50";
  spec.num_classes = 1000;
  auto model = fullburn::MakeModel(spec).value();
  // Momentum buffers as a training run holds them: one per parameter.
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& p : model->named_parameters()) {
    params.emplace_back(p.key(), p.value());
    p.value().mutable_grad() = torch::randn_like(p.value());
  }
  fullburn::OptimizerOptions oo;
  fullburn::Optimizer optim(params, oo);
  optim.Step(0.01);
  // Split as the trainer splits it (src/train/trainer.cpp, Snapshot).
  auto state = [&] {
    fullburn::CheckpointState s;
    for (auto& p : model->named_parameters()) s.until_update.emplace_back("model." + p.key(), p.value());
    for (auto& b : model->named_buffers()) s.tensors.emplace_back("model." + b.key(), b.value());
    for (auto& [n, t] : optim.State()) s.until_update.emplace_back("optim." + n, t);
    return s;
  };
  auto all = [&] {
    fullburn::CheckpointState s = state();
    for (auto& t : s.until_update) s.tensors.push_back(t);
    s.until_update.clear();
    return s;
  };
  int64_t bytes = 0;
  for (auto& [n, t] : all().tensors) bytes += t.numel() * t.element_size();
  // The work between a checkpoint and the next optimizer step: one forward
  // and backward of the model (batch 8, 64x64), as in a training loop.
  torch::Tensor x = torch::randn({8, 3, 64, 64});
  torch::Tensor y = torch::randint(0, 1000, {8}, torch::kLong);
  auto fwd_bwd = [&] {
    double t0 = Now();
    torch::cross_entropy_loss(model->forward(x), y).backward();
    return Now() - t0;
  };
  double step_alone = 0;
  for (int i = 0; i < 3; ++i) step_alone = fwd_bwd();

  std::vector<double> async_stall, async_write, sync_save, ours_sync, step_during;
  double first_stall = 0, write_s = 0;
  // One writer for the whole run, as in training: the first snapshot also
  // allocates its host buffers, later ones reuse them.
  fullburn::CheckpointWriter writer(dir, 1, /*async=*/true,
                                    [&](const fullburn::CheckpointWriter::Written& x) { write_s = x.write_s; });
  first_stall = writer.Save(0, state());
  first_stall += writer.BeforeUpdate();
  writer.Wait();
  for (int r = 0; r < repeats; ++r) {
    {
      double blocked = writer.Save(r + 1, state());
      step_during.push_back(fwd_bwd());
      blocked += writer.BeforeUpdate();  // the optimizer step would come now
      async_stall.push_back(blocked);
      writer.Wait();
      async_write.push_back(write_s);
    }
    {
      fullburn::CheckpointWriter w(dir, 1, /*async=*/false, nullptr);
      ours_sync.push_back(w.Save(100 + r, all()));
    }
    // The baseline: what a libtorch loop does today, blocking until written.
    double t0 = Now();
    torch::serialize::OutputArchive archive;
    for (auto& [n, t] : all().tensors) archive.write(n, t);
    archive.save_to(dir + "/torch_save.pt");
    sync_save.push_back(Now() - t0);
  }
  double stall = Median(async_stall), base = Median(sync_save);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"state_bytes", bytes},
                                       {"async_blocked_s", stall},
                                       {"async_first_blocked_s", first_stall},
                                       {"async_background_write_s", Median(async_write)},
                                       {"fullburn_sync_s", Median(ours_sync)},
                                       {"torch_save_s", base},
                                       {"step_s_alone", step_alone},
                                       {"step_s_during_checkpoint", Median(step_during)},
                                       {"ratio", stall / base}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("state: %.0f MB (ResNet-50 weights, buffers, SGD momentum), median of %d\n", bytes / 1e6, repeats);
    std::printf("| checkpoint | loop blocked |\n|---|---|\n");
    std::printf("| fullburn async (snapshot; write %.0f ms on a thread) | %.0f ms |\n", Median(async_write) * 1e3, stall * 1e3);
    std::printf("| fullburn async, first checkpoint (allocates its host buffers) | %.0f ms |\n", first_stall * 1e3);
    std::printf("| fullburn sync (safetensors + crc32 + fsync + rename) | %.0f ms |\n", Median(ours_sync) * 1e3);
    std::printf("| torch::save (OutputArchive, no fsync) | %.0f ms |\n", base * 1e3);
    std::printf("forward+backward (batch 8, 64x64): %.0f ms alone, %.0f ms while the writer copies and writes\n",
                step_alone * 1e3, Median(step_during) * 1e3);
    std::printf("async / torch::save: %.1f%% (goal <= 10%%)\n", 100 * stall / base);
  }
  return 0;
}
