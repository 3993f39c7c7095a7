// What fullburn fleet asks Prometheus, in order: its clock (the window ends
// at the server's now, whatever this machine's clock says), the scrape
// interval of each target (what one sample stands for), which of fullburn's
// series exist, then six range queries over the window, two at a time, on
// one grid of buckets. Each range function covers exactly one bucket.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <future>
#include <nlohmann/json.hpp>
#include <set>

#include "format.h"
#include "fullburn/fleet.h"

namespace fullburn {
namespace {

using fleet_format::Utc;

constexpr const char* kUtil = "DCGM_FI_DEV_GPU_UTIL";
constexpr const char* kHeld = "fullburn_gpu_held";
constexpr const char* kHeldIdle = "fullburn_gpu_held_idle";
constexpr const char* kThrottled = "fullburn_gpu_throttled";
constexpr const char* kJobLost = "fullburn_job_time_lost_ratio";
constexpr const char* kJobMfu = "fullburn_job_mfu";
constexpr const char* kHowToScrape =
    "scrape `fullburn serve` on every node (examples/prometheus/prometheus.yml, docs/fleet.md)";

std::string Selector(const std::string& metric, const std::string& match) {
  return match.empty() ? metric : metric + "{" + match + "}";
}

// Active targets' scrape intervals, by job and instance.
std::map<std::string, double> TargetIntervals(const PromClient& client) {
  std::map<std::string, double> out;
  Result<std::string> body = client.Get("/api/v1/targets", {{"state", "active"}});
  if (!body.ok()) return out;
  nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].contains("activeTargets")) return out;
  for (const nlohmann::json& t : j["data"]["activeTargets"]) {
    // Fields of another type are skipped: get() and value() would throw.
    if (!t.contains("labels") || !t["labels"].is_object() || !t.contains("scrapeInterval") ||
        !t["scrapeInterval"].is_string())
      continue;
    Result<double> interval = ParsePromDuration(t["scrapeInterval"].get<std::string>());
    if (!interval.ok()) continue;
    auto label = [&](const char* k) {
      const nlohmann::json& l = t["labels"];
      return l.contains(k) && l[k].is_string() ? l[k].get<std::string>() : std::string();
    };
    out[label("job") + "\x1f" + label("instance")] = *interval;
  }
  return out;
}

// The metric names among `wanted` with a series matching `match` in [start, end]
// (all time when start is NaN).
Result<std::set<std::string>> Present(const PromClient& client, const std::vector<std::string>& wanted,
                                      const std::string& match, double start, double end) {
  std::string names;
  for (const std::string& w : wanted) names += (names.empty() ? "" : "|") + w;
  std::string selector = "{__name__=~\"" + names + "\"" + (match.empty() ? "" : "," + match) + "}";
  std::vector<std::pair<std::string, std::string>> params = {{"match[]", selector}};
  if (!std::isnan(start)) {
    params.emplace_back("start", fmt::format("{:.3f}", start));
    params.emplace_back("end", fmt::format("{:.3f}", end));
  }
  Result<std::string> body = client.Get("/api/v1/label/__name__/values", params);
  if (!body.ok()) return body.status();
  nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (!j.is_object() || j["status"] != "success" || !j["data"].is_array())
    return Status::Corruption("Prometheus at " + client.url() +
                              " answered /api/v1/label/__name__/values with something else than "
                              "its API's JSON: is the URL a Prometheus server?");
  std::set<std::string> out;
  for (const nlohmann::json& n : j["data"])
    if (n.is_string()) out.insert(n.get<std::string>());
  return out;
}

}  // namespace

