// fullburn make-dataset and fullburn bench: the input pipeline from the
// command line (no libtorch needed for either).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli.h"
#include "fullburn/env.h"
#include "fullburn/pipeline.h"

namespace fullburn::cli {
namespace {

struct MakeImagesOptions {
  std::string dir, size = "500x375";
  SyntheticImagesOptions synth;
};

int MakeImages(MakeImagesOptions o) {
  int w = 0, h = 0;
  if (std::sscanf(o.size.c_str(), "%dx%d", &w, &h) != 2 || w < 8 || h < 8)
    return Fail("--size '" + o.size + "' is not WxH with both at least 8, e.g. 500x375");
  o.synth.width = w;
  o.synth.height = h;
  auto t0 = std::chrono::steady_clock::now();
  if (Status s = MakeSyntheticImages(o.dir, o.synth); !s.ok()) return Fail(s.message());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %d images (%d classes x %d, %dx%d, quality %d) to %s in %.1fs\n",
              o.synth.classes * o.synth.per_class, o.synth.classes, o.synth.per_class, w, h,
              o.synth.quality, o.dir.c_str(), secs);
  return 0;
}

struct BenchOptions {
  std::string data, device;
  int threads = 0, batch_size = 64, batches = 50, warmup = 3, size = 224;
  bool json = false;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Device-resident batches need libtorch: fullburn-train measures them.
int BenchDeviceLoader(const BenchOptions& o) {
  std::string train = TrainingExecutable();
  if (train.empty())
    return Fail("--device needs the training half (fullburn-train), which " + WithoutTrainingHalf() +
                "; or leave --device out");
  std::vector<std::string> args = {train, "bench-loader", o.data, "--device", o.device,
                                   "--threads", std::to_string(o.threads),
                                   "--batch-size", std::to_string(o.batch_size),
                                   "--batches", std::to_string(o.batches)};
  if (o.json) args.push_back("--json");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(train.c_str(), argv.data());
  return Fail("cannot run " + train);
}

int BenchLoader(const BenchOptions& o) {
  if (!o.device.empty()) return BenchDeviceLoader(o);
  LoaderOptions lo;
  lo.root = o.data;
  lo.threads = o.threads;
  lo.batch_size = o.batch_size;
  lo.out_w = lo.out_h = o.size;
  Result<std::unique_ptr<ImageLoader>> loader = ImageLoader::Open(lo);
  if (!loader.ok()) return Fail(loader.status().message());
  ImageLoader& l = **loader;
  int epoch = 0;
  l.StartEpoch(epoch);
  double start = 0;
  LoaderStats at_start;
  Batch b;
  for (int k = 0; k < o.warmup + o.batches; ++k) {
    if (k == o.warmup) {
      start = Now();
      at_start = l.stats();
    }
    while (!l.Next(&b)) {
      if (!l.status().ok()) return Fail(l.status().message());
      l.StartEpoch(++epoch);
    }
    l.Release(b);
  }
  double secs = Now() - start;
  LoaderStats end = l.stats();
  double images = static_cast<double>(o.batches) * o.batch_size;
  double per_image = 1e3 / (end.samples - at_start.samples);
  nlohmann::json j;
  j["images_per_s"] = images / secs;
  j["threads"] = end.threads;
  j["images_per_s_per_thread"] = images / secs / end.threads;
  j["stages"] = {{"read_ms_per_image", (end.stages.read_s - at_start.stages.read_s) * per_image},
                 {"decode_ms_per_image", (end.stages.decode_s - at_start.stages.decode_s) * per_image},
                 {"augment_ms_per_image", (end.stages.augment_s - at_start.stages.augment_s) * per_image}};
  j["skipped"] = end.skipped;
  j["batch_size"] = o.batch_size;
  j["batches"] = o.batches;
  j["seconds"] = secs;
  j["data_wait_share"] = (end.consumer_wait_s - at_start.consumer_wait_s) / secs;
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%.0f img/s with %d threads (%.0f img/s per thread), batch %d, %dx%d RandomResizedCrop + flip\n",
                images / secs, end.threads, images / secs / end.threads, o.batch_size, o.size, o.size);
    std::printf("per image: read %.3f ms, decode %.3f ms, crop+resize %.3f ms; skipped %lld\n",
                j["stages"]["read_ms_per_image"].get<double>(), j["stages"]["decode_ms_per_image"].get<double>(),
                j["stages"]["augment_ms_per_image"].get<double>(), static_cast<long long>(end.skipped));
  }
  return 0;
}

