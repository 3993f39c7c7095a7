// Prometheus's HTTP API over cpp-httplib: the URL split into the server and
// a path prefix (a Prometheus behind a proxy at /prometheus), credentials,
// TLS where the library has it, and every way a request goes wrong turned
// into one line that says what to change.
#include <httplib.h>

#include "fullburn/http_client.h"

#include <cmath>

#include "fullburn/fleet.h"

namespace fullburn {
namespace {

std::string FormatTime(double t) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", t);
  return buf;
}


}  // namespace

Result<PromClient> PromClient::Open(const PromConnection& connection) {
  PromClient c;
  c.c_ = connection;
  const std::string& url = connection.url;
  HttpBase base = SplitHttpBase(url);
  switch (base.problem) {
    case HttpBase::Problem::kNotHttp:
      return Status::InvalidArgument("--prometheus '" + url +
                                     "' is not an http:// or https:// URL, e.g. "
                                     "http://prometheus:9090");
    case HttpBase::Problem::kNoHost:
      return Status::InvalidArgument("--prometheus '" + url + "' names no host");
    case HttpBase::Problem::kNoTls:
      return Status::InvalidArgument(
          "this fullburn was built with a cpp-httplib without TLS: use an http:// URL (a proxy "
          "on the node), or build against Debian's libcpp-httplib-dev");
    case HttpBase::Problem::kNone:
      break;
  }
  c.scheme_host_port_ = base.scheme_host_port;
  c.prefix_ = base.prefix;
  if (!connection.bearer_token.empty() && !connection.user.empty())
    return Status::InvalidArgument(
        "both a bearer token and a basic-auth user are set: keep one (FULLBURN_PROMETHEUS_TOKEN, "
        "or FULLBURN_PROMETHEUS_USER and FULLBURN_PROMETHEUS_PASSWORD)");
  return c;
}

Result<std::string> PromClient::Get(
    const std::string& path, const std::vector<std::pair<std::string, std::string>>& params) const {
  httplib::Client http(scheme_host_port_);
  if (!http.is_valid())
    return Status::InvalidArgument("cannot use --prometheus '" + c_.url + "': check its host and port");
  time_t secs = static_cast<time_t>(std::ceil(c_.timeout_s));
  http.set_connection_timeout(std::min<time_t>(secs, 10));
  http.set_read_timeout(secs);
  http.set_write_timeout(secs);
  http.set_follow_location(true);
  if (!c_.bearer_token.empty()) http.set_bearer_token_auth(c_.bearer_token);
  if (!c_.user.empty()) http.set_basic_auth(c_.user, c_.password);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (!c_.ca_file.empty()) http.set_ca_cert_path(c_.ca_file);
  http.enable_server_certificate_verification(true);
#endif
  httplib::Params query;
  for (const auto& [k, v] : params) query.emplace(k, v);
  // Plain bytes: the answers are large, and on a cluster's network the
  // server's compression costs it more time than the transfer saves.
  httplib::Headers headers = {{"Accept-Encoding", "identity"}};
  httplib::Result res = http.Get(prefix_ + path, query, headers);
  if (!res) {
    httplib::Error e = res.error();
    bool tls = e == httplib::Error::SSLServerVerification || e == httplib::Error::SSLLoadingCerts;
    return Status::Unavailable(
        "cannot reach Prometheus at " + c_.url + " (" + WhyUnreachable(e) + "): " +
        (tls ? "give the CA that signed its certificate with --ca-file or "
               "FULLBURN_PROMETHEUS_CA_FILE"
             : "is it running, and is --prometheus its address?"));
  }
  int code = res->status;
  if (code == 401 || code == 403)
    return Status::InvalidArgument(
        "Prometheus at " + c_.url + " refused the request (" + std::to_string(code) +
        (code == 401 ? " Unauthorized" : " Forbidden") +
        "): set FULLBURN_PROMETHEUS_TOKEN (bearer) or FULLBURN_PROMETHEUS_USER and "
        "FULLBURN_PROMETHEUS_PASSWORD (basic auth) to credentials it accepts");
  if (code == 404)
    return Status::InvalidArgument(c_.url + " has no Prometheus API (" + prefix_ + path +
                                   ": 404): give the server's base URL, e.g. "
                                   "http://prometheus:9090");
  // Prometheus answers a query it cannot run with 400/422/503 and a JSON
  // error, which the parser turns into its message.
  bool api_error = (code == 400 || code == 422 || code == 503) &&
                   res->body.find("\"status\":\"error\"") != std::string::npos;
  if (code != 200 && !api_error)
    return Status::Unavailable("Prometheus at " + c_.url + " answered " + prefix_ + path +
                               " with HTTP " + std::to_string(code) + ": " +
                               Trimmed(res->body.substr(0, res->body.find('\n')), 120));
  return std::move(res->body);
}

Result<PromMatrix> PromClient::QueryRange(const std::string& promql, double start, double end,
                                          double step_s) const {
  Result<std::string> body = Get("/api/v1/query_range", {{"query", promql},
                                                         {"start", FormatTime(start)},
                                                         {"end", FormatTime(end)},
                                                         {"step", FormatTime(step_s)}});
  if (!body.ok()) return body.status();
  return ParsePromMatrix(*body, start, step_s);
}

Result<PromMatrix> PromClient::QueryInstant(const std::string& promql, double time) const {
  std::vector<std::pair<std::string, std::string>> params = {{"query", promql}};
  if (!std::isnan(time)) params.emplace_back("time", FormatTime(time));  // else the server's now
  Result<std::string> body = Get("/api/v1/query", params);
  if (!body.ok()) return body.status();
  return ParsePromMatrix(*body, time, 0);
}

}  // namespace fullburn
