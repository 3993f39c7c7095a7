// The rules of the diagnosis; thresholds in facts.h, explained with their
// sources in docs/diagnosis.md. Each fix names a knob: a config key for a
// fullburn train run, the usual PyTorch setting for a wrapped job.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "facts.h"

namespace fullburn::diagnose {
namespace {

std::string Choose(const Facts& f, const std::string& trainer, const std::string& wrapped) {
  return f.trainer ? trainer : wrapped;
}

Framework FrameworkOf(const Facts& f) { return FrameworkFrom(f.loader_framework, f.trainer); }

// The catalog's fix for this run's framework, its named fields filled in.
template <typename... Args>
std::string CatalogFix(const Facts& f, CauseId id, const Args&... args) {
  return fmt::format(fmt::runtime(FixFor(id, FrameworkOf(f))), args...);
}

// A finding under the catalog's title for its cause.
Finding Make(CauseId id, std::string evidence, double share, double confidence, std::string fix) {
  return {id, CauseOf(id).title, std::move(evidence), share, confidence, std::move(fix)};
}

// " (in Lightning: ...)": a wrapped job's framework's own words for a setting; "" for none.
std::string SettingNote(const Facts& f, FrameworkSetting setting) {
  const char* words = SettingIn(setting, FrameworkOf(f));
  return f.trainer || !*words ? "" : fmt::format(" ({})", words);
}

// "; its DataLoader: num_workers=0, pin_memory=False" when the markers told.
std::string DataLoaderNote(const Facts& f) {
  if (f.trainer || f.loader_workers < 0) return "";
  std::string note = fmt::format("; its DataLoader: num_workers={}", f.loader_workers);
  if (f.loader_pin_memory >= 0)
    note += f.loader_pin_memory ? ", pin_memory=True" : ", pin_memory=False";
  return note;
}

// The DataLoader settings for a wrapped job with idle cores.
std::string LoaderSettingsFix(const Facts& f, int workers) {
  if (f.loader_workers < 0 || f.loader_workers < workers)
    return fmt::format(
        fmt::runtime(FixFor(CauseId::kInputWorkers, Framework::kPytorch)),
        fmt::arg("workers", (f.loader_workers < 0 ? "" : std::to_string(f.loader_workers) + " -> ") +
                                std::to_string(workers)));
  // Workers enough for the cores, cores idle, and no process of the job busy
  // for even one core: the workers wait rather than compute.
  if (f.proc_cpu < kLauncherBusy)
    return fmt::format(
        "num_workers={} covers the cores, yet the job's processes used {:.0f}% of one core: "
        "the workers wait rather than decode (remote or slow storage, network reads, a lock "
        "or sleep in the Dataset); for waiting, not computing, more workers than cores help: "
        "num_workers {} -> {}, prefetch_factor=4; or local copies of the data",
        f.loader_workers, f.proc_cpu, f.loader_workers, 2 * f.loader_workers);
  // Workers enough for the cores, yet cores idle: the main process is the limit.
  return fmt::format(
      "num_workers={} already covers the cores: the main process hands batches on too slowly "
      "(collate_fn, a per-batch Python loop, transfers): prefetch_factor=4, pin_memory=True, "
      "lighter per-sample work (fullburn pack SRC DST --max-side 256, read by "
      "python/fullburn_pack.py's PackDataset)",
      f.loader_workers);
}

// Where a wrapped job sets its DataLoader's arguments, in its framework's
// terms: a Trainer's user never wrote a DataLoader, a Lightning user wrote it
// in a DataModule's train_dataloader(). "" when the markers did not say.
std::string FrameworkLoaderNote(const Facts& f, int workers) {
  if (f.trainer || f.python_loader || f.loader_workers < 0) return "";
  std::string site = f.loader_created_at.empty()
                         ? ""
                         : (f.loader_created_in.empty() ? "" : " in " + f.loader_created_in) +
                               " at " + f.loader_created_at;
  Framework framework = FrameworkOf(f);
  const char* words = SettingIn(FrameworkSetting::kLoaderArgs, framework);
  if (*words) {
    std::string made = framework == Framework::kTransformers
                           ? (f.loader_created_at.empty() ? "" : " (its train() at " + f.loader_created_at + ")")
                           : (site.empty() ? "" : ", made" + site);
    return "; " + fmt::format(fmt::runtime(words), fmt::arg("workers", workers),
                              fmt::arg("args", fmt::format("num_workers={}, persistent_workers=True, "
                                                           "pin_memory=True",
                                                           workers)),
                              fmt::arg("made", made));
  }
  if (!site.empty()) return "; its DataLoader is made" + site;
  return "";
}

// The swap of a wrapped job's ImageFolder + DataLoader for fullburn's loader
// from Python (docs/python.md), with what it was measured to gain; "" for a
// job fed by it already.
std::string SwapNote(const Facts& f) {
  if (f.trainer || f.python_loader) return "";
  // A framework's loop takes its DataLoader from the framework: only an image
  // folder has a drop-in swap there, and a Trainer builds its own.
  if (!f.loader_framework.empty() &&
      (f.loader_framework == "transformers" || f.loader_dataset != "ImageFolder"))
    return "";
  return fmt::format(
      "; or {}swap the DataLoader for fullburn.ImageLoader, two lines: `import fullburn` and "
      "`loader = fullburn.ImageLoader(root, batch_size)` in place of ImageFolder + DataLoader "
      "(the same RandomResizedCrop, flip and Normalize, decoded on C++ threads: {:.1f}x the "
      "DataLoader's images/s per core or more on this project's machine, docs/benchmarks.md){}",
      f.loader_dataset == "ImageFolder" ? "(its dataset is an ImageFolder) "
                                        : "for an image folder, ",
      kPythonLoaderSpeedup,
      f.loader_dataset == "ImageFolder" ? "; fullburn tune -- CMD tries the swap as a trial" : "");
}

// Where the script's command line sets num_workers (timm's and
// pytorch/examples' -j/--workers, HF scripts' --dataloader_num_workers):
// the user's knob is the flag, not the library's call that reads it.
std::string WorkersFlagFix(const Facts& f, int workers, bool with_site = true) {
  std::string script = f.loader_script.empty() ? "the script" : f.loader_script;
  std::string site = f.loader_created_at.empty() || !with_site
                         ? ""
                         : " (its DataLoader is made at " + f.loader_created_at + ")";
  return fmt::format(
      "{} ... {} {}: the script's own option, which sets its DataLoader's num_workers ({} -> "
      "{}){}; persistent_workers=True and pin_memory=True where the script makes it",
      script, f.loader_workers_flag, workers, f.loader_workers, workers, site);
}

// What a wrapped job with idle cores should give its DataLoader; with the
// DataLoader seen by the markers, the tuner can measure it on the script.
std::string MoreWorkersFix(const Facts& f, int workers) {
  if (!f.trainer && !f.python_loader && !f.loader_workers_flag.empty() && f.loader_workers >= 0 &&
      f.loader_workers < workers) {
    // The flag first; where the framework takes the loader's settings after.
    std::string framework = FrameworkLoaderNote(f, workers);
    return WorkersFlagFix(f, workers, framework.empty()) + framework +
           "; fullburn tune -- CMD measures DataLoader settings on the script as it is" + SwapNote(f);
  }
  if (f.python_loader)
    return fmt::format(
        "fullburn.ImageLoader(threads={}) (None: tuned while running), or pack the images once "
        "(fullburn pack SRC DST --format raw) and read the pack, so each sample costs less",
        workers);
  std::string fix = LoaderSettingsFix(f, workers) + FrameworkLoaderNote(f, workers);
  if (f.loader_workers >= 0)
    fix += "; fullburn tune -- CMD measures DataLoader settings on the script as it is";
  return fix + SwapNote(f);
}

// "batch 64 -> 256" when memory tells how far it can grow, else "".
std::string BatchSuggestion(const Facts& f) {
  if (f.batch <= 0 || !(f.mem_peak_share > 0) || f.mem_peak_share >= kMemHeadroom) return "";
  double grow = std::max(2.0, std::floor(0.8 / f.mem_peak_share));
  return fmt::format("batch {} -> {} (GPU memory {} used)", f.batch,
                     static_cast<int64_t>(f.batch * grow), Percent(f.mem_peak_share));
}

void SmallBatch(const Facts& f, const std::string& wait, double share, std::vector<Finding>* out) {
  std::string evidence = wait;
  double conf = 0.6;
  if (!std::isnan(f.proc_cpu)) {
    evidence += fmt::format("; the job's processes use {:.0f}% of a core", f.proc_cpu);
    if (f.proc_cpu >= kLauncherBusy) conf = 0.75;  // the launching thread is the limit
  }
  if (!std::isnan(f.mem_peak_share))
    evidence += fmt::format("; peak GPU memory {} of total", Percent(f.mem_peak_share));
  std::string batch = BatchSuggestion(f);
  std::string fix =
      CatalogFix(f, CauseId::kSmallBatch, fmt::arg("batch", batch.empty() ? "" : ": " + batch));
  out->push_back(Make(CauseId::kSmallBatch, evidence, share, conf, fix));
}

}  // namespace

void GpuUseRule(const Facts& f, std::vector<Finding>* out) {
  if (!f.GpuUnused()) return;
  double util_max = 0;
  for (const GpuFacts& g : f.gpus) util_max = std::max(util_max, g.util_max);
  std::string evidence = fmt::format("GPU utilization never above {:.0f}% over the run (< {:.0f}%)",
                                     util_max, kGpuUnused);
  if (!std::isnan(f.proc_cpu))
    evidence += fmt::format("; the job's processes used {:.0f}% of a core", f.proc_cpu);
  if (!std::isnan(f.cpu)) evidence += "; " + CpuReading(f);
  bool on_cpu = f.trainer && f.device == "cpu";
  std::string fix = on_cpu ? "train.device = cuda (or auto): this run trained on the CPU"
                           : CatalogFix(f, CauseId::kGpuUnused);
  out->push_back(Make(CauseId::kGpuUnused, evidence,
                      1 - (std::isnan(f.gpu_util) ? 0 : f.gpu_util) / 100, on_cpu ? 0.95 : 0.85, fix));
}

void InputRules(const Facts& f, std::vector<Finding>* out) {
  // With step records the data wait is measured; without, a GPU that idles
  // while the host works stands in for it (unless copies explain it).
  bool copies = Named(*out, CauseId::kH2dCopy);
  // A wrapped job's steps are timed on the host, which runs ahead of the
  // GPU: while it waits for the next batch, kernels it queued may still be
  // running. The GPU's idle time (1 - utilization) bounds what the input
  // cost; a busy GPU hides the wait. fullburn train reads the device once a
  // step (the loss and the inf/NaN flag), so its host does not run ahead.
  double wait_share = f.data_wait_share;
  bool hidden = false;
  if (!f.trainer && f.have_steps && !std::isnan(f.gpu_util) && 1 - f.gpu_util / 100 < wait_share) {
    wait_share = std::max(0.0, 1 - f.gpu_util / 100);
    hidden = true;
  }
  bool measured = f.have_steps && wait_share >= kDataWaitShare;
  bool inferred = !f.have_steps && f.gpu_util < kGpuLowUtil && !copies && !f.GpuUnused();
  if (!measured && !inferred) {
    // Measured steps with little data wait, yet an idle GPU: launch-bound.
    bool loop = Named(*out, CauseId::kLoopOverhead);
    if (f.have_steps && f.gpu_util < kGpuLowUtil && !loop && !f.GpuUnused())
      SmallBatch(
          f,
          fmt::format(
              "data wait {} of step time (< {}) yet GPU utilization median {:.0f}% (< {:.0f}%)",
              Percent(f.data_wait_share), Percent(kDataWaitShare), f.gpu_util, kGpuLowUtil),
          1 - f.gpu_util / 100, out);
    return;
  }
  double share = measured ? wait_share : 1 - f.gpu_util / 100;
  std::string wait =
      measured ? fmt::format("the training loop waited for data {} of step time (>= {})",
                             Percent(f.data_wait_share), Percent(kDataWaitShare))
               : fmt::format("GPU utilization median {:.0f}% (< {:.0f}%)", f.gpu_util, kGpuLowUtil);
  if (measured && hidden)
    wait += fmt::format(
        "; with GPU utilization median {:.0f}%, the GPU waited at most {} (the rest of the "
        "host's wait overlapped queued GPU work)",
        f.gpu_util, Percent(wait_share));
  wait += DataLoaderNote(f);
  double conf = measured ? 0.9 : 0.6;
  int workers = std::max(2, f.RankCores() - 1);
  if (f.iowait >= kIoWait) {
    out->push_back(Make(CauseId::kInputIo,
                        wait + fmt::format("; CPU iowait median {:.0f}%{} (>= {:.0f}%)", f.iowait,
                                           NodeNote(f.iowait_rank), kIoWait),
                        share, conf,
                        CatalogFix(f, CauseId::kInputIo) +
                            (f.trainer ? "" : FrameworkLoaderNote(f, workers))));
  } else if (f.cpu >= kCpuSaturated) {
    std::string fix =
        !f.trainer && f.python_loader
            ? "decode less: pack the images once at the size you train at (fullburn pack SRC DST "
              "--format raw --max-side 256) and give fullburn.ImageLoader the pack, or more cores"
            : CatalogFix(f, CauseId::kInputCpu) +
                  (f.trainer ? "" : FrameworkLoaderNote(f, workers) + SwapNote(f));
    if (f.cpu_of_quota)
      fix = fmt::format(
                "the container's CPU limit ({:.3g} CPUs) is the ceiling: raise it (Kubernetes "
                "resources.limits.cpu, docker --cpus), or ",
                f.cpu_quota) +
            fix;
    // A fixed worker count below the cores a loader may use comes first.
    if (f.trainer && f.data_threads > 0 && f.RankCores() > 2 && f.data_threads < f.RankCores() - 1)
      fix = fmt::format("data.threads {} -> {} (or 0: tuned); then ", f.data_threads,
                        f.RankCores() - 1) +
            fix;
    if (!f.trainer && f.loader_workers >= 0 && f.RankCores() > 2 &&
        f.loader_workers < f.RankCores() - 1)
      fix = fmt::format("DataLoader(num_workers {} -> {}); then ", f.loader_workers,
                        f.RankCores() - 1) +
            fix;
    out->push_back(Make(CauseId::kInputCpu,
                        wait + "; " + CpuReading(f) + fmt::format(" (>= {:.0f}%)", kCpuSaturated),
                        share, conf, fix));
  } else if (measured && std::isnan(f.cpu)) {
    // Too short a run for a CPU reading: workers or CPU cannot be told apart.
    out->push_back(
        {CauseId::kInputWorkers, "Input-bound: the training loop waits for data (host CPU not sampled)",
         wait + "; the host CPU was not sampled (a run shorter than two samples), so idle cores "
                "and a saturated CPU cannot be told apart",
         share, 0.5,
         Choose(f,
                fmt::format("run longer to tell; with idle cores data.threads = {}, with a busy "
                            "CPU decode less (fullburn pack SRC DST --format raw)",
                            std::max(1, f.RankCores() - 1)),
                fmt::format("run longer to tell; with idle cores DataLoader(num_workers={}), with "
                            "a busy CPU smaller images (fullburn pack SRC DST --max-side 256, "
                            "python/fullburn_pack.py){}",
                            workers, FrameworkLoaderNote(f, workers)))});
  } else if (measured) {
    std::string fix =
        !f.trainer ? MoreWorkersFix(f, workers)
        : f.data_threads > 0
            ? CatalogFix(f, CauseId::kInputWorkers,
                         fmt::arg("threads", fmt::format("{} -> {}", f.data_threads,
                                                         std::max(f.data_threads + 1, f.RankCores() - 1))))
            : fmt::format(
                  "data.threads is tuned (0) yet cores idle: fix it at {}, or pack the "
                  "images (fullburn pack) so each sample costs less; data.prefetch = 0 (tuned) "
                  "absorbs bursts",
                  std::max(2, f.RankCores() - 1));
    out->push_back(Make(CauseId::kInputWorkers,
                        wait + "; " + CpuReading(f) + fmt::format(" (< {:.0f}%)", kCpuSaturated),
                        share, conf, fix));
  } else if (f.mem_peak_share < kMemHeadroom) {
    SmallBatch(f, wait + (std::isnan(f.cpu) ? "" : "; " + CpuReading(f)), share, out);
  } else {
    // No steps, an idle GPU, cores to spare, memory in use: nothing measured
    // says where the loop waits. Too few loader workers is the usual cause;
    // timing the steps tells.
    // An attached job was started elsewhere; a recorded one without steps
    // is not PyTorch, or ran with --no-auto-steps.
    std::string how =
        f.attached ? "start it under fullburn run next time (a PyTorch job's steps and "
                     "DataLoader waits are timed with no change to it)"
                   : "mark them (a PyTorch job's are timed by themselves under fullburn run "
                     "unless --no-auto-steps; any other loop with python/fullburn_markers.py)";
    out->push_back({CauseId::kInputWorkers, "GPU mostly idle with cores to spare (steps not timed)",
                    wait +
                        (std::isnan(f.cpu)
                             ? ""
                             : "; " + CpuReading(f) + fmt::format(" (< {:.0f}%)", kCpuSaturated)) +
                        (std::isnan(f.mem_peak_share)
                             ? ""
                             : fmt::format(", peak GPU memory {} (>= {}): not a small batch",
                                           Percent(f.mem_peak_share), Percent(kMemHeadroom))) +
                        "; no step records, so the data wait was not measured",
                    share, 0.4,
                    "time the steps to tell the input from the loop's own work: " + how +
                        "; with cores to spare the usual cause is too few loader workers: " +
                        MoreWorkersFix(f, workers)});
  }
}

void LoopRule(const Facts& f, std::vector<Finding>* out) {
  // fullburn train's steps are timed phase by phase (0.2% left over in the
  // demo): only a wrapped job's loop has work of its own between steps.
  if (f.trainer || !(f.loop_share >= kLoopShare)) return;
  // On a GPU these are host times: the host may do this work while queued
  // kernels run (and a .item() here waits for them), so the GPU's idle share
  // bounds what it cost, less the part the data wait already explains.
  double share = f.loop_share;
  double confidence = 0.8;
  // The share is of the mean step: its evidence quotes the means, and the
  // medians beside them when a few long steps hold much of it.
  std::string medians =
      std::abs(f.loop_median_s - f.loop_mean_s) > 0.25 * f.loop_mean_s
          ? fmt::format(" (medians {:.1f} of {:.1f} ms: a few long steps hold much of it)",
                        f.loop_median_s * 1e3, f.phased_step_median_s * 1e3)
          : "";
  std::string evidence = fmt::format(
      "{} of step time (>= {}) went to none of {}, backward and the optimizer step: {:.1f} ms "
      "of a {:.1f} ms step on average{}, in the loop's own code{}",
      Percent(f.loop_share), Percent(kLoopShare),
      f.loop_makes_batches ? "the model's forward calls" : "fetching the batch, forward",
      f.loop_mean_s * 1e3, f.phased_step_mean_s * 1e3, medians,
      f.loop_makes_batches ? ", which makes the batches too (no DataLoader fed the steps, so the "
                             "data wait is in this share, not timed apart)"
                           : " after optimizer.step() (or a micro-batch's backward()) and "
                             "before the next batch");
  if (!std::isnan(f.gpu_util)) {
    double idle = std::max(0.0, 1 - f.gpu_util / 100);
    double input = f.have_steps ? std::min(idle, f.data_wait_share) : 0;
    confidence = 0.6;  // host-timed against a device that runs behind
    if (idle - input < share) {
      share = idle - input;
      evidence += fmt::format(
          "; with GPU utilization median {:.0f}%, the GPU idled {}{}: the loop's work cost it at "
          "most {} (the rest overlapped queued GPU work)",
          f.gpu_util, Percent(idle),
          input > 0 ? fmt::format(", {} of it explained by the data wait", Percent(input)) : "",
          Percent(share));
    }
  }
  if (share < kLoopShare) return;
  std::string fix = CatalogFix(f, CauseId::kLoopOverhead);
  if (f.loop_makes_batches)
    fix =
        "if get_batch() is the cost, make the batches ahead of the step: a DataLoader with "
        "num_workers and pin_memory=True (its wait is then timed apart) or a thread filling a "
        "queue, from tokens pre-tokenized into a np.memmap, copied .to(device, "
        "non_blocking=True) from pinned memory; if it is bookkeeping, " +
        fix;
  out->push_back({CauseId::kLoopOverhead,
                  f.loop_makes_batches
                      ? "The training loop's own work between steps (making the batches included)"
                      : CauseOf(CauseId::kLoopOverhead).title,
                  evidence, share, confidence, fix});
}

void TransferRules(const Facts& f, std::vector<Finding>* out) {
  std::string fix =
      CatalogFix(f, CauseId::kH2dCopy,
                 fmt::arg("pin_memory", f.loader_pin_memory == 0 ? "DataLoader(pin_memory=False -> True)"
                                                                 : "DataLoader(pin_memory=True)"));
  if (f.have_steps && f.h2d_share >= kH2dShare) {
    out->push_back(Make(CauseId::kH2dCopy,
                        fmt::format("copies to the device took {} of step time (>= {})",
                                    Percent(f.h2d_share), Percent(kH2dShare)),
                        f.h2d_share, 0.9, fix));
  } else if (!f.have_steps && f.gpu_util < kGpuLowUtil && f.pcie_rx >= kPcieBusy) {
    out->push_back(
        {CauseId::kH2dCopy, "Host-to-device copies likely limit the GPU",
         fmt::format("GPU utilization median {:.0f}% (< {:.0f}%) while PCIe host-to-device traffic "
                     "runs at {:.1f} GB/s (>= {:.0f} GB/s)",
                     f.gpu_util, kGpuLowUtil, f.pcie_rx / 1e9, kPcieBusy / 1e9),
         1 - f.gpu_util / 100, 0.5, fix});
  }
}

namespace {

std::string Mib(int64_t bytes) {
  double g = static_cast<double>(bytes) / (1 << 30);
  return g >= 1 ? fmt::format("{:.2f} GiB", g)
                : fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

// fullburn train's memory model: an out-of-memory with the setting that
// would have fitted, or a micro-batch held down that a setting would raise.
void MemoryModelRule(const Facts& f, std::vector<Finding>* out) {
  if (!f.memory_model) return;
  const Facts::MemoryModelFacts& m = *f.memory_model;
  std::string parts = fmt::format(
      "memory model{}: {} per rank at micro-batch {} (weights {}, gradients {}, optimizer {}, "
      "activations {}){}",
      m.rank > 0 ? fmt::format(" of rank {}", m.rank) : "", Mib(m.total), m.batch, Mib(m.weights),
      Mib(m.gradients), Mib(m.optimizer), Mib(m.activations),
      m.limit > 0 ? " of the " + Mib(m.limit) + " limit" : "");
  if (m.oom) {
    std::string fix;
    if (!m.fix.empty()) fix = fmt::format("{} (predicted {} per rank)", m.fix, Mib(m.fix_bytes));
    if (m.fits_batch > 0)
      fix += fmt::format("{}train.batch_size = {} with a larger train.accumulate",
                         fix.empty() ? "" : ", or ", m.fits_batch);
    if (fix.empty()) fix = "lower train.batch_size and raise train.accumulate";
    out->push_back({CauseId::kMemoryPressure, fmt::format("Out of memory at micro-batch {}", m.batch),
                    parts, 1.0, 0.9, fix});
    return;
  }
  out->push_back(
      {CauseId::kMemoryPressure, fmt::format("Micro-batch {} held down by memory", m.batch),
       parts + (m.chosen_by_model ? "; the batch-size search took the memory model's largest for "
                                    "this setting"
                                  : "; the batch-size search ran out of memory above it"),
       0, 0.6,
       fmt::format("{}: micro-batch up to {} (predicted {} per rank at {})", m.fix, m.fix_batch,
                   Mib(m.fix_bytes), m.batch)});
}

}  // namespace

void MemoryRules(const Facts& f, std::vector<Finding>* out) {
  MemoryModelRule(f, out);
  if (f.mem_peak_share < kMemHeadroom && !f.GpuUnused()) {
    std::string batch = BatchSuggestion(f);
    out->push_back(Make(
        CauseId::kMemoryHeadroom,
        fmt::format("peak GPU memory {} of total (< {})", Percent(f.mem_peak_share),
                    Percent(kMemHeadroom)) +
            (std::isnan(f.gpu_util) ? ""
                                    : fmt::format(", GPU utilization median {:.0f}%", f.gpu_util)),
        0, 0.8,
        CatalogFix(f, CauseId::kMemoryHeadroom,
                   fmt::arg("batch", batch.empty() ? fmt::format(" (about x{:.0f})",
                                                                 std::floor(0.8 / f.mem_peak_share))
                                                   : ": " + batch))));
  }
  if (f.mem_peak_share > kMemNearFull)
    out->push_back(Make(CauseId::kMemoryPressure,
                        fmt::format("peak GPU memory {} of total (> {})", Percent(f.mem_peak_share),
                                    Percent(kMemNearFull)),
                        0, 0.7, CatalogFix(f, CauseId::kMemoryPressure)));
  bool swapping = f.swap_share >= kSwapShare;
  bool low = f.host_avail_min_share < kHostMemLow;
  if (!swapping && !low) return;
  std::string evidence = fmt::format(
      "swapping in {} of samples (>= {}); lowest available memory {} of total", Percent(f.swap_share),
      Percent(kSwapShare), std::isnan(f.host_avail_min_share) ? "-" : Percent(f.host_avail_min_share));
  std::string fix = Choose(f, "lower data.cache_mb or data.threads, or add RAM",
                           "fewer DataLoader workers or a smaller prefetch_factor, or add RAM");
  if (f.killed)  // what the OOM killer leaves behind: SIGKILL and no memory
    out->push_back({CauseId::kMemoryPressure,
                    "Killed with host memory exhausted: most likely the kernel's OOM killer",
                    "exit code 137 (SIGKILL); " + evidence, swapping ? f.swap_share : 0, 0.8,
                    "confirm with dmesg ('Out of memory: Killed process'); then " + fix});
  else
    out->push_back({CauseId::kMemoryPressure, "Host memory pressure", evidence,
                    swapping ? f.swap_share : 0, 0.7, fix});
}

void ThrottleRules(const Facts& f, std::vector<Finding>* out) {
  if (f.power_share >= kThrottleShare)
    out->push_back(Make(CauseId::kThrottlePower,
                        fmt::format("power-capped in {} of samples (>= {})", Percent(f.power_share),
                                    Percent(kThrottleShare)),
                        f.power_share, 0.8, CatalogFix(f, CauseId::kThrottlePower)));
  if (f.thermal_share >= kThrottleShare)
    out->push_back(Make(CauseId::kThrottleThermal,
                        fmt::format("thermally throttled in {} of samples (>= {})",
                                    Percent(f.thermal_share), Percent(kThrottleShare)),
                        f.thermal_share, 0.8, CatalogFix(f, CauseId::kThrottleThermal)));
}

namespace {

// Start-up is paid once, so its share falls as the run gets longer; where it
// is worth cutting, it goes to imports, building the dataset's file list and
// starting the loader's worker processes.
std::string WrappedStartUpFix(const Facts& f) {
  std::string fix =
      "start-up: a fixed cost, smaller in a longer run; to cut it, time the imports (python -X "
      "importtime) and the dataset set-up (an ImageFolder lists every file: cache the list, or "
      "fullburn pack)";
  if (f.loader_workers > 0)
    fix += fmt::format("; the first batch waits for num_workers={} processes to start",
                       f.loader_workers);
  return fix;
}

}  // namespace

// " (every 20 steps, 80 model calls each)" for the evaluations the hooks timed.
std::string EvaluationPattern(const EvaluationFacts& ev) {
  std::vector<std::string> parts;
  if (ev.period > 0) parts.push_back(fmt::format("every {} steps", ev.period));
  if (ev.model_calls > 0) parts.push_back(fmt::format("{} model calls each", ev.model_calls));
  return parts.empty() ? "" : fmt::format(" ({})", fmt::join(parts, ", "));
}

// The script's own evaluation options with values that evaluate less:
// "get_batch_loop.py ... --eval-interval 100 --eval-iters 10 (now 20 and 40)".
std::string EvaluationOptionsFix(const EvaluationFacts& ev) {
  if (ev.options.empty()) return "";
  std::string now, suggested;
  size_t at = 0;
  while (at < ev.options.size()) {
    size_t space = ev.options.find(' ', at);
    if (space == std::string::npos) break;
    size_t next = ev.options.find(' ', space + 1);
    std::string flag = ev.options.substr(at, space - at);
    std::string value = ev.options.substr(space + 1, next == std::string::npos ? std::string::npos : next - space - 1);
    at = next == std::string::npos ? ev.options.size() : next + 1;
    long v = std::strtol(value.c_str(), nullptr, 10);
    bool how_often = flag.find("interval") != std::string::npos || flag.find("every") != std::string::npos ||
                     flag.find("freq") != std::string::npos || flag.find("steps") != std::string::npos;
    bool how_many = flag.find("iters") != std::string::npos || flag.find("batches") != std::string::npos ||
                    flag.find("samples") != std::string::npos;
    long better = how_often ? v * 5 : how_many ? std::max(1L, v / 4) : v;
    suggested += " " + flag + " " + std::to_string(better);
    now += (now.empty() ? "" : ", ") + flag + " " + value;
  }
  if (suggested.empty()) return "";
  return fmt::format("{} ...{} (the script's own options, now {})",
                     ev.script.empty() ? "the script" : ev.script, suggested, now);
}

void IdleRules(const Facts& f, std::vector<Finding>* out) {
  if (f.idle.empty() || f.wall_s <= 0) return;
  std::map<std::string, std::pair<int, double>> by_what;  // count, seconds
  double idle = 0;
  for (const IdleSpan& s : f.idle) {
    double seconds = s.Seconds();
    idle += seconds;
    by_what[s.what].first++;
    by_what[s.what].second += seconds;
  }
  double share = idle / f.wall_s;
  if (share < kIdleShare) return;
  std::vector<std::pair<std::string, std::pair<int, double>>> parts(by_what.begin(), by_what.end());
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::string evidence =
      fmt::format("{} of the run ({:.1f} s of {:.1f} s, >= {}) outside training steps:", Percent(share),
                  idle, f.wall_s, Percent(kIdleShare));
  std::string fix;
  for (const auto& [what, cs] : parts) {
    evidence += fmt::format(" {}{} {:.1f} s{};", what,
                            cs.first > 1 ? fmt::format(" x{}", cs.first) : "", cs.second,
                            what == "evaluation" ? EvaluationPattern(f.evaluations) : "");
    std::string step;
    if (what == "start-up")
      step = Choose(f,
                    "start-up: reuse the batch-size search (set train.batch_size to the chosen "
                    "value), keep the "
                    "dataset on local disk",
                    WrappedStartUpFix(f));
    else if (what == "evaluation")
      step = EvaluationOptionsFix(f.evaluations).empty()
                 ? CatalogFix(f, CauseId::kIdlePhases) + SettingNote(f, FrameworkSetting::kEvaluationSchedule)
                 : "evaluation: evaluate less often, or on fewer batches: " + EvaluationOptionsFix(f.evaluations) +
                       SettingNote(f, FrameworkSetting::kEvaluationSchedule);
    else if (what == "checkpoint")
      step =
          Choose(f, "checkpoints: raise checkpoint.every_steps (writes are already asynchronous)",
                 "checkpoints: save less often, or asynchronously "
                 "(torch.distributed.checkpoint.async_save)" +
                     SettingNote(f, FrameworkSetting::kCheckpointSchedule));
    else if (what == "flops_setup")
      step =
          "flops_setup: the FLOP count's one-time set-up, once per run (PyTorch's first dispatch "
          "mode imports torch._dynamo); FULLBURN_NO_FLOPS=1 skips the count and its MFU";
    else
      step = what + ": find what the job does there (fullburn runs trace RUN)";
    fix += (fix.empty() ? "" : "; ") + step;
  }
  evidence.pop_back();
  // Without a GPU there is no device to idle: the time is simply not training.
  std::string title = f.gpus.empty() ? "Time outside training steps" : CauseOf(CauseId::kIdlePhases).title;
  if (parts.front().first == "evaluation")  // the evaluations are the cost: said first
    title = fmt::format("Evaluation{}: {} of the run{}",
                        f.evaluations.period > 0 ? fmt::format(" every {} steps", f.evaluations.period) : "",
                        Percent(parts.front().second.second / f.wall_s),
                        f.evaluations.model_calls > 0 ? fmt::format(", {} model calls each", f.evaluations.model_calls) : "");
  out->push_back({CauseId::kIdlePhases, title, evidence, share, f.ranks.empty() ? 0.6 : 0.8, fix});
}

void StallRule(const Facts& f, std::vector<Finding>* out) {
  const StallFacts& s = f.stalls;
  if (s.stalls == 0 || f.wall_s <= 0) return;
  double share = s.excess_s / f.wall_s;
  if (share < kMinShare) return;
  std::string steps = fmt::format("{}", fmt::join(s.first, ", "));
  if (s.stalls > static_cast<int>(s.first.size())) steps += ", ...";
  std::string evidence = fmt::format(
      "{} of {} steps took >= {:.0f}x the median step's work ({:.3g} s, data wait left out): the "
      "longest {:.3g} s; {}steps {}; {:.1f} s beyond the median, {} of the run",
      s.stalls, s.judged, kStallSteps, s.median_s, s.longest_s,
      s.period > 0 ? fmt::format("every {} steps, ", s.period) : "", steps, s.excess_s, Percent(share));
  if (!s.phase.empty()) evidence += "; the time went to " + s.phase;
  // A thread's save blocks no step, yet holds the GIL while it pickles and
  // takes a core while it writes: the loop slows while it runs.
  bool beside_saves = 2 * s.beside_background_saves >= s.stalls;
  if (beside_saves)
    evidence += fmt::format("; {} of them overlapped a torch.save on a background thread",
                            s.beside_background_saves);
  std::string near_full =
      f.mem_peak_share >= 0.9
          ? fmt::format(
                "; at {} peak GPU memory, the allocator freeing and retrying (a smaller "
                "micro-batch)",
                Percent(f.mem_peak_share))
          : "";
  std::string fix;
  if (beside_saves)
    fix =
        "the background save competes with the loop for Python's GIL and the CPU: write from a "
        "separate process rather than a thread, or save less often";
  else if (f.trainer)
    fix = fmt::format(
        "fullburn runs trace RUN shows the slow steps{}; other work on the host competing for "
        "its CPUs{}",
        s.phase.empty() ? "" : " and their " + s.phase, near_full);
  else if (s.period > 0)
    fix = fmt::format(
        "something the loop does every {} steps: a synchronous torch.save (save less often, or in "
        "the background: torch.distributed.checkpoint.async_save), evaluation or logging inside "
        "the loop (wrap it in Markers.phase so it is timed apart), a .item() or print that waits "
        "for the GPU",
        s.period);
  else
    fix = CatalogFix(f, CauseId::kStepStalls) + near_full;
  out->push_back(Make(CauseId::kStepStalls, evidence, share, s.period > 0 ? 0.8 : 0.6, fix));
}

namespace {

// Steps timed without communication (a wrapped DDP job's markers): every
// rank's step lasts as long as the slowest's, since the others wait inside
// backward's all-reduce, so a straggler shows only as its own data wait.
double DataWaitStragglerRule(const Facts& f, std::vector<Finding>* out) {
  std::vector<RankFacts> timed;
  for (const RankFacts& r : f.ranks)
    if (!std::isnan(r.data_wait_share)) timed.push_back(r);
  if (timed.size() < 2) return 0;
  auto [lo, hi] = std::minmax_element(
      timed.begin(), timed.end(),
      [](const RankFacts& a, const RankFacts& b) { return a.data_wait_share < b.data_wait_share; });
  double spread = hi->data_wait_share - lo->data_wait_share;
  if (spread < kUnevenRanks) return 0;
  out->push_back(
      {CauseId::kUnevenRanks,
       fmt::format("Straggler: rank {} waits for its data, the others wait for it", hi->rank),
       fmt::format("data wait {} of rank {}'s step time vs {} on rank {} ({:.0f} points apart, "
                   ">= {:.0f}); the steps carry no communication time, so the other ranks' "
                   "wait for rank {} is inside their steps",
                   Percent(hi->data_wait_share), hi->rank, Percent(lo->data_wait_share), lo->rank,
                   spread * 100, kUnevenRanks * 100, hi->rank),
       spread, 0.7,
       CatalogFix(f, CauseId::kUnevenRanks, fmt::arg("rank", hi->rank))});
  return spread;
}

// The slowest rank by median work, when the ranks are >= kUnevenRanks apart;
// returns the share of the job's time lost to waiting for it (0: none).
double StragglerRule(const Facts& f, std::vector<Finding>* out) {
  if (f.ranks.size() < 2) return 0;
  if (std::isnan(f.comm_share)) return DataWaitStragglerRule(f, out);
  // Step time outside communication first; where gradients are reduced
  // during backward a fast rank waits inside its backward, so its work reads
  // like the slow rank's: then the forward, which holds no communication.
  double RankFacts::*measure = &RankFacts::work_s;
  const char* what = "step work";
  auto apart = [&](double RankFacts::*m) {
    auto [lo, hi] =
        std::minmax_element(f.ranks.begin(), f.ranks.end(),
                            [m](const RankFacts& a, const RankFacts& b) { return a.*m < b.*m; });
    return (*hi).*m > 0 ? ((*hi).*m - (*lo).*m) / ((*hi).*m) : 0.0;
  };
  if (!(apart(measure) >= kUnevenRanks)) {
    bool timed = std::all_of(f.ranks.begin(), f.ranks.end(),
                             [](const RankFacts& r) { return r.forward_s > 0; });
    if (!timed || !(apart(&RankFacts::forward_s) >= kUnevenRanks)) return 0;
    measure = &RankFacts::forward_s;
    what = "forward";
  }
  auto [lo, hi] = std::minmax_element(
      f.ranks.begin(), f.ranks.end(),
      [measure](const RankFacts& a, const RankFacts& b) { return a.*measure < b.*measure; });
  double spread = ((*hi).*measure - (*lo).*measure) / ((*hi).*measure);
  double mean = 0;
  for (const RankFacts& r : f.ranks) mean += r.*measure / f.ranks.size();
  double share = 1 - mean / ((*hi).*measure);
  std::string wait =
      std::isnan(hi->data_wait_share)
          ? ""
          : fmt::format(" (data wait {} of its steps, rank {} {})", Percent(hi->data_wait_share),
                        lo->rank, Percent(lo->data_wait_share));
  if (!std::isnan(hi->proc_cpu) && !std::isnan(lo->proc_cpu))
    wait += fmt::format("; its process used {:.0f}% of a core, rank {}'s {:.0f}%", hi->proc_cpu,
                        lo->rank, lo->proc_cpu);
  std::string fix = fmt::format(
      "look at rank {}: its input pipeline, its GPU's clocks and PCIe slot, other jobs "
      "on its host; give every rank equal shards and batch sizes",
      hi->rank);
  // Ranks that share one busy host's cores slow each other: which one is
  // last is chance, and the cure is CPUs, not rank hi.
  if (f.ranks_per_node >= static_cast<int>(f.ranks.size()) && f.cpu_rank <= 0 &&
      f.cpu >= kCpuSaturated) {
    wait += fmt::format("; its {} ranks share one host, {} (>= {:.0f}%)", f.ranks.size(),
                        CpuReading(f), kCpuSaturated);
    fix = Choose(f,
                 "the ranks compete for the host's CPUs: give each its own (train.threads = 0 "
                 "splits the cores between the ranks of a node, fewer data.threads), or run "
                 "fewer ranks per node",
                 "the ranks compete for the host's CPUs: torch.set_num_threads(cores // "
                 "ranks) and fewer DataLoader workers per rank, or fewer ranks per node");
  }
  out->push_back(
      {CauseId::kUnevenRanks,
       fmt::format("Straggler: rank {} is slowest, the others wait for it", hi->rank),
       fmt::format("median {} {:.1f} ms on rank {} vs {:.1f} ms on rank {}: {} apart (>= {}){}",
                   what, (*hi).*measure * 1e3, hi->rank, (*lo).*measure * 1e3, lo->rank,
                   Percent(spread), Percent(kUnevenRanks), wait),
       share, 0.8, fix});
  return share;
}

// Without step records: GPUs of one job far apart in utilization.
void UnevenGpusRule(const Facts& f, std::vector<Finding>* out) {
  if (f.gpus.size() < 2) return;
  auto [lo, hi] =
      std::minmax_element(f.gpus.begin(), f.gpus.end(),
                          [](const GpuFacts& a, const GpuFacts& b) { return a.util < b.util; });
  if (!(hi->util - lo->util >= kUnevenUtil && lo->util < kGpuBusy)) return;
  double lost = 0;
  for (const GpuFacts& g : f.gpus) lost += (hi->util - g.util) / 100 / f.gpus.size();
  out->push_back(
      {CauseId::kUnevenRanks,
       fmt::format("Uneven GPUs: {} is busy far less than {}", lo->Name(), hi->Name()),
       fmt::format("GPU utilization median {:.0f}% on {} vs {:.0f}% on {} ({:.0f} points apart, "
                   ">= {:.0f})",
                   lo->util, lo->Name(), hi->util, hi->Name(), hi->util - lo->util, kUnevenUtil),
       lost, 0.6,
       fmt::format("give every GPU the same work (equal shards, same batch per rank); if {} waits "
                   "on {}, look at {}'s rank (clocks, input, PCIe); if {} is not part of "
                   "the job, ignore this",
                   lo->Name(), hi->Name(), hi->Name(), lo->Name())});
}

}  // namespace

void RankRules(const Facts& f, std::vector<Finding>* out) {
  double uneven_share = 0;
  if (f.ranks.size() >= 2)
    uneven_share = StragglerRule(f, out);
  else
    UnevenGpusRule(f, out);
  // Communication a straggler explains is the straggler's, not the network's.
  double comm = f.comm_share - uneven_share;
  if (f.have_steps && comm >= kCommShare)
    out->push_back(Make(
        CauseId::kCommunication,
        fmt::format(
            "gradient communication took {} of step time (>= {}) beyond waiting for stragglers",
            Percent(comm), Percent(kCommShare)),
        comm, 0.8, CatalogFix(f, CauseId::kCommunication)));
}

namespace {

bool Mentions(const std::string& text, std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (text.find(n) != std::string::npos) return true;
  return false;
}

// What an exception means and what to do about it, from its type and
// message: the failures that end training runs most often each have their
// usual remedy.
std::string Gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024)); }

