// Fleet: GPU-hours across a cluster, by job and cause, read back from the
// Prometheus server that scrapes `fullburn serve` on every node
// (docs/fleet.md).
//
// Contract
// - QueryFleet talks to Prometheus's HTTP API only (instant queries, range
//   queries, the targets and build-info endpoints), over http or https, with
//   a bearer token or basic auth when given. Every expected failure comes
//   back as a Status with one line naming the problem and the fix:
//   unreachable server, a URL that is not Prometheus's API, 401/403, a
//   query Prometheus refuses, a server without fullburn's series (which
//   metric, and how to scrape it), the same GPUs reported by two scrape jobs.
// - ComputeFleet is a pure function of the series fetched (tests feed it
//   hand-made ones). GPU-hours are counted per sample: each sample of a GPU
//   stands for its target's scrape interval. A gap in the scrapes is no
//   sample, so it counts as unknown, never as idle; the report states how
//   many GPU-hours are unknown. available = used + lost exactly; the lost
//   hours split by cause add up to the lost hours.
// - Renderers are pure functions of the report. Nothing here links libtorch
//   or touches the run store.
// - Not thread-safe per call; calls share nothing.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fullburn/causes.h"
#include "fullburn/status.h"

namespace fullburn {

// ---- Prometheus's HTTP API -------------------------------------------------

struct PromConnection {
  std::string url;  // http(s)://host[:port][/prefix]
  std::string bearer_token, user, password;  // at most one of token and user/password
  std::string ca_file;  // https: a CA bundle to verify the server with ("" = the system's)
  double timeout_s = 120;
};

// One series of a range query's answer on a fixed grid: bucket k is the
// point at grid_start + k * step. values[i] belongs to bucket first + i; NaN
// where the series has no point.
struct PromSeries {
  std::map<std::string, std::string> labels;  // without __name__
  int first = 0;
  std::vector<double> values;
  double At(int bucket) const;  // NaN outside
};
using PromMatrix = std::vector<PromSeries>;

// A Prometheus answer's "data" for a range or instant query, parsed without
// building a document (a week of a thousand GPUs is tens of megabytes).
// Instant vectors come back as series of one bucket at 0. Prometheus's own
// error object becomes a Status carrying its message.
Result<PromMatrix> ParsePromMatrix(const std::string& body, double grid_start, double step_s);

class PromClient {
 public:
  static Result<PromClient> Open(const PromConnection& connection);
  // GET `path` (under the URL's prefix) with `params`; the body of a 200.
  Result<std::string> Get(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& params) const;
  Result<PromMatrix> QueryRange(const std::string& promql, double start, double end,
                                double step_s) const;
  // `time` NaN: the server's now (the answer's timestamp says when that was).
  Result<PromMatrix> QueryInstant(const std::string& promql, double time) const;
  const std::string& url() const { return c_.url; }

