// fullburn fleet's text and JSON: the totals, the lost hours by cause, the
// ranked rows with their fix, the nodes that stand out, and every stated gap.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "format.h"
#include "fullburn/fleet.h"
#include "fullburn/percent.h"

namespace fullburn {
namespace {

using fleet_format::Hours;
using fleet_format::Utc;

std::string Span(double s) {
  if (s >= 86400) return fmt::format("{:.1f} d", s / 86400);
  if (s >= 3600) return fmt::format("{:.1f} h", s / 3600);
  if (s >= 60) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.0f} s", s);
}

std::string Joined(const std::vector<std::string>& v, size_t most) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < most; ++i) out += (i ? "," : "") + v[i];
  if (v.size() > most) out += fmt::format(",+{}", v.size() - most);
  return out;
}

std::vector<std::pair<std::string, double>> ByCause(const FleetHours& h) {
  std::vector<std::pair<std::string, double>> out(h.lost_by_cause.begin(), h.lost_by_cause.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string Verdict(const FleetRow& row) {
  if (row.healthy) return "healthy";
  return row.top_cause.empty() ? "-" : row.top_cause;
}

nlohmann::json HoursJson(const FleetHours& h) {
  nlohmann::json causes = nlohmann::json::object();
  for (const auto& [cause, hours] : h.lost_by_cause) causes[cause] = hours;
  double mfu = h.Mfu();
  return {{"available", h.available}, {"used", h.used},           {"lost", h.lost},
          {"held", h.held},           {"held_idle", h.held_idle}, {"throttled", h.throttled},
          {"lost_by_cause", causes},  {"mfu", std::isnan(mfu) ? nlohmann::json() : nlohmann::json(mfu)},
          {"mfu_used", h.mfu_used},   {"low_mfu", h.low_mfu}};
}

nlohmann::json RowsJson(const std::vector<FleetRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const FleetRow& r : rows)
    out.push_back({{"key", r.key},
                   {"identity", r.identity},
                   {"nodes", r.nodes},
                   {"gpus", r.gpus},
                   {"hours", HoursJson(r.hours)},
                   {"top_cause", r.top_cause},
                   {"healthy", r.healthy},
                   {"fix", r.fix}});
  return out;
}

}  // namespace

