// fullburn serve: Prometheus exposition of the latest sample at /metrics,
// and of the jobs being recorded on this host (their last minute), over
// HttpServer (fullburn/http_server.h: idle and slow clients cost no thread).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <thread>

#include "cli.h"
#include "fullburn/http_server.h"
#include "fullburn/report.h"
#include "fullburn/web_config.h"
#include "serve_jobs.h"

namespace fullburn::cli {
namespace {

struct ServeOptions {
  CommonOptions common;
  std::string listen = "127.0.0.1:9400";
  double idle_timeout_s = HttpServerOptions().idle_timeout_s;
  unsigned max_connections = HttpServerOptions().max_connections;
  unsigned max_connections_per_ip = HttpServerOptions().max_connections_per_ip;
  std::string web_config;
};

bool SplitHostPort(const std::string& s, std::string* host, int* port) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = s.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  char* end = nullptr;
  long p = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || end == s.c_str() + colon + 1 || p < 0 || p > 65535) return false;
  *port = static_cast<int>(p);
  return true;
}

int Serve(const ServeOptions& opts) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(opts.listen, &host, &port))
    return Fail("--listen '" + opts.listen + "' is not HOST:PORT, e.g. 127.0.0.1:9400");
  // Read before anything starts: a bad file stops serve with its one line.
  WebConfig web;
  if (!opts.web_config.empty()) {
    Result<WebConfig> read = ReadWebConfig(opts.web_config);
    if (!read.ok()) return Fail(read.status().message());
    web = std::move(*read);
  }
  // Signals go to a dedicated thread that stops the server cleanly. Blocked
  // before any thread starts (NVML's PCIe reader too), so all inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  Result<std::unique_ptr<GpuSource>> gpus = OpenGpus();
  if (!gpus.ok()) return Fail(gpus.status().message());
  NoteIfGpusUnavailable(**gpus);

  Sampler sampler(Env::Default(), gpus->get(), SamplerOptions{opts.common.interval_s, -1});
  // Rates need two readings: give the first scrape a real interval.
  sampler.SampleOnce();
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(opts.common.interval_s, 0.25)));
  sampler.Start(nullptr);
  const std::string hostname = HostName();
  const std::vector<GpuInfo> gpu_info = (*gpus)->gpus();
  // The jobs: a store that cannot be opened costs them, not the machine's metrics.
  auto jobs = std::make_unique<JobsWatcher>(StorePath(opts.common), Env::Default(), hostname);
  jobs->Poll();
  if (std::string problem = jobs->Problem(); !problem.empty()) {
    std::fprintf(stderr, "fullburn: %s; serving the machine's metrics without the jobs'\n",
                 problem.c_str());
    jobs.reset();
  }
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool stopping = false;
  std::thread poller([&] {
    std::unique_lock<std::mutex> lock(poll_mu);
    while (jobs && !stopping) {
      lock.unlock();
      jobs->Poll();
      lock.lock();
      poll_cv.wait_for(lock, std::chrono::duration<double>(opts.common.interval_s),
                       [&] { return stopping; });
    }
  });
  auto stop_poller = [&] {
    {
      std::lock_guard<std::mutex> lock(poll_mu);
      stopping = true;
    }
    poll_cv.notify_all();
    poller.join();
  };

  // Who holds each GPU is read at each scrape, from the snapshot's processes.
  GpuHolders holders(Env::Default());
  std::mutex holders_mu;
  auto metrics = [&] {
    std::optional<Snapshot> s = sampler.Latest();
    std::vector<JobNow> running = jobs ? jobs->Jobs() : std::vector<JobNow>();
    HttpResponse res;
    res.content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (s) {
      std::vector<GpuInfo> labelled = gpu_info;
      {
        std::lock_guard<std::mutex> lock(holders_mu);
        LabelHolders(s->gpus, holders.Labels(s->gpus, RecordedJobs(running)), &labelled);
      }
      res.body = RenderPrometheus(*s, labelled, hostname);
    }
    if (jobs) res.body += RenderJobsPrometheus(running, hostname);
    return res;
  };
  auto healthz = [] {
    HttpResponse res;
    res.body = "ok\n";
    return res;
  };
  HttpServerOptions http;
  http.host = host;
  http.port = port;
  http.idle_timeout_s = opts.idle_timeout_s;
  http.max_connections = opts.max_connections;
  http.max_connections_per_ip = opts.max_connections_per_ip;
  http.web = web;
  Result<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(http, {{"/metrics", metrics}, {"/healthz", healthz}});
  if (!server.ok()) {
    stop_poller();
    sampler.Stop();
    return Fail(server.status().message());
  }
  int bound = (*server)->port();
  bool loopback = host == "127.0.0.1" || host == "localhost" || host == "::1";
  if (!loopback && (!web.tls() || web.basic_auth_users.empty()))
    std::fprintf(stderr,
                 "fullburn: warning: listening on %s, reachable from other machines, %s: its series name "
                 "users and jobs (--web-config adds TLS and basic auth)\n",
                 host.c_str(), web.tls() ? "without basic auth" : "in plain HTTP");
  std::string security = opts.web_config.empty() ? "" : ", " + web.Describe();
  std::fprintf(stderr, "fullburn: serving %s://%s:%d/metrics%s (Ctrl-C to stop)\n", web.tls() ? "https" : "http",
               host.c_str(), bound, security.c_str());
  // Serving happens on the server's thread; this one waits for a signal.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*server)->Stop();
  stop_poller();
  sampler.Stop();
  return 0;
}

}  // namespace

void SetupServe(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* serve = app.add_subcommand("serve", kServeAbout);
  serve->add_option("--listen", opts->listen, "HOST:PORT to listen on (port 0: any free port)")
      ->envname("FULLBURN_LISTEN")
      ->capture_default_str();
  serve->add_option("--idle-timeout", opts->idle_timeout_s,
                    "Seconds a connection may send nothing before it is closed (1 to 3600)")
      ->envname("FULLBURN_IDLE_TIMEOUT")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  serve->add_option("--max-connections", opts->max_connections,
                    "Connections served at once; more wait in the kernel's queue until one closes (16 to 1000000)")
      ->envname("FULLBURN_MAX_CONNECTIONS")
      ->check(CLI::Range(16u, 1000000u))
      ->capture_default_str();
  serve->add_option("--max-connections-per-ip", opts->max_connections_per_ip,
                    "Connections one client address may hold (0: no limit); more are closed at once, so one "
                    "host cannot take all of --max-connections")
      ->envname("FULLBURN_MAX_CONNECTIONS_PER_IP")
      ->check(CLI::Range(0u, 1000000u))
      ->capture_default_str();
  serve->add_option("--web-config", opts->web_config,
                    "exporter-toolkit's web configuration file (as node_exporter's --web.config.file): "
                    "TLS, basic auth, headers, rate limit (docs/metrics.md)")
      ->envname("FULLBURN_WEB_CONFIG");
  AddIntervalOption(serve, &opts->common, 1.0);
  AddStoreOption(serve, &opts->common);
  serve->callback([opts] { ExitCode() = Serve(*opts); });
}

}  // namespace fullburn::cli
