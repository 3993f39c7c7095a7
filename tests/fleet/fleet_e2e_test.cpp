// End to end with the real engine: Debian's Prometheus on loopback scrapes
// three `fullburn serve` processes every second, each seeing one scripted GPU
// (the fake NVML): one held and idle by a Slurm job, one running a starved
// loop under `fullburn run`, one busy. `fullburn fleet` then reads the
// window back from Prometheus. And a job recorded inside a PID namespace of
// its own is tied to its GPU by serve.
//
// Time: FleetRanksHeldIdleStarvedAndHealthyGpus takes about 60 s: the starved
// loop needs 20 s of steps before serve exports its diagnosis
// (LiveDiagnosis::kMinS), then a 40 s window in which every series exists.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmath>
#include <map>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "process.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Background;

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The pid of a child of `parent` whose command is `comm`, or -1.
int ChildOf(int parent, const std::string& comm) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = testing::ReadText(e.path() / "stat");
    size_t close = stat.rfind(')');
    if (close == std::string::npos || stat.find("(" + comm + ")") == std::string::npos) continue;
    if (std::atoi(stat.c_str() + close + 4) == parent) return std::stoi(name);
  }
  return -1;
}

// Prometheus scraping the three serves every second, each target a node:
// its `node` target label becomes the series' Hostname.
std::string PrometheusConfig(int port_a, int port_b, int port_c) {
  std::string targets;
  const std::pair<int, const char*> nodes[] = {{port_a, "node-a"}, {port_b, "node-b"}, {port_c, "node-c"}};
  for (const auto& [port, node] : nodes)
    targets += "      - targets: ['127.0.0.1:" + std::to_string(port) + "']\n        labels: {node: " +
               node + "}\n";
  return "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
         "  - job_name: fullburn\n    static_configs:\n" +
         targets +
         "    metric_relabel_configs:\n      - source_labels: [node]\n        target_label: Hostname\n";
}

class FleetE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_fleet");
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    ::unsetenv("FULLBURN_STORE");
  }
  // A fake NVML script: one GPU at `util` percent held by `pid`.
  std::string Gpu(const std::string& tag, int util, int pid, double mem_gib) {
    std::string path = dir_ + "/nvml_" + tag + ".json";
    long long mem = static_cast<long long>(mem_gib * 1073741824.0);
    json gpu = {{"name", "Fake H100"},
                {"uuid", "GPU-" + tag},
                {"util", json::array({util})},
                {"mem_util", json::array({util / 2})},
                {"mem_used", json::array({mem})},
                {"mem_total", 85899345920LL},
                {"power_mw", json::array({300000})},
                {"temp", json::array({60})},
                {"throttle", json::array({0})}};
    json process = {{"pid", pid}, {"mem", mem}};
    gpu["processes"] = json::array({json::array({process})});  // every call: this process
    json script = {{"driver", "550.1"}};
    script["gpus"] = json::array({gpu});
    std::ofstream(path) << script.dump();
    return path;
  }
  // `fullburn serve` on a free loopback port seeing the GPU of `script`.
  int Serve(Background* b, const std::string& script, const std::string& store,
            const std::string& tag, const std::vector<std::string>& extra = {}) {
    ::setenv("FAKE_NVML_SCRIPT", script.c_str(), 1);
    ::setenv("FULLBURN_NVML_LIBRARY", FAKE_NVML, 1);
    std::vector<std::string> args = {FULLBURN_BIN, "serve", "--listen", "127.0.0.1:0", "--interval", "0.5",
                                     "--store", store};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::Start(b, args, tag);
    ::unsetenv("FULLBURN_NVML_LIBRARY");
    int port = -1;
    testing::WaitFor(
        [&] {
          std::smatch m;
          std::string err = b->Err();
          if (std::regex_search(err, m, std::regex("https?://127\\.0\\.0\\.1:(\\d+)/metrics")))
            port = std::stoi(m[1]);
          return port > 0;
        },
        10);
    return port;
  }
  std::string dir_;
};

