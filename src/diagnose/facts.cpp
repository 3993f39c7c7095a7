// Gathers what the diagnosis rules read from a stored run.
#include "facts.h"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <ctime>
#include <map>
#include <set>

#include "fullburn/telemetry.h"
#include "fullburn/train_settings.h"

namespace fullburn::diagnose {
namespace {

double MedianOf(const Series& s) {
  std::vector<double> v;
  for (const SeriesPoint& p : s) v.push_back(p.v);
  return Median(v);
}

double Max(const Series& s) {
  double m = NAN;
  for (const SeriesPoint& p : s) m = std::isnan(m) ? p.v : std::max(m, p.v);
  return m;
}

const Series* Find(const std::map<std::string, Series>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() || it->second.empty() ? nullptr : &it->second;
}

// The ranks that sampled a host: 0 (bare names), then the first rank of every
// other node (rankR.host.*), found by their host.cpu_util series.
std::vector<int> HostRanks(const std::map<std::string, Series>& m) {
  std::vector<int> ranks;
  for (const auto& [name, series] : m) {
    int index = 0, rank = 0;
    const MetricDef* def = FindMetric(name, &index, &rank);
    if (def && def->scope == MetricScope::kHostCpu && std::string(def->suffix) == "util" &&
        !series.empty())
      ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

// GPUs that ran none of the job's processes while another GPU of the same node
// ran some: another job's or idle ones on a shared node (a one-GPU job on an
// eight-GPU machine). Where NVML cannot match the job's processes (a PID
// namespace) every GPU reads 0 and none is left out.
std::set<std::pair<int, int>> NotTheJobs(const std::map<std::string, Series>& m,
                                         const std::vector<std::pair<int, int>>& gpus) {
  std::set<int> nodes_with_job;
  std::set<std::pair<int, int>> idle_for_job;
  for (const auto& [rank, g] : gpus) {
    const Series* mem =
        Find(m, RankPrefix(rank) + "gpu" + std::to_string(g) + ".proc_mem_used_bytes");
    if (!mem || mem->empty()) continue;
    if (Max(*mem) > 0)
      nodes_with_job.insert(rank);
    else
      idle_for_job.insert({rank, g});
  }
  std::set<std::pair<int, int>> out;
  for (const auto& gpu : idle_for_job)
    if (nodes_with_job.count(gpu.first)) out.insert(gpu);
  return out;
}

// In a container with a CPU quota the host's /proc/stat counts every core of
// the node: the job's CPU is judged against the quota instead.
void GatherQuota(const std::map<std::string, Series>& m, int rank, Facts* f) {
  const Series* quota = Find(m, RankPrefix(rank) + "host.cpu_quota");
  if (!quota || !(Max(*quota) > 0)) return;
  const Series* job = Find(m, RankPrefix(rank) + "proc.cpu_util");
  const Series* throttled = Find(m, RankPrefix(rank) + "host.cpu_throttled");
  double q = MedianOf(*quota), t = throttled ? MedianOf(*throttled) : NAN;
  double use = job ? MedianOf(*job) / q : NAN;  // % of the quota (proc is % of one core)
  // Throttled at the quota is saturated even when the median use is lower (bursts).
  double level = t >= kCpuThrottled ? std::max(std::isnan(use) ? 0.0 : use, kCpuSaturated) : use;
  if (std::isnan(level) || level <= f->cpu) return;
  f->cpu = level;
  f->cpu_rank = rank;
  f->cpu_of_quota = true;
  f->cpu_quota = q;
  f->cpu_throttled = t;
}

// One node's host readings; Facts keeps the worst node's of each. Levels
// come from the training window (`m`); memory lows and swapping from the
// whole run (`all`), where a start-up spike is as real a pressure.
void GatherNode(const std::map<std::string, Series>& m, const std::map<std::string, Series>& all,
                int rank, Facts* f) {
  std::string p = RankPrefix(rank) + "host.";
  if (const Series* s = Find(m, p + "cpu_util"); s && !(MedianOf(*s) <= f->cpu)) {
    f->cpu = MedianOf(*s);
    f->cpu_rank = rank;
    f->cpu_of_quota = false;  // a busier node's host reading replaces a quota reading
  }
  GatherQuota(m, rank, f);
  if (const Series* s = Find(m, p + "cpu_iowait"); s && !(MedianOf(*s) <= f->iowait)) {
    f->iowait = MedianOf(*s);
    f->iowait_rank = rank;
  }
  const Series *in = Find(all, p + "swap_in_per_s"), *out = Find(all, p + "swap_out_per_s");
  size_t n = 0, swapping = 0;
  for (const Series* s : {in, out}) {
    if (!s) continue;
    n = std::max(n, s->size());
    for (const SeriesPoint& pt : *s) swapping += pt.v > 0;
  }
  if (n) f->swap_share = std::max(f->swap_share, std::min(1.0, static_cast<double>(swapping) / n));
  const Series *avail = Find(all, p + "mem_available_bytes"),
               *total = Find(all, p + "mem_total_bytes");
  if (avail && total && Max(*total) > 0) {
    double lo = INFINITY;
    for (const SeriesPoint& pt : *avail) lo = std::min(lo, pt.v);
    if (!(lo / Max(*total) >= f->host_avail_min_share)) f->host_avail_min_share = lo / Max(*total);
  }
}

void GatherHost(const std::map<std::string, Series>& m, const std::map<std::string, Series>& all,
                Facts* f) {
  for (int rank : HostRanks(m)) GatherNode(m, all, rank, f);
  if (f->cpu_rank < 0) GatherNode(m, all, 0, f);  // iowait or memory without a CPU series
  if (const Series* s = Find(m, "proc.cpu_util")) f->proc_cpu = MedianOf(*s);
  while (Find(m, "host.cpu" + std::to_string(f->cores) + ".util")) ++f->cores;
  // Worker advice counts the CPUs the quota allows, not the host's.
  if (const Series* q = Find(m, "host.cpu_quota"); q && f->cores > 0)
    f->cores = std::min(f->cores, std::max(1, static_cast<int>(MedianOf(*q))));
}

// The step's measured phases, data wait included.
double PhasesSum(const StepRecord& r) {
  double sum = 0;
  for (const StepPhase& ph : kStepPhases) sum += (r.*ph.field).value_or(0);
  return sum;
}

// The part of each step no phase accounts for, where the forward was timed
// (without it the rest would hold the forward too). A step with no data wait
// had no DataLoader: its rest makes the batches too.
void GatherLoop(const std::vector<StepRecord>& steps, Facts* f) {
  double phased = 0, rest = 0;
  std::vector<double> rests, durations;
  for (const StepRecord& r : steps) {
    if (!r.forward_s || r.step_s <= 0) continue;
    f->loop_makes_batches |= !r.data_wait_s;
    double other = std::max(0.0, r.step_s - PhasesSum(r));
    phased += r.step_s;
    rest += other;
    rests.push_back(other);
    durations.push_back(r.step_s);
  }
  if (phased <= 0) return;
  f->loop_share = rest / phased;
  f->loop_median_s = Median(rests);
  f->phased_step_median_s = Median(durations);
  f->loop_mean_s = rest / static_cast<double>(rests.size());
  f->phased_step_mean_s = phased / static_cast<double>(durations.size());
}

void GatherSteps(const std::vector<StepRecord>& steps, const std::map<std::string, Series>& samples,
                 Facts* f) {
  double timed = 0, wait = 0, h2d = 0, comm = 0;
  bool have_h2d = false, have_comm = false;
  std::map<int, std::vector<const StepRecord*>> by_rank;
  std::vector<double> batch;
  for (const StepRecord& r : steps) {
    by_rank[r.rank].push_back(&r);
    batch.push_back(static_cast<double>(r.samples));
    if (!r.data_wait_s) continue;
    timed += r.step_s;
    wait += *r.data_wait_s;
    h2d += r.h2d_s.value_or(0);
    comm += r.comm_s.value_or(0);
    have_h2d |= r.h2d_s.has_value();
    have_comm |= r.comm_s.has_value();
  }
  GatherLoop(steps, f);
  f->step_records = static_cast<int64_t>(steps.size());
  f->have_steps = timed > 0;
  if (f->have_steps) {
    f->data_wait_share = wait / timed;
    if (have_h2d) f->h2d_share = h2d / timed;
    if (have_comm) f->comm_share = comm / timed;
  }
  if (!batch.empty()) f->batch = static_cast<int64_t>(Median(batch));
  for (const auto& [rank, list] : by_rank) {
    RankFacts rf;
    rf.rank = rank;
    std::vector<double> work, forward;
    double st = 0, dw = 0;
    for (const StepRecord* r : list) {
      work.push_back(r->step_s - r->comm_s.value_or(0));
      if (r->forward_s) forward.push_back(*r->forward_s);
      if (r->data_wait_s) st += r->step_s, dw += *r->data_wait_s;
    }
    rf.work_s = Median(work);
    if (!forward.empty()) rf.forward_s = Median(forward);
    if (st > 0) rf.data_wait_share = dw / st;
    if (const Series* series = Find(samples, RankPrefix(rank) + "proc.cpu_util");
        series && !series->empty())
      rf.proc_cpu = MedianOf(*series);
    f->ranks.push_back(rf);
  }
}

// What happened inside [start, end]: the first event or checkpoint there.
// Timed saves are left out: their time is checkpoint_stall's.
std::string Label(const RunData& d, double start, double end, const std::string& fallback) {
  for (const RunEvent& e : d.events)
    if (e.t >= start && e.t <= end + 0.5 && e.kind != "loader" && e.kind != "dataloader" &&
        e.kind != "torch" && e.kind != "flops" && e.kind != kStacksEvent && e.kind != "layers" &&
        !IsTimedSave(e))
      return e.kind;
  for (const CheckpointRecord& c : d.checkpoints)
    if (c.t >= start && c.t <= end + 0.5) return "checkpoint";
  return fallback;
}

// The seconds of [start, end] that a cut (a stretch the store lacks) covers.
double CutWithin(const Facts& f, double start, double end) {
  double s = 0;
  for (const CutSpan& c : f.cuts) s += std::max(0.0, std::min(end, c.to) - std::max(start, c.from));
  return s;
}

// The stretches a spill holds and the store does not (LoadRun's store_gap events).
void GatherCuts(const RunData& d, Facts* f) {
  for (const RunEvent& e : d.events) {
    if (e.kind != kStoreGapEvent && e.kind != kEventsCutEvent) continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    if (!j.is_object()) continue;
    CutSpan c;
    c.from = e.t;
    c.to = std::max(e.t, j.value("to", e.t));
    c.why = j.value("why", std::string());
    std::time_t at = static_cast<std::time_t>(d.run.start_time + e.t);
    std::tm tm{};
    char buf[16] = "";
    if (::localtime_r(&at, &tm)) std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
    c.clock = buf;
    c.spill = j.value("spill", std::string());
    f->cuts.push_back(c);
  }
}

// Gaps in the lowest rank's steps: before the first, between, after the last.
void IdleFromSteps(const RunData& d, Facts* f) {
  std::vector<const StepRecord*> steps;
  int rank = f->ranks.front().rank;
  std::vector<double> durations;
  for (const StepRecord& r : d.steps)
    if (r.rank == rank) steps.push_back(&r), durations.push_back(r.step_s);
  std::sort(steps.begin(), steps.end(),
            [](const StepRecord* a, const StepRecord* b) { return a->t < b->t; });
  double min_gap = std::max(kIdleGapMin_s, kIdleGapSteps * Median(durations));
  // A gap is idle when it is long without the checkpoint saves in it: the
  // saves after the step before it (the markers move a save out of the step
  // it interrupts, to the gap before that step).
  auto add = [&](double start, double end, int64_t after, double min, const std::string& what) {
    double saves = SavesAfter(f->checkpoints, after), cut = CutWithin(*f, start, end);
    if (end - start - saves - cut >= min) f->idle.push_back({start, end, what, saves, cut});
  };
  double prev_end = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    double start = steps[i]->t - steps[i]->step_s;
    if (i == 0)
      add(0, start, 0, kIdleGapMin_s, "start-up");
    else
      add(prev_end, start, steps[i - 1]->step, min_gap, Label(d, prev_end, start, "between steps"));
    prev_end = steps[i]->t;
  }
  if (!f->running && !steps.empty())
    add(prev_end, f->wall_s, steps.back()->step, min_gap, Label(d, prev_end, f->wall_s, "end"));
  // Each timed evaluation is idle time whatever its length: ten of 0.9 s
  // are as idle as one of 9 s (a gap shorter than min_gap is not seen above).
  for (const RunEvent& e : d.events) {
    if (e.kind != "evaluation") continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    double took = j.is_object() ? j.value("duration_s", 0.0) : 0.0;
    if (!(took > 0)) continue;
    double start = e.t - took, end = e.t;
    auto around = std::find_if(f->idle.begin(), f->idle.end(), [&](const IdleSpan& s) {
      return s.start <= start + 1e-3 && end <= s.end + 1e-3;
    });
    if (around != f->idle.end() && around->what == "evaluation") continue;  // the gap was it
    // One before the first step (nanoGPT's at iteration 0) is the
    // evaluation's, not the start-up's.
    if (around != f->idle.end()) around->inner_s += took;
    f->idle.push_back({start, end, "evaluation", 0, CutWithin(*f, start, end)});
  }
}

// How often the job evaluated, for how long and how (idle_phases says it).
void GatherEvaluations(const RunData& d, Facts* f) {
  EvaluationFacts& ev = f->evaluations;
  std::vector<int64_t> after;
  std::vector<double> calls;
  for (const RunEvent& e : d.events) {
    if (e.kind != "evaluation") continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    if (!j.is_object()) continue;
    ev.count++;
    ev.seconds += std::max(0.0, j.value("duration_s", 0.0));
    if (j.contains("after_step") && j["after_step"].is_number_integer()) after.push_back(j["after_step"].get<int64_t>());
    if (j.contains("model_calls") && j["model_calls"].is_number()) calls.push_back(j["model_calls"].get<double>());
    if (j.contains("options") && j["options"].is_object() && ev.options.empty()) {
      for (auto& [flag, value] : j["options"].items())
        ev.options += (ev.options.empty() ? "" : " ") + flag + " " + value.dump();
      ev.script = j.value("script", std::string());
    }
  }
  if (!calls.empty()) ev.model_calls = static_cast<int>(Median(calls));
  // Regular: every gap between evaluations after the first the same.
  std::vector<int64_t> gaps;
  for (size_t i = 1; i < after.size(); ++i)
    if (after[i] > after[i - 1]) gaps.push_back(after[i] - after[i - 1]);
  if (gaps.size() >= 2 && std::all_of(gaps.begin(), gaps.end(), [&](int64_t g) { return g == gaps[0]; }))
    ev.period = static_cast<int>(gaps[0]);
}

// Without steps: stretches where every GPU idles while the run is otherwise busy.
void IdleFromGpus(const RunData& d, Facts* f) {
  if (f->gpus.empty() || !(f->gpu_util >= kGpuLowUtil)) return;
  const GpuFacts& first = f->gpus.front();
  const Series* util =
      Find(d.samples, RankPrefix(first.rank) + "gpu" + std::to_string(first.index) + ".util");
  double interval = d.run.interval_s > 0 ? d.run.interval_s : 1;
  size_t i = 0;
  while (i < util->size()) {
    if ((*util)[i].v >= kGpuIdle) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < util->size() && (*util)[j].v < kGpuIdle) ++j;
    double start = i == 0 ? 0 : (*util)[i - 1].t,
           end = j < util->size() ? (*util)[j].t : (*util)[j - 1].t + interval;
    bool first = i == 0, last = j == util->size();
    double saves = SavesWithin(f->checkpoints, start, end), cut = CutWithin(*f, start, end);
    if (end - start - saves - cut >= std::max(kIdleGapMin_s, 2 * interval))
      f->idle.push_back(
          {start, end,
           first ? "start-up" : Label(d, start, end, last ? "end" : "between busy stretches"),
           saves, cut});
    i = j;
  }
}

// The samples taken while the job trained: from the start of its first step
// to the end of its last (a sample covers the interval before its time, so
// one counts when its middle is inside). Start-up (imports, a single-threaded
// dataset scan, the batch-size search) and the end are left out: they are
// idle_phases' to judge, and in a short run they pulled the CPU median of a
// job whose loader workers filled both cores down to 76%. A series with fewer
// than 3 samples inside is kept whole.
std::map<std::string, Series> TrainingWindow(const RunData& d) {
  if (d.steps.empty()) return d.samples;
  double t0 = INFINITY, t1 = -INFINITY;
  for (const StepRecord& r : d.steps) {
    t0 = std::min(t0, r.t - r.step_s);
    t1 = std::max(t1, r.t);
  }
  double half = d.run.interval_s > 0 ? d.run.interval_s / 2 : 0.5;
  std::map<std::string, Series> out;
  for (const auto& [name, series] : d.samples) {
    Series inside;
    for (const SeriesPoint& p : series)
      if (p.t - half >= t0 && p.t - half <= t1) inside.push_back(p);
    out[name] = inside.size() >= 3 ? inside : series;
  }
  return out;
}

// Of the phases the step records time (forward, backward, ...), the one whose
// time beyond its median makes up most of the stalls' excess; "" if none does.
std::string GrownPhase(const std::vector<const StepRecord*>& steps,
                       const std::vector<const StepRecord*>& stalled, double excess) {
  std::string best;
  double best_s = 0;
  for (const StepPhase& ph : kStepPhases) {
    if (std::string(ph.name) == "data_wait") continue;
    std::vector<double> all;
    for (const StepRecord* r : steps)
      if ((r->*ph.field).has_value()) all.push_back(*(r->*ph.field));
    if (all.size() != steps.size()) continue;
    double median = Median(all), grown = 0;
    for (const StepRecord* r : stalled) grown += std::max(0.0, *(r->*ph.field) - median);
    if (grown > best_s) best_s = grown, best = ph.label;
  }
  // With every phase timed (a wrapped job's forward included), what none
  // holds is the loop's own code: a stall there is logging or evaluation in it.
  std::vector<double> rest;
  for (const StepRecord* r : steps)
    if (r->forward_s) rest.push_back(r->step_s - PhasesSum(*r));
  if (rest.size() == steps.size() && !rest.empty()) {
    double median = Median(rest), grown = 0;
    for (const StepRecord* r : stalled) grown += std::max(0.0, r->step_s - PhasesSum(*r) - median);
    if (grown > best_s) {
      best_s = grown;
      best = "the loop's own code, outside forward, backward and the optimizer step";
    }
  }
  return best_s > 0.5 * excess ? best : "";
}

// After GatherSteps: f->ranks is in rank order, so its first is the lowest.
void GatherStalls(const RunData& d, Facts* f) {
  if (f->ranks.empty()) return;
  int rank = f->ranks.front().rank;
  std::vector<const StepRecord*> steps;
  int seen = 0;
  for (const StepRecord& r : d.steps)
    if (r.rank == rank && ++seen > kStallWarmupSteps) steps.push_back(&r);
  if (static_cast<int>(steps.size()) < kStallMinSteps) return;
  auto work = [](const StepRecord* r) { return r->step_s - r->data_wait_s.value_or(0); };
  std::vector<double> all;
  for (const StepRecord* r : steps) all.push_back(work(r));
  StallFacts& s = f->stalls;
  s.judged = static_cast<int>(steps.size());
  s.median_s = Median(all);
  if (!(s.median_s > 0)) return;
  std::vector<const StepRecord*> stalled;
  std::vector<int64_t> numbers;
  for (const StepRecord* r : steps) {
    if (work(r) < kStallSteps * s.median_s) continue;
    stalled.push_back(r);
    numbers.push_back(r->step);
    s.excess_s += work(r) - s.median_s;
    s.longest_s = std::max(s.longest_s, work(r));
    for (const auto& [start, end] : f->checkpoints.background)
      if (start < r->t && end > r->t - r->step_s) {
        ++s.beside_background_saves;
        break;
      }
  }
  s.stalls = static_cast<int>(stalled.size());
  s.period = Period(numbers, 2);  // a gap of 1 is a run of stalled steps, not a period
  s.first.assign(numbers.begin(), numbers.begin() + std::min<size_t>(4, numbers.size()));
  s.phase = GrownPhase(steps, stalled, s.excess_s);
}

// Utilisation, PCIe and throttling from the training window (`m`); memory
// peaks and which GPUs the job used from the whole run (`all`): an
// out-of-memory comes after the last step that finished.
void GatherGpuSeries(const std::map<std::string, Series>& m,
                     const std::map<std::string, Series>& all, Facts* f) {
  double util_sum = 0;
  std::vector<std::pair<int, int>> found;  // (rank, gpu) with a util series
  for (const auto& [name, series] : m) {
    int index = 0, rank = 0;
    const MetricDef* def = FindMetric(name, &index, &rank);
    if (def && def->scope == MetricScope::kGpu && std::string(def->suffix) == "util")
      found.emplace_back(rank, index);
  }
  std::sort(found.begin(), found.end());
  std::set<std::pair<int, int>> not_the_jobs = NotTheJobs(all, found);
  for (const auto& [rank, g] : found) {
    std::string p = RankPrefix(rank) + "gpu" + std::to_string(g) + ".";
    const Series* util = Find(m, p + "util");
    if (!util) continue;
    GpuFacts gf;
    gf.index = g;
    gf.rank = rank;
    if (not_the_jobs.count({rank, g})) {
      f->other_gpus.push_back(gf.Name());
      continue;
    }
    gf.util = MedianOf(*util);
    if (const Series* whole = Find(all, p + "util")) gf.util_max = Max(*whole);
    util_sum += gf.util;
    const Series *used = Find(all, p + "mem_used_bytes"), *total = Find(all, p + "mem_total_bytes");
    if (used && total && Max(*total) > 0) {
      gf.mem_peak_share = Max(*used) / Max(*total);
      f->mem_peak_share = std::isnan(f->mem_peak_share)
                              ? gf.mem_peak_share
                              : std::max(f->mem_peak_share, gf.mem_peak_share);
    }
    if (const Series* rx = Find(m, p + "pcie_rx_bytes_per_s")) {
      gf.pcie_rx = MedianOf(*rx);
      f->pcie_rx = std::isnan(f->pcie_rx) ? gf.pcie_rx : std::max(f->pcie_rx, gf.pcie_rx);
    }
    auto median = [&](const char* suffix) {
      const Series* series = Find(m, p + suffix);
      return series ? MedianOf(*series) : NAN;
    };
    gf.sm_active = median("sm_active");
    gf.tensor_active = median("tensor_active");
    gf.sm_occupancy = median("sm_occupancy");
    gf.fp32_active = median("fp32_active");
    if (const Series* t = Find(m, p + "throttle_reasons")) {
      double power = 0, thermal = 0;
      for (const SeriesPoint& s : *t) {
        power += IsPowerThrottled(static_cast<uint64_t>(s.v));
        thermal += IsThermalThrottled(static_cast<uint64_t>(s.v));
      }
      f->power_share = std::max(f->power_share, power / t->size());
      f->thermal_share = std::max(f->thermal_share, thermal / t->size());
    }
    f->gpus.push_back(gf);
  }
  if (!f->gpus.empty()) f->gpu_util = util_sum / f->gpus.size();
}

}  // namespace

void GatherGpus(const RunData& run, Facts* f) {
  GatherGpuSeries(TrainingWindow(run), run.samples, f);
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}


bool Facts::GpuUnused() const {
  return !gpus.empty() && std::all_of(gpus.begin(), gpus.end(), [](const GpuFacts& g) {
    return g.util_max < kGpuUnused;  // false for NaN: not read is not idle
  });
}

std::string GpuFacts::Name() const {
  return rank > 0 ? fmt::format("GPU {} of rank {}'s node", index, rank)
                  : fmt::format("GPU {}", index);
}

std::string NodeNote(int rank) { return rank > 0 ? fmt::format(" on rank {}'s node", rank) : ""; }

std::string CpuReading(const Facts& f) {
  if (!f.cpu_of_quota) return fmt::format("host CPU median {:.0f}%{}", f.cpu, NodeNote(f.cpu_rank));
  std::string s = fmt::format("the job's CPU median {:.0f}% of its container's {:.3g}-CPU quota{}",
                              f.cpu, f.cpu_quota, NodeNote(f.cpu_rank));
  if (!std::isnan(f.cpu_throttled))
    s += fmt::format(", throttled in {:.0f}% of CFS periods", f.cpu_throttled);
  return s;
}

// The first DataLoader a wrapped job's markers described.
void GatherDataLoader(const std::vector<RunEvent>& events, Facts* f) {
  for (const RunEvent& e : events) {
    if (e.kind != "loader" || f->python_loader) continue;
    auto data = nlohmann::json::parse(e.data, nullptr, false);
    f->python_loader = data.is_object() && data.contains("python");
  }
  for (const RunEvent& e : events) {
    if (e.kind != "dataloader") continue;
    auto data = nlohmann::json::parse(e.data, nullptr, false);
    if (!data.is_object() || !data.contains("num_workers") ||
        !data["num_workers"].is_number_integer())
      continue;
    f->loader_workers = std::max(0, data["num_workers"].get<int>());
    if (data.contains("pin_memory") && data["pin_memory"].is_boolean())
      f->loader_pin_memory = data["pin_memory"].get<bool>() ? 1 : 0;
    auto text = [&](const char* key, std::string* out) {
      if (data.contains(key) && data[key].is_string()) *out = data[key].get<std::string>();
    };
    text("dataset", &f->loader_dataset);
    text("created_at", &f->loader_created_at);
    text("created_in", &f->loader_created_in);
    text("framework", &f->loader_framework);
    text("workers_flag", &f->loader_workers_flag);
    text("script", &f->loader_script);
    return;
  }
}

namespace {

// The first out-of-memory's `memory` event; else, when a batch-size trial ran
// out of memory, the setting whose predicted largest micro-batch is the
// largest (at least twice the chosen one).
void GatherMemoryModel(const std::vector<RunEvent>& events, Facts* f) {
  bool search_oom = false, chosen_by_model = false;
  for (const RunEvent& e : events) {
    if (e.kind != "batch_size_trial" && e.kind != "batch_size_chosen") continue;
    auto t = nlohmann::json::parse(e.data, nullptr, false);
    if (!t.is_object()) continue;
    if (e.kind == "batch_size_chosen")
      chosen_by_model |= t.value("memory_model", false);
    else
      search_oom |= t.value("error", std::string()) == "out of memory";
  }
  for (const RunEvent& e : events) {
    if (e.kind != "memory") continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    if (!j.is_object() || !j.contains("predicted") || !j["predicted"].is_object()) continue;
    Facts::MemoryModelFacts m;
    m.oom = j.value("oom", false);
    m.rank = j.value("rank", 0);
    m.batch = j.value("batch", int64_t{0});
    m.limit = j.value("limit_bytes", int64_t{0});
    const nlohmann::json& p = j["predicted"];
    m.total = p.value("total", int64_t{0});
    m.weights = p.value("weights", int64_t{0});
    m.gradients = p.value("gradients", int64_t{0});
    m.optimizer = p.value("optimizer", int64_t{0});
    m.activations = p.value("activations", int64_t{0});
    if (m.oom) {
      m.fix = j.value("fix", std::string());
      m.fix_bytes = j.value("fix_bytes", int64_t{0});
      m.fits_batch = j.value("fits_batch", int64_t{0});
      f->memory_model = m;
      return;
    }
    if (!search_oom || f->memory_model || !j.contains("settings")) continue;
    const std::string shard = j.value("shard", std::string("none")),
                      ckpt = j.value("checkpoint", std::string("none"));
    for (const nlohmann::json& s : j["settings"]) {
      int64_t largest = s.value("largest_batch", int64_t{0});
      if (largest < 2 * m.batch || largest <= m.fix_batch) continue;
      std::string fix;
      if (s.value("shard", shard) != shard) fix = "dist.shard = " + s.value("shard", shard);
      if (s.value("checkpoint", ckpt) != ckpt)
        fix += (fix.empty() ? "" : " and ") + ("model.checkpoint = " + s.value("checkpoint", ckpt));
      if (s.value("fused_loss", false))
        fix += (fix.empty() ? "" : " and ") + std::string("model.fused_loss = true");
      m.fix = fix;
      m.fix_batch = largest;
      m.fix_bytes = s.value("bytes", int64_t{0});
    }
    if (m.fix.empty()) continue;
    m.search_limited = true;
    m.chosen_by_model = chosen_by_model;
    f->memory_model = m;
  }
}

void GatherFailure(const RunData& d, Facts* f) {
  std::set<int> ranks;
  for (const RunEvent& e : d.events) {
    if (e.kind != "exception") continue;
    auto data = nlohmann::json::parse(e.data, nullptr, false);
    if (!data.is_object()) continue;
    int rank = data.value("rank", 0);
    ranks.insert(rank);
    if (!f->failure.type.empty() && f->failure.t <= e.t) continue;  // the first one counts
    f->failure.type = data.value("type", std::string("Exception"));
    f->failure.message = data.value("message", std::string());
    f->failure.where = data.value("where", std::string());
    f->failure.rank = rank;
    f->failure.t = e.t;
    const nlohmann::json oom = data.value("oom", nlohmann::json());
    f->failure.oom_recorded = oom.is_object();
    if (oom.is_object()) {
      auto bytes = [&](const char* key) {
        return oom.contains(key) && oom[key].is_number() ? oom[key].get<double>() : NAN;
      };
      f->failure.oom_layer = oom.value("layer", std::string());
      f->failure.oom_module_type = oom.value("module_type", std::string());
      f->failure.oom_pass = oom.value("pass", std::string());
      f->failure.oom_allocated = bytes("allocated_bytes");
      f->failure.oom_reserved = bytes("reserved_bytes");
      f->failure.oom_total = bytes("total_bytes");
      f->failure.oom_alloc_conf = oom.value("alloc_conf", std::string());
    }
  }
  f->failure.ranks = static_cast<int>(ranks.size());
  if (f->failure.type.empty()) return;
  for (const StepRecord& r : d.steps)
    if (r.rank == f->failure.rank && r.t <= f->failure.t + 1e-6)
      f->failure.last_step = std::max(f->failure.last_step, r.step);
}

}  // namespace

Facts Gather(const RunData& d) {
  Facts f;
  std::map<std::string, Series> training = TrainingWindow(d);
  GatherGpuSeries(training, d.samples, &f);
  GatherHost(training, d.samples, &f);
  GatherSteps(d.steps, training, &f);
  GatherDataLoader(d.events, &f);
  try {
    GatherMemoryModel(d.events, &f);
  } catch (const nlohmann::json::exception&) {  // a malformed memory event: left out
    f.memory_model.reset();
  }
  GatherCheckpoints(d, &f);
  GatherStalls(d, &f);
  f.running = !d.run.end_time.has_value();
  f.interrupted = d.run.status == "interrupted";
  f.killed = d.run.exit_code == 128 + SIGKILL;
  f.exit_code = d.run.exit_code;
  GatherFailure(d, &f);
  if (d.run.end_time) {
    f.wall_s = *d.run.end_time - d.run.start_time;
  } else {
    for (const auto& [name, s] : d.samples)
      if (!s.empty()) f.wall_s = std::max(f.wall_s, s.back().t);
    for (const StepRecord& r : d.steps) f.wall_s = std::max(f.wall_s, r.t);
  }
  // Without the trainer's count (0: unknown, or another job's step markers),
  // the ranks that recorded steps, spread over the nodes that sampled a host.
  if (f.ranks.size() > 1) {
    int nodes = std::max<int>(1, HostRanks(d.samples).size());
    f.ranks_per_node = (static_cast<int>(f.ranks.size()) + nodes - 1) / nodes;
  }
  GatherEfficiency(d, &f);
  GatherCuts(d, &f);
  f.wall_s -= CutWithin(f, 0, f.wall_s);  // shares are of what the store holds
  if (!f.ranks.empty())
    IdleFromSteps(d, &f);
  else
    IdleFromGpus(d, &f);
  GatherEvaluations(d, &f);
  auto cfg = nlohmann::json::parse(d.run.config_json, nullptr, false);
  if (cfg.is_object()) {
    f.attached = cfg.contains("attached_pid");
    // A trainer's options through the trainer's own typed reader; "resolved"
    // is what the trainer chose at run time, no option.
    auto settings = ReadStoredSettings(d.run.config_json);
    f.trainer = settings.ok();
    if (settings.ok()) {
      f.precision = settings->train.precision;
      f.data_threads = static_cast<int>(settings->data.threads);
    }
    if (cfg.contains("resolved") && cfg["resolved"].contains("device") &&
        cfg["resolved"]["device"].is_string())
      f.device = cfg["resolved"]["device"].get<std::string>();
    if (cfg.contains("resolved") && cfg["resolved"].contains("threads") &&
        cfg["resolved"]["threads"].is_number_integer())
      f.train_threads = cfg["resolved"]["threads"].get<int>();
    if (cfg.contains("resolved") && cfg["resolved"].contains("ranks_per_node") &&
        cfg["resolved"]["ranks_per_node"].is_number_integer() &&
        cfg["resolved"]["ranks_per_node"].get<int>() > 0)
      f.ranks_per_node = cfg["resolved"]["ranks_per_node"].get<int>();
  }
  return f;
}

}  // namespace fullburn::diagnose
