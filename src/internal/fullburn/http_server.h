// fullburn/http_server.h: the HTTP server behind `fullburn serve`, made to sit
// on a shared network, where slow clients, half-open connections and port
// scanners come with the scrapes (docs/metrics.md, "Serving on a network").
//
// Contract
// - One thread, libmicrohttpd's over epoll, owns every connection and calls
//   the handlers; an idle or slow connection costs a few KiB of memory, never
//   a thread, so a thousand of them do not delay a scrape. Handlers must be
//   quick (render from a snapshot) and thread-safe against the caller's
//   threads; they never run after Stop() or the destructor returned.
// - Bounded: at most max_connections at once (more wait, unaccepted, in the
//   kernel's listen queue until one closes: libmicrohttpd stops accepting);
//   a connection with no traffic for idle_timeout_s is closed; a request's
//   line and headers live in request_memory_bytes (beyond: 431, closed).
//   Only GET and HEAD are served (others: 405); a request that carries a body
//   gets 413 and the connection is closed without reading the body; a path
//   without a handler gets 404.
// - With options.web: TLS (a plain-HTTP client's connection is closed at the
//   handshake); a client without a verified certificate gets 403 when a
//   client CA is set; without valid basic-auth credentials, 401 and nothing
//   else; past the rate limit, 429. Checked in that order, before the method.
// - Errors: Start() returns a Status naming the address and the fix (in use,
//   not an address of this machine, no permission); nothing is thrown.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fullburn/status.h"
#include "fullburn/web_config.h"

namespace fullburn {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an address of this machine, or a name resolving to one
  int port = 9400;                 // 0: any free port (port() says which)
  // Prometheus scrapes every 15-60 s and holds its connection open between
  // scrapes only when the interval is shorter than this, so 30 s keeps a
  // keep-alive scraper's connection and drops the rest soon enough.
  double idle_timeout_s = 30;
  unsigned max_connections = 4096;
  // One address may hold at most this many (0: no limit); more are closed as
  // they arrive, so one host cannot fill max_connections and starve the
  // scraper. Off by default: clients behind one NAT share an address.
  unsigned max_connections_per_ip = 0;
  size_t request_memory_bytes = 16 * 1024;
  WebConfig web;  // TLS, basic auth, headers, rate limit (fullburn/web_config.h)
};

class HttpServer {
 public:
  // Listens and starts serving `routes` (path -> handler) at once.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                   std::map<std::string, HttpHandler> routes);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  unsigned connections() const;  // open now
  void Stop();                     // closes every connection; idempotent

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace fullburn
