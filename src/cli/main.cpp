// fullburn: observe, diagnose and fix GPU training jobs.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <unistd.h>

#include "cli.h"
#include "fullburn/causes.h"
#include "fullburn/report.h"

namespace {

const char* const kCommands[] = {"run",    "attach",       "watch",  "runs",  "diagnose",
                                 "report", "compare",      "launch", "serve", "metrics",
                                 "bench",  "make-dataset", "pack",   "tune",  "version",
                                 "analyze", "fleet", "causes"};

std::string TrainingHalf() {
  std::string path = fullburn::cli::TrainingExecutable();
  if (path.empty()) return "";
  std::string out;
  if (FILE* p = ::popen((path + " --version 2>&1").c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// serve, fleet and runs push: fullburn-net's (cli.h NetworkExecutable).
int NetworkCommand(int argc, char** argv) {
  std::string exe = fullburn::cli::NetworkExecutable();
  if (exe.empty())
    return fullburn::cli::Fail(std::string("'") + argv[1] +
                               "' needs fullburn-net beside this fullburn, which is missing: "
                               "reinstall fullburn (or build the target fullburn-net)");
  return fullburn::cli::HandOff(exe, argc, argv);
}

int Version() {
  std::printf("fullburn %s\n", FULLBURN_VERSION);
  std::string train = TrainingHalf();
  std::printf("training half: %s\n",
              train.empty() ? "not built (libtorch was not found at build time)" : train.c_str());
  std::string net = fullburn::cli::NetworkExecutable();
  std::printf("serve, fleet: %s\n", net.empty() ? "missing (fullburn-net is not beside fullburn)" : net.c_str());
  auto gpus = fullburn::GpuSource::Open();
  if (!gpus.ok()) {
    std::printf("GPU telemetry: %s\n", gpus.status().message().c_str());
  } else if (!(*gpus)->available()) {
    std::printf("GPU telemetry: unavailable (%s)\n", (*gpus)->unavailable_reason().c_str());
  } else {
    std::printf("GPU telemetry: NVML %s, driver %s, %zu GPU(s)\n", (*gpus)->library_path().c_str(),
                (*gpus)->driver_version().c_str(), (*gpus)->gpus().size());
  }
  return 0;
}

// The metric catalog, as a table (docs/metrics.md is this output).
int Metrics(bool markdown) {
  using fullburn::MetricScope;
  if (markdown) {
    std::printf("| metric | unit | Prometheus name | meaning |\n|---|---|---|---|\n");
  } else {
    std::printf("%-28s %-8s %-34s %s\n", "metric", "unit", "prometheus", "meaning");
  }
  for (const fullburn::MetricDef& d : fullburn::MetricCatalog()) {
    std::string name = fullburn::MetricName(d, 0);
    if (d.scope == MetricScope::kGpu) name = "gpuN." + std::string(d.suffix);
    if (d.scope == MetricScope::kCore) name = "host.cpuN." + std::string(d.suffix);
    std::string prom = fullburn::PrometheusName(d);
    if (markdown)
      std::printf("| `%s` | %s | `%s` | %s |\n", name.c_str(), d.unit, prom.c_str(), d.help);
    else
      std::printf("%-28s %-8s %-34s %s\n", name.c_str(), d.unit, prom.c_str(), d.help);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fullburn::cli;
  // Its own argument grammar (CONFIG.toml key=value ...), passed on whole.
  if (argc > 1 && (std::strcmp(argv[1], "train") == 0 || std::strcmp(argv[1], "export-weights") == 0))
    return Train(argc, argv);
  if (argc > 1 && (std::strcmp(argv[1], "serve") == 0 || std::strcmp(argv[1], "fleet") == 0))
    return NetworkCommand(argc, argv);
  if (argc > 2 && std::strcmp(argv[1], "runs") == 0 && std::strcmp(argv[2], "push") == 0)
    return NetworkCommand(argc, argv);  // MLflow's REST API
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string all = "train";
    for (const char* c : kCommands) {
      known |= std::strcmp(argv[1], c) == 0;
      all += std::string(", ") + c;
    }
    if (!known)
      return Fail(std::string("unknown command '") + argv[1] + "': use one of " + all + " (see 'fullburn --help')");
  }
  CLI::App app{"fullburn: keep GPUs busy while deep-learning models train"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fullburn " FULLBURN_VERSION);
  SetupRun(app);
  SetupAttach(app);
  SetupWatch(app);
  SetupRuns(app);
  SetupReport(app);
  SetupLaunch(app);
  SetupData(app);
  SetupTune(app);
  SetupAnalyze(app);
  // Listed for --help; main() hands these to fullburn-net and fullburn-train
  // before parsing.
  app.add_subcommand("serve", kServeAbout);
  app.add_subcommand("fleet", kFleetAbout);
  app.add_subcommand("train", "Train a model (libtorch): CONFIG.toml key=value ... (fullburn train --help)");
  app.add_subcommand("export-weights", "CHECKPOINT OUT.safetensors: a checkpoint's model weights for Python");
  auto markdown = std::make_shared<bool>(false);
  CLI::App* metrics = app.add_subcommand("metrics", "List every metric: name, unit, Prometheus name");
  metrics->add_flag("--markdown", *markdown, "As a markdown table");
  metrics->callback([markdown] { ExitCode() = Metrics(*markdown); });
  CLI::App* causes = app.add_subcommand(
      "causes", "List every cause a finding can name: title, evidence, fleet's wording, tune's knob");
  causes->add_flag("--markdown", *markdown, "As a markdown table (docs/diagnosis.md)");
  causes->callback([markdown] {
    std::fputs(fullburn::RenderCauses(*markdown).c_str(), stdout);
    ExitCode() = 0;
  });
  app.add_subcommand("version", "Print versions of fullburn, libtorch and NVML")
      ->callback([] { ExitCode() = Version(); });
  return ParseAndRun(app, argc, argv);
}
