// What fullburn sends to MLflow, decided without a server: what a run lacks,
// the log-batch limits, the run's end, which run a job has. The server
// itself is tests/python/test_trackers.py's.
#include "fullburn/mlflow.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace fullburn {
namespace {

TEST(NotYetLogged, SendsOnlyWhatIsNewerThanTheRunsLatestPerKey) {
  MlflowRun run;
  run.latest["a"] = {5, 1000500};
  std::vector<TrackerPoint> points = {{"a", 1, 4, 1000.4}, {"a", 2, 5, 1000.5}, {"a", 3, 5, 1000.6},
                                      {"a", 4, 6, 1000.7}, {"b", 5, 1, 999}};
  std::vector<TrackerPoint> rest = NotYetLogged(points, run);
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_EQ(rest[0].value, 3);  // same step, a later sample
  EXPECT_EQ(rest[1].value, 4);
  EXPECT_EQ(rest[2].key, "b");  // a key the run does not have
}

TEST(SplitBatches, KeepsWithinTheCountAndTheSize) {
  std::vector<TrackerPoint> points(2500, TrackerPoint{"fullburn/step_time_ms", 1, 1, 1});
  auto batches = SplitBatches(points);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].size(), kMaxBatchMetrics);
  EXPECT_EQ(batches[2].size(), 500u);
  std::vector<TrackerPoint> long_keys(50, TrackerPoint{std::string(200, 'k'), 1, 1, 1});
  auto by_size = SplitBatches(long_keys, 1000, 1000);
  EXPECT_EQ(by_size.size(), 17u);  // three 270-byte metrics fit in 1000 bytes
  for (const auto& b : by_size) EXPECT_LE(b.size() * 270, 1000u);
  EXPECT_TRUE(SplitBatches({}).empty());
}

TEST(RunEndRecords, NamesTheCommandTheFrameworkAndTheTopCause) {
  RunData run;
  run.run.id = 12;
  run.run.command = {"python", "train.py", "--lr", "0.1"};
  run.run.config_json = R"({"interval_s":1})";
  run.events.push_back({1, "dataloader", R"({"num_workers":2,"framework":"lightning"})"});
  StepRecord s;
  s.step = 1;
  run.steps.push_back(s);
  Finding top;
  top.cause = CauseId::kInputWorkers;
  top.share_lost = 0.482;
  top.title = "input-bound";
  MlflowRunEnd end = RunEndRecords(run, {top});
  std::map<std::string, std::string> params(end.params.begin(), end.params.end());
  std::map<std::string, std::string> tags(end.tags.begin(), end.tags.end());
  EXPECT_EQ(params["fullburn.command"], "python train.py --lr 0.1");
  EXPECT_EQ(params["fullburn.config"], R"({"interval_s":1})");
  EXPECT_EQ(params["fullburn.framework"], "Lightning");
  EXPECT_EQ(tags["fullburn.top_cause"], "input_workers");
  EXPECT_EQ(tags["fullburn.top_cause_pct"], "48.2");
  EXPECT_EQ(tags["fullburn.run_id"], "12");
  RunData bare;
  MlflowRunEnd none = RunEndRecords(bare, {});
  std::map<std::string, std::string> bare_params(none.params.begin(), none.params.end());
  EXPECT_EQ(bare_params["fullburn.framework"], "none seen");
}

