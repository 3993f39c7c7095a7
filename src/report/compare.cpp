// `fullburn compare`: what each run amounts to, side by side.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "fullburn/report.h"

namespace fullburn {
namespace {

void Flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) Flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    (*out)[prefix] = j.is_string() ? j.get<std::string>() : j.dump();
  }
}

double MedianOf(const std::map<std::string, Series>& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end() || it->second.empty()) return NAN;
  std::vector<double> v;
  for (const SeriesPoint& p : it->second) v.push_back(p.v);
  return Percentile(v, 50);
}

std::string Cell(double v, const char* format) { return std::isnan(v) ? "-" : fmt::format(fmt::runtime(format), v); }

// "+12%" against the first run's value.
std::string Change(double v, double base) {
  if (std::isnan(v) || std::isnan(base) || base == 0) return "";
  return fmt::format(" ({:+.0f}%)", (v / base - 1) * 100);
}

// For commands of one length: each run's differing arguments, each run of
// them after the flag that names it ("--batch-size 16 ... --workers 0").
bool DifferingArgs(const std::vector<RunDigest>& runs, std::vector<std::string>* cells) {
  const std::vector<std::string>& first = runs.front().command;
  for (const RunDigest& d : runs)
    if (d.command.size() != first.size()) return false;
  std::vector<bool> differs(first.size(), false);
  for (const RunDigest& d : runs)
    for (size_t i = 0; i < first.size(); ++i) differs[i] = differs[i] || d.command[i] != first[i];
  cells->clear();
  for (const RunDigest& d : runs) {
    std::string cell;
    for (size_t i = 0; i < first.size(); ++i) {
      if (!differs[i]) continue;
      bool starts = i == 0 || !differs[i - 1];
      if (starts && !cell.empty()) cell += " ... ";
      if (starts && i > 0 && !first[i - 1].empty() && first[i - 1][0] == '-')
        cell += first[i - 1] + " ";
      else if (!starts)
        cell += " ";
      cell += d.command[i];
    }
    cells->push_back(cell);
  }
  return true;
}

}  // namespace

std::vector<ComparisonRow> ComparisonTable(const std::vector<RunDigest>& runs) {
  using Row = ComparisonRow;
  std::vector<Row> rows;
  auto measure = [&](const std::string& label, double RunDigest::*field, const char* format, double scale, bool change) {
    Row r{label, {}};
    for (const RunDigest& d : runs)
      r.second.push_back(Cell(d.*field * scale, format) + (change && &d != &runs[0] ? Change(d.*field, runs[0].*field) : ""));
    rows.push_back(r);
  };
  measure("samples/s (median)", &RunDigest::samples_per_s, "{:.1f}", 1, true);
  measure("step time (median, ms)", &RunDigest::step_s, "{:.1f}", 1e3, true);
  measure("data wait (% of step)", &RunDigest::data_wait_share, "{:.0f}%", 100, false);
  if (std::any_of(runs.begin(), runs.end(), [](const RunDigest& d) { return !std::isnan(d.mfu); }))
    measure("MFU", &RunDigest::mfu, "{:.1f}%", 100, true);
  std::vector<std::string> phases;
  for (const StepPhase& p : kStepPhases) phases.push_back(p.name);
  phases.push_back("other");
  for (const std::string& phase : phases) {
    if (phase == "data_wait") continue;
    if (std::none_of(runs.begin(), runs.end(),
                     [&](const RunDigest& d) { return d.phase_share.count(phase) > 0; }))
      continue;
    Row r{phase + " (% of step)", {}};
    for (const RunDigest& d : runs) {
      auto it = d.phase_share.find(phase);
      r.second.push_back(it == d.phase_share.end() ? "-"
                                                   : fmt::format("{:.0f}%", it->second * 100));
    }
    rows.push_back(r);
  }
  measure("GPU utilization (median)", &RunDigest::gpu_util, "{:.0f}%", 1, false);
  measure("peak GPU memory", &RunDigest::gpu_mem_peak_share, "{:.0f}%", 100, false);
  measure("host CPU (median)", &RunDigest::cpu_util, "{:.0f}%", 1, false);
  measure("wall time (s)", &RunDigest::wall_s, "{:.1f}", 1, false);
  std::set<std::string> causes;
  for (const RunDigest& d : runs)
    for (const auto& [cause, share] : d.time_lost) causes.insert(cause);
  for (const std::string& cause : causes) {
    Row r{"time lost: " + cause, {}};
    for (const RunDigest& d : runs) {
      auto it = d.time_lost.find(cause);
      r.second.push_back(it == d.time_lost.end() ? "-" : fmt::format("{:.0f}%", it->second * 100));
    }
    rows.push_back(r);
  }
  std::set<std::string> keys;
  for (const RunDigest& d : runs)
    for (const auto& [k, v] : d.config) keys.insert(k);
  for (const std::string& k : keys) {
    std::vector<std::string> values;
    for (const RunDigest& d : runs) {
      auto it = d.config.find(k);
      values.push_back(it == d.config.end() ? "-" : it->second);
    }
    if (std::all_of(values.begin(), values.end(), [&](const std::string& v) { return v == values[0]; })) continue;
    if (k == "command" && DifferingArgs(runs, &values)) {
      rows.push_back({"config: command (what differs)", values});
      continue;
    }
    rows.push_back({"config: " + k, values});
  }
  return rows;
}

