// A tuning run in the HTML report: the trials `fullburn tune` recorded as
// `tune_trial` events (docs/tune.md), as a table and a chart.
#include <fmt/format.h>

#include <cmath>

#include "fullburn/report.h"

namespace fullburn {
namespace {

std::vector<nlohmann::json> Trials(const RunData& run) {
  std::vector<nlohmann::json> out;
  for (const RunEvent& e : run.events) {
    if (e.kind != "tune_trial") continue;
    auto j = nlohmann::json::parse(e.data, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

double Num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string Str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string Unit(const std::vector<nlohmann::json>& trials) {
  for (const auto& t : trials)
    if (!Str(t, "unit").empty()) return Str(t, "unit");
  return "samples/s";
}

}  // namespace

bool IsTuning(const RunData& run) {
  for (const RunEvent& e : run.events)
    if (e.kind == "tune_trial") return true;
  return false;
}

std::string TuningHtml(const RunData& run) {
  std::vector<nlohmann::json> trials = Trials(run);
  std::string unit = Unit(trials);
  std::string out = fmt::format(
      "<h3>Trials</h3><table class=compare><tr><th>#</th><th>knob</th><th>value</th><th>{}</th><th>spread "
      "(IQR)</th><th>GPU util</th><th>data wait</th><th>peak memory</th><th>verdict</th><th>run</th></tr>",
      HtmlEscape(unit));
  auto num = [](double v, const char* f) { return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(f), v); };
  for (const auto& t : trials) {
    std::string status = Str(t, "status");
    std::string verdict = status == "ok" ? Str(t, "verdict") : status + ": " + Str(t, "reason");
    int64_t run_id = t.value("run_id", int64_t{0});
    out += fmt::format(
        "<tr class=trial><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td style=\"text-align:left\">{}</td><td>{}</td></tr>",
        t.value("index", 0), HtmlEscape(Str(t, "knob")), HtmlEscape(Str(t, "value")), num(Num(t, "objective"), "{:.1f}"),
        num(Num(t, "spread") * 100, "{:.0f}%"), num(Num(t, "gpu_util"), "{:.0f}%"),
        num(Num(t, "data_wait_share") * 100, "{:.0f}%"),
        std::isnan(Num(t, "peak_memory_bytes")) ? "-" : FormatBytes(Num(t, "peak_memory_bytes")), HtmlEscape(verdict),
        run_id > 0 ? std::to_string(run_id) : "-");
  }
  out += "</table>";
  for (const RunEvent& e : run.events)
    if (e.kind == "tune_result") {
      auto j = nlohmann::json::parse(e.data, nullptr, false);
      if (j.is_object() && j.contains("summary"))
        out += "<p><b>" + HtmlEscape(j.value("summary", "")) + "</b></p>";
    }
  return out;
}

nlohmann::json TuningChart(const RunData& run) {
  std::vector<nlohmann::json> trials = Trials(run);
  nlohmann::json x = nlohmann::json::array(), median = nlohmann::json::array(), low = nlohmann::json::array(),
                 high = nlohmann::json::array(), labels = nlohmann::json::array();
  for (const auto& t : trials) {
    if (Str(t, "status") == "skipped") continue;
    auto value = [&](const char* key) { return std::isnan(Num(t, key)) ? nlohmann::json(nullptr) : nlohmann::json(Num(t, key)); };
    x.push_back(t.value("index", 0));
    median.push_back(value("objective"));
    low.push_back(value("low"));
    high.push_back(value("high"));
    labels.push_back(Str(t, "knob") + "=" + Str(t, "value"));
  }
  auto series = [&](const char* label, const nlohmann::json& v) {
    return nlohmann::json{{"label", label}, {"t", x}, {"v", v}};
  };
  return {{"title", "Tuning trials"},
          {"unit", Unit(trials)},
          {"bars", true},
          {"labels", labels},
          {"series", {series("median", median), series("slowest window", low), series("fastest window", high)}}};
}

}  // namespace fullburn
