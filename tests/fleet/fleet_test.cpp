// fullburn fleet's parts without a Prometheus: the answer parser, the
// GPU-hours accounting on hand-made series (every expected number derived
// here from the series, not read back), the renderers, and the client's
// one-line errors against a small HTTP server standing in for a broken,
// locked or wrong server. The real Prometheus is in fleet_e2e_test.cpp.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "fullburn/fleet.h"
#include "fullburn/http_client.h"

namespace fullburn {
namespace {

// ---- the parser ----

// Found by fuzz/prom_json_fuzz (fuzz/regressions/prom_json/): a point far
// past the grid sized its series by its bucket (a 2 GB allocation).
TEST(PromParse, APointPastTheMostARangeQueryHasIsRefused) {
  auto answer = [](const std::string& t) {
    return ParsePromMatrix(R"({"status":"success","data":{"resultType":"matrix","result":[)"
                           R"({"metric":{},"values":[[1000,"1"],[)" + t + R"(,"2"]]}]}})",
                           1000, 10);
  };
  Result<PromMatrix> last = answer("111000");  // bucket 11000: the last a query can have
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_EQ(last->at(0).At(11000), 2);
  Result<PromMatrix> past = answer("111010");
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().message(),
            "Prometheus's answer is not its API's JSON (a point at t=111010, 11001 steps past "
            "the start): is the URL a Prometheus server?");
  EXPECT_FALSE(answer("1e400").ok());
}

// Found by fuzz/prom_json_fuzz: a value with all 16 of its digits after
// the point read past the table of powers of ten (UBSan).
TEST(PromParse, SixteenFractionDigitsWithoutAnIntegerPart) {
  for (const char* v : {".1234567890123456", "-.0000000000000001", "0.123456789012345"}) {
    Result<PromMatrix> m = ParsePromMatrix(
        std::string(R"({"status":"success","data":{"resultType":"vector","result":[)") +
            R"({"metric":{},"value":[1000,")" + v + R"("]}]}})",
        0, 0);
    ASSERT_TRUE(m.ok()) << v << ": " << m.status().message();
    EXPECT_EQ(m->at(0).At(0), std::strtod(v, nullptr)) << v;
  }
}

TEST(PromParse, RangeAnswerOnTheGrid) {
  std::string body = R"({"status":"success","data":{"resultType":"matrix","result":[
    {"metric":{"__name__":"x","Hostname":"node \"a\"","pod":"caf\u00e9\\1"},
     "values":[[1000,"1"],[1020,"NaN"],[1030,"2.5"]]},
    {"metric":{"gpu":"1"},"values":[[1010,"+Inf"]]}]},
    "warnings":["something"]})";
  Result<PromMatrix> m = ParsePromMatrix(body, 1000, 10);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 2u);
  const PromSeries& a = m->at(0);
  EXPECT_EQ(a.labels.at("Hostname"), "node \"a\"");
  EXPECT_EQ(a.labels.at("pod"), "caf\xc3\xa9\\1");
  EXPECT_EQ(a.labels.count("__name__"), 0u);
  EXPECT_EQ(a.first, 0);
  EXPECT_EQ(a.At(0), 1);
  EXPECT_TRUE(std::isnan(a.At(1)));  // no point at 1010
  EXPECT_TRUE(std::isnan(a.At(2)));  // "NaN"
  EXPECT_EQ(a.At(3), 2.5);
  EXPECT_TRUE(std::isnan(a.At(4)));
  EXPECT_EQ(m->at(1).first, 1);
  EXPECT_TRUE(std::isinf(m->at(1).At(1)));
}

TEST(PromParse, InstantVectorAndEmptyResult) {
  Result<PromMatrix> m = ParsePromMatrix(
      R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1.7e9,"1700000000.25"]}]}})",
      0, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->at(0).At(0), 1700000000.25);
  m = ParsePromMatrix(R"({"status":"success","data":{"resultType":"matrix","result":[]}})", 0, 1);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->empty());
}

