#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "cli.h"

namespace fullburn::cli {

void AddStoreOption(CLI::App* app, CommonOptions* opts) {
  app->add_option("--store", opts->store,
                  "Run store file (default: $XDG_DATA_HOME/fullburn/runs.db, "
                  "else ~/.local/share/fullburn/runs.db)")
      ->envname("FULLBURN_STORE")
      ->type_name("PATH");
}

void AddIntervalOption(CLI::App* app, CommonOptions* opts, double default_s) {
  opts->interval_s = default_s;
  app->add_option("--interval", opts->interval_s, "Seconds between samples (0.05 to 3600)")
      ->envname("FULLBURN_INTERVAL")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0))
      ->type_name("S");
}

std::string SelfExecutable() {
  char self[4096] = {0};
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string path = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
  // Rebuilt or upgraded while running (a long tuning): the kernel names the
  // old file "PATH (deleted)"; children start the new one at PATH.
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() &&
      path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0) {
    std::string replaced = path.substr(0, path.size() - deleted.size());
    if (::access(replaced.c_str(), X_OK) == 0) return replaced;
  }
  return path;
}

std::string HostName() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string CurrentDir() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) ? buf : "";
}

namespace {

std::string ExecutableBeside(const char* name) {
  std::string path = SelfExecutable();
  if (path.empty()) return "";
  path = path.substr(0, path.rfind('/') + 1) + name;
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

}  // namespace

std::string TrainingExecutable() { return ExecutableBeside("fullburn-train"); }

std::string NetworkExecutable() { return ExecutableBeside("fullburn-net"); }

int HandOff(const std::string& exe, int argc, char** argv) {
  std::vector<char*> args = {const_cast<char*>(exe.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(exe.c_str(), args.data());
  return Fail("cannot start " + exe + ": " + std::strerror(errno), kExitCannotStart);
}

int ParseAndRun(CLI::App& app, int argc, char** argv) {
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

std::string WithoutTrainingHalf() {
#ifdef FULLBURN_PIP_BUILD
  return "is not in the pip package (it links libtorch): build fullburn with CMake for it "
         "(docs/install.md, \"The CMake path\")";
#else
  return "was not built: install libtorch (scripts/install-deps.sh) and rebuild";
#endif
}

std::string PythonDir() {
  std::vector<std::string> candidates;
  // An installed fullburn's, found from its own path, so a prefix can be
  // moved; a binary in its build tree has none there and uses the source's.
  if (std::string self = SelfExecutable(); !self.empty())
    candidates.push_back(
        std::filesystem::path(self.substr(0, self.rfind('/') + 1) + FULLBURN_INSTALLED_PYTHON_DIR)
            .lexically_normal()
            .string());
  candidates.push_back(FULLBURN_SOURCE_PYTHON_DIR);  // "" in a pip-built fullburn
  for (const std::string& dir : candidates)
    if (!dir.empty() && ::access((dir + "/fullburn_markers.py").c_str(), R_OK) == 0) return dir;
  return "";
}

std::string PythonPackageDir() {
  // Only a build-tree fullburn: an installed one's package lives in the
  // interpreter's site-packages (cmake --install --component python).
  if (std::string(FULLBURN_SOURCE_PYTHON_DIR).empty() || PythonDir() != FULLBURN_SOURCE_PYTHON_DIR)
    return "";
  std::string dir = FULLBURN_BUILD_PYTHON_DIR;
  return ::access((dir + "/fullburn/__init__.py").c_str(), R_OK) == 0 ? dir : "";
}

int& ExitCode() {
  static int code = 0;
  return code;
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "fullburn: %s\n", message.c_str());
  return code;
}

namespace {

// mkdir -p for the default store location only.
bool MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

}  // namespace

std::string StorePath(const CommonOptions& opts) {
  // --store and $FULLBURN_STORE both arrive in opts.store (CLI11's envname).
  return opts.store.empty() ? RunStore::DefaultPath() : opts.store;
}

Result<std::unique_ptr<RunStore>> OpenStore(const CommonOptions& opts) {
  std::string path = StorePath(opts);
  if (opts.store.empty()) {
    std::string dir = path.substr(0, path.rfind('/'));
    if (!MakeDirs(dir))
      return Status::IoError("cannot create the store directory " + dir + ": " +
                             std::strerror(errno) + "; pass --store with a writable path");
  }
  return RunStore::Open(path);
}

Result<std::unique_ptr<GpuSource>> OpenGpus() { return GpuSource::Open(); }

void NoteIfGpusUnavailable(const GpuSource& gpus) {
  if (!gpus.available()) {
    std::fprintf(stderr, "fullburn: GPU metrics unavailable: %s; recording host metrics only\n",
                 gpus.unavailable_reason().c_str());
    return;
  }
  // GPUs without GPM, one line per reason: tensor-core use is then judged
  // from the step hooks' FLOP counts and a trace's kernels alone.
  std::map<std::string, std::vector<const GpuInfo*>> by_reason;
  for (const GpuInfo& g : gpus.gpus())
    if (!g.no_gpm.empty()) by_reason[g.no_gpm].push_back(&g);
  for (const auto& [reason, list] : by_reason) {
    std::string which;
    for (const GpuInfo* g : list) which += (which.empty() ? "" : ", ") + std::to_string(g->index);
    std::fprintf(stderr,
                 "fullburn: no SM, tensor or DRAM activity on GPU %s (%s): %s; tensor-core use "
                 "is judged from the job's FLOP counts instead\n",
                 which.c_str(), list.front()->name.c_str(), reason.c_str());
  }
}

std::vector<std::string> OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  std::string arg;
  while (std::getline(in, arg, '\0')) argv.push_back(arg);
  if (!argv.empty()) argv[0] = "fullburn";
  return argv;
}

}  // namespace fullburn::cli
