// MLflow's REST API over cpp-httplib, and what a run sends to it.
#include "fullburn/mlflow.h"

#include <httplib.h>

#include "fullburn/http_client.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fullburn/causes.h"

namespace fullburn {
namespace {

using nlohmann::json;

std::string EnvOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int64_t Millis(double unix_time) { return static_cast<int64_t>(std::llround(unix_time * 1000)); }


json KeyValueArray(const KeyValues& kv, size_t max_value) {
  json a = json::array();
  for (const auto& [k, v] : kv) a.push_back({{"key", k}, {"value", Trimmed(v, max_value - 3)}});
  return a;
}

json MetricJson(const TrackerPoint& p) {
  return {{"key", p.key}, {"value", p.value}, {"timestamp", Millis(p.unix_time)}, {"step", p.step}};
}

Result<json> ParseJson(Result<std::string> body, const std::string& what) {
  if (!body.ok()) return body.status();
  json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Unavailable("MLflow answered " + what + " with something that is not JSON: " +
                               Trimmed(*body, 80));
  return j;
}

MlflowRun RunFromJson(const json& j) {
  MlflowRun r;
  const json& info = j.value("run", json::object()).value("info", json::object());
  r.run_id = info.value("run_id", info.value("run_uuid", ""));
  r.experiment_id = info.value("experiment_id", "");
  r.artifact_uri = info.value("artifact_uri", "");
  r.status = info.value("status", "");
  r.name = info.value("run_name", "");
  const json& data = j.value("run", json::object()).value("data", json::object());
  for (const json& m : data.value("metrics", json::array())) {
    if (!m.is_object() || !m.contains("key")) continue;
    std::pair<int64_t, int64_t> at{m.value("step", int64_t{0}), m.value("timestamp", int64_t{0})};
    auto& latest = r.latest[m["key"].get<std::string>()];
    latest = std::max(latest, at);
  }
  for (const json& t : data.value("tags", json::array()))
    if (t.is_object() && t.contains("key")) r.tags[t["key"].get<std::string>()] = t.value("value", "");
  return r;
}

std::string PercentEncoded(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

MlflowConnection MlflowConnection::FromEnv(const std::string& uri) {
  MlflowConnection c;
  c.uri = uri.empty() ? EnvOr("MLFLOW_TRACKING_URI") : uri;
  while (!c.uri.empty() && c.uri.back() == '/') c.uri.pop_back();
  c.token = EnvOr("MLFLOW_TRACKING_TOKEN");
  c.user = EnvOr("MLFLOW_TRACKING_USERNAME");
  c.password = EnvOr("MLFLOW_TRACKING_PASSWORD");
  std::string insecure = EnvOr("MLFLOW_TRACKING_INSECURE_TLS");
  c.insecure_tls = insecure == "true" || insecure == "True" || insecure == "1";
  c.ca_file = EnvOr("MLFLOW_TRACKING_SERVER_CERT_PATH");
  return c;
}

Result<MlflowClient> MlflowClient::Open(const MlflowConnection& connection) {
  MlflowClient c;
  c.c_ = connection;
  const std::string& url = connection.uri;
  if (url.empty())
    return Status::InvalidArgument(
        "no MLflow server given: pass --mlflow http://HOST:5000 or set MLFLOW_TRACKING_URI");
  HttpBase base = SplitHttpBase(url);
  switch (base.problem) {
    case HttpBase::Problem::kNotHttp:
      return Status::InvalidArgument(
          "the MLflow URI '" + url +
          "' is not an http:// or https:// tracking server (fullburn sends "
          "through MLflow's REST API; a file: or sqlite: store needs "
          "`mlflow server` in front of it), e.g. http://127.0.0.1:5000");
    case HttpBase::Problem::kNoHost:
      return Status::InvalidArgument("the MLflow URI '" + url + "' names no host");
    case HttpBase::Problem::kNoTls:
      return Status::InvalidArgument(
          "this fullburn was built with a cpp-httplib without TLS: use an http:// MLflow URI, or "
          "build against Debian's libcpp-httplib-dev");
    case HttpBase::Problem::kNone:
      break;
  }
  c.scheme_host_port_ = base.scheme_host_port;
  c.prefix_ = base.prefix;
  return c;
}

Result<std::string> MlflowClient::Call(const char* method, const std::string& path, const std::string& body,
                                       const std::string& content_type) {
  httplib::Client http(scheme_host_port_);
  if (!http.is_valid())
    return Status::InvalidArgument("cannot use the MLflow URI '" + c_.uri + "': check its host and port");
  time_t secs = static_cast<time_t>(std::ceil(c_.timeout_s));
  http.set_connection_timeout(std::min<time_t>(secs, 5));
  http.set_read_timeout(secs);
  http.set_write_timeout(secs);
  if (!c_.token.empty()) http.set_bearer_token_auth(c_.token);
  if (!c_.user.empty()) http.set_basic_auth(c_.user, c_.password);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (!c_.ca_file.empty()) http.set_ca_cert_path(c_.ca_file);
  http.enable_server_certificate_verification(!c_.insecure_tls);
#endif
  std::string full = prefix_ + path;
  httplib::Result res = std::string(method) == "GET"   ? http.Get(full)
                        : std::string(method) == "PUT" ? http.Put(full, body, content_type)
                                                       : http.Post(full, body, content_type);
  if (!res)
    return Status::Unavailable("cannot reach MLflow at " + c_.uri + " (" + WhyUnreachable(res.error()) +
                               "): is `mlflow server` running there?");
  int code = res->status;
  if (code == 200) return std::move(res->body);
  if (code == 401 || code == 403)
    return Status::Aborted("MLflow at " + c_.uri + " refused the request (" + std::to_string(code) +
                           "): set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
                           "MLFLOW_TRACKING_PASSWORD, to credentials it accepts");
  json err = json::parse(res->body, nullptr, false);
  std::string message = err.is_object() ? err.value("message", "") : "";
  std::string error_code = err.is_object() ? err.value("error_code", "") : "";
  if (code >= 500 || code == 429)
    return Status::Unavailable("MLflow at " + c_.uri + " answered " + path + " with HTTP " +
                               std::to_string(code) + ": " +
                               Trimmed(message.empty() ? res->body.substr(0, res->body.find('\n')) : message, 160));
  if (code == 404 && error_code.empty())
    return Status::InvalidArgument(c_.uri + " has no MLflow API (" + full +
                                   ": 404): give the tracking server's base URL, e.g. http://HOST:5000");
  return Status::InvalidArgument("MLflow at " + c_.uri + " refused " + path + " (" +
                                 (error_code.empty() ? std::to_string(code) : error_code) +
                                 "): " + Trimmed(message, 200));
}

Result<std::string> MlflowClient::ExperimentId(const std::string& name) {
  auto got = ParseJson(Call("GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" +
                                       PercentEncoded(name), ""),
                       "experiments/get-by-name");
  if (got.ok()) return got->value("experiment", json::object()).value("experiment_id", "");
  if (got.status().code() != Status::Code::kInvalidArgument) return got.status();
  auto made = ParseJson(Call("POST", "/api/2.0/mlflow/experiments/create", json{{"name", name}}.dump()),
                        "experiments/create");
  if (!made.ok()) return made.status();
  return made->value("experiment_id", "");
}

Result<MlflowRun> MlflowClient::CreateRun(const std::string& experiment_id, const std::string& name,
                                          double start_time, const KeyValues& tags) {
  json req{{"experiment_id", experiment_id}, {"run_name", name}, {"start_time", Millis(start_time)},
           {"tags", KeyValueArray(tags, kMaxTagValue)}};
  auto got = ParseJson(Call("POST", "/api/2.0/mlflow/runs/create", req.dump()), "runs/create");
  if (!got.ok()) return got.status();
  MlflowRun r = RunFromJson(*got);
  if (r.run_id.empty()) return Status::Unavailable("MLflow at " + c_.uri + " made a run but named no run_id");
  return r;
}

Result<MlflowRun> MlflowClient::GetRun(const std::string& run_id) {
  auto got = ParseJson(Call("GET", "/api/2.0/mlflow/runs/get?run_id=" + PercentEncoded(run_id), ""), "runs/get");
  if (!got.ok()) return got.status();
  return RunFromJson(*got);
}

Status MlflowClient::LogBatch(const std::string& run_id, const std::vector<TrackerPoint>& points,
                              const KeyValues& params, const KeyValues& tags, std::set<std::string>* refused) {
  std::vector<TrackerPoint> kept;
  for (const TrackerPoint& p : points)
    if (!refused->count(p.key)) kept.push_back(p);
  std::vector<std::vector<TrackerPoint>> batches = SplitBatches(kept);
  if (batches.empty() && (!params.empty() || !tags.empty())) batches.emplace_back();
  for (size_t i = 0; i < batches.size(); ++i) {
    json req{{"run_id", run_id}, {"metrics", json::array()}};
    for (const TrackerPoint& p : batches[i]) req["metrics"].push_back(MetricJson(p));
    if (i == 0) {  // params and tags (at most 100 each: few here) ride with the first
      req["params"] = KeyValueArray(params, kMaxParamValue);
      req["tags"] = KeyValueArray(tags, kMaxTagValue);
    }
    Status s = Call("POST", "/api/2.0/mlflow/runs/log-batch", req.dump()).status();
    if (s.ok()) continue;
    if (s.code() != Status::Code::kInvalidArgument || batches[i].empty()) return s;
    // Which key did it refuse? Each alone, once.
    std::map<std::string, json> by_key;
    for (const TrackerPoint& p : batches[i]) {
      json& m = by_key[p.key];
      if (m.is_null()) m = json::array();
      m.push_back(MetricJson(p));
    }
    for (auto& [key, metrics] : by_key) {
      json one{{"run_id", run_id}, {"metrics", metrics}};
      Status k = Call("POST", "/api/2.0/mlflow/runs/log-batch", one.dump()).status();
      if (k.code() == Status::Code::kInvalidArgument) {
        refused->insert(key);
      } else if (!k.ok()) {
        return k;
      }
    }
    if (i == 0 && (!params.empty() || !tags.empty())) {
      json rest{{"run_id", run_id}, {"params", KeyValueArray(params, kMaxParamValue)},
                {"tags", KeyValueArray(tags, kMaxTagValue)}};
      if (Status p = Call("POST", "/api/2.0/mlflow/runs/log-batch", rest.dump()).status(); !p.ok()) return p;
    }
  }
  return Status::Ok();
}

Status MlflowClient::EndRun(const std::string& run_id, const std::string& status, double end_time) {
  json req{{"run_id", run_id}, {"status", status}, {"end_time", Millis(end_time)}};
  return Call("POST", "/api/2.0/mlflow/runs/update", req.dump()).status();
}

Status MlflowClient::UploadArtifact(const MlflowRun& run, const std::string& name, const std::string& bytes,
                                    const std::string& content_type) {
  const std::string& uri = run.artifact_uri;
  const std::string proxied = "mlflow-artifacts:";
  if (uri.rfind(proxied, 0) == 0) {
    // mlflow-artifacts:/1/<run>/artifacts or mlflow-artifacts://host:port/1/<run>/artifacts:
    // the server's proxy, at its own address.
    std::string path = uri.substr(proxied.size());
    if (path.rfind("//", 0) == 0) path = path.substr(path.find('/', 2) == std::string::npos ? path.size() : path.find('/', 2));
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    return Call("PUT", "/api/2.0/mlflow-artifacts/artifacts/" + path + "/" + name, bytes, content_type).status();
  }
  std::string local = uri.rfind("file://", 0) == 0 ? uri.substr(7) : uri;
  if (!local.empty() && local.front() == '/') {
    std::error_code ec;
    std::filesystem::create_directories(local, ec);
    std::ofstream out(local + "/" + name, std::ios::binary);
    out << bytes;
    if (ec || !out.flush())
      return Status::IoError("cannot write the artifact " + local + "/" + name +
                             (ec ? ": " + ec.message() : std::string()) +
                             ": the run's artifact folder must be writable from this machine "
                             "(or start `mlflow server` with --serve-artifacts)");
    return Status::Ok();
  }
  return Status::InvalidArgument("the MLflow run's artifacts go to " + uri +
                                 ", which fullburn cannot write: start `mlflow server` with "
                                 "--serve-artifacts (its default) so they go through the server");
}

std::vector<TrackerPoint> NotYetLogged(const std::vector<TrackerPoint>& points, const MlflowRun& run) {
  std::vector<TrackerPoint> out;
  for (const TrackerPoint& p : points) {
    auto latest = run.latest.find(p.key);
    if (latest != run.latest.end() && std::make_pair(p.step, Millis(p.unix_time)) <= latest->second) continue;
    out.push_back(p);
  }
  return out;
}

std::vector<std::vector<TrackerPoint>> SplitBatches(const std::vector<TrackerPoint>& points, size_t max_metrics,
                                                    size_t max_bytes) {
  std::vector<std::vector<TrackerPoint>> out;
  size_t bytes = 0;
  for (const TrackerPoint& p : points) {
    // {"key":"...","value":...,"timestamp":1700000000000,"step":...} and a comma
    size_t size = p.key.size() + 70;
    if (out.empty() || out.back().size() >= max_metrics || bytes + size > max_bytes) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(p);
    bytes += size;
  }
  return out;
}

MlflowRunEnd RunEndRecords(const RunData& run, const std::vector<Finding>& findings) {
  MlflowRunEnd end;
  std::string command;
  for (const std::string& a : run.run.command) command += (command.empty() ? "" : " ") + a;
  end.params.emplace_back("fullburn.command", command.empty() ? "-" : command);
  end.params.emplace_back("fullburn.config", run.run.config_json);
  std::string framework;
  for (const RunEvent& e : run.events) {
    if (e.kind != "dataloader") continue;
    json d = json::parse(e.data, nullptr, false);
    if (d.is_object() && d.contains("framework") && d["framework"].is_string())
      framework = d["framework"].get<std::string>();
  }
  json config = json::parse(run.run.config_json, nullptr, false);
  bool trainer = config.is_object() && (config.contains("train") || config.contains("data"));  // as facts.cpp
  bool any_steps = !run.steps.empty();
  end.params.emplace_back("fullburn.framework",
                          any_steps || trainer || !framework.empty()
                              ? FrameworkName(FrameworkFrom(framework, trainer))
                              : "none seen");
  end.tags.emplace_back("fullburn.run_id", std::to_string(run.run.id));
  if (!findings.empty()) {
    const Finding& top = findings.front();
    end.tags.emplace_back("fullburn.top_cause", top.name());
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f", 100 * top.share_lost);
    end.tags.emplace_back("fullburn.top_cause_pct", pct);
    end.tags.emplace_back("fullburn.top_finding", top.title);
  }
  return end;
}

std::string MlflowRunOf(const std::vector<RunEvent>& events, const std::string& uri) {
  auto bare = [](std::string u) {
    while (!u.empty() && u.back() == '/') u.pop_back();
    return u;
  };
  std::string found;
  for (const RunEvent& e : events) {
    if (e.kind != kMlflowRunEvent) continue;
    json d = json::parse(e.data, nullptr, false);
    if (!d.is_object() || !d.contains("run_id") || !d["run_id"].is_string()) continue;
    if (!uri.empty() && bare(d.value("tracking_uri", "")) != bare(uri)) continue;
    found = d["run_id"].get<std::string>();
  }
  return found;
}

}  // namespace fullburn