TEST(PromParse, ErrorsAreOneLine) {
  Result<PromMatrix> m = ParsePromMatrix(
      R"({"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected \"}\""})", 0,
      1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "Prometheus refused the query (bad_data): 1:5: parse error: unexpected \"}\"");
  for (const char* bad : {"<html><body>Grafana</body></html>", "{\"status\":\"success\"",
                          R"({"status":"success","data":{"result":[{"metric":{"a":1}}]}})", ""}) {
    m = ParsePromMatrix(bad, 0, 1);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().message().find("is the URL a Prometheus server?"), std::string::npos)
        << m.status().message();
  }
}

TEST(Durations, PrometheusUnits) {
  EXPECT_EQ(*ParsePromDuration("7d"), 7 * 86400);
  EXPECT_EQ(*ParsePromDuration("36h"), 36 * 3600);
  EXPECT_EQ(*ParsePromDuration("1m30s"), 90);
  EXPECT_EQ(*ParsePromDuration("250ms"), 0.25);
  EXPECT_EQ(*ParsePromDuration("1w"), 7 * 86400);
  EXPECT_EQ(*ParsePromDuration("1.5h"), 5400);
  for (const char* bad : {"7", "7x", "d", "", "-1d", "0s"}) EXPECT_FALSE(ParsePromDuration(bad).ok()) << bad;
}

// Found by fuzz/prom_duration_fuzz.cpp: these threw std::invalid_argument or
// std::out_of_range out of std::stod and ended `fullburn fleet`.
TEST(Durations, DamagedNumbersAreErrorsNotExceptions) {
  for (const char* bad : {".s", "1.2.3m", "..d"}) {
    Result<double> d = ParsePromDuration(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("is not a duration"), std::string::npos) << d.status().message();
  }
  Result<double> huge = ParsePromDuration(std::string(400, '9') + "y");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("longer than any window Prometheus keeps"), std::string::npos)
      << huge.status().message();
  EXPECT_LT(huge.status().message().size(), 160u);
}

// ---- the accounting ----

// A grid of 10 buckets of 60 s; targets scraped every 15 s (4 samples a bucket).
class Accounting : public ::testing::Test {
 protected:
  static constexpr int kBuckets = 10;
  static constexpr double kStep = 60, kInterval = 15, kHour = 3600;
  void SetUp() override {
    in_.url = "http://prom:9090";
    in_.start = 1'700'000'000;
    in_.step_s = kStep;
    in_.buckets = kBuckets;
    in_.end = in_.start + kBuckets * kStep;
    for (const char* node : {"node-a", "node-b", "node-c"})
      in_.intervals[std::string("fullburn\x1f") + node + ":9400"] = kInterval;
  }
  static std::map<std::string, std::string> Gpu(const std::string& node, int gpu,
                                                std::map<std::string, std::string> more = {}) {
    more["Hostname"] = node;
    more["gpu"] = std::to_string(gpu);
    more["UUID"] = "GPU-" + node + "-" + std::to_string(gpu);
    more["job"] = "fullburn";
    more["instance"] = node + ":9400";
    return more;
  }
  static PromSeries Flat(std::map<std::string, std::string> labels, double v, int from = 0,
                         int to = kBuckets, std::vector<int> missing = {}) {
    PromSeries s;
    s.labels = std::move(labels);
    s.first = from;
    for (int b = from; b < to; ++b)
      s.values.push_back(std::count(missing.begin(), missing.end(), b) ? NAN : v);
    return s;
  }
  // A GPU's five series: every sample at `util`, held or not, held-idle or not, throttled or not.
  void AddGpu(const std::map<std::string, std::string>& labels, double util, bool held, bool idle,
              bool throttled, std::vector<int> missing = {}) {
    in_.samples.push_back(Flat(labels, 4, 0, kBuckets, missing));
    in_.util_sum.push_back(Flat(labels, 4 * util, 0, kBuckets, missing));
    in_.held.push_back(Flat(labels, held ? 4 : 0, 0, kBuckets, missing));
    in_.held_idle.push_back(Flat(labels, idle ? 4 : 0, 0, kBuckets, missing));
    in_.throttled.push_back(Flat(labels, throttled ? 4 : 0, 0, kBuckets, missing));
  }
  FleetInput in_;
};

const FleetRow* Row(const std::vector<FleetRow>& rows, const std::string& key) {
  for (const FleetRow& r : rows)
    if (r.key == key) return &r;
  return nullptr;
}