// The answer of an instant query, or a null json.
json Query(httplib::Client& prom, const std::string& promql) {
  auto res = prom.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return json();
  json j = json::parse(res->body, nullptr, false);
  return j.is_discarded() ? json() : j["data"]["result"];
}

const json* Job(const json& jobs, const std::string& key) {
  for (const json& j : jobs)
    if (j["key"] == key) return &j;
  return nullptr;
}

TEST_F(FleetE2E, FleetRanksHeldIdleStarvedAndHealthyGpus) {
  const std::string loop = std::string(SOURCE_DIR) + "/examples/scenarios/loop.py";
  // The jobs: two Slurm jobs' processes (their identity in their environment)
  // and a starved loop recorded by fullburn run, its GPU unseen by the run.
  Background idle_job, healthy_job, starved;
  testing::Start(&idle_job,
                 {"env", "SLURM_JOB_ID=101", "SLURM_JOB_USER=alice", "SLURM_JOB_PARTITION=gpu",
                  "sleep", "300"},
                 "idle_job");
  testing::Start(&healthy_job, {"env", "SLURM_JOB_ID=303", "SLURM_JOB_USER=carol", "sleep", "300"},
                 "healthy_job");
  const std::string store_b = dir_ + "/b.db";
  testing::Start(&starved,
                 {FULLBURN_BIN, "run", "-q", "--interval", "0.25", "--store", store_b, "--",
                  "python3", loop, "starved", "--seconds", "300"},
                 "starved");
  int loop_pid = -1;
  ASSERT_TRUE(testing::WaitFor([&] { return (loop_pid = ChildOf(starved.pid, "python3")) > 0; }, 20))
      << starved.Err();

  Background serve_a, serve_b, serve_c;
  int port_a = Serve(&serve_a, Gpu("idle", 0, idle_job.pid, 10), dir_ + "/a.db", "serve_a");
  int port_b = Serve(&serve_b, Gpu("starved", 30, loop_pid, 6), store_b, "serve_b");
  int port_c = Serve(&serve_c, Gpu("busy", 97, healthy_job.pid, 20), dir_ + "/c.db", "serve_c");
  ASSERT_GT(port_a, 0) << serve_a.Err();
  ASSERT_GT(port_b, 0) << serve_b.Err();
  ASSERT_GT(port_c, 0) << serve_c.Err();

  // Each serve is a node of its own: Hostname from a target label, as a
  // cluster's relabelling would do (the three share this machine's name).
  const int prom_port = FreePort();
  std::ofstream(dir_ + "/prometheus.yml") << PrometheusConfig(port_a, port_b, port_c);
  Background prom;
  testing::Start(&prom,
                 {"prometheus", "--config.file=" + dir_ + "/prometheus.yml",
                  "--storage.tsdb.path=" + dir_ + "/data",
                  "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                  "--storage.tsdb.retention.time=1d"},
                 "prometheus");
  httplib::Client client("127.0.0.1", prom_port);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto res = client.Get("/-/ready");
        return res && res->status == 200;
      },
      60))
      << prom.Err();
  // Serve B labels its GPU with the run holding it (the loop's recorder is its parent).
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        json r = Query(client, "DCGM_FI_DEV_GPU_UTIL{run=\"1\",Hostname=\"node-b\"}");
        return r.is_array() && r.size() == 1;
      },
      30))
      << Query(client, "DCGM_FI_DEV_GPU_UTIL").dump();
  // The starved loop's diagnosis, exported after 20 s of steps.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        json r = Query(client, "fullburn_job_time_lost_ratio{Hostname=\"node-b\"}");
        return r.is_array() && r.size() == 1;
      },
      90))
      << serve_b.Err();
  json t0 = Query(client, "vector(time())");
  ASSERT_TRUE(t0.is_array() && !t0.empty());
  const double diagnosed_at = std::stod(t0[0]["value"][1].get<std::string>());
  // A window that starts after every series exists.
  const double window_s = 40;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        json now = Query(client, "vector(time())");
        return now.is_array() && !now.empty() &&
               std::stod(now[0]["value"][1].get<std::string>()) > diagnosed_at + window_s + 2;
      },
      120));

  const std::string url = "http://127.0.0.1:" + std::to_string(prom_port);
  testing::Outcome o = testing::RunToEnd(
      {FULLBURN_BIN, "fleet", "--prometheus", url, "--window", "40s", "--json"});
  ASSERT_EQ(o.code, 0) << o.err;
  json r = json::parse(o.out);
  EXPECT_EQ(r["gpus"], 3) << o.out;
  // The held-idle GPU's job first, with its Slurm identity.
  const json& jobs = r["jobs"];
  ASSERT_GE(jobs.size(), 3u) << o.out;
  EXPECT_EQ(jobs[0]["key"], "slurm job 101") << o.out;
  EXPECT_EQ(jobs[0]["identity"]["user"], "alice");
  EXPECT_EQ(jobs[0]["identity"]["partition"], "gpu");
  EXPECT_EQ(jobs[0]["top_cause"], "idle_held");
  // The starved run's cause, from its diagnosis.
  const json* run = Job(jobs, "run 1 on node-b");
  ASSERT_TRUE(run) << o.out;
  EXPECT_EQ((*run)["top_cause"].get<std::string>().rfind("input_", 0), 0u) << run->dump();
  EXPECT_FALSE((*run)["healthy"].get<bool>());
  EXPECT_FALSE((*run)["fix"].get<std::string>().empty());
  // The busy one is healthy.
  const json* busy = Job(jobs, "slurm job 303");
  ASSERT_TRUE(busy) << o.out;
  EXPECT_TRUE((*busy)["healthy"].get<bool>()) << busy->dump();
  // Three GPUs sampled every second over the window: its GPU-hours, less
  // the scrapes a busy machine missed, which are counted as unknown.
  const double span_h = (r["end"].get<double>() - r["start"].get<double>()) / 3600;
  const json& h = r["hours"];
  const double available = h["available"].get<double>();
  // (within 2%: the window may start a scrape interval late)
  EXPECT_NEAR(available + r["unknown_hours"].get<double>(), 3 * span_h, 0.02 * 3 * span_h) << h;
  EXPECT_GT(available, 0.9 * 3 * span_h) << h;
  EXPECT_NEAR(h["used"].get<double>() + h["lost"].get<double>(), h["available"].get<double>(),
              1e-9);
  double causes = 0;
  for (const auto& [cause, hours] : h["lost_by_cause"].items()) causes += hours.get<double>();
  EXPECT_NEAR(causes, h["lost"].get<double>(), 1e-9) << h;
  // Used hours: 30% and 97% of two GPUs' time, 0% of the third's (of the
  // time sampled: a missed scrape is in neither).
  EXPECT_NEAR(h["used"].get<double>(), (0.30 + 0.97) * available / 3, 0.05 * available) << h;

  // The text and the page.
  o = testing::RunToEnd({FULLBURN_BIN, "fleet", "--prometheus", url, "--window", "40s", "--html",
                         dir_ + "/fleet.html"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("slurm job 101"), std::string::npos) << o.out;
  std::string html = testing::ReadText(dir_ + "/fleet.html");
  EXPECT_NE(html.find("uPlot"), std::string::npos);
  EXPECT_NE(html.find("run 1 on node-b"), std::string::npos);
  // The page in a real browser: both charts drawn by uPlot, no console message.
  auto dom = testing::RunToEnd({"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                "--disable-dev-shm-usage", "--user-data-dir=" + dir_ + "/chromium",
                                "--enable-logging=stderr", "--v=0", "--window-size=1280,1600",
                                "--dump-dom", "file://" + dir_ + "/fleet.html"},
                               90);
  ASSERT_EQ(dom.code, 0) << dom.err;
  EXPECT_EQ(dom.err.find(":CONSOLE"), std::string::npos) << dom.err;
  EXPECT_NE(dom.out.find("data-charts-drawn=\"2\""), std::string::npos) << dom.out.substr(0, 2000);
  size_t plots = 0;
  for (size_t pos = 0; (pos = dom.out.find("class=\"uplot", pos)) != std::string::npos; ++pos) ++plots;
  EXPECT_EQ(plots, 2u);
  EXPECT_NE(dom.out.find("<canvas"), std::string::npos);

  // A window longer than what Prometheus holds: the totals cover what is
  // there and the report says so.
  o = testing::RunToEnd({FULLBURN_BIN, "fleet", "--prometheus", url, "--window", "7d"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("Prometheus has nothing older"), std::string::npos) << o.out;
  // A metric name that no series matches: one line naming it and the fix.
  o = testing::RunToEnd({FULLBURN_BIN, "fleet", "--prometheus", url, "--window", "30s", "--match",
                         "job=\"nope\""});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("has no DCGM_FI_DEV_GPU_UTIL matching --match"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}

// Prometheus behind TLS and basic auth (its --web.config.file), as a cluster
// exposes it: fullburn fleet verifies the server's certificate against the CA
// file it is given, sends the credentials from the environment, and says
// which one is missing when the server refuses. Time: about 10 s of scrapes.
TEST_F(FleetE2E, HttpsWithBasicAuthAgainstTheRealEngine) {
  const std::string cert = dir_ + "/cert.pem", key = dir_ + "/key.pem";
  auto made = testing::RunToEnd({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                                 "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                                 "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert});
  ASSERT_EQ(made.code, 0) << "openssl (scripts/install-deps.sh installs it): " << made.err;
  Background job;
  testing::Start(&job, {"sleep", "120"}, "tls_job");
  Background serve;
  int serve_port = Serve(&serve, Gpu("tls", 60, job.pid, 4), dir_ + "/s.db", "serve_tls");
  ASSERT_GT(serve_port, 0) << serve.Err();
  const int prom_port = FreePort();
  std::ofstream(dir_ + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
         "  - job_name: fullburn\n    static_configs:\n      - targets: ['127.0.0.1:"
      << serve_port << "']\n";
  // bcrypt of "fleet-secret" (Python's crypt.crypt with a $2b$05$ salt).
  std::ofstream(dir_ + "/web.yml")
      << "tls_server_config:\n  cert_file: " << cert << "\n  key_file: " << key
      << "\nbasic_auth_users:\n  fleet: '$2b$05$abcdefghijklmnopqrstuuiz1Y.0Qtk59V/ZKMvf0YaAfVnLcEY7q'\n";
  Background prom;
  testing::Start(&prom,
                 {"prometheus", "--config.file=" + dir_ + "/prometheus.yml",
                  "--web.config.file=" + dir_ + "/web.yml", "--storage.tsdb.path=" + dir_ + "/data",
                  "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                 "prometheus_tls");
  const std::string url = "https://127.0.0.1:" + std::to_string(prom_port);
  const std::vector<std::string> creds = {"env", "FULLBURN_PROMETHEUS_USER=fleet",
                                          "FULLBURN_PROMETHEUS_PASSWORD=fleet-secret",
                                          "FULLBURN_PROMETHEUS_CA_FILE=" + cert};
  auto fleet = [&](std::vector<std::string> env, const std::string& window) {
    env.insert(env.end(), {FULLBURN_BIN, "fleet", "--prometheus", url, "--window", window,
                           "--json", "--timeout", "5"});
    return testing::RunToEnd(env);
  };
  // Ten seconds of scrapes, read back through TLS and basic auth.
  testing::Outcome o;
  bool answered = testing::WaitFor(
      [&] {
        o = fleet(creds, "10s");
        if (o.code != 0) return false;
        json r = json::parse(o.out, nullptr, false);
        return !r.is_discarded() && r["hours"]["available"].get<double>() * 3600 >= 8;
      },
      60);
  ASSERT_TRUE(answered) << o.err << prom.Err().substr(0, 2000);
  json r = json::parse(o.out);
  EXPECT_EQ(r["gpus"], 1);
  EXPECT_NEAR(r["hours"]["used"].get<double>() / r["hours"]["available"].get<double>(), 0.60, 0.01);

  // No password: the server's 401, with the variables to set.
  o = fleet({"env", "FULLBURN_PROMETHEUS_USER=fleet", "FULLBURN_PROMETHEUS_CA_FILE=" + cert}, "10s");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("refused the request (401 Unauthorized)"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("FULLBURN_PROMETHEUS_PASSWORD"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  // No CA file: the self-signed certificate is not trusted, and nothing is sent.
  o = fleet({"env", "FULLBURN_PROMETHEUS_USER=fleet", "FULLBURN_PROMETHEUS_PASSWORD=fleet-secret"},
            "10s");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("certificate"), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}

// serve behind TLS and basic auth (--web-config), with the very file
// Prometheus itself is given as --web.config.file (both read
// exporter-toolkit's format): Prometheus scrapes serve over TLS with the
// password, a scrape job with a wrong password and one in plain HTTP get
// nothing, and fullburn fleet reads the window back as before.
TEST_F(FleetE2E, PrometheusScrapesServeOverTlsWithBasicAuth) {
  const std::string fixtures = SOURCE_DIR "/tests/http/fixtures/";
  const std::string web = dir_ + "/web.yml";
  std::ofstream(web) << "tls_server_config:\n  cert_file: " << fixtures << "server.pem\n  key_file: " << fixtures
                     << "server.key\nbasic_auth_users:\n"
                        "  fleet: '$2b$05$abcdefghijklmnopqrstuuiz1Y.0Qtk59V/ZKMvf0YaAfVnLcEY7q'\n";
  Background job;
  testing::Start(&job, {"sleep", "120"}, "tls_serve_job");
  Background serve;
  int serve_port = Serve(&serve, Gpu("tlsserve", 40, job.pid, 4), dir_ + "/s.db", "serve_web", {"--web-config", web});
  ASSERT_GT(serve_port, 0) << serve.Err();
  EXPECT_NE(serve.Err().find("serving https://127.0.0.1:" + std::to_string(serve_port) +
                             "/metrics, TLS 1.2-1.3, basic auth (1 user)"),
            std::string::npos)
      << serve.Err();
  const int prom_port = FreePort();
  const std::string target = "['127.0.0.1:" + std::to_string(serve_port) + "']";
  auto job_config = [&](const std::string& name, const std::string& scheme, const std::string& password) {
    return "  - job_name: " + name + "\n    scheme: " + scheme + "\n    tls_config:\n      ca_file: " + fixtures +
           "server.pem\n    basic_auth:\n      username: fleet\n      password: " + password +
           "\n    static_configs:\n      - targets: " + target + "\n";
  };
  std::ofstream(dir_ + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
      << job_config("fullburn", "https", "fleet-secret") << job_config("wrong_password", "https", "guess")
      << job_config("plain_http", "http", "fleet-secret");
  Background prom;
  testing::Start(&prom,
                 {"prometheus", "--config.file=" + dir_ + "/prometheus.yml", "--web.config.file=" + web,
                  "--storage.tsdb.path=" + dir_ + "/data",
                  "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                 "prometheus_web");
  httplib::SSLClient api("127.0.0.1", prom_port);
  api.set_ca_cert_path((fixtures + "server.pem").c_str());
  api.enable_server_certificate_verification(true);
  api.set_basic_auth("fleet", "fleet-secret");
  // Each job's last scrape, as Prometheus's targets API reports it.
  std::map<std::string, json> targets;
  bool scraped = testing::WaitFor(
      [&] {
        auto res = api.Get("/api/v1/targets");
        if (!res || res->status != 200) return false;
        json j = json::parse(res->body, nullptr, false);
        if (j.is_discarded()) return false;
        for (const json& t : j["data"]["activeTargets"]) targets[t["labels"]["job"]] = t;
        return targets.size() == 3 && targets["fullburn"]["health"] == "up" &&
               targets["wrong_password"]["health"] == "down" && targets["plain_http"]["health"] == "down";
      },
      30);
  ASSERT_TRUE(scraped) << json(targets).dump() << prom.Err().substr(0, 2000);
  EXPECT_NE(targets["wrong_password"]["lastError"].get<std::string>().find("401 Unauthorized"), std::string::npos)
      << targets["wrong_password"];
  const std::vector<std::string> creds = {"env", "FULLBURN_PROMETHEUS_USER=fleet",
                                          "FULLBURN_PROMETHEUS_PASSWORD=fleet-secret",
                                          "FULLBURN_PROMETHEUS_CA_FILE=" + fixtures + "server.pem"};
  testing::Outcome o;
  bool answered = testing::WaitFor(
      [&] {
        std::vector<std::string> cmd = creds;
        cmd.insert(cmd.end(), {FULLBURN_BIN, "fleet", "--prometheus", "https://127.0.0.1:" + std::to_string(prom_port),
                               "--window", "10s", "--json", "--timeout", "5"});
        o = testing::RunToEnd(cmd);
        if (o.code != 0) return false;
        json r = json::parse(o.out, nullptr, false);
        return !r.is_discarded() && r["hours"]["available"].get<double>() * 3600 >= 8;
      },
      60);
  ASSERT_TRUE(answered) << o.out << o.err;
  json r = json::parse(o.out);
  EXPECT_EQ(r["gpus"], 1);
  EXPECT_NEAR(r["hours"]["used"].get<double>() / r["hours"]["available"].get<double>(), 0.40, 0.01);
}

// A job recorded inside a PID namespace of its own: `fullburn run` there is
// pid 1 and the store has that pid; NVML (and serve, on the host) sees the
// job's host pid. Serve maps it through NSpid and labels the GPU's series.
TEST_F(FleetE2E, ServeLabelsAJobRecordedInItsOwnPidNamespace) {
  const std::string store = dir_ + "/ns.db";
  Background ns;
  testing::Start(&ns,
                 {"unshare", "--pid", "--fork", "--mount-proc", FULLBURN_BIN, "run", "-q",
                  "--interval", "0.25", "--store", store, "--", "sleep", "120"},
                 "ns_run");
  int recorder = -1, job = -1;
  bool started = testing::WaitFor(
      [&] {
        if (ns.Wait(0.001) >= 0) return true;  // unshare refused
        recorder = ChildOf(ns.pid, "fullburn");
        job = recorder > 0 ? ChildOf(recorder, "sleep") : -1;
        return job > 0 && fs::exists(store);
      },
      20);
  if (!started || job < 0)
    GTEST_SKIP() << "unshare --pid --fork --mount-proc was refused (needs root or user "
                    "namespaces): "
                 << ns.Err();
  // Its pid inside is not its pid here.
  std::string status = testing::ReadText("/proc/" + std::to_string(job) + "/status");
  ASSERT_TRUE(std::regex_search(status, std::regex("NSpid:\t" + std::to_string(job) + "\t[0-9]+\n")))
      << status;
  Background serve;
  int port = Serve(&serve, Gpu("ns", 55, job, 3), store, "serve_ns");
  ASSERT_GT(port, 0) << serve.Err();
  httplib::Client client("127.0.0.1", port);
  std::string body;
  bool labelled = testing::WaitFor(
      [&] {
        auto res = client.Get("/metrics");
        body = res ? res->body : "";
        return body.find("modelName=\"Fake H100\",run=\"1\",") != std::string::npos;
      },
      30);
  EXPECT_TRUE(labelled) << body;
  EXPECT_NE(body.find("fullburn_gpu_held{gpu=\"0\",UUID=\"GPU-ns\",modelName=\"Fake H100\",run=\"1\","),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("fullburn_gpu_held_idle{"), std::string::npos);
}

}  // namespace
}  // namespace fullburn
