// fullburn serve: Prometheus exposition of the latest sample at /metrics,
// and of the jobs being recorded on this host (their last minute).
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <thread>

#include "cli.h"
#include "fullburn/report.h"
#include "serve_jobs.h"

namespace fullburn::cli {
namespace {

struct ServeOptions {
  CommonOptions common;
  std::string listen = "127.0.0.1:9400";
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

  httplib::Server server;
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // exporter bind the same port silently; a port in use must be an error.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Who holds each GPU is read at each scrape, from the snapshot's processes.
  GpuHolders holders(Env::Default());
  std::mutex holders_mu;
  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    std::optional<Snapshot> s = sampler.Latest();
    std::vector<JobNow> running = jobs ? jobs->Jobs() : std::vector<JobNow>();
    std::string text;
    if (s) {
      std::vector<GpuInfo> labelled = gpu_info;
      {
        std::lock_guard<std::mutex> lock(holders_mu);
        LabelHolders(s->gpus, holders.Labels(s->gpus, RecordedJobs(running)), &labelled);
      }
      text = RenderPrometheus(*s, labelled, hostname);
    }
    if (jobs) text += RenderJobsPrometheus(running, hostname);
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  if (!server.bind_to_port(host.c_str(), port)) {
    stop_poller();
    return Fail("cannot listen on " + opts.listen + " (address in use or not local): choose another --listen");
  }
  int bound = port == 0 ? -1 : port;
  if (port == 0) {
    // bind_to_port with 0 does not tell the port; rebind to an OS-chosen one.
    server.stop();
    bound = server.bind_to_any_port(host.c_str());
    if (bound < 0) {
      stop_poller();
      return Fail("cannot listen on " + host + ": choose another --listen");
    }
  }
  if (host != "127.0.0.1" && host != "localhost" && host != "::1")
    std::fprintf(stderr, "fullburn: warning: listening on %s, reachable from other machines\n", host.c_str());
  std::fprintf(stderr, "fullburn: serving http://%s:%d/metrics (Ctrl-C to stop)\n", host.c_str(), bound);
  std::thread stopper([&server, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    server.stop();
  });
  server.listen_after_bind();
  // listen_after_bind returned without a signal only on a server error.
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  stop_poller();
  sampler.Stop();
  return 0;
}

}  // namespace

void SetupServe(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* serve = app.add_subcommand("serve", "Prometheus exporter: /metrics and /healthz");
  serve->add_option("--listen", opts->listen, "HOST:PORT to listen on (port 0: any free port)")
      ->envname("FULLBURN_LISTEN")
      ->capture_default_str();
  AddIntervalOption(serve, &opts->common, 1.0);
  AddStoreOption(serve, &opts->common);
  serve->callback([opts] { ExitCode() = Serve(*opts); });
}

}  // namespace fullburn::cli
