// Tune: what `fullburn tune` decides, separated from how it runs trials.
// A tuning measures short trials, each a run in the store, changing one knob
// at a time from the best setting so far and keeping a change only when it
// beats the noise. The knobs are tried in the order the starting run's
// diagnosis suggests (the bottleneck first).
//
// Contract
// - Pure functions of their inputs: no processes, no files, no clocks; safe
//   from any thread. The loop that uses them (which trial next, the budget,
//   the store's records) is tuner.h's; src/cli/tune_trial.cpp runs each trial
//   as a child process.
// - Expected failures (an unknown knob, an empty or malformed grid, a run too
//   short to measure) are a Status with a one-line message naming the input
//   and the fix; nothing here throws.
// - A trial's JSON (TrialJson) is the `tune_trial` event of the tuning run, as
//   docs/tune.md describes; the HTML report reads it from there.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/diagnose.h"
#include "fullburn/status.h"
#include "fullburn/store.h"
#include "fullburn/train_settings.h"

namespace fullburn {

// ---- Knobs --------------------------------------------------------------

struct KnobDef {
  const char* name;  // what --knobs takes
  const char* key;   // the config key it sets ("" for batch: two keys)
  const char* help;
};
const std::vector<KnobDef>& TuneKnobs();
// "a,b" -> the knobs in that order; an unknown one suggests the closest.
Result<std::vector<std::string>> ParseKnobList(const std::string& csv);
Result<std::vector<std::string>> ParseKnobList(const std::string& csv,
                                               const std::vector<KnobDef>& knobs);

// What the tuner knows when it picks candidate values.
struct TuneContext {
  // The best run so far: its options (ReadStoredSettings), and where the
  // trainer resolved its images to (its stored "resolved" section).
  TrainSettings settings = DefaultSettings();
  std::string data_path, val_path;
  bool cuda = false;  // the trials run on a CUDA device
  int cores = 1;
  double host_memory_bytes = 0;
  bool input_bound = false;  // the diagnosis names the input pipeline
  // --knobs named the knobs: the input knobs (pack, cache) are tried even
  // when the diagnosis does not name the input pipeline.
  bool knobs_chosen = false;
  bool keep_effective_batch = true;
  std::string pack_dir;       // where the tuner may write a packed copy of the images
  bool data_is_pack = false;  // resolved.data_path already is a pack
};

// A packed copy of an image folder to write before a trial (fullburn pack
// SRC DST --format raw --max-side N).
struct PackJob {
  std::string src, dst;
  int max_side = 0;
};

// One value of a knob to try: the config overrides it stands for.
struct Candidate {
  std::string value;  // for people: "4", "bf16", "auto (largest that fits)"
  std::map<std::string, std::string> overrides;
  std::optional<PackJob> pack;  // to write first (the pack knob)
};
// The side a pack keeps for crops of `image_size`: twice the crop, so random
// resized crops of a quarter of the image still come from full-resolution
// pixels (docs/tune.md).
int PackMaxSide(int image_size);
// Whether a raw pack of `images` images of at most `max_side` pixels a side
// (3 bytes a pixel) leaves half of `free_bytes` free in `dir`: else an
// IoError with the sizes and the way out (pack by hand elsewhere).
Status CheckPackSpace(size_t images, int max_side, double free_bytes, const std::string& dir);
// Values of `knob` other than the current one; none with `skip_reason` set
// when the knob does not apply (no CUDA, not an image model, ...).
std::vector<Candidate> KnobCandidates(const std::string& knob, const TuneContext& ctx,
                                      std::string* skip_reason);

// Whether the top finding other than `healthy` names the input pipeline
// (input_cpu, input_io, input_workers, h2d_copy).
bool InputBound(const std::vector<Finding>& findings);

// The knobs of `order` that `selected` names (all when it is empty), in `order`'s order.
std::vector<std::string> OnlySelected(std::vector<std::string> order,
                                      const std::vector<std::string>& selected);

// The bottleneck first: loader knobs when the top finding is the input
// pipeline, batch size for small_batch/memory_headroom, else compute knobs.
// Keeps only the knobs in `selected` (all when empty).
std::vector<std::string> KnobOrder(const std::vector<Finding>& findings,
                                   const std::vector<std::string>& selected);

// The micro-batch to use after a batch-size search chose `searched`, keeping
// `effective` = micro x accumulate: the largest divisor of `effective` not
// above `searched` (and its accumulate).
std::pair<int64_t, int64_t> KeepEffectiveBatch(int64_t searched, int64_t effective);

// ---- Knobs of an unchanged PyTorch script (fullburn tune -- CMD) ---------
// The automatic markers (python/fullburn_autosteps/tune_settings.py) apply a trial's
// settings from FULLBURN_TUNE_SET, a JSON object: the DataLoader arguments
// num_workers, prefetch_factor, persistent_workers, pin_memory, and threads
// (torch.set_num_threads). A candidate's overrides use those keys.

// The variable python/fullburn_autosteps/tune_settings.py reads a trial's settings from.
inline constexpr char kTuneSetVar[] = "FULLBURN_TUNE_SET";

const std::vector<KnobDef>&
ScriptKnobs();  // workers, prefetch, persistent_workers, pin_memory, threads

// What the script ran with, as its markers recorded it (its "dataloader"
// and "torch" events); -1 / unknown where it did not say.
struct ScriptSettings {
  int num_workers = -1, prefetch_factor = -1, threads = -1;
  int persistent_workers = -1, pin_memory = -1;  // 0/1
  bool has_loader = false;
  std::string dataset;  // the training DataLoader's dataset class ("ImageFolder")
  // "fullburn": the trial's DataLoader was swapped for fullburn.ImageLoader
  // (the automatic markers' "swapped" in its dataloader event); "" otherwise.
  std::string loader;
  // One rank's (each rank of a data-parallel job applies FULLBURN_TUNE_SET itself).
  static ScriptSettings FromEvents(const std::vector<RunEvent>& events, int rank = 0);
};
// The ranks whose first step was recorded ("torch" events): 1 for a single process.
int ScriptRanks(const std::vector<RunEvent>& events);

struct ScriptContext {
  ScriptSettings current;  // the best trial's, as recorded
  int cores = 1;           // one rank's share of the CPUs (workers and threads are per process)
  bool cuda = false;  // a GPU was sampled: pinned memory can matter
};
std::vector<Candidate> ScriptKnobCandidates(const std::string& knob, const ScriptContext& ctx,
                                            std::string* skip_reason);
// Loader knobs first when the diagnosis names the input pipeline, else threads first.
std::vector<std::string> ScriptKnobOrder(const std::vector<Finding>& findings,
                                         const std::vector<std::string>& selected);
// The overrides as FULLBURN_TUNE_SET's JSON ({"num_workers": 4, "pin_memory": true}).
nlohmann::json ScriptSettingsJson(const std::map<std::string, std::string>& overrides);
// The overrides as the lines to put in the script:
// "DataLoader(num_workers=4, persistent_workers=True); torch.set_num_threads(2)".
std::string ScriptAdvice(const std::map<std::string, std::string>& overrides);
// "" when the run recorded what the overrides asked for, else what differs
// ("num_workers 4 was asked, the DataLoader had 0").
std::string ScriptSettingsMismatch(const std::map<std::string, std::string>& overrides,
                                   const ScriptSettings& recorded);

// ---- Measuring ------------------------------------------------------------

enum class Objective { kSamplesPerSecond, kSamplesPerJoule };
Result<Objective> ParseObjective(const std::string& name);
const char* ObjectiveName(Objective o);

struct Measure {
  double value = NAN;            // the objective, median over windows after warm-up
  double spread = NAN;           // interquartile range of the windows / median
  double low = NAN, high = NAN;  // smallest and largest window
  std::string unit;              // "samples/s", "steps/s", "samples/J", or the metric's name
  int64_t steps = 0;             // steps (or metric lines) measured, warm-up excluded
  bool rough = false;            // too few steps for windows: one window after the first step
  double gpu_util = NAN, data_wait_share = NAN, peak_memory_bytes = NAN;
};
// From a trial's step records: the steps of the first 20% of the time (at
// least 3) are warm-up; the rest are cut into up to 8 windows of equal step
// count, each giving samples over the window's time. With fewer than 8 steps
// after warm-up (a very slow setting) the measure is `rough`: one window
// after the first step, no spread. Fewer than 3 steps is an error, Unavailable
// (a longer trial would measure it).
Result<Measure> MeasureRun(const RunData& run, Objective objective);
// From numbers the command printed (--metric-regex): the first 20% are
// warm-up; needs 3 values after it.
Result<Measure> MeasureValues(const std::vector<double>& values, const std::string& unit);

// ---- Trials ----------------------------------------------------------------

// What became of a trial. Its JSON string (TrialStatusName: "ok", "failed",
// "skipped", "interrupted") is the `status` of the `tune_trial` event.
enum class TrialStatus { kOk, kFailed, kSkipped, kInterrupted };
const char* TrialStatusName(TrialStatus status);
// The status a `tune_trial` event names; an unknown or missing one reads as failed.
TrialStatus ParseTrialStatus(const std::string& name);

struct Trial {
  int index = 0;
  std::string knob;                              // "start" for the first, "grid" for --grid trials
  std::string value;                             // the candidate's value, or the grid combination
  std::map<std::string, std::string> overrides;  // everything changed from the start
  int64_t run_id = 0;                            // 0: no run was recorded
  TrialStatus status = TrialStatus::kOk;
  std::string reason;                            // why failed/skipped
  Measure measure;
  std::string verdict;  // "start", "kept +12%", "within noise +1%", "slower -8%", "failed"
  double wall_s = 0;
  std::string log;  // the trial's output file
  bool too_short = false;  // too few steps to measure: a longer trial would (not stored)
  bool no_steps = false;   // ran its whole length without a step (not stored)
  bool stretched = false;  // ran longer than the plan's trials, for a slow start (not stored)
};
nlohmann::json TrialJson(const Trial& t);
Trial TrialFromJson(const nlohmann::json& j);

// Is `candidate` better than `best` by more than the noise: by `min_gain`
// and by the average of their spreads? *gain is candidate/best - 1.
bool BeatsBest(const Measure& candidate, const Measure& best, double min_gain, double* gain);

// "kept +12%", "within noise +1%", "slower -8%"; *kept: t beats best beyond min_gain.
std::string Verdict(const Trial& t, const Trial& best, double min_gain, bool* kept);
// A grid has no start to improve on: each combination is judged against the
// fastest before it ("first", "fastest so far (+12%)", "ties #2 (+1%, within
// the noise)", "-8% vs #2"), and a faster median within the noise is a tie;
// "" for a trial that was not measured.
std::string GridVerdict(const Trial& trial, const std::vector<Trial>& before, double min_gain);

// The measured trial with the highest objective, or -1 when none was measured.
int BestTrial(const std::vector<Trial>& trials);
// The other measured trials that the best does not beat beyond the noise
// (BeatsBest with `min_gain`): as fast as the best, as far as the
// measurements can tell, so the user may prefer the one that costs least.
std::vector<int> TiedWithBest(const std::vector<Trial>& trials, int best, double min_gain);

// "512 ±2%" (half the IQR as a ±), "64 (5 steps)" for a rough measure, "-".
std::string FormatMeasure(const Measure& m);

// The table `fullburn tune` prints: knob, value, objective with spread, GPU
// util, data wait, peak memory, verdict, run.
std::string RenderTrialTable(const std::vector<Trial>& trials);

// ---- Grids (external commands) --------------------------------------------

struct GridAxis {
  std::string name;
  std::vector<std::string> values;
};
// "batch=64,128,256".
Result<GridAxis> ParseGridAxis(const std::string& spec);
// "batch=64 workers=4": a combination as its trial's value.
std::string GridValue(const std::vector<GridAxis>& axes,
                      const std::map<std::string, std::string>& combo);
// Every combination, the first axis varying slowest.
std::vector<std::map<std::string, std::string>> ExpandGrid(const std::vector<GridAxis>& axes);
// Replaces {name} in each argument; a placeholder with no axis, or an axis
// used nowhere, is an error (checked before any trial runs).
Result<std::vector<std::string>> Substitute(const std::vector<std::string>& command,
                                            const std::map<std::string, std::string>& values);

// "90", "90s", "10m", "1h", "1m30s", "30d" -> seconds.
Result<double> ParseDuration(const std::string& text);

}  // namespace fullburn
