// `fullburn report`: one self-contained HTML file. Tables and text are made
// here; the charts are drawn in the browser by uPlot (third_party/uplot,
// inlined), from series downsampled for display (the store keeps every point).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "fullburn/report.h"

extern const char kUplotJs[];
extern const char kUplotCss[];

namespace fullburn {
namespace {

constexpr size_t kMaxPoints = 2000;  // per series: a 10-hour run at 1 Hz is 36,000

std::string Escape(const std::string& s) { return HtmlEscape(s); }

struct ChartSpec {
  const char* title;
  const char* unit;
  const char* prefix;  // "gpu" for every GPU, else the metric's full name prefix
  std::vector<const char*> names;
  double scale;
};

const ChartSpec kTelemetryCharts[] = {
    {"GPU utilization", "%", "gpu", {"util", "sm_active", "tensor_active"}, 1},
    {"GPU pipes (GPM): what the SMs compute with",
     "%",
     "gpu",
     {"tensor_hmma_active", "tensor_imma_active", "tensor_dfma_active", "fp16_active",
      "fp32_active", "fp64_active"},
     1},
    {"SM occupancy and DRAM bandwidth (GPM)", "%", "gpu", {"sm_occupancy", "dram_active"}, 1},
    {"GPU memory",
     "GiB",
     "gpu",
     {"mem_used_bytes", "mem_total_bytes", "proc_mem_used_bytes"},
     1.0 / (1 << 30)},
    {"GPU power", "W", "gpu", {"power_w", "power_limit_w"}, 1},
    {"GPU temperature", "°C", "gpu", {"temp_c"}, 1},
    {"GPU SM clock", "MHz", "gpu", {"sm_clock_mhz", "max_sm_clock_mhz"}, 1},
    {"PCIe traffic", "GB/s", "gpu", {"pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s"}, 1e-9},
    {"Host CPU, all cores", "%", "host.", {"cpu_util", "cpu_iowait"}, 1},
    {"The job's process tree (each rank's)", "% of one core", "proc.", {"cpu_util"}, 1},
    {"Process memory (RSS)", "GiB", "proc.", {"rss_bytes"}, 1.0 / (1 << 30)},
    {"Host memory used", "GiB", "host.", {"mem_used_bytes"}, 1.0 / (1 << 30)},
};

nlohmann::json SeriesJson(const std::string& label, const Series& s) {
  nlohmann::json t = nlohmann::json::array(), v = nlohmann::json::array();
  for (const SeriesPoint& p : s) {
    t.push_back(std::round(p.t * 1000) / 1000);
    v.push_back(p.v);  // NaN (a gap) is written as null
  }
  return {{"label", label}, {"t", t}, {"v", v}};
}

std::string RunPrefix(const ReportRun& r, bool several) {
  return several ? fmt::format("run {}: ", r.data.run.id) : "";
}

// The stored series a chart draws, for every rank that sampled them (rank 0's
// bare names, then rankR.*: other ranks' process trees, other nodes' hosts
// and GPUs), ordered by rank, GPU and the spec's order of names.
std::vector<std::string> ChartSeriesNames(const ChartSpec& spec,
                                          const std::map<std::string, Series>& samples) {
  std::vector<std::tuple<int, int, size_t, std::string>> found;
  for (const auto& [name, series] : samples) {
    int index = 0, rank = 0;
    const MetricDef* def = FindMetric(name, &index, &rank);
    if (!def) continue;
    std::string bare = MetricName(*def, index);
    for (size_t k = 0; k < spec.names.size(); ++k) {
      bool gpu = std::string(spec.prefix) == "gpu";
      std::string want = gpu ? "gpu" + std::to_string(index) + "." + spec.names[k]
                             : spec.prefix + std::string(spec.names[k]);
      if (bare == want && (def->scope == MetricScope::kGpu) == gpu)
        found.emplace_back(rank, index, k, name);
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (const auto& f : found) names.push_back(std::get<3>(f));
  return names;
}

void TelemetryCharts(const std::vector<ReportRun>& runs, nlohmann::json* charts) {
  bool several = runs.size() > 1;
  for (const ChartSpec& spec : kTelemetryCharts) {
    nlohmann::json series = nlohmann::json::array();
    for (const ReportRun& r : runs) {
      double gap = 3 * std::max(0.05, r.data.run.interval_s);
      for (const std::string& name : ChartSeriesNames(spec, r.data.samples)) {
        auto it = r.data.samples.find(name);
        if (it->second.empty()) continue;
        Series scaled = Downsample(it->second, kMaxPoints, gap);
        for (SeriesPoint& p : scaled) p.v *= spec.scale;
        series.push_back(SeriesJson(RunPrefix(r, several) + name, scaled));
      }
    }
    if (!series.empty())
      charts->push_back({{"title", spec.title}, {"unit", spec.unit}, {"series", series}});
  }
}

// Time outside the steps (an evaluation, a checkpoint, a restart) breaks a
// step chart's line rather than being drawn across as if steps had gone on:
// true before each of `steps` (one rank's, by end time) that starts more than
// max(0.1 s, 2 median steps) after the previous one ended.
std::vector<bool> IdleBreaks(const std::vector<const StepRecord*>& steps, double median_step_s) {
  double idle_break = std::max(0.1, 2 * median_step_s);
  std::vector<bool> out(steps.size(), false);
  for (size_t i = 1; i < steps.size(); ++i)
    out[i] = steps[i]->t - steps[i]->step_s - steps[i - 1]->t > idle_break;
  return out;
}

// Downsample, each stretch between breaks on its own, a gap (NaN) between them.
Series DownsampleWithBreaks(const Series& points, const std::vector<bool>& break_before,
                            double gap) {
  Series drawn, segment;
  auto flush = [&] {
    if (segment.empty()) return;
    size_t share = kMaxPoints * segment.size() / points.size() + 2;
    for (const SeriesPoint& p : Downsample(segment, share, gap)) drawn.push_back(p);
    segment.clear();
  };
  for (size_t i = 0; i < points.size(); ++i) {
    if (break_before[i] && i > 0) {
      flush();
      if (!drawn.empty()) drawn.push_back({(points[i - 1].t + points[i].t) / 2, NAN});
    }
    segment.push_back(points[i]);
  }
  flush();
  return drawn;
}

// Per-rank series of one step quantity.
void StepChart(const std::vector<ReportRun>& runs, const char* title, const char* unit,
               double (*value)(const StepRecord&), nlohmann::json* charts) {
  nlohmann::json series = nlohmann::json::array();
  for (const ReportRun& r : runs) {
    std::map<int, std::vector<const StepRecord*>> by_rank;
    std::vector<double> durations;
    for (const StepRecord& s : r.data.steps) {
      durations.push_back(s.step_s);
      by_rank[s.rank].push_back(&s);
    }
    double median = Percentile(durations, 50);
    double gap = std::max(2.0, 10 * median);
    for (auto& [rank, steps] : by_rank) {
      std::sort(steps.begin(), steps.end(),
                [](const StepRecord* a, const StepRecord* b) { return a->t < b->t; });
      std::vector<bool> breaks = IdleBreaks(steps, median), kept_breaks;
      Series points;
      bool pending_break = false;  // a break before a step with no value moves on
      for (size_t i = 0; i < steps.size(); ++i) {
        pending_break = pending_break || breaks[i];
        double v = value(*steps[i]);
        if (std::isnan(v)) continue;
        points.push_back({steps[i]->t, v});
        kept_breaks.push_back(pending_break);
        pending_break = false;
      }
      if (points.empty()) continue;
      Series drawn = DownsampleWithBreaks(points, kept_breaks, gap);
      std::string label = RunPrefix(r, runs.size() > 1) +
                          (by_rank.size() > 1 ? fmt::format("rank {}", rank) : "all");
      series.push_back(SeriesJson(label, drawn));
    }
  }
  if (!series.empty()) charts->push_back({{"title", title}, {"unit", unit}, {"series", series}});
}

// Phases of the lowest rank's timed steps, cumulative, drawn as stacked bands.
void BreakdownChart(const ReportRun& r, bool several, nlohmann::json* charts) {
  const auto& phases = kStepPhases;
  if (r.data.steps.empty()) return;
  int rank = r.data.steps.front().rank;
  std::vector<Series> cumulative(std::size(phases) + 1);
  std::vector<bool> present(std::size(phases), false);
  std::vector<double> durations;
  std::vector<const StepRecord*> timed;
  for (const StepRecord& s : r.data.steps) {
    if (s.rank != rank || (!s.data_wait_s && !s.forward_s)) continue;
    durations.push_back(s.step_s);
    timed.push_back(&s);
    double sum = 0;
    for (size_t p = 0; p < std::size(phases); ++p) {
      present[p] = present[p] || (s.*phases[p].field).has_value();
      sum += (s.*phases[p].field).value_or(0) * 1e3;
      cumulative[p].push_back({s.t, sum});
    }
    cumulative.back().push_back({s.t, s.step_s * 1e3});  // the rest of the step: "other"
  }
  if (durations.empty()) return;
  double median = Percentile(durations, 50);
  double gap = std::max(2.0, 10 * median);
  std::vector<bool> breaks = IdleBreaks(timed, median);  // steps are stored in order
  // Painter's order: the tallest band first, each later one drawn over it.
  nlohmann::json series = nlohmann::json::array();
  series.push_back(SeriesJson(RunPrefix(r, several) + "other",
                              DownsampleWithBreaks(cumulative.back(), breaks, gap)));
  for (size_t p = std::size(phases); p-- > 0;)
    if (present[p])
      series.push_back(SeriesJson(RunPrefix(r, several) + phases[p].label,
                                  DownsampleWithBreaks(cumulative[p], breaks, gap)));
  charts->push_back({{"title", fmt::format("Step time breakdown{} (stacked)",
                                           several ? fmt::format(", run {}", r.data.run.id) : "")},
                     {"unit", "ms"},
                     {"stacked", true},
                     {"series", series}});
}

// One value of every evaluation event (val_loss, val_accuracy), over time.
Series EvaluationSeries(const RunData& d, const char* key, double scale) {
  Series out;
  for (const RunEvent& e : d.events) {
    if (e.kind != "evaluation") continue;
    auto data = nlohmann::json::parse(e.data, nullptr, false);
    if (data.is_object() && data.contains(key) && data[key].is_number())
      out.push_back({e.t, data[key].get<double>() * scale});
  }
  return out;
}

// Training loss per rank, with the held-out loss of each evaluation as points.
void LossCharts(const std::vector<ReportRun>& runs, nlohmann::json* charts) {
  size_t before = charts->size();
  StepChart(
      runs, "Loss", "loss",
      [](const StepRecord& s) { return std::isfinite(s.loss) ? s.loss : NAN; }, charts);
  nlohmann::json accuracy = nlohmann::json::array();
  for (const ReportRun& r : runs) {
    Series loss = EvaluationSeries(r.data, "val_loss", 1),
           acc = EvaluationSeries(r.data, "val_accuracy", 100);
    if (loss.empty()) continue;
    nlohmann::json held = SeriesJson(RunPrefix(r, runs.size() > 1) + "held-out", loss);
    held["points"] = true;
    if (charts->size() > before)
      (*charts)[before]["series"].push_back(held);
    else
      charts->push_back({{"title", "Loss"}, {"unit", "loss"}, {"series", {held}}});
    nlohmann::json a = SeriesJson(RunPrefix(r, runs.size() > 1) + "held-out", acc);
    a["points"] = true;
    accuracy.push_back(a);
  }
  if (!accuracy.empty())
    charts->push_back({{"title", "Held-out accuracy"}, {"unit", "%"}, {"series", accuracy}});
}

nlohmann::json Charts(const std::vector<ReportRun>& runs) {
  nlohmann::json charts = nlohmann::json::array();
  TelemetryCharts(runs, &charts);
  StepChart(
      runs, "Throughput", "samples/s",
      [](const StepRecord& s) { return s.step_s > 0 ? s.samples / s.step_s : NAN; }, &charts);
  StepChart(
      runs, "Step time", "ms", [](const StepRecord& s) { return s.step_s * 1e3; }, &charts);
  StepChart(
      runs, "Data wait", "% of step",
      [](const StepRecord& s) {
        return s.data_wait_s && s.step_s > 0 ? 100 * *s.data_wait_s / s.step_s : NAN;
      },
      &charts);
  for (const ReportRun& r : runs) BreakdownChart(r, runs.size() > 1, &charts);
  LossCharts(runs, &charts);
  for (const ReportRun& r : runs)
    if (IsTuning(r.data)) charts.push_back(TuningChart(r.data));
  return charts;
}

std::string FindingsHtml(const std::vector<Finding>& findings) {
  std::string out = "<div class=findings>";
  for (const Finding& f : findings)
    out += fmt::format(
        "<div class=\"finding {}\"><div class=cause><code>{}</code> {}{}</div><div><b>why</b> "
        "{}</div>{}"
        "<div><b>fix</b> {}</div><div class=conf>confidence {:.0f}%</div></div>",
        f.cause == CauseId::kHealthy ? "ok"
                             : (f.share_lost > 0 || f.cause == CauseId::kJobFailed ? "bad" : "hint"),
        Escape(f.name()), Escape(f.title),
        f.share_lost > 0
            ? fmt::format(" <span class=lost>~{:.0f}% of the time</span>", f.share_lost * 100)
            : "",
        Escape(f.evidence),
        f.where.empty() ? "" : "<div class=where><b>where</b> <code>" + Escape(f.where) + "</code></div>",
        Escape(f.fix), f.confidence * 100);
  return out + "</div>";
}

// The top frames of each phase the job's Python stacks were sampled in.
std::string StacksHtml(const RunData& data) {
  StackSummary s = RunStacks(data);
  if (s.empty()) return "";
  std::string out = fmt::format(
      "<h3>Where the time went in the code (Python stacks)</h3><p class=note>{} samples, {:g} per "
      "second per thread, by py-spy; folded or speedscope: <code>fullburn runs stacks {}</code></p>"
      "<table class=stacks><tr><th>phase</th><th>samples</th><th>top frames (share of the phase's "
      "busy samples)</th></tr>",
      s.samples, s.rate_hz, data.run.id);
  int64_t step = s.StepSamples();
  for (int i = 0; i < kStackPhaseCount; ++i) {
    auto phase = static_cast<StackPhase>(i);
    const StackPhaseSummary& p = s.of(phase);
    if (p.samples == 0) continue;
    std::string share = IsStepPhase(phase) && step > 0
                            ? fmt::format(" ({:.0f}% of step time)", 100.0 * p.samples / step)
                            : "";
    std::string frames;
    int64_t busy = p.samples - p.waiting;
    for (size_t k = 0; k < p.top.size() && k < 3; ++k)
      frames += fmt::format("<div><code>{}</code> {:.0f}%</div>", Escape(p.top[k].where),
                            busy > 0 ? 100.0 * p.top[k].samples / busy : 0.0);
    if (p.waiting > 0)
      frames += fmt::format("<div class=note>waiting {:.0f}% of its samples</div>", 100.0 * p.waiting / p.samples);
    out += fmt::format("<tr><td>{}</td><td>{}{}</td><td>{}</td></tr>", StackPhaseName(phase), p.samples, share,
                       frames);
  }
  return out + "</table>";
}

// fullburn run --layers: each top-level layer's time and activations.
std::string LayersHtml(const RunData& data) {
  RunLayerTimes layers = RunLayers(data);
  if (layers.empty()) return "";
  double total = 0;
  for (const LayerTime& l : layers.layers) total += l.forward_s + l.backward_s;
  std::string out = fmt::format(
      "<h3>Layers</h3><p class=note>{} on {}: medians per step over {} steps (the hooks cost {:.2f} ms "
      "a step)</p><table class=stacks><tr><th>layer</th><th>type</th><th>forward ms</th><th>backward "
      "ms</th><th>share</th><th>activations KiB</th></tr>",
      Escape(layers.model), Escape(layers.device), layers.steps, layers.hooks_s_per_step * 1e3);
  for (const LayerTime& l : layers.layers)
    out += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.0f}%</td>"
                       "<td>{:.1f}</td></tr>",
                       Escape(l.name), Escape(l.type), l.forward_s * 1e3, l.backward_s * 1e3,
                       total > 0 ? 100 * (l.forward_s + l.backward_s) / total : 0.0,
                       l.activation_bytes / 1024.0);
  return out + "</table>";
}

std::string BreakdownBar(const std::vector<StepRecord>& steps) {
  StepsSummary s = SummarizeSteps(steps);
  if (s.phase_share.empty()) return "";
  static const char* colors[] = {"#e45756", "#f58518", "#4c78a8", "#72b7b2",
                                 "#b279a2", "#54a24b", "#9d755d"};
  std::string bar = "<div class=bar>", legend = "<div class=legend>";
  for (size_t i = 0; i < s.phase_share.size(); ++i) {
    const auto& [name, share] = s.phase_share[i];
    bar += fmt::format("<span style=\"width:{:.2f}%;background:{}\" title=\"{} {:.1f}%\"></span>",
                       share * 100, colors[i % 7], name, share * 100);
    legend += fmt::format("<span><i style=\"background:{}\"></i>{} {:.1f}%</span>", colors[i % 7],
                          name, share * 100);
  }
  return "<h3>Where step time went (timed steps)</h3>" + bar + "</div>" + legend + "</div>";
}

std::string RunHtml(const ReportRun& r) {
  const RunInfo& run = r.data.run;
  std::string out =
      fmt::format("<section class=run><h2>Run {} <small>{}</small></h2><table class=meta>", run.id,
                  Escape(run.name));
  auto row = [&](const char* k, const std::string& v) {
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>", k, v);
  };
  row("command", "<code>" + Escape(JoinedCommand(run.command)) + "</code>");
  row("host", Escape(run.host));
  row("directory", Escape(run.cwd));
  row("started", FormatLocalTime(run.start_time));
  row("status",
      Escape(run.status) +
          (run.exit_code ? " (" + Escape(DescribeExitCode(*run.exit_code)) + ")" : "") +
          (run.end_time ? fmt::format(", {}", FormatDuration(*run.end_time - run.start_time))
                        : " (no end recorded: the data stops where the recording did)"));
  row("samples", fmt::format("{} every {} s", run.sample_count, run.interval_s));
  if (!r.data.steps.empty()) row("steps", fmt::format("{} step records", r.data.steps.size()));
  if (!r.data.checkpoints.empty()) row("checkpoints", std::to_string(r.data.checkpoints.size()));
  if (Mfu mfu = ComputeMfu(r.data); mfu.counted) row("MFU", Escape(mfu.Text()));
  out += "</table>";
  if (IsTuning(r.data)) {
    out += TuningHtml(r.data);  // each trial is a run of its own, with its findings
  } else {
    if (run.sample_count == 0)
      out += "<p class=note>No telemetry samples were recorded for this run.</p>";
    out += "<h3>Findings</h3>" + FindingsHtml(r.findings) + BreakdownBar(r.data.steps) + StacksHtml(r.data) + LayersHtml(r.data);
  }
  if (!r.trace_text.empty())
    out += fmt::format(
        "<h3>From the profiler trace (steps {})</h3>{}<details><summary>The trace's analysis "
        "(fullburn analyze)</summary><pre>{}</pre></details>",
        Escape(r.trace_steps), FindingsHtml(r.trace_findings), Escape(r.trace_text));
  auto pretty = [](const std::string& j) {
    auto parsed = nlohmann::json::parse(j, nullptr, false);
    return parsed.is_discarded() ? j : parsed.dump(2);
  };
  out += fmt::format(
      "<details><summary>Config and environment</summary><pre>{}</pre><pre>GPUs: "
      "{}</pre></details>",
      Escape(pretty(run.config_json)), Escape(pretty(run.gpus_json)));
  return out + "</section>";
}

std::string ComparisonHtml(const std::vector<ReportRun>& runs) {
  std::vector<RunDigest> digests;
  for (const ReportRun& r : runs) digests.push_back(Digest(r.data, r.findings));
  std::string out = "<h2>Comparison</h2><table class=compare><tr><th></th>";
  for (const RunDigest& d : digests)
    out += fmt::format("<th>run {}<br><small>{}</small></th>", d.id, Escape(d.name));
  out += "</tr>";
  for (const auto& [label, cells] : ComparisonTable(digests)) {
    out += "<tr><th>" + Escape(label) + "</th>";
    for (const std::string& c : cells) out += "<td>" + Escape(c) + "</td>";
    out += "</tr>";
  }
  return out + "</table>";
}

const char kStyle[] = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}
table{border-collapse:collapse}th,td{padding:3px 10px;text-align:left;vertical-align:top}
table.compare td{text-align:right;font-variant-numeric:tabular-nums}table.compare tr:nth-child(even){background:#f4f4f4}
.finding{border-left:5px solid #999;padding:6px 10px;margin:6px 0;background:#fafafa}
.finding.bad{border-color:#e45756}.finding.hint{border-color:#f58518}.finding.ok{border-color:#54a24b}
.cause{font-weight:600}.lost{color:#c0392b}.conf{color:#777;font-size:12px}
table.stacks tr:nth-child(even){background:#f4f4f4}table.stacks code,.where code{font-size:12px}
.bar{display:flex;height:22px;width:100%;max-width:900px;border:1px solid #ccc}.bar span{display:block;height:100%}
.legend span{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.chart{margin:10px 0}.note{color:#a15c00}pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:300px}
)";

const char kScript[] = R"(
(function(){
  var D = JSON.parse(document.getElementById('fb-data').textContent);
  var colors = ['#4c78a8','#f58518','#e45756','#72b7b2','#54a24b','#eeca3b','#b279a2','#ff9da6','#9d755d','#bab0ac'];
  function align(series) {
    var seen = {}, xs = [];
    series.forEach(function(s){ s.t.forEach(function(t){ if (!(t in seen)) { seen[t] = 1; xs.push(t); } }); });
    xs.sort(function(a,b){ return a-b; });
    var index = {}; xs.forEach(function(t,i){ index[t] = i; });
    var out = [xs];
    series.forEach(function(s){
      var ys = new Array(xs.length).fill(undefined);
      s.t.forEach(function(t,i){ ys[index[t]] = s.v[i]; });
      out.push(ys);
    });
    return out;
  }
  function duration(v, incr) {
    if (v == null) return '';
    if (incr < 1) return v.toFixed(incr < 0.1 ? 2 : 1) + 's';
    var s = Math.round(v), h = Math.floor(s/3600), m = Math.floor(s%3600/60), r = s%60;
    return h ? h+'h'+String(m).padStart(2,'0') : m ? m+'m'+String(r).padStart(2,'0') : r+'s';
  }
  var box = document.getElementById('charts'), drawn = 0;
  var width = Math.max(480, Math.min(1150, (window.innerWidth || 1200) - 50));
  D.charts.forEach(function(c){
    var div = document.createElement('div');
    div.className = 'chart';
    box.appendChild(div);
    var series = [{label: c.bars ? 'trial' : 'time'}];
    c.series.forEach(function(s, i){
      var color = colors[i % colors.length];
      var spec = {label: s.label, stroke: color, width: 1.5, spanGaps: false,
                  fill: c.stacked ? color + 'cc' : undefined,
                  value: function(u, v){ return v == null ? '-' : v.toFixed(v < 10 ? 2 : 1); }};
      // Trials: the median as bars, the slowest and fastest windows as points.
      if (s.points) spec.points = {show: true, size: 7};
      if (c.bars && i == 0) { spec.paths = uPlot.paths.bars({size: [0.6, 80]}); spec.fill = color + '99'; }
      if (c.bars && i > 0) { spec.paths = function(){ return null; }; spec.points = {show: true, size: 7}; }
      series.push(spec);
    });
    var xaxis = c.bars
        ? {values: function(u, vals){ return vals.map(function(v){
             var i = c.series[0].t.indexOf(v); return i < 0 ? '' : '#' + v + ' ' + c.labels[i]; }); }}
        : {values: function(u, vals, ax, space, incr){ return vals.map(function(v){ return duration(v, incr); }); }};
    new uPlot({title: c.title + ' (' + c.unit + ')', width: width, height: c.bars ? 300 : 230,
               cursor: {sync: {key: c.bars ? 'trials' : 'fullburn'}, drag: {x: !c.bars, y: false}},
               scales: {x: {time: false, range: c.bars ? function(u, lo, hi){ return [lo - 0.5, hi + 0.5]; } : undefined},
                        y: c.bars ? {range: function(u, lo, hi){ return [0, hi * 1.1]; }} : {}},
               axes: [xaxis, {label: c.unit, size: 60}],
               series: series}, align(c.series), div);
    drawn++;
  });
  if (!D.charts.length) box.textContent = 'No time series to draw: the run has no samples and no step records.';
  document.body.setAttribute('data-charts-drawn', String(drawn));
})();
)";

}  // namespace

namespace {

// Min and max of each of `buckets` index ranges, in time order.
void MinMaxBuckets(Series::const_iterator begin, Series::const_iterator end, size_t buckets,
                   Series* out) {
  size_t n = static_cast<size_t>(end - begin);
  if (n <= 2 * buckets) {
    out->insert(out->end(), begin, end);
    return;
  }
  for (size_t b = 0; b < buckets; ++b) {
    size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    size_t min_i = lo, max_i = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (begin[i].v < begin[min_i].v) min_i = i;
      if (begin[i].v > begin[max_i].v) max_i = i;
    }
    out->push_back(begin[std::min(min_i, max_i)]);
    if (min_i != max_i) out->push_back(begin[std::max(min_i, max_i)]);
  }
}

}  // namespace

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Series Downsample(const Series& s, size_t max_points, double gap_s) {
  // Segments between gaps in the original; each gets its share of the points.
  std::vector<size_t> cuts = {0};
  for (size_t i = 1; i < s.size(); ++i)
    if (s[i].t - s[i - 1].t > gap_s) cuts.push_back(i);
  cuts.push_back(s.size());
  size_t budget = max_points > cuts.size() ? max_points - cuts.size() : 2;
  Series out;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    if (k > 0) out.push_back({(s[cuts[k] - 1].t + s[cuts[k]].t) / 2, NAN});
    size_t n = cuts[k + 1] - cuts[k];
    size_t buckets = std::max<size_t>(1, budget * n / s.size() / 2);
    MinMaxBuckets(s.begin() + cuts[k], s.begin() + cuts[k + 1], buckets, &out);
  }
  return out;
}

std::string HtmlPage(const std::string& title, const std::string& style, const std::string& body,
                     const nlohmann::json& data, const std::string& script) {
  std::string json = data.dump();
  // JSON inside <script>: "</" would end the element early.
  for (size_t pos = 0; (pos = json.find("</", pos)) != std::string::npos; pos += 3)
    json.replace(pos, 2, "<\\/");
  return "<!doctype html><html lang=en><head><meta charset=utf-8><title>" + HtmlEscape(title) +
         "</title><style>" + kUplotCss + style + "</style></head><body><h1>" + HtmlEscape(title) +
         "</h1>" + body + "<script type=\"application/json\" id=fb-data>" + json +
         "</script><script>" + kUplotJs + "</script><script>" + script +
         "</script></body></html>\n";
}

std::string RenderHtmlReport(const std::vector<ReportRun>& runs) {
  std::string title =
      runs.size() == 1
          ? fmt::format("fullburn report: run {} ({})", runs[0].data.run.id, runs[0].data.run.name)
          : fmt::format("fullburn report: {} runs compared", runs.size());
  std::string body;
  if (runs.size() > 1) body += ComparisonHtml(runs);
  for (const ReportRun& r : runs) body += RunHtml(r);
  body +=
      "<h2>Time series</h2><p class=note>Drag across a chart to zoom (all charts follow), "
      "double-click to reset. Series are downsampled for display (min and max kept per bucket); "
      "the store keeps every sample (fullburn runs export).</p><div id=charts></div>";
  return HtmlPage(title, kStyle, body, nlohmann::json{{"charts", Charts(runs)}}, kScript);
}

}  // namespace fullburn