TEST(FleetCauses, TheFleetsOwnCausesAreTheCatalogs) {
  EXPECT_STREQ(kCauseIdleHeld, CauseName(CauseId::kIdleHeld));
  EXPECT_STREQ(kCauseNotHeld, CauseName(CauseId::kNotHeld));
  EXPECT_STREQ(kCauseUndiagnosed, CauseName(CauseId::kUndiagnosed));
  EXPECT_STREQ(kCauseUnreported, CauseName(CauseId::kUnreported));
  for (const char* c : {kCauseIdleHeld, kCauseNotHeld, kCauseUndiagnosed, kCauseUnreported})
    EXPECT_EQ(FindCause(c)->scope, CauseScope::kFleet) << c;
}

TEST_F(Accounting, MfuByJobAndTheBusyHoursBelowItsLine) {
  // Run 7 busy at 90%, its MFU 12% (below the line) for buckets 0-4, 35% after.
  AddGpu(Gpu("node-b", 0, {{"run", "7"}}), 90, true, false, false);
  std::map<std::string, std::string> job = {{"Hostname", "node-b"}, {"run", "7"}, {"job", "fullburn"}};
  PromSeries mfu = Flat(job, 0.12, 0, kBuckets);
  for (int b = 5; b < kBuckets; ++b) mfu.values[b] = 0.35;
  in_.mfu.push_back(mfu);
  // Run 8 reports none.
  AddGpu(Gpu("node-c", 0, {{"run", "8"}}), 90, true, false, false);

  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double busy = 0.9 * 4 * kInterval / kHour;  // used GPU-hours per bucket
  const FleetRow* seven = Row(r->jobs, "run 7 on node-b");
  ASSERT_NE(seven, nullptr);
  EXPECT_NEAR(seven->hours.mfu_used, kBuckets * busy, 1e-12);
  EXPECT_NEAR(seven->hours.Mfu(), (5 * 0.12 + (kBuckets - 5) * 0.35) / kBuckets, 1e-12);
  EXPECT_NEAR(seven->hours.low_mfu, 5 * busy, 1e-12);
  const FleetRow* eight = Row(r->jobs, "run 8 on node-c");
  ASSERT_NE(eight, nullptr);
  EXPECT_TRUE(std::isnan(eight->hours.Mfu())) << "no MFU reported is not 0";
  EXPECT_NEAR(r->total.low_mfu, 5 * busy, 1e-12);
  std::string text = RenderFleetText(*r, "job", 10);
  EXPECT_NE(text.find("busy below 20% MFU"), std::string::npos) << text;
  EXPECT_NE(text.find("low_mfu"), std::string::npos) << text;
  nlohmann::json j = FleetJson(*r);
  EXPECT_NEAR(j["hours"]["low_mfu"].get<double>(), 5 * busy, 1e-12) << j.dump();
}