// Reserved far above allocated: blocks the caching allocator holds but cannot
// reuse for the request (PyTorch's own advice names expandable_segments).
bool Fragmented(const Facts::Failure& x) {
  if (std::isnan(x.oom_allocated) || std::isnan(x.oom_reserved)) return false;
  double base = std::isnan(x.oom_total) ? x.oom_reserved : x.oom_total;
  return x.oom_reserved - x.oom_allocated >= std::max(0.2 * base, 1024.0 * 1024 * 1024);
}

// What ran out of memory, for the evidence: "; it ran out in layer h
// (forward); the allocator: 70.1 GiB allocated, 78.9 GiB reserved of 79.6 GiB".
std::string OomEvidence(const Facts& f) {
  const Facts::Failure& x = f.failure;
  if (!x.oom_recorded) return "";
  std::string out;
  if (!x.oom_layer.empty())
    out = fmt::format("; it ran out in layer {} ({})", x.oom_layer, x.oom_pass);
  else if (!x.oom_module_type.empty())
    out = fmt::format("; it ran out in a {} ({}; fullburn run --layers names the layer)",
                      x.oom_module_type, x.oom_pass);
  else if (!x.oom_pass.empty())
    out = fmt::format("; it ran out in the {}", x.oom_pass);
  if (std::isnan(x.oom_allocated) || std::isnan(x.oom_reserved))
    return out + "; the CUDA allocator's numbers were not read (no CUDA context in the process)";
  out += fmt::format("; the allocator: {} allocated, {} reserved", Gib(x.oom_allocated), Gib(x.oom_reserved));
  if (!std::isnan(x.oom_total)) out += " of " + Gib(x.oom_total);
  if (Fragmented(x))
    out += fmt::format(" ({} reserved beyond what is allocated: fragmentation)",
                       Gib(x.oom_reserved - x.oom_allocated));
  return out;
}

