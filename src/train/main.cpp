// fullburn-train: the libtorch half of fullburn as its own executable, so the
// monitoring commands never pay libtorch's start-up time and memory. The
// `fullburn` command hands training subcommands to it.
#include <cstdio>
#include <cstring>

#include "fullburn/train.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("fullburn-train 0.1.0 (%s)\n", fullburn::TorchDescription().c_str());
    return 0;
  }
  std::fprintf(stderr, "fullburn-train: no training commands yet; use --version\n");
  return 2;
}