RunDigest Digest(const RunData& d, const std::vector<Finding>& findings) {
  RunDigest g;
  g.id = d.run.id;
  g.name = d.run.name;
  g.status = d.run.status;
  g.wall_s = d.run.end_time ? *d.run.end_time - d.run.start_time : 0;
  if (!d.steps.empty()) {
    StepsSummary s = SummarizeSteps(d.steps);
    if (s.median_samples_per_s > 0) g.samples_per_s = s.median_samples_per_s;
    for (const auto& [phase, share] : s.phase_share)
      if (phase != "data_wait") g.phase_share[phase] = share;
    std::vector<double> step_s;
    double wait = 0, timed = 0;
    for (const StepRecord& r : d.steps) {
      step_s.push_back(r.step_s);
      if (r.data_wait_s) wait += *r.data_wait_s, timed += r.step_s;
    }
    g.step_s = Percentile(step_s, 50);
    if (timed > 0) g.data_wait_share = wait / timed;
  }
  JobGpus gpus = ReadJobGpus(d);
  g.gpu_util = gpus.util_pct;
  g.gpu_mem_peak_share = gpus.mem_peak_share;
  g.cpu_util = MedianOf(d.samples, "host.cpu_util");
  g.mfu = ComputeMfu(d).value;
  for (const Finding& f : findings)
    if (f.share_lost > 0) g.time_lost[f.name()] = std::max(g.time_lost[f.name()], f.share_lost);
  Flatten(nlohmann::json::parse(d.run.config_json, nullptr, false), "", &g.config);
  g.config.erase("");
  g.config["command"] = JoinedCommand(d.run.command);
  g.command = d.run.command;
  return g;
}

// Long cells (commands) keep their start and end, where runs differ.
std::string Shorten(const std::string& s, size_t width = 40) {
  return s.size() <= width ? s : s.substr(0, 14) + "..." + s.substr(s.size() - (width - 17));
}

std::string RenderComparison(const std::vector<RunDigest>& runs) {
  std::vector<ComparisonRow> rows = ComparisonTable(runs);
  std::vector<std::string> header;
  for (const RunDigest& d : runs) header.push_back(fmt::format("run {} {}", d.id, d.name.substr(0, 24)));
  size_t label_w = 0;
  std::vector<size_t> w(runs.size(), 0);
  for (size_t c = 0; c < runs.size(); ++c) w[c] = header[c].size();
  for (const auto& [label, cells] : rows) {
    label_w = std::max(label_w, label.size());
    for (size_t c = 0; c < cells.size(); ++c) w[c] = std::max(w[c], Shorten(cells[c]).size());
  }
  std::string out = fmt::format("{:<{}}", "", label_w);
  for (size_t c = 0; c < runs.size(); ++c) out += fmt::format("  {:>{}}", header[c], w[c]);
  out += "\n";
  for (const auto& [label, cells] : rows) {
    out += fmt::format("{:<{}}", label, label_w);
    for (size_t c = 0; c < cells.size(); ++c) out += fmt::format("  {:>{}}", Shorten(cells[c]), w[c]);
    out += "\n";
  }
  return out;
}

nlohmann::json ComparisonJson(const std::vector<RunDigest>& runs) {
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
  nlohmann::json out = nlohmann::json::array();
  for (const RunDigest& d : runs) {
    nlohmann::json lost = nlohmann::json::object();
    for (const auto& [cause, share] : d.time_lost) lost[cause] = std::round(share * 1000) / 10;
    nlohmann::json phases = nlohmann::json::object();
    for (const auto& [phase, share] : d.phase_share) phases[phase] = std::round(share * 1000) / 10;
    out.push_back({{"run", d.id},
                   {"name", d.name},
                   {"status", d.status},
                   {"wall_s", d.wall_s},
                   {"samples_per_s", num(d.samples_per_s)},
                   {"step_s", num(d.step_s)},
                   {"data_wait_pct", num(d.data_wait_share * 100)},
                   {"step_phases_pct", phases},
                   {"gpu_util_pct", num(d.gpu_util)},
                   {"gpu_mem_peak_pct", num(d.gpu_mem_peak_share * 100)},
                   {"cpu_util_pct", num(d.cpu_util)},
                   {"mfu_pct", num(d.mfu * 100)},
                   {"time_lost_pct", lost},
                   {"config", d.config}});
  }
  return out;
}

}  // namespace fullburn