// libjpeg-turbo alone: full-size decode of the folder's files, no crop, no resize.
int BenchDecode(const BenchOptions& o) {
  Result<ImageFolder> folder = ScanImageFolder(o.data);
  if (!folder.ok()) return Fail(folder.status().message());
  int threads =
      o.threads > 0 ? o.threads : std::max(1, RankCpus(ReadCpuView(Env::Default()), 1) - 1);
  const int64_t total = static_cast<int64_t>(o.batches) * o.batch_size;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> failed{0}, png{0};
  auto work = [&] {
    DecodedRegion region;
    std::vector<uint8_t> bytes;
    for (int64_t i; (i = next++) < total;) {
      const std::string& path = folder->files[static_cast<size_t>(i) % folder->files.size()];
      if (!ReadWholeFile(path, &bytes).ok()) {
        ++failed;
        continue;
      }
      // PNGs as the loader decodes them (libpng, whole), counted apart.
      bool is_png = IsPng(bytes.data(), bytes.size());
      png += is_png;
      Status s = is_png ? DecodePng(bytes.data(), bytes.size(), &region)
                        : DecodeJpeg(bytes.data(), bytes.size(), &region);
      failed += !s.ok();
    }
  };
  double t0 = Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  double secs = Now() - t0;
  nlohmann::json j{{"images_per_s", total / secs},
                   {"threads", threads},
                   {"images_per_s_per_thread", total / secs / threads},
                   {"failed", failed.load()},
                   {"png", png.load()}};
  if (o.json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    std::printf("%.0f img/s decode-only with %d threads (%.0f per thread)\n", total / secs, threads,
                total / secs / threads);
  return 0;
}

struct PackCliOptions {
  std::string src, dst, format = "jpeg";
  PackOptions pack;
};

int Pack(PackCliOptions o) {
  o.pack.format = o.format == "raw" ? PackFormat::kRaw : PackFormat::kJpeg;
  auto t0 = std::chrono::steady_clock::now();
  Result<PackReport> r = WritePack(o.src, o.dst, o.pack);
  if (!r.ok()) return Fail(r.status().message());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("packed %lld images (%s, %.1f MiB) into %s in %.1fs; %lld skipped\n",
              static_cast<long long>(r->images), o.format.c_str(), r->bytes / 1048576.0, o.dst.c_str(),
              secs, static_cast<long long>(r->skipped));
  return 0;
}

void AddBenchFlags(CLI::App* app, BenchOptions* o) {
  app->add_option("DATA", o->data, "Image folder (ROOT/<class>/*.jpg) or pack")->required();
  app->add_option("--threads", o->threads,
                  "Worker threads (0: the CPUs this process may use, less one)")
      ->capture_default_str();
  app->add_option("--batch-size", o->batch_size, "Images per batch")->capture_default_str()->check(CLI::PositiveNumber);
  app->add_option("--batches", o->batches, "Batches to time (after warm-up)")->capture_default_str()->check(CLI::PositiveNumber);
  app->add_flag("--json", o->json, "JSON output");
}

}  // namespace