// The batch and checkpointing fix for an out-of-memory, in the framework's words.
std::string OomFix(const Facts& f) {
  const Facts::Failure& x = f.failure;
  std::string layer = !x.oom_layer.empty() ? "layer " + x.oom_layer
                      : !x.oom_module_type.empty() ? "the " + x.oom_module_type + " layers"
                                                   : "the largest layers";
  std::string half = f.batch >= 2 ? fmt::format(" ({} -> {})", f.batch, f.batch / 2) : "";
  std::string fix;
  switch (FrameworkOf(f)) {
    case Framework::kLightning:
      fix = "half the DataLoader's batch_size" + half +
            " with Trainer(accumulate_grad_batches=2) for the same effective batch; activation "
            "checkpointing of " + layer + " (torch.utils.checkpoint.checkpoint in its forward); "
            "Trainer(precision=\"bf16-mixed\")";
      break;
    case Framework::kTransformers:
      fix = "TrainingArguments(per_device_train_batch_size=" +
            (f.batch >= 2 ? std::to_string(f.batch / 2) : std::string("half")) +
            ", gradient_accumulation_steps=2) for the same effective batch, "
            "gradient_checkpointing=True, bf16=True";
      break;
    case Framework::kAccelerate:
      fix = "half the batch" + half + " with Accelerator(gradient_accumulation_steps=2); "
            "torch.utils.checkpoint.checkpoint around " + layer +
            "; Accelerator(mixed_precision=\"bf16\")";
      break;
    case Framework::kFullburnTrain:
      fix = "train.batch_size = auto finds the largest batch that fits; model.checkpoint = blocks";
      break;
    default:
      fix = "half the batch" + half + " with 2 accumulation steps for the same effective batch "
            "(loss / 2, optimizer.step() every second batch); "
            "torch.utils.checkpoint.checkpoint around " + layer +
            "'s forward; bf16 autocast";
  }
  if (Fragmented(x))
    return "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first: the memory is there but in "
           "pieces the allocator cannot join" +
           std::string(x.oom_alloc_conf.empty() ? "" : " (now: " + x.oom_alloc_conf + ")") +
           "; then, if it still does not fit, " + fix;
  return fix + "; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True if it is fragmentation";
}

