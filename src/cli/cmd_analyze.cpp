// fullburn analyze: PyTorch profiler traces, where each rank's GPU time went
// and what it waited for (src/analyze, docs/analyze.md).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli.h"
#include "fullburn/analyze.h"
#include "fullburn/step_range.h"

namespace fullburn::cli {
namespace {

struct AnalyzeCliOptions {
  std::vector<std::string> paths;
  bool json = false;
  int rank = -1;
  std::string steps;
  double kernel_wait_us = 30;
  size_t top = 10;
};

// "5-9" (or "7": one step) into ProfilerStep numbers, which count from 0.
Status ParseSteps(const std::string& text, AnalyzeOptions* o) {
  auto range = ParseStepRange(text, 0);
  if (!range.ok())
    return Status::InvalidArgument("--steps " + range.status().message() +
                                   " (the first and last ProfilerStep numbers, e.g. 5-9)");
  std::tie(o->first_step, o->last_step) = *range;
  return Status::Ok();
}

int AnalyzeCommand(const AnalyzeCliOptions& c) {
#ifndef FULLBURN_HAVE_ANALYZE
  (void)c;
  return Fail(
      "analyze: this fullburn was built without simdjson (libsimdjson-dev); install it "
      "(scripts/install-deps.sh) and build again");
#else
  AnalyzeOptions o;
  if (c.rank >= 0) o.rank = c.rank;
  if (!c.steps.empty()) {
    Status s = ParseSteps(c.steps, &o);
    if (!s.ok()) return Fail(s.message());
  }
  o.kernel_wait_us = c.kernel_wait_us;
  o.top_kernels = c.top;
  Result<TraceReport> rep = AnalyzeTraces(c.paths, o);
  if (!rep.ok()) return Fail(rep.status().message());
  for (const std::string& e : rep->errors) std::fprintf(stderr, "fullburn: %s\n", e.c_str());
  if (c.json)
    std::printf("%s\n", TraceReportJson(*rep).dump(2).c_str());
  else
    std::printf("%s", RenderTraceReport(*rep).c_str());
  return 0;
#endif
}

}  // namespace

void SetupAnalyze(CLI::App& app) {
  auto o = std::make_shared<AnalyzeCliOptions>();
  CLI::App* a = app.add_subcommand(
      "analyze",
      "PyTorch profiler traces (Kineto .json/.json.gz, one per rank, or a folder): where GPU "
      "time went, what it waited for, and the fix");
  a->add_option("TRACE", o->paths, "Trace files, or folders of them")->required();
  a->add_flag("--json", o->json,
              "JSON: per rank the breakdowns, the cross-rank comparison, findings and notes");
  a->add_option("--rank", o->rank,
                "Report only this rank (every file is still read, to compare the ranks)")
      ->check(CLI::NonNegativeNumber);
  a->add_option("--steps", o->steps,
                "ProfilerStep numbers A-B to analyse (default: every step but the last, as HTA)");
  a->add_option("--kernel-wait-us", o->kernel_wait_us,
                "A gap between launched kernels shorter than this is kernel wait (HTA's "
                "consecutive_kernel_delay)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  a->add_option("--top", o->top, "Kernels listed per rank")->capture_default_str();
  a->callback([o] { ExitCode() = AnalyzeCommand(*o); });
}

}  // namespace fullburn::cli