std::string RenderFleetText(const FleetReport& r, const std::string& by, size_t top) {
  const FleetHours& t = r.total;
  std::string out = fmt::format("fullburn fleet: {}, {} to {} ({}, buckets of {})\n", r.url,
                                Utc(r.start), Utc(r.end), Span(r.end - r.start), Span(r.step_s));
  out += fmt::format("{} GPUs on {} nodes\n", r.gpus, r.nodes.size());
  out += fmt::format(
      "GPU-hours: available {}, used {} ({} of available, weighted by utilization), lost {}, "
      "unknown {} (no sample)\n",
      Hours(t.available), Hours(t.used), PercentOf(t.used, t.available), Hours(t.lost),
      Hours(r.unknown));
  out += fmt::format("held {} ({}), held and idle {}, throttled {}\n", Hours(t.held),
                     PercentOf(t.held, t.available), Hours(t.held_idle), Hours(t.throttled));
  if (t.mfu_used > 0)
    out += fmt::format(
        "MFU {} over the {} busy GPU-hours of jobs that report it (fullburn_job_mfu); busy "
        "below {} MFU: {} ({}): {}\n",
        PercentOf(t.Mfu(), 1), Hours(t.mfu_used), PercentOf(kMfuLow, 1), Hours(t.low_mfu),
        CauseName(CauseId::kLowMfu), FleetFix(CauseName(CauseId::kLowMfu)));
  out += "\nLost GPU-hours by cause:\n";
  for (const auto& [cause, hours] : ByCause(t))
    out += fmt::format("  {:<18} {:>10}  {:>4}  {}\n", cause, Hours(hours), PercentOf(hours, t.lost),
                       FleetFix(cause));

  const std::vector<FleetRow>& rows = FleetRows(r, by);
  const bool jobs = by == "job" || by == "user";
  out += fmt::format("\nTop {} by GPU-hours lost{}:\n", by == "gpu" ? "GPUs" : by + "s",
                     jobs ? " while held" : "");
  out += fmt::format("  {:>3}  {:<28} {:<10} {:<16} {:>4}  {:>9}  {:>5}  {:>9}  {:<16} {}\n", "#",
                     by, "user", "nodes", "GPUs", jobs ? "held h" : "avail h", "used",
                     "lost h", "verdict", "fix");
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const FleetRow& row = rows[i];
    auto user = row.identity.find("user");
    double base = jobs ? row.hours.held : row.hours.available;
    out += fmt::format("  {:>3}  {:<28} {:<10} {:<16} {:>4}  {:>9}  {:>5}  {:>9}  {:<16} {}\n",
                       i + 1, row.key, user == row.identity.end() ? "-" : user->second,
                       Joined(row.nodes, 2), row.gpus, Hours(base),
                       PercentOf(row.hours.used, row.hours.available), Hours(row.hours.lost),
                       Verdict(row), row.fix);
  }
  if (rows.size() > top) out += fmt::format("  ... {} more (--top)\n", rows.size() - top);
  if (jobs && t.mfu_used > 0) {
    out += fmt::format("\nMFU by {} (busy GPU-hours at it; below {}: {}):\n", by,
                       PercentOf(kMfuLow, 1), CauseName(CauseId::kLowMfu));
    for (size_t i = 0; i < rows.size() && i < top; ++i)
      if (rows[i].hours.mfu_used > 0)
        out += fmt::format("  {:<28} MFU {:>6}  over {:>9}  below the line {:>9}\n", rows[i].key,
                           PercentOf(rows[i].hours.Mfu(), 1), Hours(rows[i].hours.mfu_used),
                           Hours(rows[i].hours.low_mfu));
  }

  std::string flagged;
  for (const FleetNode& n : r.node_flags) {
    if (n.throttles_more)
      flagged += fmt::format("  {} throttles: {} of its GPU time (power or thermal slowdown)\n",
                             n.host, PercentOf(n.throttled_share, 1));
    if (n.idles_more)
      flagged += fmt::format("  {} idles: {} of its GPU time unused\n", n.host,
                             PercentOf(n.idle_share, 1));
  }
  if (!flagged.empty()) out += "\nNodes that stand out from the others:\n" + flagged;
  if (!r.notes.empty()) {
    out += "\nNotes:\n";
    for (const std::string& n : r.notes) out += "  - " + n + "\n";
  }
  return out;
}

nlohmann::json FleetJson(const FleetReport& r) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const FleetNode& n : r.node_flags)
    nodes.push_back({{"host", n.host},
                     {"gpus", n.gpus},
                     {"throttled_share", n.throttled_share},
                     {"idle_share", n.idle_share},
                     {"throttles_more", n.throttles_more},
                     {"idles_more", n.idles_more}});
  auto series = [](const std::vector<double>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(std::isnan(x) ? nlohmann::json() : nlohmann::json(x));
    return a;
  };
  return {{"prometheus", r.url},
          {"start", r.start},
          {"end", r.end},
          {"effective_start", r.effective_start},
          {"step_s", r.step_s},
          {"gpus", r.gpus},
          {"hours", HoursJson(r.total)},
          {"unknown_hours", r.unknown},
          {"jobs", RowsJson(r.jobs)},
          {"users", RowsJson(r.users)},
          {"nodes", RowsJson(r.nodes)},
          {"gpu_rows", RowsJson(r.gpu_rows)},
          {"node_flags", nodes},
          {"notes", r.notes},
          {"over_time",
           {{"times", r.times},
            {"util_pct", series(r.util_pct)},
            {"gpus_sampled", series(r.gpus_sampled)},
            {"gpus_held_idle", series(r.gpus_held_idle)}}}};
}

}  // namespace fullburn
