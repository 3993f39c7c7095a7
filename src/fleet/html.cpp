// fullburn fleet --html: one self-contained page, readable offline and
// attachable to a ticket: the totals, the lost hours by cause, the fleet's
// utilization over time (uPlot, inlined as the run report does) and the
// ranked table.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "format.h"
#include "fullburn/fleet.h"
#include "fullburn/percent.h"
#include "fullburn/report.h"

namespace fullburn {
namespace {

using fleet_format::Hours;
using fleet_format::Utc;

std::string Escape(const std::string& s) { return HtmlEscape(s); }

const char* const kColors[] = {"#e45756", "#f58518", "#4c78a8", "#72b7b2", "#54a24b",
                               "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"};

std::string CauseBar(const FleetHours& t) {
  if (t.lost <= 0) return "";
  std::vector<std::pair<std::string, double>> causes(t.lost_by_cause.begin(), t.lost_by_cause.end());
  std::stable_sort(causes.begin(), causes.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string bar = "<div class=bar>", legend = "<div class=legend>", table =
      "<table class=causes><tr><th>cause</th><th>GPU-hours</th><th>share of lost</th><th>what to "
      "do</th></tr>";
  for (size_t i = 0; i < causes.size(); ++i) {
    const auto& [cause, hours] = causes[i];
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    bar += fmt::format("<span style=\"width:{:.2f}%;background:{}\" title=\"{}\"></span>",
                       100 * hours / t.lost, color, Escape(cause));
    legend += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", color, Escape(cause));
    table += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", Escape(cause),
                         Hours(hours), PercentOf(hours, t.lost), Escape(FleetFix(cause)));
  }
  return bar + "</div>" + legend + "</div>" + table + "</table>";
}

std::string RowsTable(const std::vector<FleetRow>& rows, const std::string& by, size_t top) {
  const bool jobs = by == "job" || by == "user";
  std::string out = fmt::format(
      "<table class=rows><tr><th>#</th><th>{}</th><th>user</th><th>nodes</th><th>GPUs</th>"
      "<th>{}</th><th>used</th><th>lost h</th><th>verdict</th><th>fix</th></tr>",
      Escape(by), jobs ? "held h" : "available h");
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const FleetRow& r = rows[i];
    auto user = r.identity.find("user");
    std::string nodes;
    for (size_t k = 0; k < r.nodes.size() && k < 3; ++k) nodes += (k ? ", " : "") + r.nodes[k];
    if (r.nodes.size() > 3) nodes += fmt::format(" +{}", r.nodes.size() - 3);
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
        i + 1, Escape(r.key), Escape(user == r.identity.end() ? "-" : user->second), Escape(nodes),
        r.gpus, Hours(jobs ? r.hours.held : r.hours.available), PercentOf(r.hours.used, r.hours.available),
        Hours(r.hours.lost), r.healthy ? "ok" : "lost", Escape(r.healthy ? "healthy" : r.top_cause),
        Escape(r.fix));
  }
  return out + "</table>";
}

nlohmann::json ChartValues(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(std::isnan(x) ? nlohmann::json() : nlohmann::json(x));
  return a;
}

