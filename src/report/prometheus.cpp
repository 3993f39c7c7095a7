// Prometheus text exposition. GPU metrics use dcgm-exporter's DCGM field names
// and units where one exists, with the labels dashboards built for
// dcgm-exporter expect (gpu, UUID, modelName, Hostname, and the holding job's
// hpc_job, namespace and pod); everything else is under fullburn_.
#include <fmt/format.h>

#include <functional>

#include "fullburn/report.h"

namespace fullburn {
namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string PrometheusName(const MetricDef& def) {
  if (*def.prom_name) return def.prom_name;
  std::string scope;
  switch (def.scope) {
    case MetricScope::kGpu:
      scope = "gpu_";
      break;
    case MetricScope::kCore:
      scope = "host_core_cpu_";
      break;
    case MetricScope::kHostCpu:
      scope = "host_cpu_";
      break;
    case MetricScope::kHost:
      scope = "host_";
      break;
    case MetricScope::kProc:
      scope = "proc_";
      break;
  }
  return "fullburn_" + scope + def.suffix;
}

std::string RenderPrometheus(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                             const std::string& hostname) {
  std::map<std::string, std::pair<const MetricDef*, std::vector<std::string>>> families;
  std::vector<std::string> order;
  for (const auto& [name, value] : Flatten(s)) {
    int index = 0, rank = 0;
    const MetricDef* def = FindMetric(name, &index, &rank);
    if (!def) continue;
    std::string labels;
    if (def->scope == MetricScope::kGpu) {
      const GpuInfo* info = nullptr;
      for (const GpuInfo& g : gpus)
        if (g.index == index && rank == s.rank) info = &g;
      labels = fmt::format("gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",", index,
                           Escape(info ? info->uuid : ""), Escape(info ? info->name : ""));
      // The job holding it (fullburn serve): dcgm-exporter's hpc_job, pod and namespace.
      if (info)
        for (const auto& [name, value] : info->labels)
          labels += fmt::format("{}=\"{}\",", name, Escape(value));
    } else if (def->scope == MetricScope::kCore) {
      labels = fmt::format("cpu=\"{}\",", index);
    }
    if (rank > 0) labels += fmt::format("rank=\"{}\",", rank);
    labels += fmt::format("Hostname=\"{}\"", Escape(hostname));
    std::string prom = PrometheusName(*def);
    auto& fam = families[prom];
    if (!fam.first) {
      fam.first = def;
      order.push_back(prom);
    }
    fam.second.push_back(fmt::format("{}{{{}}} {}", prom, labels, value * def->prom_scale));
  }
  std::string out;
  for (const std::string& prom : order) {
    const auto& fam = families[prom];
    const MetricDef& d = *fam.first;
    std::string unit = d.prom_scale == 1.0 && *d.unit ? fmt::format(" ({})", d.unit) : "";
    out += fmt::format("# HELP {} {}{}.\n# TYPE {} gauge\n", prom, d.help, unit, prom);
    for (const std::string& line : fam.second) out += line + "\n";
  }
  return out;
}

std::string RenderJobsPrometheus(const std::vector<JobNow>& jobs, const std::string& hostname) {
  struct Family {
    const char* name;
    const char* help;
    std::function<std::optional<double>(const JobNow&)> value;
  };
  const Family families[] = {
      {"fullburn_job_step", "Latest optimizer step of a job recorded on this host",
       [](const JobNow& j) { return j.step ? std::optional<double>(*j.step) : std::nullopt; }},
      {"fullburn_job_loss", "Training loss at the job's latest step",
       [](const JobNow& j) { return j.loss; }},
      {"fullburn_job_samples_per_second",
       "Samples per second of the job (every rank) over its last minute of steps",
       [](const JobNow& j) { return j.samples_per_s; }},
      {"fullburn_job_step_seconds", "Median step time of the job over its last minute (s)",
       [](const JobNow& j) { return j.step_s; }},
      {"fullburn_job_data_wait_ratio",
       "Share of step time the job waited for data over its last minute",
       [](const JobNow& j) { return j.data_wait_share; }},
      {"fullburn_job_mfu",
       "Model FLOPs utilization of the job over its last minute: one step's counted FLOPs at "
       "the median step time, of its GPUs' dense bf16 peak (0-1)",
       [](const JobNow& j) { return j.mfu; }},
  };
  auto labels = [&](const JobNow& j) {
    return fmt::format("run=\"{}\",name=\"{}\",Hostname=\"{}\"", j.run.id, Escape(j.run.name),
                       Escape(hostname));
  };
  std::string out;
  for (const Family& f : families) {
    std::string lines;
    for (const JobNow& j : jobs)
      if (std::optional<double> v = f.value(j))
        lines += fmt::format("{}{{{}}} {}\n", f.name, labels(j), *v);
    if (!lines.empty())
      out += fmt::format("# HELP {} {}.\n# TYPE {} gauge\n{}", f.name, f.help, f.name, lines);
  }
  std::string lost;
  for (const JobNow& j : jobs)
    if (j.now)
      lost += fmt::format("fullburn_job_time_lost_ratio{{{},cause=\"{}\"}} {}\n", labels(j),
                          Escape(j.now->name()), j.now->share_lost);
  if (!lost.empty())
    out +=
        "# HELP fullburn_job_time_lost_ratio Share of the job's last minute lost to what limits "
        "it now (cause: docs/diagnosis.md; healthy: 0).\n# TYPE fullburn_job_time_lost_ratio "
        "gauge\n" +
        lost;
  return out;
}

}  // namespace fullburn
