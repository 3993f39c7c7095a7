// JSON and CSV renderings of snapshots and stored runs.
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "fullburn/report.h"

namespace fullburn {

nlohmann::json JobsJson(const std::vector<JobNow>& jobs) {
  nlohmann::json out = nlohmann::json::array();
  for (const JobNow& j : jobs) {
    nlohmann::json one{{"run", j.run.id}, {"name", j.run.name}};
    if (j.step) one["step"] = *j.step;
    if (j.loss) one["loss"] = *j.loss;
    if (j.samples_per_s) one["samples_per_s"] = *j.samples_per_s;
    if (j.step_s) one["step_s"] = *j.step_s;
    if (j.data_wait_share) one["data_wait_share"] = *j.data_wait_share;
    if (j.mfu) one["mfu"] = *j.mfu;
    if (j.now) one["now"] = {{"cause", j.now->name()}, {"time_lost_pct", j.now->share_lost * 100}};
    out.push_back(one);
  }
  return out;
}

nlohmann::json SnapshotJson(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                            const std::string& gpu_note) {
  nlohmann::json j;
  j["time"] = s.unix_time;
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, value] : Flatten(s)) metrics[name] = value;
  j["metrics"] = metrics;
  nlohmann::json g = nlohmann::json::array();
  for (const GpuSample& gs : s.gpus) {
    nlohmann::json one;
    one["index"] = gs.index;
    for (const GpuInfo& info : gpus)
      if (info.index == gs.index) {
        one["name"] = info.name;
        one["uuid"] = info.uuid;
      }
    if (gs.throttle_reasons)
      one["throttle_reasons"] = DecodeThrottleReasons(static_cast<uint64_t>(*gs.throttle_reasons));
    nlohmann::json procs = nlohmann::json::array();
    for (const GpuProcess& p : gs.processes) {
      nlohmann::json pj{{"pid", p.pid}, {"name", p.name}};
      if (p.used_memory_bytes) pj["used_memory_bytes"] = *p.used_memory_bytes;
      procs.push_back(pj);
    }
    one["processes"] = procs;
    g.push_back(one);
  }
  j["gpus"] = g;
  if (!gpu_note.empty()) j["gpu_unavailable"] = gpu_note;
  return j;
}

nlohmann::json RunJson(const RunInfo& r) {
  nlohmann::json j;
  j["id"] = r.id;
  j["name"] = r.name;
  j["command"] = r.command;
  j["cwd"] = r.cwd;
  j["host"] = r.host;
  j["start_time"] = r.start_time;
  j["end_time"] = r.end_time ? nlohmann::json(*r.end_time) : nlohmann::json();
  j["exit_code"] = r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json();
  j["status"] = r.status;
  j["parent_id"] = r.parent_id ? nlohmann::json(*r.parent_id) : nlohmann::json();
  j["interval_s"] = r.interval_s;
  j["samples"] = r.sample_count;
  j["config"] = nlohmann::json::parse(r.config_json, nullptr, false);
  j["gpus"] = nlohmann::json::parse(r.gpus_json, nullptr, false);
  return j;
}

nlohmann::json RunShowJson(const RunInfo& run, const RunSummary& summary) {
  nlohmann::json j = RunJson(run);
  j["wall_s"] = summary.wall_s;
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, s] : summary.stats)
    metrics[name] = {{"unit", s.unit}, {"count", s.count}, {"min", s.min},  {"median", s.median},
                     {"p95", s.p95},   {"max", s.max},     {"mean", s.mean}};
  j["metrics"] = metrics;
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuRunSummary& g : summary.gpus) {
    nlohmann::json one{{"index", g.index}};
    auto put = [&one](const char* k, const std::optional<double>& v) {
      if (v) one[k] = *v;
    };
    put("low_util_share", g.low_util_share);
    put("peak_mem_bytes", g.peak_mem_bytes);
    put("mem_total_bytes", g.mem_total_bytes);
    put("peak_proc_mem_bytes", g.peak_proc_mem_bytes);
    put("throttled_share", g.throttled_share);
    one["throttle_reasons_seen"] = g.throttle_reasons_seen;
    if (g.used_by_job) one["used_by_job"] = *g.used_by_job;
    gpus.push_back(one);
  }
  j["gpu_summary"] = gpus;
  return j;
}

std::string SamplesCsv(const std::map<std::string, Series>& samples) {
  std::set<double> times;
  for (const auto& kv : samples)
    for (const SeriesPoint& p : kv.second) times.insert(p.t);
  std::ostringstream out;
  out << std::setprecision(15);
  out << "t";
  for (const auto& kv : samples) out << "," << kv.first;
  out << "\n";
  std::vector<size_t> pos(samples.size(), 0);
  for (double t : times) {
    out << t;
    size_t k = 0;
    for (const auto& kv : samples) {
      out << ",";
      const Series& s = kv.second;
      if (pos[k] < s.size() && s[pos[k]].t == t) out << s[pos[k]++].v;
      ++k;
    }
    out << "\n";
  }
  return out.str();
}

nlohmann::json SamplesJson(const RunInfo& run, const std::map<std::string, Series>& samples) {
  nlohmann::json j;
  j["run"] = RunJson(run);
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, series] : samples) {
    const MetricDef* def = FindMetric(name);
    nlohmann::json t = nlohmann::json::array(), v = nlohmann::json::array();
    for (const SeriesPoint& p : series) {
      t.push_back(p.t);
      v.push_back(p.v);
    }
    metrics[name] = {{"unit", def ? def->unit : ""}, {"t", t}, {"v", v}};
  }
  j["metrics"] = metrics;
  return j;
}

}  // namespace fullburn
