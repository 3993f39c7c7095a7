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
    first = d.value("first_step", int64_t{-1});
    last = std::max(last, d.value("last_step", int64_t{-1}));
  }
  if (t.paths.empty()) return t;
  t.steps = fmt::format("{}-{}", first, last);
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