TEST_F(Accounting, HoursAddUpAndLostHoursGoToTheirCauses) {
  // node-a: held by Slurm job 101 and idle throughout.
  AddGpu(Gpu("node-a", 0, {{"hpc_job", "101"}, {"user", "alice"}}), 0, true, true, false);
  // node-b: recorded run 7 at 30%, bucket 3 never scraped; diagnosed
  // input_workers from bucket 5 on (none before: still starting).
  AddGpu(Gpu("node-b", 0, {{"run", "7"}}), 30, true, false, false, {3});
  PromSeries cause = Flat({{"Hostname", "node-b"}, {"run", "7"}, {"name", "train.py"},
                           {"cause", "input_workers"}, {"job", "fullburn"}},
                          4, 5, kBuckets);
  in_.causes.push_back(cause);
  // node-c: Slurm job 303 busy at 97% but throttled; and a free GPU.
  AddGpu(Gpu("node-c", 0, {{"hpc_job", "303"}, {"user", "carol"}}), 97, true, false, true);
  AddGpu(Gpu("node-c", 1), 0, false, false, false);

  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double per_bucket = 4 * kInterval / kHour;  // GPU-hours a sampled bucket stands for
  const double a = 10 * per_bucket, b = 9 * per_bucket, c = 10 * per_bucket;
  EXPECT_EQ(r->gpus, 4);
  EXPECT_NEAR(r->total.available, a + b + c + c, 1e-12);
  EXPECT_NEAR(r->total.used, 0.3 * b + 0.97 * c, 1e-12);
  EXPECT_NEAR(r->total.lost, r->total.available - r->total.used, 1e-12);
  double causes = 0;
  for (const auto& [cause, hours] : r->total.lost_by_cause) causes += hours;
  EXPECT_NEAR(causes, r->total.lost, 1e-12);
  EXPECT_NEAR(r->total.lost_by_cause.at(kCauseIdleHeld), a, 1e-12);
  EXPECT_NEAR(r->total.lost_by_cause.at(kCauseNotHeld), c, 1e-12);
  EXPECT_NEAR(r->total.lost_by_cause.at("input_workers"), 5 * 0.7 * per_bucket, 1e-12);
  // run 7's 4 undiagnosed buckets, and job 303's 3%.
  EXPECT_NEAR(r->total.lost_by_cause.at(kCauseUndiagnosed),
              4 * 0.7 * per_bucket + 0.03 * c, 1e-12);
  EXPECT_NEAR(r->total.throttled, c, 1e-12);
  // Bucket 3 of node-b was not scraped: unknown, not idle.
  EXPECT_NEAR(r->unknown, per_bucket, 1e-12);

  ASSERT_EQ(r->jobs.size(), 3u);  // the free GPU is no job's
  EXPECT_EQ(r->jobs[0].key, "slurm job 101");
  EXPECT_EQ(r->jobs[0].identity.at("user"), "alice");
  EXPECT_EQ(r->jobs[0].top_cause, kCauseIdleHeld);
  EXPECT_FALSE(r->jobs[0].healthy);
  EXPECT_EQ(r->jobs[1].key, "run 7 on node-b");
  EXPECT_EQ(r->jobs[1].top_cause, "input_workers");
  EXPECT_EQ(r->jobs[1].identity.at("name"), "train.py");
  EXPECT_NE(r->jobs[1].fix.find("num_workers"), std::string::npos);
  EXPECT_EQ(r->jobs[2].key, "slurm job 303");
  EXPECT_TRUE(r->jobs[2].healthy);
  EXPECT_NEAR(r->jobs[2].hours.held, c, 1e-12);
  // Users own what their jobs held.
  EXPECT_NEAR(Row(r->users, "alice")->hours.lost, a, 1e-12);
  // node-c throttles (half its GPU time) while the others never do.
  bool flagged = false;
  for (const FleetNode& n : r->node_flags) {
    EXPECT_EQ(n.throttles_more, n.host == "node-c") << n.host;
    flagged |= n.throttles_more;
  }
  EXPECT_TRUE(flagged);
  // The fleet over time: bucket 3 has 3 GPUs sampled, the others 4.
  ASSERT_EQ(r->gpus_sampled.size(), static_cast<size_t>(kBuckets));
  EXPECT_NEAR(r->gpus_sampled[3], 3, 1e-9);
  EXPECT_NEAR(r->gpus_sampled[4], 4, 1e-9);
  EXPECT_NEAR(r->util_pct[4], (30 + 97) / 4.0, 1e-9);
  EXPECT_NEAR(r->gpus_held_idle[4], 1, 1e-9);
}

TEST_F(Accounting, GapsAreUnknownAndSaidSo) {
  // Half of node-a's scrapes missed in every bucket (2 of 4), and bucket 7 not at all.
  in_.samples.push_back(Flat(Gpu("node-a", 0), 2, 0, kBuckets, {7}));
  in_.util_sum.push_back(Flat(Gpu("node-a", 0), 2 * 50, 0, kBuckets, {7}));
  in_.samples.push_back(Flat(Gpu("node-b", 0), 4));
  in_.util_sum.push_back(Flat(Gpu("node-b", 0), 4 * 50));
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double sample = kInterval / kHour;
  EXPECT_NEAR(r->total.available, (9 * 2 + 10 * 4) * sample, 1e-12);
  EXPECT_NEAR(r->unknown, 2 * 10 * 4 * sample - r->total.available, 1e-12);
  EXPECT_NEAR(r->total.used, r->total.available / 2, 1e-12);  // never counted idle
  // No held state: the lost hours are 'unreported', and the report says why.
  EXPECT_NEAR(r->total.lost_by_cause.at(kCauseUnreported), r->total.lost, 1e-12);
  std::string notes;
  for (const std::string& n : r->notes) notes += n + "\n";
  EXPECT_NE(notes.find("have no sample"), std::string::npos) << notes;
  EXPECT_NE(notes.find("have no fullburn_gpu_held"), std::string::npos) << notes;
}

