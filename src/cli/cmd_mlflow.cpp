// fullburn-net's MLflow commands: `fullburn runs push RUN --mlflow URI` (a
// stored run, after the fact) and `mlflow-follow` (what `fullburn run
// --mlflow` starts beside the job: it reads the run from the store while it
// is recorded and sends it on, so the job never waits on the tracker).
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli.h"
#include "fullburn/diagnose.h"
#include "fullburn/mlflow.h"
#include "fullburn/report.h"
#include "fullburn/trackers.h"

namespace fullburn::cli {
namespace {

struct MlflowOptions {
  CommonOptions common;
  std::string run = "last";
  std::string uri;
  std::string experiment;
  // mlflow-follow: seconds to wait for the job's own MLflow run before making one.
  double join_wait_s = 20;
  double poll_s = 2;
  double end_wait_s = 20;  // after the run's end, how long it keeps trying to send
};

volatile std::sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

std::string ExperimentName(const MlflowOptions& o) {
  if (!o.experiment.empty()) return o.experiment;
  const char* env = std::getenv("MLFLOW_EXPERIMENT_NAME");
  return env && *env ? env : "Default";
}

std::string MlflowStatus(const RunInfo& run) {
  if (run.status == "running") return "";
  if (run.status == "finished" && run.exit_code && *run.exit_code == 0) return "FINISHED";
  if (run.status == "finished" || run.status == "failed_to_start") return "FAILED";
  return "KILLED";  // interrupted, detached
}

// One line per kind of trouble (a server that is down, credentials it
// refuses), not one per try, however the reason is worded; and one when it passes.
class Notes {
 public:
  void Trouble(const Status& s) {
    if (troubled_ && s.code() == last_) return;
    troubled_ = true;
    last_ = s.code();
    std::fprintf(stderr, "fullburn: mlflow: %s; fullburn tries again (the job goes on)\n", s.message().c_str());
  }
  void Cleared(const std::string& what) {
    if (!troubled_) return;
    troubled_ = false;
    std::fprintf(stderr, "fullburn: mlflow: %s\n", what.c_str());
  }
  bool troubled() const { return troubled_; }

 private:
  bool troubled_ = false;
  Status::Code last_ = Status::Code::kOk;
};

// The MLflow run a fullburn run goes to, and what it sends there.
class Sender {
 public:
  Sender(MlflowClient client, RunStore* store, int64_t run_id)
      : client_(std::move(client)), store_(store), run_id_(run_id) {}

  bool has_remote() const { return !remote_.run_id.empty(); }
  const MlflowRun& remote() const { return remote_; }
  bool own() const { return own_; }
  const std::string& uri() const { return client_.uri(); }

  // The job's own run (or the one fullburn sent to before): joined when it is there.
  Status Join(const std::string& mlflow_run_id) {
    auto got = client_.GetRun(mlflow_run_id);
    if (!got.ok()) return got.status();
    remote_ = *got;
    own_ = remote_.tags.count("fullburn.made_by") > 0;
    return Status::Ok();
  }

  Status Create(const RunInfo& run, const std::string& experiment) {
    auto id = client_.ExperimentId(experiment);
    if (!id.ok()) return id.status();
    auto made = client_.CreateRun(*id, run.name, run.start_time,
                                  {{"fullburn.made_by", "fullburn"}, {"fullburn.run_id", std::to_string(run.id)},
                                   {"mlflow.source.name", JoinedCommand(run.command)}});
    if (!made.ok()) return made.status();
    remote_ = *made;
    own_ = true;
    nlohmann::json data{{"run_id", remote_.run_id}, {"experiment_id", remote_.experiment_id},
                        {"tracking_uri", client_.uri()}, {"by", "fullburn"}};
    // Where a later `runs push` sends the rest; a store that refuses it only costs that.
    double t = std::max(0.0, std::chrono::duration<double>(
                                 std::chrono::system_clock::now().time_since_epoch()).count() -
                                 run.start_time);
    store_->AddEvent(run_id_, {t, kMlflowRunEvent, data.dump()});
    return Status::Ok();
  }

  Status Send(const std::vector<TrackerPoint>& points, const KeyValues& params, const KeyValues& tags) {
    size_t before = refused_.size();
    Status s = client_.LogBatch(remote_.run_id, points, params, tags, &refused_);
    if (refused_.size() > before) {
      std::string keys;
      for (const std::string& k : refused_) keys += (keys.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "fullburn: mlflow: %s refused the metric(s) %s: they are left out from now on\n",
                   client_.uri().c_str(), keys.c_str());
    }
    if (s.ok()) sent_ += points.size();
    return s;
  }

