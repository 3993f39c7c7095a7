// Stacks: where the time goes in the job's own code. `fullburn run` samples
// the Python stacks of the job's whole process tree with py-spy (its main
// process and every DataLoader worker, fork and spawn alike) into a raw
// folded file; this component reads it, gives each sample to a phase of the
// step and folds library frames under the job's frame that called them, for
// the findings' "where", the report and `fullburn runs stacks`
// (docs/stacks.md).
//
// Contract
// - Pure functions of their inputs (no I/O, no processes), safe from any
//   thread; the sampler that runs py-spy is the cli's (stacks_sampler.cpp).
// - A sample's phase is decided by its own frames, in this order: an
//   import under way is start-up ("startup", wherever it happens); a save
//   (the step hooks' timed torch.save, torch.save itself) is a checkpoint;
//   a function of the job's under torch.no_grad()'s decorator, or a
//   framework's evaluation loop (Lightning's, the HF Trainer's evaluate),
//   an evaluation; a DataLoader's __next__/__iter__ (the hooks' wrappers,
//   or the DataLoader's own) the data wait. Otherwise its innermost frame
//   of autograd's backward, of torch.optim/clip_grad/GradScaler, or of
//   torch.nn decides: backward, optimizer, forward. Else the loop's own
//   work ("other").
// - Processes: a process with torch's worker loop on its stack is a
//   DataLoader worker; the training processes are the others whose main
//   thread ran a step phase (every rank under torchrun), else the process
//   fullburn started; any other process (a launcher, a compile pool) is
//   "processes". A training process's other threads are "threads".
// - A sample is waiting when its innermost frame is the standard library
//   blocking (a queue's get, a lock's wait, select): counted in its phase,
//   left out of the places, so a worker's idle wait for indices names no
//   line.
// - A frame is the job's own when its file is under none of the
//   interpreter's folders, site- or dist-packages, frozen modules, or
//   `tool_dirs` (fullburn's own Python files).
// - Strings are kept as py-spy wrote them, except that bytes that are not
//   UTF-8 and control bytes (a name py-spy read torn, "~\0") are replaced
//   (U+FFFD), so every summary is valid JSON and every folded stack one line.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace fullburn {

struct StackFrame {
  std::string function, file;
  int line = 0;
};

struct StackSample {
  int pid = 0;
  int tid = 0;  // 0: py-spy ran without --threads
  std::string thread;
  std::vector<StackFrame> frames;  // outermost first
  int64_t count = 1;
};

// py-spy's raw format ("process PID:\"cmd\";thread (TID): NAME;func
// (file:line);... COUNT"), one stack per line; lines that are not one are
// counted in `bad`.
std::vector<StackSample> ParseFoldedStacks(const std::string& text, int64_t* bad = nullptr);

enum class StackPhase {
  kDataWait,
  kForward,
  kBackward,
  kOptimizer,
  kEvaluation,
  kCheckpoint,
  kOther,
  kStartup,
  kThreads,
  kWorkers,
  kProcesses
};
constexpr int kStackPhaseCount = 11;
const char* StackPhaseName(StackPhase p);   // "data_wait", ..., "processes"
const char* StackPhaseLabel(StackPhase p);  // "the data wait", ..., "the DataLoader workers"
// Fails (false) on a name that is no phase.
bool ParseStackPhase(const std::string& name, StackPhase* out);
// The phases of a training step's main thread: data wait to other.
bool IsStepPhase(StackPhase p);

struct StackRoles {
  std::set<int> training;  // the training processes
  std::set<int> workers;   // DataLoader workers
  int root = 0;            // the process fullburn started
};
// `root`: the process fullburn started (its pid in the file).
StackRoles FindStackRoles(const std::vector<StackSample>& samples, int root);

StackPhase PhaseOf(const StackSample& s, const StackRoles& roles);
bool IsOwnFrame(const StackFrame& f, const std::vector<std::string>& tool_dirs = {});
bool IsWaiting(const StackSample& s);
// "train.py:42 Photos.__getitem__ -> PIL Image.resize": the innermost own
// frame, and under it the innermost frame of all, when that is another
// (a library's, said as its package and function). No own frame: the
// innermost frame, with its file. Places are summed by function: `key`
// leaves the line out, `line` is the own frame's (0: none).
struct SamplePlace {
  std::string key;   // "train.py Photos.__getitem__ -> PIL Image.resize"
  std::string file;  // the own frame's basename, "" when none
  int line = 0;
  std::string function, callee;  // callee: "PIL Image.resize", or ""
  std::string Render(int at_line) const;
};
SamplePlace PlaceOf(const StackSample& s, const std::vector<std::string>& tool_dirs = {});

struct StackPlace {
  std::string where;
  int64_t samples = 0;
};

struct StackPhaseSummary {
  int64_t samples = 0;  // all of the phase's, waiting included
  int64_t waiting = 0;
  std::vector<StackPlace> top;  // busy samples by place, most first
};

struct StackSummary {
  double rate_hz = 0;   // samples per second per thread
  int64_t samples = 0;  // every stack's
  int64_t bad_lines = 0;
  int64_t errors = 0;  // samples py-spy could not take (its own count)
  int root = 0;
  // The sampler's own cost: py-spy's CPU time over the run's length.
  double sampler_cpu_s = 0, duration_s = 0;
  double sampler_paused_s = 0;  // held paused to stay within its CPU budget
  std::vector<int> training, workers;
  std::array<StackPhaseSummary, kStackPhaseCount> phases{};
  const StackPhaseSummary& of(StackPhase p) const { return phases[static_cast<int>(p)]; }
  int64_t StepSamples() const;  // the training threads' samples in step phases
  bool empty() const { return samples == 0; }
};
StackSummary SummarizeStacks(const std::vector<StackSample>& samples, int root, double rate_hz,
                             const std::vector<std::string>& tool_dirs = {}, size_t top = 8);

// The summary as the run's `stacks` event stores it, and back (a summary
// that is not one reads as empty).
constexpr const char* kStacksEvent = "stacks";
nlohmann::json StackSummaryJson(const StackSummary& s);
StackSummary StackSummaryFromJson(const nlohmann::json& j);

// "train.py:42 Photos.__getitem__ -> PIL Image.resize 83% of the data wait,
// train.py:50 ... 9%": the phase's top `n` places, each as a share of
// `base` samples (0: the phase's busy samples) said as `of`
// (empty: the phase's label). "" when the phase has no busy sample.
std::string RenderStackPlaces(const StackSummary& s, StackPhase phase, size_t n = 2,
                              int64_t base = 0, const std::string& of = "");

// Every phase's top places, for the report and `fullburn runs show`.
std::string RenderStackPhases(const StackSummary& s, size_t n = 3);

// Exports: folded stacks (flamegraph.pl's input), each line led by its
// phase, every phase or one (`phase` empty: all); speedscope's JSON, one
// sampled profile per phase with samples.
std::string FoldedStacks(const std::vector<StackSample>& samples, int root,
                         const std::string& phase = "");
nlohmann::json SpeedscopeJson(const std::vector<StackSample>& samples, int root, double rate_hz,
                              const std::string& name);

// `text` with bytes that are not UTF-8 replaced by U+FFFD.
std::string ValidUtf8(const std::string& text);

}  // namespace fullburn
