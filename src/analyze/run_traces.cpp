#include "fullburn/run_traces.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#ifdef FULLBURN_HAVE_ANALYZE
#include "fullburn/analyze.h"
#endif

namespace fullburn {

RunTraces AnalyzeRunTraces(const RunData& run) {
  RunTraces t;
  int64_t first = -1, last = -1;
  for (const RunEvent& e : run.events) {
    if (e.kind != "profile") continue;
    auto d = nlohmann::json::parse(e.data, nullptr, false);
    if (!d.is_object() || !d.contains("path") || !d["path"].is_string()) continue;
    std::string path = d["path"].get<std::string>();
    if (std::find(t.paths.begin(), t.paths.end(), path) == t.paths.end()) t.paths.push_back(path);
    // The event comes from the job's side: a field of another type is left
    // out rather than thrown (json::value would throw).
    auto step = [&](const char* key) {
      return d.contains(key) && d[key].is_number_integer() ? d[key].get<int64_t>() : int64_t{-1};
    };
    first = step("first_step");
    last = std::max(last, step("last_step"));
  }
  if (t.paths.empty()) return t;
  auto step_text = [](int64_t step) { return step >= 0 ? std::to_string(step) : std::string("?"); };
  t.steps = step_text(first) + "-" + step_text(last);
#ifdef FULLBURN_HAVE_ANALYZE
  Result<TraceReport> report = AnalyzeTraces(t.paths, AnalyzeOptions{});
  if (!report.ok()) {
    t.error = report.status().message();
    return t;
  }
  t.findings = report->findings;
  t.text = RenderTraceReport(*report);
#else
  t.error = "this fullburn was built without simdjson (libsimdjson-dev): fullburn analyze is off";
#endif
  return t;
}

}  // namespace fullburn
