// fullburn fleet: GPU-hours available, used and lost across a cluster, by
// job and cause, from the Prometheus that scrapes fullburn serve.
#include <cmath>
#include <cstdio>

#include "cli.h"
#include "fullburn/fleet.h"

namespace fullburn::cli {
namespace {

struct FleetOptions {
  PromConnection connection;
  std::string window = "7d";
  double end = NAN;
  std::string by = "job";
  bool json = false;
  std::string html;
  size_t top = 10;
  std::string match;
};

int Fleet(const FleetOptions& opts) {
  Result<double> window = ParsePromDuration(opts.window);
  if (!window.ok()) return Fail("--window " + window.status().message());
  Result<PromClient> client = PromClient::Open(opts.connection);
  if (!client.ok()) return Fail(client.status().message());
  FleetQuery query;
  query.window_s = *window;
  if (!std::isnan(opts.end)) query.end = opts.end;
  query.match = opts.match;
  Result<FleetReport> report = QueryFleet(*client, query);
  if (!report.ok()) return Fail(report.status().message());
  if (!opts.html.empty()) {
    Status written = WriteFileAtomically(opts.html, RenderFleetHtml(*report, opts.by, opts.top));
    if (!written.ok()) return Fail(written.message());
  }
  if (opts.json) {
    std::printf("%s\n", FleetJson(*report).dump(2).c_str());
  } else {
    std::printf("%s", RenderFleetText(*report, opts.by, opts.top).c_str());
    if (!opts.html.empty()) std::printf("\nwrote %s\n", opts.html.c_str());
  }
  return 0;
}

}  // namespace

void SetupFleet(CLI::App& app) {
  auto opts = std::make_shared<FleetOptions>();
  CLI::App* cmd = app.add_subcommand("fleet", kFleetAbout);
  cmd->add_option("--prometheus", opts->connection.url,
                  "Prometheus's base URL (http or https), the server scraping fullburn serve")
      ->envname("FULLBURN_PROMETHEUS_URL")
      ->required();
  cmd->add_option("--window", opts->window, "How far back: 7d, 36h, 90m")->capture_default_str();
  cmd->add_option("--end", opts->end,
                  "End of the window, Unix seconds (default: the Prometheus server's now)");
  cmd->add_option("--by", opts->by, "Rows of the ranked table")
      ->check(CLI::IsMember({"job", "user", "node", "gpu"}))
      ->capture_default_str();
  cmd->add_option("--top", opts->top, "Rows shown")->capture_default_str();
  cmd->add_option("--match", opts->match,
                  "Label matchers added to every query, e.g. 'job=\"fullburn\"' (when "
                  "dcgm-exporter is scraped too)");
  cmd->add_flag("--json", opts->json, "The whole report as JSON");
  cmd->add_option("--html", opts->html, "Also write one self-contained HTML page to this file");
  // Credentials come from the environment: a command line is visible to
  // every user of the machine.
  cmd->add_option("--token", opts->connection.bearer_token,
                  "Bearer token (set the environment variable rather than the flag)")
      ->envname("FULLBURN_PROMETHEUS_TOKEN");
  cmd->add_option("--user", opts->connection.user, "Basic-auth user")
      ->envname("FULLBURN_PROMETHEUS_USER");
  cmd->add_option("--password", opts->connection.password,
                  "Basic-auth password (set the environment variable rather than the flag)")
      ->envname("FULLBURN_PROMETHEUS_PASSWORD");
  cmd->add_option("--ca-file", opts->connection.ca_file,
                  "https: CA bundle to verify the server with (default: the system's)")
      ->envname("FULLBURN_PROMETHEUS_CA_FILE");
  cmd->add_option("--timeout", opts->connection.timeout_s, "Seconds to wait for each answer")
      ->capture_default_str();
  cmd->callback([opts] { ExitCode() = Fleet(*opts); });
}

}  // namespace fullburn::cli