std::pair<std::string, std::string> FailureKind(const Facts& f) {
  const std::string text = f.failure.type + ": " + f.failure.message;
  if (f.failure.oom_recorded && !f.trainer) {
    std::string peak = std::isnan(f.mem_peak_share)
                           ? ""
                           : fmt::format(" (peak GPU memory sampled: {})", Percent(f.mem_peak_share));
    return {Fragmented(f.failure) ? "The job ran out of GPU memory: fragmentation"
                                  : "The job ran out of GPU memory",
            "the step does not fit in GPU memory" + peak + ": " + OomFix(f)};
  }
  if (Mentions(text, {"CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED",
                      "HIP out of memory", "XPU out of memory"})) {
    std::string peak = std::isnan(f.mem_peak_share)
                           ? ""
                           : fmt::format(" (peak GPU memory sampled: {})", Percent(f.mem_peak_share));
    return {
        "The job ran out of GPU memory",
        "the step does not fit in GPU memory" + peak +
            ": a smaller batch with gradient accumulation for the same effective batch, bf16 "
            "autocast, activation checkpointing; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "if it is fragmentation; fullburn train finds the largest batch that fits "
            "(train.batch_size = auto)"};
  }
  if (Mentions(text, {"in DataLoader worker process"}))
    return {"The Dataset raised in a DataLoader worker",
            "the Dataset or its transform raised inside a DataLoader worker: the original "
            "traceback in the job's output names the line; num_workers=0 raises it in the main "
            "process, where a debugger reaches it"};
  if (Mentions(text, {"DataLoader worker (pid", "DataLoader timed out", "Bus error", "bus error",
                      "shared memory", "/dev/shm"}))
    return {"A DataLoader worker died",
            "host memory (dmesg: the OOM killer) or, in a container, a shared-memory segment too "
            "small for the batches (docker --shm-size, a memory-backed emptyDir at /dev/shm in "
            "Kubernetes); fewer workers or a smaller prefetch_factor need less"};
  if (f.failure.type == "MemoryError" ||
      Mentions(text, {"DefaultCPUAllocator: can't allocate memory", "Cannot allocate memory"}))
    return {"The job ran out of host memory",
            "fewer DataLoader workers, a smaller prefetch_factor or batch, memory-mapped data "
            "instead of loading it whole; or more RAM"};
  if (Mentions(text, {"NCCL", "ProcessGroup", "DistBackendError", "Connection reset by peer",
                      "Connection closed by peer", "Broken pipe", "collective operation timeout"}))
    return {"A collective failed",
            f.failure.ranks > 1
                ? fmt::format("rank {} raised first, so its cause (the message above, its host, "
                              "its memory) comes before the others', which waited for it",
                              f.failure.rank)
                : "another rank probably died or hung first: find the first rank that failed in "
                  "its output (fullburn launch names it) and fix that one"};
  return {"The job failed: " + f.failure.type, CatalogFix(f, CauseId::kJobFailed)};
}

}  // namespace