TEST_F(Accounting, DataStartingLateIsStated) {
  // Prometheus has nothing before bucket 6 (its retention, or no scrape yet).
  in_.samples.push_back(Flat(Gpu("node-a", 0), 4, 6));
  in_.util_sum.push_back(Flat(Gpu("node-a", 0), 400, 6));
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->effective_start, in_.start + 6 * kStep);
  EXPECT_NEAR(r->unknown, 0, 1e-12);  // the time before the data is not a gap
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes[0].find("Prometheus has nothing older"), std::string::npos) << r->notes[0];
}

TEST_F(Accounting, IntervalFromTheSamplesWithoutATarget) {
  in_.intervals.clear();  // backfilled data, or nodes since removed
  in_.samples.push_back(Flat(Gpu("node-a", 0), 4));
  in_.util_sum.push_back(Flat(Gpu("node-a", 0), 400));
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->total.available, kBuckets * kStep / kHour, 1e-12);  // 15 s a sample
  std::string notes;
  for (const std::string& n : r->notes) notes += n + "\n";
  EXPECT_NE(notes.find("no active scrape target"), std::string::npos) << notes;
}

TEST_F(Accounting, TheSameGpuFromTwoScrapeJobsIsRefused) {
  AddGpu(Gpu("node-a", 0), 50, true, false, false);
  auto dcgm = Gpu("node-a", 0);
  dcgm["job"] = "dcgm-exporter";
  in_.samples.push_back(Flat(dcgm, 4));
  in_.util_sum.push_back(Flat(dcgm, 200));
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--match 'job=\"fullburn\"'"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

TEST_F(Accounting, Renderers) {
  AddGpu(Gpu("node-a", 0, {{"hpc_job", "101"}, {"user", "alice"}}), 0, true, true, false);
  AddGpu(Gpu("node-b", 0, {{"hpc_job", "202"}, {"user", "bob"}}), 95, true, false, false);
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_TRUE(r.ok());
  std::string text = RenderFleetText(*r, "job", 10);
  EXPECT_NE(text.find("2 GPUs on 2 nodes"), std::string::npos) << text;
  size_t first = text.find("slurm job 101"), second = text.find("slurm job 202");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_LT(first, second) << text;
  EXPECT_NE(text.find("healthy"), std::string::npos) << text;
  EXPECT_NE(RenderFleetText(*r, "user", 1).find("... 1 more (--top)"), std::string::npos);
  nlohmann::json j = FleetJson(*r);
  EXPECT_EQ(j["gpus"], 2);
  EXPECT_EQ(j["jobs"][0]["identity"]["hpc_job"], "101");
  EXPECT_DOUBLE_EQ(j["hours"]["available"].get<double>(), r->total.available);
  EXPECT_EQ(j["over_time"]["times"].size(), static_cast<size_t>(kBuckets));
  std::string html = RenderFleetHtml(*r, "job", 10);
  EXPECT_NE(html.find("uPlot"), std::string::npos);
  EXPECT_NE(html.find("slurm job 101"), std::string::npos);
  // Self-contained: nothing is fetched from elsewhere.
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
}

// ---- the client's errors ----

// A server on a free loopback port, on its own thread, stopped on exit.
class FakeServer {
 public:
  FakeServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::yield();
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  std::string Url(const std::string& path = "") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

PromConnection Conn(const std::string& url, const std::string& token = "",
                    const std::string& user = "", const std::string& password = "") {
  PromConnection c;
  c.url = url;
  c.bearer_token = token;
  c.user = user;
  c.password = password;
  return c;
}

std::string ErrorOf(const PromConnection& c) {
  Result<PromClient> client = PromClient::Open(c);
  if (!client.ok()) return client.status().message();
  FleetQuery q;
  q.window_s = 3600;
  Result<FleetReport> r = QueryFleet(*client, q);
  return r.ok() ? "" : r.status().message();
}

const char kTimeAnswer[] =
    R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"1700000000"]}]}})";