const char kStyle[] = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;max-width:1250px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse}th,td{padding:3px 10px;text-align:left;vertical-align:top}
table.rows tr:nth-child(even),table.causes tr:nth-child(even){background:#f4f4f4}
td.lost{color:#c0392b;font-weight:600}td.ok{color:#2e7d32;font-weight:600}
.bar{display:flex;height:22px;width:100%;max-width:900px;border:1px solid #ccc;margin:8px 0}
.bar span{display:block;height:100%}.legend span{margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}.note{color:#a15c00}
)";

const char kScript[] = R"(
(function(){
  var D = JSON.parse(document.getElementById('fb-data').textContent);
  var box = document.getElementById('charts'), drawn = 0;
  var width = Math.max(480, Math.min(1150, (window.innerWidth || 1200) - 50));
  var colors = ['#4c78a8','#e45756','#54a24b','#f58518'];
  D.charts.forEach(function(c){
    var div = document.createElement('div');
    box.appendChild(div);
    var series = [{label: 'time'}], data = [D.times];
    c.series.forEach(function(s, i){
      series.push({label: s.label, stroke: colors[i % colors.length], width: 1.5, spanGaps: false,
                   value: function(u, v){ return v == null ? '-' : v.toFixed(1); }});
      data.push(s.v);
    });
    new uPlot({title: c.title, width: width, height: 240, scales: {x: {time: true}},
               cursor: {sync: {key: 'fleet'}, drag: {x: true, y: false}},
               axes: [{}, {label: c.unit, size: 60}], series: series}, data, div);
    drawn++;
  });
  document.body.setAttribute('data-charts-drawn', String(drawn));
})();
)";

}  // namespace

std::string RenderFleetHtml(const FleetReport& r, const std::string& by, size_t top) {
  nlohmann::json data{
      {"times", r.times},
      {"charts",
       {{{"title", "Fleet GPU utilization (sampled GPUs, weighted by time)"},
         {"unit", "%"},
         {"series", {{{"label", "utilization"}, {"v", ChartValues(r.util_pct)}}}}},
        {{"title", "GPUs"},
         {"unit", "GPUs"},
         {"series",
          {{{"label", "sampled"}, {"v", ChartValues(r.gpus_sampled)}},
           {{"label", "held and idle"}, {"v", ChartValues(r.gpus_held_idle)}}}}}}}};
  const FleetHours& t = r.total;
  std::string title = "fullburn fleet: " + r.url;
  std::string out = fmt::format(
      "<p>{} to {}, {} GPUs on {} nodes.</p><table class=totals><tr><th>GPU-hours "
      "available</th><td>{}</td></tr><tr><th>used (weighted by utilization)</th><td>{} "
      "({})</td></tr><tr><th>lost</th><td>{}</td></tr><tr><th>held and idle</th><td>{}</td></tr>"
      "<tr><th>throttled</th><td>{}</td></tr><tr><th>unknown (no sample)</th><td>{}</td></tr>"
      "{}</table>",
      Utc(r.start), Utc(r.end), r.gpus, r.nodes.size(), Hours(t.available), Hours(t.used),
      PercentOf(t.used, t.available), Hours(t.lost), Hours(t.held_idle), Hours(t.throttled),
      Hours(r.unknown),
      t.mfu_used > 0
          ? fmt::format("<tr><th>MFU (jobs that report it)</th><td>{} over {}</td></tr><tr><th>busy "
                        "below {} MFU (<code>low_mfu</code>)</th><td>{}</td></tr>",
                        PercentOf(t.Mfu(), 1), Hours(t.mfu_used), PercentOf(kMfuLow, 1),
                        Hours(t.low_mfu))
          : "");
  out += "<h2>Lost GPU-hours by cause</h2>" + CauseBar(t);
  out += "<h2>Over time</h2><div id=charts></div>";
  out += fmt::format("<h2>Top {} by GPU-hours lost</h2>", by == "gpu" ? "GPUs" : Escape(by) + "s") +
         RowsTable(FleetRows(r, by), by, top);
  std::string flagged;
  for (const FleetNode& n : r.node_flags) {
    if (n.throttles_more)
      flagged += fmt::format("<li>{} throttles: {} of its GPU time</li>", Escape(n.host),
                             PercentOf(n.throttled_share, 1));
    if (n.idles_more)
      flagged += fmt::format("<li>{} idles: {} of its GPU time unused</li>", Escape(n.host),
                             PercentOf(n.idle_share, 1));
  }
  if (!flagged.empty()) out += "<h2>Nodes that stand out</h2><ul>" + flagged + "</ul>";
  if (!r.notes.empty()) {
    out += "<h2>Notes</h2><ul>";
    for (const std::string& n : r.notes) out += "<li class=note>" + Escape(n) + "</li>";
    out += "</ul>";
  }
  return HtmlPage(title, kStyle, out, data, kScript);
}

}  // namespace fullburn