std::optional<Finding> CutFinding(const Facts& f) {
  if (f.cuts.empty()) return std::nullopt;
  std::string evidence, spills;
  for (const CutSpan& c : f.cuts) {
    evidence += fmt::format("{}records after {} ({:.1f} s into the run, to {:.1f} s) were not "
                            "stored: {}{}",
                            evidence.empty() ? "" : "; ", c.clock, c.from, c.to,
                            c.why.empty() ? "the store refused them" : c.why,
                            c.spill.empty() ? "" : "; they are kept in " + c.spill);
    if (!c.spill.empty()) spills += (spills.empty() ? "" : " ") + c.spill;
  }
  evidence += "; the findings below leave that stretch out (it is not idle time)";
  std::string fix =
      spills.empty()
          ? "those records were never written anywhere: give fullburn run a TMPDIR (the step "
            "events file's folder) with room next time"
          : fmt::format(fmt::runtime(FixFor(CauseId::kRecordCut, Framework::kPytorch)),
                        fmt::arg("spill", spills));
  return Finding{CauseId::kRecordCut, CauseOf(CauseId::kRecordCut).title, evidence, 0, 0.9, fix};
}

std::optional<Finding> FailureFinding(const Facts& f) {
  if (f.failure.type.empty()) return std::nullopt;
  std::string message = f.failure.message.substr(0, f.failure.message.find('\n'));
  if (message.size() > 240) message = message.substr(0, 237) + "...";
  std::string evidence = f.exit_code ? fmt::format("exit code {}; ", *f.exit_code) : "";
  evidence += fmt::format("{}raised {}{} ",
                          f.failure.ranks > 1 ? fmt::format("rank {} ", f.failure.rank) : "",
                          f.failure.type, f.failure.where.empty() ? "" : " at " + f.failure.where);
  evidence += f.failure.last_step > 0 ? fmt::format("after step {}", f.failure.last_step)
                                      : std::string("before its first step");
  evidence += fmt::format(", {:.1f} s into the run", f.failure.t);
  if (f.failure.ranks > 1)
    evidence += fmt::format(" (the first of {} ranks that raised one)", f.failure.ranks);
  if (!message.empty()) evidence += ": " + message;
  evidence += OomEvidence(f);
  auto [title, fix] = FailureKind(f);
  return Finding{CauseId::kJobFailed, title, evidence, 0, 0.9, fix};
}

}  // namespace fullburn::diagnose
