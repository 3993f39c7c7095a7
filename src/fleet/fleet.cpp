// The fleet's GPU-hours from the series Prometheus returned: each sample of
// a GPU stands for its target's scrape interval, so a gap is no sample and
// counts as unknown. Per sample, `available` is the interval, `used` the
// interval weighted by utilization, `lost` the rest; the lost part is given
// a cause by the GPU's state (free, held and idle) and, for the rest of a
// held GPU's idle time, by the diagnosis `fullburn serve` exported for the
// run holding it in that bucket.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "fullburn/fleet.h"

#include "fullburn/causes.h"

namespace fullburn {
namespace {

constexpr double kHour = 3600;

std::string Get(const std::map<std::string, std::string>& labels, const std::string& name) {
  auto it = labels.find(name);
  if (it != labels.end()) return it->second;
  // Prometheus renames a scraped label that clashes with a target label
  // (Kubernetes service discovery adds namespace and pod) to exported_NAME.
  it = labels.find("exported_" + name);
  return it != labels.end() ? it->second : "";
}

std::string SeriesKey(const std::map<std::string, std::string>& labels) {
  std::string key;
  for (const auto& [k, v] : labels) key += k + "=" + v + "\x1f";
  return key;
}

// The identity of the job holding a GPU series, "" for none.
std::string JobKey(const std::map<std::string, std::string>& l) {
  if (std::string j = Get(l, "hpc_job"); !j.empty()) return "slurm job " + j;
  if (std::string p = Get(l, "pod"); !p.empty()) return "pod " + Get(l, "namespace") + "/" + p;
  if (std::string r = Get(l, "run"); !r.empty()) return "run " + r + " on " + Get(l, "Hostname");
  return "";
}

std::string Node(const std::map<std::string, std::string>& l) {
  std::string host = Get(l, "Hostname");
  return host.empty() ? Get(l, "instance") : host;
}

std::string GpuKey(const std::map<std::string, std::string>& l) {
  std::string uuid = Get(l, "UUID");
  return Node(l) + " gpu " + Get(l, "gpu") + (uuid.empty() ? "" : " " + uuid);
}

struct GpuSeries {
  std::map<std::string, std::string> labels;
  const PromSeries *n = nullptr, *util = nullptr, *held = nullptr, *idle = nullptr,
                   *throttled = nullptr;
};

struct RowAcc {
  FleetRow row;
  std::set<std::string> nodes, gpus;
};

double Clamp(double v, double lo, double hi) { return std::max(lo, std::min(v, hi)); }

// The scrape interval of a series' target: the targets API's, else the
// mean spacing of its samples over the buckets it fills (a lattice of
// interval I gives step / I samples per bucket on average).
double Interval(const FleetInput& in, const GpuSeries& s, int* estimated) {
  auto it = in.intervals.find(Get(s.labels, "job") + "\x1f" + Get(s.labels, "instance"));
  if (it != in.intervals.end() && it->second > 0) return it->second;
  ++*estimated;
  double most = 0;
  for (double v : s.n->values)
    if (!std::isnan(v)) most = std::max(most, v);
  double sum = 0;
  int count = 0;
  for (size_t i = 1; i + 1 < s.n->values.size(); ++i)
    if (s.n->values[i] >= 0.5 * most) {
      sum += s.n->values[i];
      ++count;
    }
  if (count == 0) {  // too short for interior buckets: its densest one
    sum = most;
    count = 1;
  }
  double interval = in.step_s * count / std::max(1.0, sum);
  double whole = std::round(interval);
  return whole >= 1 && std::fabs(interval - whole) < 0.02 * whole ? whole : interval;
}

void AddCause(FleetHours* h, const std::string& cause, double hours) {
  if (hours > 0) h->lost_by_cause[cause] += hours;
}

void Finish(FleetRow* row) {
  double best = 0;
  for (const auto& [cause, hours] : row->hours.lost_by_cause)
    if (cause != kCauseNotHeld && hours > best) {
      best = hours;
      row->top_cause = cause;
    }
  double held_lost = row->hours.lost - [&] {
    auto it = row->hours.lost_by_cause.find(kCauseNotHeld);
    return it == row->hours.lost_by_cause.end() ? 0.0 : it->second;
  }();
  row->healthy = row->hours.held > 0 && held_lost < kHealthyLostShare * row->hours.held;
  row->fix = row->healthy ? FleetFix("healthy") : FleetFix(row->top_cause);
}

std::vector<FleetRow> Ranked(std::map<std::string, RowAcc>& rows) {
  std::vector<FleetRow> out;
  for (auto& [key, acc] : rows) {
    acc.row.key = key;
    acc.row.nodes.assign(acc.nodes.begin(), acc.nodes.end());
    acc.row.gpus = static_cast<int>(acc.gpus.size());
    Finish(&acc.row);
    out.push_back(std::move(acc.row));
  }
  std::stable_sort(out.begin(), out.end(), [](const FleetRow& a, const FleetRow& b) {
    return a.hours.lost > b.hours.lost;
  });
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nodes whose share stands out from the median of the others'.
void FlagNodes(FleetReport* r) {
  for (const FleetRow& row : r->nodes) {
    FleetNode n;
    n.host = row.key;
    n.gpus = row.gpus;
    n.hours = row.hours;
    if (row.hours.available > 0) {
      n.throttled_share = row.hours.throttled / row.hours.available;
      n.idle_share = row.hours.lost / row.hours.available;
    }
    r->node_flags.push_back(n);
  }
  for (FleetNode& n : r->node_flags) {
    std::vector<double> throttled, idle;
    for (const FleetNode& o : r->node_flags)
      if (&o != &n && o.hours.available > 0) {
        throttled.push_back(o.throttled_share);
        idle.push_back(o.idle_share);
      }
    if (throttled.empty()) continue;
    auto stands_out = [](double share, double median) {
      return share >= median + kNodeOutlierPoints && share >= 2 * median;
    };
    n.throttles_more = stands_out(n.throttled_share, Median(throttled));
    n.idles_more = stands_out(n.idle_share, Median(idle));
  }
}

}  // namespace

void FleetHours::Add(const FleetHours& o) {
  available += o.available;
  used += o.used;
  lost += o.lost;
  held += o.held;
  held_idle += o.held_idle;
  throttled += o.throttled;
  mfu_used += o.mfu_used;
  mfu_weighted += o.mfu_weighted;
  low_mfu += o.low_mfu;
  for (const auto& [cause, hours] : o.lost_by_cause) lost_by_cause[cause] += hours;
}

Result<FleetReport> ComputeFleet(const FleetInput& in) {
  FleetReport r;
  r.url = in.url;
  r.start = in.start;
  r.end = in.end;
  r.step_s = in.step_s;
  r.notes = in.notes;

  // Join the five GPU queries by label set.
  std::map<std::string, GpuSeries> gpu_series;
  for (const PromSeries& s : in.samples) {
    GpuSeries& g = gpu_series[SeriesKey(s.labels)];
    g.labels = s.labels;
    g.n = &s;
  }
  auto join = [&](const PromMatrix& m, const PromSeries* GpuSeries::*field) {
    for (const PromSeries& s : m) {
      auto it = gpu_series.find(SeriesKey(s.labels));
      if (it != gpu_series.end()) it->second.*field = &s;
    }
  };
  join(in.util_sum, &GpuSeries::util);
  join(in.held, &GpuSeries::held);
  join(in.held_idle, &GpuSeries::idle);
  join(in.throttled, &GpuSeries::throttled);

  // The same GPU from two scrape jobs (dcgm-exporter beside fullburn serve)
  // would count its hours twice. fullburn serve's is the one with held state.
  std::map<std::string, std::map<std::string, std::pair<int, int>>> sources;
  std::set<std::string> serve_jobs;
  for (const auto& [key, g] : gpu_series) {
    auto& span = sources[GpuKey(g.labels)]
                     .emplace(Get(g.labels, "job"), std::make_pair(1 << 30, -1))
                     .first->second;
    span.first = std::min(span.first, g.n->first);
    span.second = std::max(span.second, g.n->first + static_cast<int>(g.n->values.size()) - 1);
    if (g.held) serve_jobs.insert(Get(g.labels, "job"));
  }
  for (const auto& [gpu, jobs] : sources)
    for (auto a = jobs.begin(); a != jobs.end(); ++a)
      for (auto b = std::next(a); b != jobs.end(); ++b)
        if (a->second.first <= b->second.second && b->second.first <= a->second.second) {
          std::string keep = serve_jobs.count(b->first) ? b->first : a->first;
          return Status::InvalidArgument(fmt::format(
              "DCGM_FI_DEV_GPU_UTIL of {} comes from two scrape jobs ('{}' and '{}'), which would "
              "count its hours twice: pass --match 'job=\"{}\"' (fullburn serve's scrape job)",
              gpu, a->first, b->first, keep));
        }

  // The diagnoses of the runs, by node and run.
  std::map<std::pair<std::string, std::string>, std::vector<const PromSeries*>> causes;
  std::map<std::pair<std::string, std::string>, std::string> run_names;
  for (const PromSeries& s : in.causes) {
    auto key = std::make_pair(Node(s.labels), Get(s.labels, "run"));
    causes[key].push_back(&s);
    run_names[key] = Get(s.labels, "name");
  }
  std::map<std::pair<std::string, std::string>, const PromSeries*> mfus;
  for (const PromSeries& s : in.mfu) mfus[{Node(s.labels), Get(s.labels, "run")}] = &s;

  std::map<std::string, RowAcc> jobs, users, nodes, gpus;
  std::vector<double> avail_b(in.buckets, 0), used_b(in.buckets, 0), idle_b(in.buckets, 0);
  int first_bucket = in.buckets, estimated = 0;
  std::set<std::string> all_gpus, with_held;
  for (const auto& [key, g] : gpu_series) {
    const std::string node = Node(g.labels), gpu = GpuKey(g.labels), job = JobKey(g.labels);
    const std::string run = Get(g.labels, "run");
    all_gpus.insert(gpu);
    if (g.held) with_held.insert(gpu);
    const double hours_per_sample = Interval(in, g, &estimated) / kHour;
    auto cause_it = causes.find({node, run});
    auto mfu_it = run.empty() ? mfus.end() : mfus.find({node, run});
    FleetHours series;  // this series over the window
    FleetHours held_part;
    for (size_t i = 0; i < g.n->values.size(); ++i) {
      int b = g.n->first + static_cast<int>(i);
      double n = g.n->values[i];
      double u = g.util ? g.util->At(b) : NAN;
      if (std::isnan(n) || n <= 0 || std::isnan(u) || b < 0 || b >= in.buckets) continue;
      first_bucket = std::min(first_bucket, b);
      FleetHours h;
      h.available = n * hours_per_sample;
      h.used = Clamp(u / 100 * hours_per_sample, 0, h.available);
      h.lost = h.available - h.used;
      double rest = h.lost, not_held = 0;
      double held = g.held ? g.held->At(b) : NAN;
      if (std::isnan(held)) {
        AddCause(&h, kCauseUnreported, rest);
        rest = 0;
      } else {
        double idle = g.idle ? g.idle->At(b) : NAN;
        h.held = Clamp(held, 0, n) * hours_per_sample;
        not_held = Clamp((n - held) * hours_per_sample, 0, rest);
        rest -= not_held;
        // A held-idle sample is wholly lost (its utilization is under 5%).
        double idle_hours = std::isnan(idle) ? 0 : Clamp(idle * hours_per_sample, 0, rest);
        h.held_idle = std::isnan(idle) ? 0 : idle * hours_per_sample;
        rest -= idle_hours;
        AddCause(&h, kCauseNotHeld, not_held);
        AddCause(&h, kCauseIdleHeld, idle_hours);
      }
      if (double t = g.throttled ? g.throttled->At(b) : NAN; !std::isnan(t))
        h.throttled = t * hours_per_sample;
      if (double m = mfu_it != mfus.end() ? mfu_it->second->At(b) : NAN; !std::isnan(m)) {
        h.mfu_used = h.used;
        h.mfu_weighted = m * h.used;
        if (m < kMfuLow) h.low_mfu = h.used;
      }
      if (rest > 0) {
        double diagnosed = 0;
        std::vector<std::pair<std::string, double>> weights;
        if (cause_it != causes.end())
          for (const PromSeries* c : cause_it->second)
            if (double w = c->At(b); !std::isnan(w) && w > 0) {
              weights.emplace_back(Get(c->labels, "cause"), w);
              diagnosed += w;
            }
        for (const auto& [cause, w] : weights) AddCause(&h, cause, rest * w / diagnosed);
        if (weights.empty()) AddCause(&h, kCauseUndiagnosed, rest);
      }
      avail_b[b] += h.available;
      used_b[b] += h.used;
      idle_b[b] += h.held_idle;
      series.Add(h);
      // A job owns the time it held the GPU, not the GPU's free time.
      h.available -= not_held;
      h.lost -= not_held;
      h.lost_by_cause.erase(kCauseNotHeld);
      held_part.Add(h);
    }
    if (series.available <= 0) continue;
    r.total.Add(series);
    auto add_row = [&](std::map<std::string, RowAcc>& rows, const std::string& k,
                       const FleetHours& h, std::vector<const char*> names) {
      RowAcc& acc = rows[k];
      acc.row.hours.Add(h);
      acc.nodes.insert(node);
      acc.gpus.insert(gpu);
      for (const char* name : names)
        if (std::string v = Get(g.labels, name); !v.empty()) acc.row.identity[name] = v;
      if (!run.empty() && !run_names[{node, run}].empty())
        acc.row.identity["name"] = run_names[{node, run}];
      return &acc.row;
    };
    add_row(nodes, node, series, {})->identity["Hostname"] = node;
    add_row(gpus, gpu, series, {"gpu", "UUID", "modelName"})->identity["Hostname"] = node;
    if (held_part.available > 0) {
      std::string owner = job.empty() ? "unidentified holder on " + node : job;
      FleetRow* row =
          add_row(jobs, owner, held_part, {"hpc_job", "user", "partition", "namespace", "pod", "run"});
      if (!run.empty() || job.empty()) row->identity["Hostname"] = node;
      std::string user = Get(g.labels, "user");
      add_row(users, user.empty() ? "(unknown user)" : user, held_part, {"user"});
    }
  }
  if (all_gpus.empty())
    return Status::NotFound("no GPU sample in the window: nothing to count");

  r.gpus = static_cast<int>(all_gpus.size());
  r.jobs = Ranked(jobs);
  r.users = Ranked(users);
  r.nodes = Ranked(nodes);
  r.gpu_rows = Ranked(gpus);
  FlagNodes(&r);

  // Data begins later than the window: the rest is past the retention, or
  // before anything was scraped. The totals cover what is there.
  r.effective_start = in.start + first_bucket * in.step_s;
  if (first_bucket > 1)
    r.notes.push_back(fmt::format(
        "no GPU sample in the first {:.1f} h of the window: Prometheus has nothing older (its "
        "retention), or fullburn serve was not scraped yet; the totals cover the {:.1f} h since",
        (r.effective_start - in.start) / kHour, (in.end - r.effective_start) / kHour));
  double expected = r.gpus * (in.end - r.effective_start) / kHour;
  r.unknown = std::max(0.0, expected - r.total.available);
  if (r.unknown > 0.01 * expected)
    r.notes.push_back(fmt::format(
        "{:.0f}% of the GPU-hours since the first sample have no sample ({:.2f} GPU-hours): "
        "missed scrapes, or GPUs added or removed in the window; counted as unknown, not as idle",
        100 * r.unknown / expected, r.unknown));
  if (estimated > 0)
    r.notes.push_back(std::to_string(estimated) +
                      " series have no active scrape target: their scrape interval was taken "
                      "from the spacing of their samples");
  if (with_held.size() < all_gpus.size())
    r.notes.push_back(std::to_string(all_gpus.size() - with_held.size()) + " of " +
                      std::to_string(r.gpus) +
                      " GPUs have no fullburn_gpu_held (scraped from dcgm-exporter, or an older "
                      "fullburn): their lost hours are '" + kCauseUnreported +
                      "'; scrape fullburn serve on their nodes");
  for (int b = 0; b < in.buckets; ++b) {
    r.times.push_back(in.start + (b + 1) * in.step_s);
    double hours_per_bucket = in.step_s / kHour;
    r.util_pct.push_back(avail_b[b] > 0 ? 100 * used_b[b] / avail_b[b] : NAN);
    r.gpus_sampled.push_back(avail_b[b] > 0 ? avail_b[b] / hours_per_bucket : NAN);
    r.gpus_held_idle.push_back(avail_b[b] > 0 ? idle_b[b] / hours_per_bucket : NAN);
  }
  return r;
}

const std::vector<FleetRow>& FleetRows(const FleetReport& r, const std::string& by) {
  if (by == "user") return r.users;
  if (by == "node") return r.nodes;
  if (by == "gpu") return r.gpu_rows;
  return r.jobs;
}

std::string FleetFix(const std::string& cause) {
  const Cause* c = FindCause(cause);
  return c && *c->fleet ? c->fleet : "`fullburn diagnose RUN` on its node gives the fix";
}

}  // namespace fullburn