 private:
  PromConnection c_;
  std::string scheme_host_port_, prefix_;
};

// ---- The fleet's GPU-hours -----------------------------------------------------

// Causes of lost GPU-hours besides the diagnosis's (from
// fullburn_job_time_lost_ratio): what the GPU's own state tells. The cause
// catalog's fleet entries (causes.h), spelt here as constants so the
// parser's fuzz target needs no catalog; a test keeps the two equal.
constexpr const char* kCauseIdleHeld = "idle_held";      // held, utilization < 5%
constexpr const char* kCauseNotHeld = "not_held";        // no process: free capacity
constexpr const char* kCauseUndiagnosed = "undiagnosed"; // held, busy some, no diagnosis
constexpr const char* kCauseUnreported = "unreported";   // no held state (not fullburn serve)

struct FleetHours {
  double available = 0;  // sampled GPU-hours
  double used = 0;       // weighted by utilization
  double lost = 0;       // available - used
  double held = 0, held_idle = 0, throttled = 0;  // GPU-hours in each state
  std::map<std::string, double> lost_by_cause;
  // Of `used`: hours whose job reported an MFU (fullburn_job_mfu), the MFU
  // they add up to (mfu x hours), and those below kMfuLow: busy, yet at a
  // low MFU (the cause low_mfu's hours, which are used, not lost).
  double mfu_used = 0, mfu_weighted = 0, low_mfu = 0;
  double Mfu() const { return mfu_used > 0 ? mfu_weighted / mfu_used : NAN; }
  void Add(const FleetHours& o);
};

// One row of a breakdown: a job, user, node or GPU.
struct FleetRow {
  std::string key;  // "slurm 4242", "pod ns/name", "run 7 on node3", "node3", "node3 gpu 0"
  std::map<std::string, std::string> identity;  // hpc_job, user, partition, namespace, pod, run, name, Hostname
  std::vector<std::string> nodes;
  int gpus = 0;
  FleetHours hours;
  std::string top_cause;  // the cause of most lost hours ("" for none)
  bool healthy = false;   // held and busy: lost < kHealthyLostShare of held hours
  std::string fix;        // for top_cause
};

struct FleetNode {
  std::string host;
  int gpus = 0;
  FleetHours hours;
  double throttled_share = 0, idle_share = 0;  // of the node's available hours
  bool throttles_more = false, idles_more = false;
};

struct FleetReport {
  std::string url;
  double start = 0, end = 0, step_s = 0;  // the window and its buckets
  double effective_start = 0;             // the first bucket with data
  int gpus = 0;                            // distinct GPUs seen
  FleetHours total;
  double unknown = 0;  // GPU-hours of the window with no sample (gpus x window - available)
  std::vector<FleetRow> jobs, users, nodes, gpu_rows;  // ranked by lost hours to jobs
  std::vector<FleetNode> node_flags;
  std::vector<std::string> notes;  // stated gaps, one line each
  // The fleet over time, one point per bucket (NaN: no sample).
  std::vector<double> times, util_pct, gpus_sampled, gpus_held_idle;
};

// A job counts as healthy when its lost hours stay under this share of its held hours.
constexpr double kHealthyLostShare = 0.10;
// A node throttles or idles more than the rest when its share is this many
// points above the median of the other nodes', and at least twice it.
constexpr double kNodeOutlierPoints = 0.10;

// What QueryFleet fetched: the series of each query on one grid.
struct FleetInput {
  std::string url;
  double start = 0, end = 0, step_s = 0;  // bucket k ends at start + (k + 1) * step
  int buckets = 0;
  PromMatrix samples, util_sum, held, held_idle, throttled;  // per GPU series and bucket
  PromMatrix causes;  // count_over_time(fullburn_job_time_lost_ratio) per job series and cause
  PromMatrix mfu;     // avg_over_time(fullburn_job_mfu) per job series
  std::map<std::string, double> intervals;  // "job\x1finstance" -> scrape interval, seconds
  std::vector<std::string> notes;
};

Result<FleetReport> ComputeFleet(const FleetInput& in);

struct FleetQuery {
  double window_s = 7 * 86400;
  std::optional<double> end;  // Unix seconds; default: the server's now
  std::string match;          // label matchers added to every selector: job="fullburn"
  int target_points = 2000;   // buckets per series, about
};
Result<FleetReport> QueryFleet(const PromClient& client, const FleetQuery& query);

// "7d", "36h", "90m", "45s", "1w" -> seconds; an error for anything else.
Result<double> ParsePromDuration(const std::string& text);

// --by job|user|node|gpu: the rows of that breakdown.
const std::vector<FleetRow>& FleetRows(const FleetReport& r, const std::string& by);
std::string RenderFleetText(const FleetReport& r, const std::string& by, size_t top);
nlohmann::json FleetJson(const FleetReport& r);
// One self-contained page: the fleet's utilization over time (uPlot inlined),
// the lost hours by cause, the ranked table.
std::string RenderFleetHtml(const FleetReport& r, const std::string& by, size_t top);
// The fix to try first for a cause (the diagnosis's, shortened: docs/diagnosis.md).
std::string FleetFix(const std::string& cause);

}  // namespace fullburn
