// The diagnosis: gathers the facts, applies the rules, orders the findings.
#include "fullburn/diagnose.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "facts.h"

namespace fullburn {

namespace {

using namespace diagnose;

// A wrapped job with steps but no GPU sampled ran on the CPU, or on a GPU
// NVML could not see: tensor cores are not the first thing to point to.
std::string WrappedCpuFix(const Facts& f) {
  const char* unseen =
      "; if it ran on a GPU, NVML did not see it (fullburn version names the driver)";
  if (f.cores > 1 && f.proc_cpu < (f.cores - 0.5) * 100)
    return fmt::format(
        "compute-bound on the CPU (no GPU sampled), the job's processes used {:.1f} of {} cores: "
        "torch.set_num_threads({}) (OMP_NUM_THREADS), or train on a GPU{}",
        f.proc_cpu / 100, f.cores, f.RankCores(), unseen);
  return std::string("compute-bound on the CPU (no GPU sampled): train on a GPU") + unseen;
}

// A job that trains on the CPU (no GPU sampled) with fewer threads at work
// than the cores it may use: steps that compute on the CPU would take up to
// used / cores of their time with all of them (intra-op scaling is below
// linear, so this is an upper bound, said with confidence 0.6).
void CpuThreadsRule(const Facts& f, std::vector<Finding>* out) {
  const int cores = f.RankCores();
  // Without a DataLoader (a get_batch() loop, word_language_model's slicing)
  // no data wait is timed: the batches are made in the loop's own work, so a
  // small share of that says what a small data wait would.
  bool little_input = f.have_steps ? f.data_wait_share < kDataWaitShare
                                   : f.loop_makes_batches && f.loop_share < kDataWaitShare;
  if (!f.gpus.empty() || !little_input || cores < 2) return;
  std::string ranks = f.ranks_per_node > 1
                          ? fmt::format(" per rank ({} ranks share {})", f.ranks_per_node, f.cores)
                          : "";
  double used;
  std::string evidence, fix;
  if (f.trainer && f.device == "cpu") {
    if (!(f.train_threads > 0 && f.train_threads < cores)) return;
    used = f.train_threads;
    evidence = fmt::format("train.threads = {} of {} cores{}", f.train_threads, cores, ranks);
    fix = fmt::format(fmt::runtime(FixFor(CauseId::kCpuThreads, Framework::kFullburnTrain)),
                      fmt::arg("cores", cores));
  } else if (!f.trainer) {
    // Under a core in all: the loop waits on something other than the CPU
    // (a sleep, a GPU NVML does not see), which threads would not speed up.
    if (std::isnan(f.proc_cpu) || f.proc_cpu < kCpuThreadsMinBusy ||
        f.proc_cpu > (cores - 0.5) * 100)
      return;
    used = f.proc_cpu / 100;
    evidence =
        fmt::format("the job's processes used {:.1f} of {} cores{} (median proc.cpu_util {:.0f}%)",
                    used, cores, ranks, f.proc_cpu);
    fix = fmt::format(fmt::runtime(FixFor(CauseId::kCpuThreads, Framework::kPytorch)),
                      fmt::arg("cores", cores));
  } else {
    return;
  }
  out->push_back({CauseId::kCpuThreads,
                  fmt::format("Training on the CPU with {:.1f} of {} cores at work", used, cores),
                  evidence + (f.have_steps ? fmt::format("; no GPU sampled, data wait {} of step time (< {}), so "
                                                         "the steps compute on the CPU",
                                                         Percent(f.data_wait_share), Percent(kDataWaitShare))
                                           : fmt::format("; no GPU sampled, and the loop's own work (making the "
                                                         "batches included: no DataLoader fed the steps) {} of "
                                                         "step time (< {}), so the steps compute on the CPU",
                                                         Percent(f.loop_share), Percent(kDataWaitShare))),
                  1 - used / cores, 0.6, fix});
}

// The stack phase of the largest idle part: its where is that part's.
std::string IdleStackPhase(const Facts& f) {
  std::map<std::string, double> seconds;
  for (const IdleSpan& s : f.idle) seconds[s.what] += s.Seconds();
  auto top = std::max_element(seconds.begin(), seconds.end(),
                              [](const auto& a, const auto& b) { return a.second < b.second; });
  if (top == seconds.end()) return "";
  if (top->first == "start-up") return "startup";
  if (top->first == "evaluation" || top->first == "checkpoint") return top->first;
  return "";
}

Finding Healthy(const Facts& f) {
  std::string evidence =
      !std::isnan(f.gpu_util) ? fmt::format("GPU utilization median {:.0f}%", f.gpu_util)
      : f.have_steps ? fmt::format("data wait {} of step time (< {})", Percent(f.data_wait_share),
                                   Percent(kDataWaitShare))
      : f.step_records > 0
          ? fmt::format("{} steps recorded, no GPU readings, no data wait timed (no DataLoader fed them): "
                        "nothing pointed to a bottleneck",
                        f.step_records)
          : "no GPU readings and no step records: nothing pointed to a bottleneck";
  if (f.have_steps && !std::isnan(f.gpu_util))
    evidence += fmt::format("; data wait {} of step time", Percent(f.data_wait_share));
  if (f.interrupted)
    evidence += " (the recording stopped early, its recorder killed: diagnosed from what it holds)";
  else if (f.running)
    evidence += " (the run is still going: diagnosed so far)";
  std::string fix;
  if (f.step_records == 0 && f.gpus.empty() && f.attached)
    fix =
        "nothing measured this job's speed: attach where NVML sees its GPUs, or start it with "
        "fullburn run (a PyTorch job's optimizer steps and DataLoader waits are timed with no "
        "change to it)";
  else if (f.step_records == 0 && f.gpus.empty())
    fix =
        "nothing measured this job's speed: run it where NVML sees the GPUs, or have it print "
        "step markers (python/fullburn_markers.py; a PyTorch job's optimizer steps are timed "
        "by themselves unless --no-auto-steps) so each step is timed";
  else if (f.trainer && f.device == "cpu")
    // No tensor cores to win. bf16 autocast on the CPU went from -21% to +32%
    // on one AVX512-BF16 machine depending on the model (docs/benchmarks.md,
    // tuning), and is far slower without native bf16: only a measurement tells.
    fix = f.train_threads > 0 && f.train_threads < f.RankCores()
              ? fmt::format(
                    "compute-bound on the CPU with {} of {} cores{}: train.threads = 0 (this "
                    "rank's share of the CPUs) or {}",
                    f.train_threads, f.RankCores(),
                    f.ranks_per_node > 1
                        ? fmt::format(" per rank ({} ranks share {})", f.ranks_per_node, f.cores)
                        : "",
                    f.RankCores())
              : "compute-bound on the CPU, every core at work: train on a GPU; on a CPU with "
                "native bf16 (AVX512-BF16, AMX) fullburn tune measures train.precision = bf16";
  else if (!f.trainer && f.gpus.empty())
    fix = WrappedCpuFix(f);
  else if (f.precision == "fp32")
    fix = "compute-bound: train.precision = bf16 (or fp16 on CUDA) for tensor cores";
  else
    fix = FixFor(CauseId::kHealthy, f.trainer ? Framework::kFullburnTrain : Framework::kPytorch);
  return {CauseId::kHealthy, CauseOf(CauseId::kHealthy).title, evidence, 0,
      f.have_steps || !f.gpus.empty() ? 0.8 : f.step_records > 0 ? 0.6 : 0.3,
      fix};
}

}  // namespace

std::vector<Finding> Diagnose(const RunData& run) {
  Facts f = Gather(run);
  std::vector<Finding> out;
  GpuUseRule(f, &out);
  TransferRules(f, &out);
  LoopRule(f, &out);
  InputRules(f, &out);
  PrecisionRule(f, &out);
  LowMfuRule(f, &out);
  MemoryRules(f, &out);
  ThrottleRules(f, &out);
  IdleRules(f, &out);
  RankRules(f, &out);
  StallRule(f, &out);
  CheckpointRule(f, &out);
  CpuThreadsRule(f, &out);
  std::stable_sort(out.begin(), out.end(),
                   [](const Finding& a, const Finding& b) { return a.share_lost > b.share_lost; });
  bool problem = std::any_of(out.begin(), out.end(),
                             [](const Finding& x) { return x.share_lost >= kMinShare; });
  if (!problem) out.push_back(Healthy(f));
  if (!f.other_gpus.empty())
    out.front().evidence +=
        fmt::format("; left out: {} (sampled, but none of the job's processes ran there)",
                    fmt::join(f.other_gpus, ", "));
  StackSummary stacks = RunStacks(run);
  if (!stacks.empty())
    for (Finding& x : out)
      x.where = WhereOf(x.cause, stacks, x.cause == CauseId::kIdlePhases ? IdleStackPhase(f) : "");
  // The compute causes' time is in the model: with --layers, which layers.
  if (std::string layers = TopLayers(RunLayers(run)); !layers.empty())
    for (Finding& x : out)
      if (x.cause == CauseId::kCpuThreads || x.cause == CauseId::kSmallBatch ||
          x.cause == CauseId::kPrecision || x.cause == CauseId::kLowMfu)
        x.where += (x.where.empty() ? "layers: " : "; layers: ") + layers;
  // A failure comes first whatever it cost: the findings after it describe
  // the run until it stopped.
  if (std::optional<Finding> failed = FailureFinding(f)) out.insert(out.begin(), *failed);
  // A cut record before all: every finding after it reads only what is stored.
  if (std::optional<Finding> cut = CutFinding(f)) out.insert(out.begin(), *cut);
  return out;
}

RunLayerTimes RunLayers(const RunData& run) {
  RunLayerTimes out;
  for (auto e = run.events.rbegin(); e != run.events.rend(); ++e) {
    if (e->kind != "layers") continue;
    auto j = nlohmann::json::parse(e->data, nullptr, false);
    if (!j.is_object()) continue;
    try {
      out.device = j.value("device", std::string());
      out.model = j.value("model", std::string());
      out.steps = j.value("steps", int64_t{0});
      out.hooks_s_per_step = j.value("hooks_s_per_step", 0.0);
      for (const nlohmann::json& l : j.value("layers", nlohmann::json::array()))
        out.layers.push_back({l.value("name", std::string()), l.value("type", std::string()),
                              l.value("params", int64_t{0}), l.value("forward_s", 0.0),
                              l.value("backward_s", 0.0), l.value("activation_bytes", int64_t{0})});
    } catch (const nlohmann::json::exception&) {
      return RunLayerTimes{};
    }
    return out;
  }
  return out;
}

namespace {
std::string LayerBytes(double bytes) {
  if (bytes < 1024.0 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}

double LayersTotal(const RunLayerTimes& layers) {
  double total = 0;
  for (const LayerTime& l : layers.layers) total += l.forward_s + l.backward_s;
  return total;
}
}  // namespace

std::string TopLayers(const RunLayerTimes& layers, size_t n) {
  double total = LayersTotal(layers);
  if (layers.empty() || total <= 0) return "";
  std::vector<LayerTime> sorted = layers.layers;
  std::stable_sort(sorted.begin(), sorted.end(), [](const LayerTime& a, const LayerTime& b) {
    return a.forward_s + a.backward_s > b.forward_s + b.backward_s;
  });
  std::string out;
  for (size_t i = 0; i < sorted.size() && i < n; ++i)
    out += fmt::format("{}{} ({}) {}{}", i ? ", " : "", sorted[i].name, sorted[i].type,
                       Percent((sorted[i].forward_s + sorted[i].backward_s) / total),
                       i == 0 ? " of the layers' forward and backward" : "");
  return out;
}

std::string RenderLayers(const RunLayerTimes& layers, size_t max_shown) {
  if (layers.empty()) return "";
  double total = LayersTotal(layers);
  std::string s = fmt::format(
      "  layers of {} ({}, medians per step over {} steps; the hooks cost {:.2f} ms a step):\n",
      layers.model, layers.device, layers.steps, layers.hooks_s_per_step * 1e3);
  s += fmt::format("    {:<16} {:<18} {:>10} {:>10} {:>7} {:>12}\n", "layer", "type", "forward",
                   "backward", "share", "activations");
  for (size_t i = 0; i < layers.layers.size() && i < max_shown; ++i) {
    const LayerTime& l = layers.layers[i];
    s += fmt::format("    {:<16} {:<18} {:>7.2f} ms {:>7.2f} ms {:>7} {:>12}\n", l.name, l.type,
                     l.forward_s * 1e3, l.backward_s * 1e3,
                     total > 0 ? Percent((l.forward_s + l.backward_s) / total) : "-",
                     LayerBytes(static_cast<double>(l.activation_bytes)));
  }
  if (layers.layers.size() > max_shown)
    s += fmt::format("    ({} more layers)\n", layers.layers.size() - max_shown);
  return s;
}

StackSummary RunStacks(const RunData& run) {
  for (auto e = run.events.rbegin(); e != run.events.rend(); ++e)
    if (e->kind == kStacksEvent)
      return StackSummaryFromJson(nlohmann::json::parse(e->data, nullptr, false));
  return {};
}

constexpr int64_t kMinWhereSamples = 10;

std::string WhereOf(CauseId cause, const StackSummary& stacks, const std::string& only) {
  std::string phases = only.empty() ? CauseOf(cause).stack_phases : only;
  int64_t best = 0;
  StackPhase chosen{};
  size_t at = 0;
  while (at < phases.size()) {
    size_t comma = phases.find(',', at);
    std::string name = phases.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? phases.size() : comma + 1;
    StackPhase p;
    if (!ParseStackPhase(name, &p)) continue;
    int64_t busy = stacks.of(p).samples - stacks.of(p).waiting;
    if (busy > best) best = busy, chosen = p;
  }
  // A handful of samples is noise, not a place (at 50 per second, 0.2 s).
  if (best < kMinWhereSamples) return "";
  // The loop's own work is a share of the step, as the finding's is.
  if (chosen == StackPhase::kOther)
    return RenderStackPlaces(stacks, chosen, 2, stacks.StepSamples(), "step time");
  return RenderStackPlaces(stacks, chosen);
}

JobGpus ReadJobGpus(const RunData& run) {
  Facts f;
  GatherGpus(run, &f);
  return {f.gpu_util, f.mem_peak_share, f.other_gpus};
}

std::string RenderFindings(const std::vector<Finding>& findings, size_t max_shown) {
  std::string s = "  findings:\n";
  for (size_t i = 0; i < findings.size() && i < max_shown; ++i) {
    const Finding& x = findings[i];
    s += fmt::format("    [{}] {}{}\n      why: {}\n{}      fix: {}\n", x.name(), x.title,
                     x.share_lost > 0 ? fmt::format(" (~{} of the time)", Percent(x.share_lost)) : "",
                     x.evidence, x.where.empty() ? "" : "      where: " + x.where + "\n", x.fix);
  }
  if (findings.size() > max_shown)
    s += fmt::format("    ({} more: fullburn diagnose RUN)\n", findings.size() - max_shown);
  return s;
}

nlohmann::json FindingsJson(const std::vector<Finding>& findings) {
  nlohmann::json out = nlohmann::json::array();
  for (const Finding& x : findings)
    out.push_back({{"cause", x.name()},
                   {"title", x.title},
                   {"time_lost_pct", std::round(x.share_lost * 1000) / 10},
                   {"confidence", x.confidence},
                   {"evidence", x.evidence},
                   {"where", x.where},
                   {"fix", x.fix}});
  return out;
}

}  // namespace fullburn