// One split of a base URL for the Prometheus and the MLflow client.
TEST(HttpBase, ABaseUrlSplitsIntoTheServerAndThePrefixOfEveryRequest) {
  HttpBase b = SplitHttpBase("http://prom:9090/sub/path/");
  EXPECT_EQ(b.problem, HttpBase::Problem::kNone);
  EXPECT_EQ(b.scheme_host_port, "http://prom:9090");
  EXPECT_EQ(b.prefix, "/sub/path");
  b = SplitHttpBase("http://127.0.0.1:5000/");  // the root: no "//api/..."
  EXPECT_EQ(b.scheme_host_port, "http://127.0.0.1:5000");
  EXPECT_EQ(b.prefix, "");
  EXPECT_EQ(SplitHttpBase("http://h").prefix, "");
  EXPECT_EQ(SplitHttpBase("prom:9090").problem, HttpBase::Problem::kNotHttp);
  EXPECT_EQ(SplitHttpBase("file:///tmp/mlruns").problem, HttpBase::Problem::kNotHttp);
  EXPECT_EQ(SplitHttpBase("http:///x").problem, HttpBase::Problem::kNoHost);
  EXPECT_EQ(SplitHttpBase("https://").problem, HttpBase::Problem::kNoHost);
}

TEST(PromClientErrors, BadUrlsAndUnreachableServers) {
  EXPECT_NE(ErrorOf(Conn("prometheus:9090")).find("is not an http:// or https:// URL"), std::string::npos);
  EXPECT_NE(ErrorOf(Conn("http:///x")).find("names no host"), std::string::npos);
  int closed_port;
  {
    FakeServer s;
    closed_port = std::stoi(s.Url().substr(s.Url().rfind(':') + 1));
  }
  std::string e = ErrorOf(Conn("http://127.0.0.1:" + std::to_string(closed_port)));
  EXPECT_NE(e.find("cannot reach Prometheus at http://127.0.0.1:"), std::string::npos) << e;
  EXPECT_NE(e.find("is it running"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(PromClientErrors, CredentialsRefused) {
  FakeServer s;
  s.server().Get("/api/v1/query", [](const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("Authorization") != "Bearer s3cret") {
      res.status = 401;
      res.set_content("Unauthorized\n", "text/plain");
      return;
    }
    res.set_content(kTimeAnswer, "application/json");
  });
  std::string e = ErrorOf(Conn(s.Url()));
  EXPECT_NE(e.find("refused the request (401 Unauthorized)"), std::string::npos) << e;
  EXPECT_NE(e.find("FULLBURN_PROMETHEUS_TOKEN"), std::string::npos) << e;
  PromConnection with_token = Conn(s.Url(), "s3cret");
  e = ErrorOf(with_token);
  // Past the credentials: this stand-in has no other endpoint.
  EXPECT_EQ(e.find("refused the request"), std::string::npos) << e;
  PromConnection both = Conn(s.Url(), "s3cret", "bob", "pw");
  EXPECT_NE(ErrorOf(both).find("keep one"), std::string::npos);
}

TEST(PromClientErrors, BasicAuthAndForbidden) {
  FakeServer s;
  s.server().Get("/prom/api/v1/query", [](const httplib::Request& req, httplib::Response& res) {
    // "bob:pw" in base64
    res.status = req.get_header_value("Authorization") == "Basic Ym9iOnB3" ? 403 : 401;
  });
  PromConnection c = Conn(s.Url("/prom/"), "", "bob", "pw");
  std::string e = ErrorOf(c);
  EXPECT_NE(e.find("(403 Forbidden)"), std::string::npos) << e;  // the path prefix was kept
}

TEST(PromClientErrors, NotPrometheus) {
  FakeServer s;
  s.server().Get("/api/v1/query", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("<html>Grafana</html>", "text/html");
  });
  std::string e = ErrorOf(Conn(s.Url()));
  EXPECT_NE(e.find("is the URL a Prometheus server?"), std::string::npos) << e;
  FakeServer empty;
  e = ErrorOf(Conn(empty.Url()));
  EXPECT_NE(e.find("has no Prometheus API (/api/v1/query: 404)"), std::string::npos) << e;
  EXPECT_NE(ErrorOf(Conn("https://" + empty.Url().substr(7))).find("TLS"), std::string::npos);
}

// A Prometheus whose clock is an hour behind this machine's: the window
// follows the server's clock (its samples' stamps), and the report says how
// far apart the two are.
TEST(PromClientErrors, ThisMachinesClockApartFromPrometheusIsStated) {
  FakeServer s;
  const double skew = 3600;
  auto server_now = [&] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
               .count() -
           skew;
  };
  s.server().Get("/api/v1/query", [&](const httplib::Request&, httplib::Response& res) {
    std::string t = std::to_string(server_now());
    res.set_content(R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[)" +
                        t + ",\"" + t + "\"]}]}}",
                    "application/json");
  });
  s.server().Get("/api/v1/targets", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        R"({"status":"success","data":{"activeTargets":[{"labels":{"job":"fullburn","instance":"n1:9400"},"scrapeInterval":"15s"}]}})",
        "application/json");
  });
  s.server().Get("/api/v1/label/__name__/values", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"success","data":["DCGM_FI_DEV_GPU_UTIL"]})", "application/json");
  });
  // Every range query: one GPU, one sample at 50% in each bucket.
  s.server().Get("/api/v1/query_range", [](const httplib::Request& req, httplib::Response& res) {
    double start = std::stod(req.get_param_value("start"));
    double end = std::stod(req.get_param_value("end"));
    double step = std::stod(req.get_param_value("step"));
    bool sum = req.get_param_value("query").rfind("sum_over_time", 0) == 0;
    std::string values;
    for (double t = start; t <= end + 1e-6; t += step)
      values += (values.empty() ? "" : ",") + std::string("[") + std::to_string(t) + ",\"" +
                (sum ? "50" : "1") + "\"]";
    res.set_content(
        R"({"status":"success","data":{"resultType":"matrix","result":[{"metric":{"job":"fullburn","instance":"n1:9400","Hostname":"n1","gpu":"0","UUID":"GPU-1"},"values":[)" +
            values + "]}]}}",
        "application/json");
  });
  Result<PromClient> client = PromClient::Open(Conn(s.Url()));
  ASSERT_TRUE(client.ok()) << client.status().message();
  FleetQuery q;
  q.window_s = 60;
  Result<FleetReport> r = QueryFleet(*client, q);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::string notes;
  for (const std::string& n : r->notes) notes += n + "\n";
  // +3600, or +3601 when the query's round trip took over half a second.
  EXPECT_TRUE(notes.find("this machine's clock is +3600 s off Prometheus's") != std::string::npos ||
              notes.find("this machine's clock is +3601 s off Prometheus's") != std::string::npos)
      << notes;
  // The window is the server's last minute, not this machine's.
  EXPECT_NEAR(r->end, server_now() - 15, 5);
  EXPECT_NEAR(r->total.used / r->total.available, 0.5, 1e-9);
}