Result<FleetReport> QueryFleet(const PromClient& client, const FleetQuery& q) {
  FleetInput in;
  in.url = client.url();
  Result<PromMatrix> now = client.QueryInstant("vector(time())", NAN);
  if (!now.ok()) return now.status();
  if (now->size() != 1 || now->at(0).values.empty())
    return Status::Corruption("Prometheus at " + client.url() +
                              " did not answer vector(time()) with one value: is it Prometheus?");
  const double server_now = now->at(0).values[0];
  const double local_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (std::fabs(local_now - server_now) > 2)
    in.notes.push_back(fmt::format(
        "this machine's clock is {:+.0f} s off Prometheus's: the window ends at Prometheus's now",
        local_now - server_now));
  in.intervals = TargetIntervals(client);
  double longest = 0;
  for (const auto& [target, interval] : in.intervals) longest = std::max(longest, interval);
  // The scrape under way now is not in yet: the window ends one interval ago.
  in.end = q.end ? *q.end : server_now - std::max(1.0, longest);

  // Which of fullburn's series exist in the window; what is missing is said.
  const std::vector<std::string> wanted = {kUtil, kHeld, kHeldIdle, kThrottled, kJobLost, kJobMfu};
  Result<std::set<std::string>> present =
      Present(client, wanted, q.match, in.end - q.window_s, in.end);
  if (!present.ok()) return present.status();
  const std::string matching = q.match.empty() ? "" : " matching --match '" + q.match + "'";
  if (!present->count(kUtil)) {
    Result<std::set<std::string>> ever = Present(client, {kUtil}, "", NAN, NAN);
    if (ever.ok() && ever->count(kUtil))
      return Status::NotFound(fmt::format(
          "Prometheus at {} has no {}{} between {} and {}: widen --window, or check that its "
          "targets are up (the up series)",
          client.url(), kUtil, matching, Utc(in.end - q.window_s), Utc(in.end)));
    return Status::NotFound("Prometheus at " + client.url() + " has no " + kUtil +
                            " series (GPU utilization): " + kHowToScrape);
  }
  if (!present->count(kHeld))
    in.notes.push_back(std::string(kHeld) + " is missing" + matching +
                       ": which GPUs are held, and by which job, is unknown; " + kHowToScrape);
  if (!present->count(kJobLost))
    in.notes.push_back(std::string(kJobLost) +
                       " is missing: no job was diagnosed (jobs not run under `fullburn run` or "
                       "`fullburn train` on nodes running `fullburn serve`)");

  // One grid: about target_points buckets, none shorter than a scrape.
  double step = std::max(q.window_s / std::max(1, q.target_points), longest);
  step = step >= 1 ? std::ceil(step) : std::ceil(step * 1000) / 1000;
  in.step_s = step;
  in.buckets = static_cast<int>(std::floor(q.window_s / step + 1e-9));
  if (in.buckets < 1)
    return Status::InvalidArgument(fmt::format(
        "--window {:.0f} s is shorter than one scrape interval ({:.0f} s): widen it", q.window_s,
        step));
  in.start = in.end - in.buckets * step;
  // Prometheus 2 includes both ends of a range; one millisecond less makes
  // the buckets meet without overlap ((t - step, t]).
  const std::string range = fmt::format("[{}ms]", static_cast<long long>(std::llround(step * 1000)) - 1);
  const double first_point = in.start + step;

  struct Query {
    std::string promql;
    PromMatrix* out;
  };
  std::vector<Query> queries = {
      {"count_over_time(" + Selector(kUtil, q.match) + range + ")", &in.samples},
      {"sum_over_time(" + Selector(kUtil, q.match) + range + ")", &in.util_sum},
  };
  if (present->count(kHeld))
    queries.push_back({"sum_over_time(" + Selector(kHeld, q.match) + range + ")", &in.held});
  if (present->count(kHeldIdle))
    queries.push_back({"sum_over_time(" + Selector(kHeldIdle, q.match) + range + ")", &in.held_idle});
  if (present->count(kThrottled))
    queries.push_back({"sum_over_time(" + Selector(kThrottled, q.match) + range + ")", &in.throttled});
  if (present->count(kJobLost))
    queries.push_back({"count_over_time(" + Selector(kJobLost, q.match) + range + ")", &in.causes});
  if (present->count(kJobMfu))
    queries.push_back({"avg_over_time(" + Selector(kJobMfu, q.match) + range + ")", &in.mfu});
  // Two at a time: Prometheus evaluates each on a core of its own.
  for (size_t i = 0; i < queries.size(); i += 2) {
    std::vector<std::future<Result<PromMatrix>>> running;
    for (size_t k = i; k < std::min(queries.size(), i + 2); ++k)
      running.push_back(std::async(std::launch::async,
                                   [&client, promql = queries[k].promql, first_point,
                                    end = in.end, step] {
                                     return client.QueryRange(promql, first_point, end, step);
                                   }));
    for (size_t k = 0; k < running.size(); ++k) {
      Result<PromMatrix> m = running[k].get();
      if (!m.ok()) return m.status();
      *queries[i + k].out = std::move(*m);
    }
  }
  Result<FleetReport> report = ComputeFleet(in);
  if (report.ok() && report->effective_start > report->start + step) {
    Result<std::string> info = client.Get("/api/v1/status/runtimeinfo", {});
    nlohmann::json j = info.ok() ? nlohmann::json::parse(*info, nullptr, false) : nlohmann::json();
    if (j.is_object() && j.contains("data") && j["data"].contains("storageRetention") &&
        j["data"]["storageRetention"].is_string())
      report->notes.push_back("Prometheus keeps " +
                              j["data"]["storageRetention"].get<std::string>() +
                              " (its storage retention)");
  }
  return report;
}

}  // namespace fullburn
