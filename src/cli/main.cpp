// fullburn: observe, diagnose and fix GPU training jobs.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#ifdef FULLBURN_HAVE_TORCH
#include "fullburn/train.h"
#endif

namespace {

const char* const kCommands[] = {"run", "watch", "runs", "serve", "version"};

int Version() {
  std::printf("fullburn 0.1.0\n");
#ifdef FULLBURN_HAVE_TORCH
  std::printf("training half: %s\n", fullburn::TorchDescription().c_str());
#else
  std::printf("training half: not built (libtorch was not found at build time)\n");
#endif
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

}  // namespace

int main(int argc, char** argv) {
  using namespace fullburn::cli;
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const char* c : kCommands) known |= std::strcmp(argv[1], c) == 0;
    if (!known)
      return Fail(std::string("unknown command '") + argv[1] +
                  "': use run, watch, runs, serve or version (see 'fullburn --help')");
  }
  CLI::App app{"fullburn: keep GPUs busy while deep-learning models train"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fullburn 0.1.0");
  SetupRun(app);
  SetupWatch(app);
  SetupRuns(app);
  SetupServe(app);
  app.add_subcommand("version", "Print versions of fullburn, libtorch and NVML")
      ->callback([] { ExitCode() = Version(); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where = app.get_subcommands().empty()
                            ? "fullburn --help"
                            : "fullburn " + app.get_subcommands().front()->get_name() + " --help";
    return Fail(std::string(e.what()) + " (see '" + where + "')");
  }
  return ExitCode();
}
