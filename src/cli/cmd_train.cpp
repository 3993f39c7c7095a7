// fullburn train: hands the job to fullburn-train (the libtorch half) by exec,
// so signals and the exit code are its own. Help and the config reference are
// answered here, so they work even where the training half is not built.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli.h"
#include "fullburn/config.h"

namespace fullburn::cli {
namespace {

const char* const kTrainUsage =
    "fullburn train: train a model with libtorch and record every step\n\n"
    "Usage: fullburn train [CONFIG.toml] [key=value ...] [OPTIONS]\n\n"
    "With no arguments: trains a small ResNet on a synthetic JPEG image set (created on first\n"
    "use beside the run store) for a few minutes, on the GPU when libtorch sees one.\n\n"
    "Options:\n"
    "  --resume RUN|PATH   Continue a run (its last good checkpoint) or a checkpoint file\n"
    "  --name NAME         Name of the run (default: model and data)\n"
    "  --parent RUN        Record the run as part of another (fullburn tune's trials)\n"
    "  --store PATH        Run store (env FULLBURN_STORE)\n"
    "  -q, --quiet         No live progress line\n"
    "  --print-config      Print the effective config as TOML and exit\n"
    "  --help-config [--markdown]  Every config key with its default (docs/config.md)\n\n";

bool Has(int argc, char** argv, const char* flag) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

}  // namespace

int Train(int argc, char** argv) {
  bool train = std::strcmp(argv[1], "train") == 0;
  if (train && Has(argc, argv, "--help-config")) {
    std::fputs((Has(argc, argv, "--markdown") ? ConfigMarkdown() : ConfigHelp()).c_str(), stdout);
    return 0;
  }
  if (train && (Has(argc, argv, "--help") || Has(argc, argv, "-h"))) {
    std::printf("%s%s", kTrainUsage, ConfigHelp().c_str());
    return 0;
  }
  std::string exe = TrainingExecutable();
  if (exe.empty())
    return Fail(std::string("'") + argv[1] + "' needs the training half (fullburn-train), which was not built: install "
                "libtorch (scripts/install-deps.sh) and rebuild");
  std::vector<char*> args = {const_cast<char*>(exe.c_str()), argv[1]};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(exe.c_str(), args.data());
  return Fail("cannot start " + exe + ": " + std::strerror(errno), kExitCannotStart);
}

}  // namespace fullburn::cli
