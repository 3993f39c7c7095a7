// fullburn train: hands the job to fullburn-train (the libtorch half) by exec,
// so signals and the exit code are its own. Help and the config reference are
// answered here, so they work even where the training half is not built.
#include <cstdio>
#include <cstring>

#include "cli.h"
#include "fullburn/config.h"

namespace fullburn::cli {
namespace {

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
    std::fputs(TrainHelp().c_str(), stdout);
    return 0;
  }
  std::string exe = TrainingExecutable();
  if (exe.empty())
    return Fail(std::string("'") + argv[1] + "' needs the training half (fullburn-train), which " +
                WithoutTrainingHalf());
  return HandOff(exe, argc, argv);
}

}  // namespace fullburn::cli