  // The run's end: what the live feed has not sent, params, tags, the
  // report and the findings, and (for a run fullburn made) its status.
  Status End(const RunData& data) {
    std::vector<Finding> findings = Diagnose(data);
    MlflowRunEnd end = RunEndRecords(data, findings);
    auto now = client_.GetRun(remote_.run_id);
    if (!now.ok()) return now.status();
    std::vector<TrackerPoint> rest = NotYetLogged(RunPoints(data, TrackerStyle::kMlflow), *now);
    if (Status s = Send(rest, end.params, end.tags); !s.ok()) return s;
    std::vector<ReportRun> report(1);
    report[0].data = data;
    report[0].findings = findings;
    Status html = client_.UploadArtifact(remote_, "fullburn-report.html", RenderHtmlReport(report), "text/html");
    Status json = html.ok() ? client_.UploadArtifact(remote_, "fullburn-diagnose.json",
                                                     FindingsJson(findings).dump(2), "application/json")
                            : html;
    if (!json.ok())
      std::fprintf(stderr, "fullburn: mlflow: the report was not attached: %s\n", json.message().c_str());
    else
      artifacts_ = 2;
    std::string status = MlflowStatus(data.run);
    if (own_ && !status.empty())
      if (Status s = client_.EndRun(remote_.run_id, status, data.run.end_time.value_or(data.run.start_time));
          !s.ok())
        return s;
    return Status::Ok();
  }

  size_t sent() const { return sent_; }
  int artifacts() const { return artifacts_; }