TEST(MlflowRunOf, TakesTheNewestRunOnThisServer) {
  std::vector<RunEvent> events = {
      {1, kMlflowRunEvent, R"({"run_id":"a","tracking_uri":"http://h:5000/"})"},
      {2, kMlflowRunEvent, R"({"run_id":"b","tracking_uri":"file:///tmp/mlruns"})"},
      {3, "dataloader", R"({"run_id":"c"})"},
      {4, kMlflowRunEvent, R"({"run_id":7})"}};
  EXPECT_EQ(MlflowRunOf(events, "http://h:5000"), "a");
  EXPECT_EQ(MlflowRunOf(events, ""), "b");
  EXPECT_EQ(MlflowRunOf(events, "http://other:5000"), "");
}

TEST(MlflowClient, RefusesWhatIsNoTrackingServerInOneLine) {
  ::unsetenv("MLFLOW_TRACKING_URI");
  auto none = MlflowClient::Open(MlflowConnection::FromEnv(""));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("MLFLOW_TRACKING_URI"), std::string::npos);
  auto file = MlflowClient::Open(MlflowConnection::FromEnv("file:///tmp/mlruns"));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("mlflow server"), std::string::npos) << file.status().message();
  auto ok = MlflowClient::Open(MlflowConnection::FromEnv("http://127.0.0.1:5000/"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->uri(), "http://127.0.0.1:5000");
}

TEST(MlflowClient, AServerThatIsNotThereIsUnavailableNamingIt) {
  // Port 1 on loopback: nothing listens there (a refused connection).
  auto c = MlflowClient::Open(MlflowConnection::FromEnv("http://127.0.0.1:1"));
  ASSERT_TRUE(c.ok());
  auto got = c->GetRun("x");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(got.status().message().find("cannot reach MLflow at http://127.0.0.1:1"), std::string::npos)
      << got.status().message();
}

// A server on a loopback port answering as MLflow's does when it refuses:
// the faults a real `mlflow server` cannot be made to give on demand.
class RefusingServer {
 public:
  RefusingServer() {
    server_.Post("/api/2.0/mlflow/runs/log-batch", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      nlohmann::json body = nlohmann::json::parse(req.body);
      ++requests_;
      if (status_ != 200) {
        res.status = status_;
        res.set_content(R"({"error_code":"TEMPORARILY_UNAVAILABLE","message":"try later"})", "application/json");
        return;
      }
      for (const auto& m : body["metrics"])
        if (m["key"] == "fullburn/refused") {
          res.status = 400;
          res.set_content(R"({"error_code":"INVALID_PARAMETER_VALUE","message":"Invalid value \"fullburn/refused\""})",
                          "application/json");
          return;
        }
      for (const auto& m : body["metrics"]) logged_.push_back(m["key"].get<std::string>());
      res.set_content("{}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::yield();
  }
  ~RefusingServer() {
    server_.stop();
    thread_.join();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Answer(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
  }
  int requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<std::string> logged() {
    std::lock_guard<std::mutex> lock(mu_);
    return logged_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  int status_ = 200, requests_ = 0;
  std::vector<std::string> logged_;
};

TEST(MlflowClient, ARefusedKeyIsFoundLeftOutAndNotSentAgain) {
  RefusingServer server;
  auto c = MlflowClient::Open(MlflowConnection::FromEnv(server.Url()));
  ASSERT_TRUE(c.ok());
  std::set<std::string> refused;
  std::vector<TrackerPoint> points = {{"fullburn/a", 1, 1, 10}, {"fullburn/refused", 2, 1, 10},
                                      {"fullburn/b", 3, 1, 10}};
  Status s = c->LogBatch("run", points, {}, {}, &refused);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(refused, std::set<std::string>{"fullburn/refused"});
  std::vector<std::string> logged = server.logged();
  EXPECT_EQ(std::set<std::string>(logged.begin(), logged.end()), (std::set<std::string>{"fullburn/a", "fullburn/b"}));
  int before = server.requests();
  ASSERT_TRUE(c->LogBatch("run", points, {}, {}, &refused).ok());
  EXPECT_EQ(server.requests(), before + 1) << "the refused key is not tried again";
}

TEST(MlflowClient, ServerTroubleAndCredentialsAreToldApart) {
  RefusingServer server;
  auto c = MlflowClient::Open(MlflowConnection::FromEnv(server.Url()));
  ASSERT_TRUE(c.ok());
  std::set<std::string> refused;
  server.Answer(503);
  Status busy = c->LogBatch("run", {{"fullburn/a", 1, 1, 10}}, {}, {}, &refused);
  EXPECT_EQ(busy.code(), Status::Code::kUnavailable);
  EXPECT_NE(busy.message().find("HTTP 503: try later"), std::string::npos) << busy.message();
  server.Answer(401);
  Status denied = c->LogBatch("run", {{"fullburn/a", 1, 1, 10}}, {}, {}, &refused);
  EXPECT_EQ(denied.code(), Status::Code::kAborted);
  EXPECT_NE(denied.message().find("MLFLOW_TRACKING_TOKEN"), std::string::npos) << denied.message();
  EXPECT_TRUE(refused.empty()) << "a server in trouble refuses no key";
}

}  // namespace
}  // namespace fullburn
