// The cause catalog: every cause a finding can name, one entry each, read by
// diagnose (its rules), analyze (its trace thresholds), fleet (its wording
// for a cluster's owner) and tune (the knob it tries first). docs/diagnosis.md's
// catalog table is `fullburn causes --markdown`.
//
// Contract
// - Static data, built once, immutable: safe from any thread. Nothing here
//   reads a run; the rules in src/diagnose do, and fill the measured numbers
//   into the catalog's texts.
// - A cause's name is stable (JSON, Prometheus labels, docs use it): never
//   renamed, only added. CauseId's order is the catalog's order, not an
//   on-disk value: nothing stores the number.
// - Adding a cause is one entry here (causes.cpp) and one rule that makes its
//   findings (src/diagnose/rules.cpp, or analyze/fleet for their own).
// - Fix texts are fmt format strings: a rule fills the named fields it lists
//   ({workers}, {batch}, ...) with fmt::runtime, and FixFor() falls back to
//   plain PyTorch's text where a framework has no words of its own.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace fullburn {

enum class CauseId {
  kInputCpu,
  kInputIo,
  kInputWorkers,
  kH2dCopy,
  kSmallBatch,
  kMemoryHeadroom,
  kMemoryPressure,
  kThrottlePower,
  kThrottleThermal,
  kIdlePhases,
  kUnevenRanks,
  kCommunication,
  kStepStalls,
  kCheckpointStall,
  kJobFailed,
  kRecordCut,
  kLoopOverhead,
  kGpuUnused,
  kHostSync,
  kCpuThreads,
  kPrecision,
  kLowMfu,
  kHealthy,
  // A cluster's own causes (fleet): what the GPU's state says where no
  // diagnosis of a job does.
  kIdleHeld,
  kNotHeld,
  kUndiagnosed,
  kUnreported,
};

// Whose words a fix is in: the loop's framework, as the step hooks saw it
// (docs/frameworks.md), or fullburn train's config keys.
enum class Framework { kPytorch, kLightning, kTransformers, kAccelerate, kFullburnTrain };
constexpr int kFrameworkCount = 5;
// "lightning", "transformers", "accelerate" (the hooks' names); anything else
// (timm, none) is plain PyTorch; `trainer`: a fullburn train run.
Framework FrameworkFrom(std::string_view hooks_framework, bool trainer);
const char* FrameworkName(Framework f);  // "PyTorch", "Lightning", "HF Trainer", ...

// Where a cause is named: by a run's diagnosis (and analyze's traces), or
// only by fleet, from the GPU's own state.
enum class CauseScope { kRun, kFleet };

struct Cause {
  CauseId id;
  const char* name;      // the stable identifier: "input_workers"
  const char* title;     // the one-line title; a rule may say it more precisely
  const char* evidence;  // what its evidence quotes, and the threshold
  // The fix in each framework's words (indexed by Framework); nullptr: the
  // plain-PyTorch text applies. Named fields are the rule's to fill.
  const char* fix[kFrameworkCount];
  const char* fleet;      // fleet's wording, for whoever owns the cluster
  const char* tune_knob;  // the knob fullburn tune tries first for it ("": none)
  double trace_share;     // analyze names it from a trace at this share of the kernel span (NaN: never)
  CauseScope scope;
  bool input_bound;  // the input pipeline's: tune then orders the loader's knobs first
  // The stack phases (stacks.h) whose top frames are its findings' "where":
  // of "workers,data_wait", the one with the most busy samples. "": none.
  const char* stack_phases = "";
};

// low_mfu's line: a busy GPU at a lower MFU is used inefficiently (its
// source in docs/diagnosis.md, "Used well"); diagnose's rule and fleet's
// GPU-hours below it.
constexpr double kMfuLow = 0.20;

const std::vector<Cause>& Causes();     // every entry, in CauseId order
const Cause& CauseOf(CauseId id);
const Cause* FindCause(std::string_view name);  // nullptr: no such cause
inline const char* CauseName(CauseId id) { return CauseOf(id).name; }
// The cause's fix in framework `f`'s words (plain PyTorch's where it has none).
const char* FixFor(CauseId id, Framework f);

// Settings several causes' fixes point to, as each framework spells them
// (docs/frameworks.md): where a Lightning user gives the DataLoader its
// arguments is not where a Trainer's user does. "" where a framework has no
// words of its own (plain PyTorch: the fix's own text says it).
enum class FrameworkSetting { kLoaderArgs, kEvaluationSchedule, kCheckpointSchedule };
const char* SettingIn(FrameworkSetting s, Framework f);

// The catalog as a table: text, or markdown (docs/diagnosis.md).
std::string RenderCauses(bool markdown);

}  // namespace fullburn