TEST(PromClientErrors, ServerWithoutFullburnsSeries) {
  FakeServer s;
  s.server().Get("/api/v1/query", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kTimeAnswer, "application/json");
  });
  s.server().Get("/api/v1/label/__name__/values",
                 [](const httplib::Request&, httplib::Response& res) {
                   res.set_content(R"({"status":"success","data":[]})", "application/json");
                 });
  std::string e = ErrorOf(Conn(s.Url()));
  EXPECT_NE(e.find("has no DCGM_FI_DEV_GPU_UTIL series (GPU utilization): scrape `fullburn serve`"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

// ---- messages true to the input (issue 53) ----

// A key whose value is not JSON is named: the one that was broken.
TEST(PromParse, AMalformedAnswerNamesTheKeyWhoseValueIsBroken) {
  auto message = [](const std::string& body) {
    Result<PromMatrix> m = ParsePromMatrix(body, 0, 1);
    return m.ok() ? std::string("ok") : m.status().message();
  };
  auto says = [](const std::string& what) {
    return "Prometheus's answer is not its API's JSON (" + what + "): is the URL a Prometheus server?";
  };
  EXPECT_EQ(message(R"({"status":"success","warnings":[1,,2],"data":{"result":[]}})"), says("warnings"));
  EXPECT_EQ(message(R"({"status":"success","data":{"resultType":"matrix","stats":{"a":},"result":[]}})"),
            says("stats"));
  EXPECT_EQ(message(R"({"status":"success","data":{"result":[{"metric":{},"exemplars":[}]}})"),
            says("exemplars"));
  EXPECT_EQ(message(R"({"status":"success","data":{"result":[{"metric":{"gpu":1}}]}})"), says("labels"));
}

TEST_F(Accounting, TheTwoScrapeJobsAndTheirGpuAreNamed) {
  AddGpu(Gpu("node-b", 3), 50, true, false, false);
  auto dcgm = Gpu("node-b", 3);
  dcgm["job"] = "dcgm-exporter";
  in_.samples.push_back(Flat(dcgm, 4));
  in_.util_sum.push_back(Flat(dcgm, 200));
  Result<FleetReport> r = ComputeFleet(in_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "DCGM_FI_DEV_GPU_UTIL of node-b gpu 3 GPU-node-b-3 comes from two scrape jobs ('dcgm-exporter' "
            "and 'fullburn'), which would count its hours twice: pass --match 'job=\"fullburn\"' (fullburn "
            "serve's scrape job)");
}

TEST(PromClientErrors, AnotherHttpStatusIsQuotedWithTheFirstLineOfItsBody) {
  FakeServer s;
  s.server().Get("/api/v1/query", [](const httplib::Request&, httplib::Response& res) {
    res.status = 502;
    res.set_content("upstream prometheus-0 is down\nretry later\n", "text/plain");
  });
  EXPECT_EQ(ErrorOf(Conn(s.Url())),
            "Prometheus at " + s.Url() + " answered /api/v1/query with HTTP 502: upstream prometheus-0 is down");
}

// A server that answers the time, its targets (`targets`) and the metric names.
void ServeTheBasics(FakeServer& s, const std::string& targets, const std::string& names) {
  s.server().Get("/api/v1/query", [](const httplib::Request&, httplib::Response& res) {
    std::string t = std::to_string(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    res.set_content(R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[)" + t +
                        ",\"" + t + "\"]}]}}",
                    "application/json");
  });
  s.server().Get("/api/v1/targets", [targets](const httplib::Request&, httplib::Response& res) {
    res.set_content(targets, "application/json");
  });
  s.server().Get("/api/v1/label/__name__/values", [names](const httplib::Request&, httplib::Response& res) {
    res.set_content(names, "application/json");
  });
}

// The interval quoted is the target's, as Prometheus's /api/v1/targets gives it.
TEST(PromClientErrors, AWindowShorterThanTheScrapeIntervalQuotesTheTargets) {
  FakeServer s;
  ServeTheBasics(
      s,
      R"({"status":"success","data":{"activeTargets":[{"labels":{"job":"fullburn","instance":"n1:9400"},"scrapeInterval":"2h"}]}})",
      R"({"status":"success","data":["DCGM_FI_DEV_GPU_UTIL"]})");
  EXPECT_EQ(ErrorOf(Conn(s.Url())), "--window 3600 s is shorter than one scrape interval (7200 s): widen it");
}

// Fields of another type in the targets' and the names' answers threw out of
// nlohmann's get() and value() and would have ended fullburn fleet.
TEST(PromClientErrors, TargetsAndNamesOfOtherTypesAreNotExceptions) {
  FakeServer s;
  ServeTheBasics(
      s,
      R"({"status":"success","data":{"activeTargets":[{"labels":"n1","scrapeInterval":"15s"},)"
      R"({"labels":{"job":7},"scrapeInterval":"30s"},{"labels":{"job":"a"},"scrapeInterval":15},)"
      R"({"labels":{"job":"fullburn"},"scrapeInterval":"2h"}]}})",
      R"({"status":"success","data":["DCGM_FI_DEV_GPU_UTIL"]})");
  std::string e;
  EXPECT_NO_THROW(e = ErrorOf(Conn(s.Url())));
  EXPECT_EQ(e, "--window 3600 s is shorter than one scrape interval (7200 s): widen it");
  FakeServer names;
  ServeTheBasics(names, R"({"status":"success","data":{"activeTargets":[]}})", R"({"status":1,"data":[]})");
  EXPECT_NO_THROW(e = ErrorOf(Conn(names.Url())));
  EXPECT_EQ(e, "Prometheus at " + names.Url() +
                   " answered /api/v1/label/__name__/values with something else than its API's JSON: is the URL "
                   "a Prometheus server?");
}

}  // namespace
}  // namespace fullburn