 private:
  MlflowClient client_;
  RunStore* store_;
  int64_t run_id_;
  MlflowRun remote_;
  bool own_ = false;
  std::set<std::string> refused_;
  size_t sent_ = 0;
  int artifacts_ = 0;
};

Result<Sender> OpenSender(const MlflowOptions& o, RunStore* store, int64_t run_id) {
  auto client = MlflowClient::Open(MlflowConnection::FromEnv(o.uri));
  if (!client.ok()) return client.status();
  return Sender(std::move(*client), store, run_id);
}

// With the CPU it took: what following a run costs is said, not guessed.
void SayDone(const Sender& s, const RunInfo& run, const char* how) {
  rusage self{};
  ::getrusage(RUSAGE_SELF, &self);
  double cpu_s = self.ru_utime.tv_sec + self.ru_stime.tv_sec + 1e-6 * (self.ru_utime.tv_usec + self.ru_stime.tv_usec);
  std::fprintf(stderr,
               "fullburn: mlflow: run %lld %s: %zu metric values%s into %s run %s (experiment %s) at %s "
               "(%.2f s of CPU)\n",
               static_cast<long long>(run.id), how, s.sent(), s.artifacts() ? ", params, tags, the report" : "",
               s.own() ? "its" : "the job's", s.remote().run_id.c_str(), s.remote().experiment_id.c_str(),
               s.uri().c_str(), cpu_s);
}

int Push(const MlflowOptions& o) {
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  auto data = (*store)->LoadRun(o.run);
  if (!data.ok()) return Fail(data.status().message());
  auto sender = OpenSender(o, store->get(), data->run.id);
  if (!sender.ok()) return Fail(sender.status().message());
  std::string earlier = MlflowRunOf(data->events, sender->uri());
  Status joined = earlier.empty() ? Status::NotFound("") : sender->Join(earlier);
  if (!joined.ok() && joined.code() != Status::Code::kNotFound && joined.code() != Status::Code::kInvalidArgument)
    return Fail("mlflow: " + joined.message(), 1);
  if (!joined.ok())
    if (Status s = sender->Create(data->run, ExperimentName(o)); !s.ok()) return Fail("mlflow: " + s.message(), 1);
  if (Status s = sender->End(*data); !s.ok())
    return Fail("mlflow: " + s.message() + "; run fullburn runs push " + std::to_string(data->run.id) +
                    " --mlflow " + sender->uri() + " again: what was sent is not sent twice",
                1);
  SayDone(*sender, data->run, "pushed");
  return 0;
}

int Follow(const MlflowOptions& o) {
  std::signal(SIGTERM, OnStop);
  std::signal(SIGINT, SIG_IGN);  // a terminal's Ctrl-C is the job's; the run's end tells this one
  auto store = OpenStore(o.common);
  if (!store.ok()) return Fail(store.status().message());
  auto run = (*store)->GetRun(o.run);
  if (!run.ok()) return Fail(run.status().message());
  auto sender = OpenSender(o, store->get(), run->id);
  if (!sender.ok()) return Fail("mlflow: " + sender.status().message() + "; the run goes on without it", 1);

  TrackerFeed feed(*run, TrackerStyle::kMlflow);
  std::vector<TrackerPoint> pending;
  std::vector<RunEvent> events;
  Notes notes;
  const char* env_run = std::getenv("MLFLOW_RUN_ID");
  std::string join = env_run && *env_run ? env_run : "";
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double next_try = 0, backoff = o.poll_s, ended_at = -1;
  std::string now_tag, not_here;
  // While the server refuses, what is unsent waits here up to this many
  // values; past it the feed is not read (the store keeps the rest, read
  // from where the feed stopped once these are sent), so memory stays bounded.
  constexpr size_t kMaxPending = 500000;
  bool finished = false;
  for (;;) {
    Result<TrackerBatch> batch = Status::Unavailable("not read: values wait to be sent");
    if (pending.size() < kMaxPending) batch = feed.Poll(store->get());
    if (!batch.ok() && pending.size() >= kMaxPending) {
      // not read this time
    } else if (!batch.ok()) {
      notes.Trouble(Status::IoError("cannot read the run from the store: " + batch.status().message()));
    } else {
      finished = finished || batch->finished;
      pending.insert(pending.end(), batch->points.begin(), batch->points.end());
      events.insert(events.end(), batch->events.begin(), batch->events.end());
      if (batch->now) {
        std::string text = RenderLiveFinding(batch->now);
        now_tag = text.rfind(" | now: ", 0) == 0 ? text.substr(8) : text;
      }
    }
    if (finished && ended_at < 0) ended_at = elapsed();
    bool due = elapsed() >= next_try;
    Status s;
    if (!sender->has_remote() && due) {
      std::string id = join.empty() ? MlflowRunOf(events, sender->uri()) : join;
      if (id == not_here) id.clear();
      if (!id.empty()) {
        s = sender->Join(id);
        if (s.ok()) {
          std::fprintf(stderr, "fullburn: mlflow: logging into the job's own MLflow run %s at %s\n", id.c_str(),
                       sender->uri().c_str());
        } else if (s.code() == Status::Code::kInvalidArgument) {
          std::fprintf(stderr, "fullburn: mlflow: the job's MLflow run %s is not on %s (%s): fullburn makes a run of its own\n",
                       id.c_str(), sender->uri().c_str(), s.message().c_str());
          not_here = id;
          join.clear();
          s = Status::Ok();
        }
      }
      // No run of the job's yet: it may start one in its first steps.
      if (!sender->has_remote() && s.ok() && (elapsed() >= o.join_wait_s || finished)) {
        s = sender->Create(*run, ExperimentName(o));
        if (s.ok())
          std::fprintf(stderr, "fullburn: mlflow: logging into run %s of experiment %s at %s\n",
                       sender->remote().run_id.c_str(), ExperimentName(o).c_str(), sender->uri().c_str());
      }
    }
    if (sender->has_remote() && due && (!pending.empty() || !now_tag.empty())) {
      KeyValues tags;
      if (!now_tag.empty()) tags.emplace_back("fullburn.now", now_tag);
      s = sender->Send(pending, {}, tags);
      if (s.ok()) {
        pending.clear();
        now_tag.clear();
      }
    }
    if (sender->has_remote() && s.ok() && finished && pending.empty()) {
      auto data = (*store)->LoadRun(std::to_string(run->id));
      s = data.ok() ? sender->End(*data) : data.status();
      if (s.ok()) {
        notes.Cleared("sending again");
        SayDone(*sender, run.value(), "logged live");
        return 0;
      }
    }
    if (!s.ok()) {
      notes.Trouble(s);
      next_try = elapsed() + backoff;
      backoff = std::min(backoff * 2, 60.0);
    } else if (due) {
      notes.Cleared("sending again");
      backoff = o.poll_s;
    }
    if (g_stop || (ended_at >= 0 && elapsed() - ended_at > o.end_wait_s)) {
      std::fprintf(stderr,
                   "fullburn: mlflow: %zu metric values of run %lld were not sent (%s); the store keeps "
                   "them: fullburn runs push %lld --mlflow %s\n",
                   pending.size(), static_cast<long long>(run->id),
                   notes.troubled() ? "the server did not take them" : "the run ended first",
                   static_cast<long long>(run->id), sender->uri().c_str());
      return 1;
    }
    for (double slept = 0; slept < o.poll_s && !g_stop; slept += 0.1)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

void SetupMlflow(CLI::App& app) {
  auto o = std::make_shared<MlflowOptions>();
  CLI::App* runs = app.add_subcommand("runs", "Stored runs (fullburn-net: runs push)");
  runs->require_subcommand(1);
  CLI::App* push = runs->add_subcommand("push", kRunsPushAbout);
  push->add_option("RUN", o->run, "Run id, or 'last'")->required();
  push->add_option("--mlflow", o->uri, kMlflowUriHelp);
  push->add_option("--mlflow-experiment", o->experiment, kMlflowExperimentHelp);
  AddStoreOption(push, &o->common);
  push->callback([o] { ExitCode() = Push(*o); });

  auto f = std::make_shared<MlflowOptions>();
  CLI::App* follow = app.add_subcommand("mlflow-follow", "What fullburn run --mlflow starts beside the job");
  follow->group("");  // internal: fullburn run's
  follow->add_option("RUN", f->run)->required();
  follow->add_option("--mlflow", f->uri, kMlflowUriHelp);
  follow->add_option("--mlflow-experiment", f->experiment, kMlflowExperimentHelp);
  AddStoreOption(follow, &f->common);
  follow->add_option("--join-wait", f->join_wait_s)->capture_default_str()->envname("FULLBURN_MLFLOW_JOIN_WAIT");
  follow->add_option("--end-wait", f->end_wait_s)->capture_default_str()->envname("FULLBURN_MLFLOW_END_WAIT");
  follow->callback([f] { ExitCode() = Follow(*f); });
}

}  // namespace fullburn::cli
