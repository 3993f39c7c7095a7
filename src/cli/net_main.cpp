// fullburn-net: `fullburn serve`, `fullburn fleet` and MLflow's (`runs
// push`, and mlflow-follow beside `run --mlflow`), which fullburn hands over
// by exec. They are the only commands that speak HTTP and TLS, and an
// executable of their own keeps those libraries (libmicrohttpd with GnuTLS,
// cpp-httplib with OpenSSL, yaml-cpp: 6.5 MB resident once loaded, nearly
// half of a small command's peak) out of every other command's process.
#include "cli.h"

int main(int argc, char** argv) {
  using namespace fullburn::cli;
  CLI::App app{"fullburn: keep GPUs busy while deep-learning models train", "fullburn"};
  app.require_subcommand(1);
  SetupServe(app);
  SetupFleet(app);
  SetupMlflow(app);
  return ParseAndRun(app, argc, argv);
}