void SetupData(CLI::App& app) {
  CLI::App* make = app.add_subcommand("make-dataset", "Write a synthetic dataset (no download)");
  make->require_subcommand(1);
  auto mo = std::make_shared<MakeImagesOptions>();
  CLI::App* images = make->add_subcommand("images", "A learnable, photo-like JPEG image folder");
  images->add_option("DIR", mo->dir, "Folder to create (ROOT/class_NNN/img_NNNNN.jpg)")->required();
  images->add_option("--classes", mo->synth.classes, "Number of classes")->capture_default_str()->check(CLI::Range(1, 100000));
  images->add_option("--per-class", mo->synth.per_class, "Images per class")->capture_default_str()->check(CLI::Range(1, 10000000));
  images->add_option("--size", mo->size, "Image size WxH")->capture_default_str();
  images->add_option("--quality", mo->synth.quality, "JPEG quality")->capture_default_str()->check(CLI::Range(1, 100));
  images->add_option("--seed", mo->synth.seed, "Random seed")->capture_default_str();
  images->callback([mo] { ExitCode() = MakeImages(*mo); });

  auto po = std::make_shared<PackCliOptions>();
  CLI::App* pack = app.add_subcommand("pack", "Preprocess an image folder once into a packed dataset");
  pack->add_option("SRC", po->src, "Image folder (ROOT/<class>/*.jpg)")->required();
  pack->add_option("DST", po->dst, "Pack directory to create (docs/formats.md)")->required();
  pack->add_option("--max-side", po->pack.max_side, "Resize so no side exceeds this (0: keep)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  pack->add_option("--format", po->format, "jpeg (re-encoded when resized) or raw (decoded RGB: no decoding while training)")
      ->capture_default_str()->check(CLI::IsMember({"jpeg", "raw"}));
  pack->add_option("--quality", po->pack.quality, "JPEG quality when re-encoding")->capture_default_str()->check(CLI::Range(1, 100));
  pack->add_option("--threads", po->pack.threads, "Threads (0: one per CPU this process may use)")
      ->capture_default_str();
  pack->callback([po] { ExitCode() = Pack(*po); });

  auto to = std::make_shared<std::pair<std::string, SyntheticTokensOptions>>();
  CLI::App* tokens = make->add_subcommand("tokens", "A learnable token file (uint16, nanoGPT layout)");
  tokens->add_option("FILE", to->first, "File to write")->required();
  tokens->add_option("--tokens", to->second.tokens, "Number of tokens")->capture_default_str()->check(CLI::Range(int64_t(2), int64_t(1) << 40));
  tokens->add_option("--vocab", to->second.vocab, "Vocabulary size")->capture_default_str()->check(CLI::Range(2, 65536));
  tokens->add_option("--seed", to->second.seed, "Random seed")->capture_default_str();
  tokens->callback([to] {
    Status s = MakeSyntheticTokens(to->first, to->second);
    if (!s.ok()) {
      ExitCode() = Fail(s.message());
      return;
    }
    std::printf("wrote %lld tokens (vocabulary %d) to %s\n", static_cast<long long>(to->second.tokens),
                to->second.vocab, to->first.c_str());
  });

  CLI::App* bench = app.add_subcommand("bench", "Measure a part of the pipeline alone");
  bench->require_subcommand(1);
  auto bo = std::make_shared<BenchOptions>();
  CLI::App* loader = bench->add_subcommand("loader", "Input pipeline throughput: RandomResizedCrop 224 + flip");
  AddBenchFlags(loader, bo.get());
  loader->add_option("--device", bo->device,
                     "Measure batches resident on this device, normalized (cpu, cuda[:N]); "
                     "default: uint8 host batches");
  loader->callback([bo] { ExitCode() = BenchLoader(*bo); });
  CLI::App* decode = bench->add_subcommand(
      "decode", "Full-size decode alone, libjpeg-turbo (libpng for PNGs): the ceiling");
  AddBenchFlags(decode, bo.get());
  decode->callback([bo] { ExitCode() = BenchDecode(*bo); });
}

}  // namespace fullburn::cli
