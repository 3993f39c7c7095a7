// HttpServer over libmicrohttpd: its internal thread polls every connection
// with epoll, so a connection that sends nothing holds a few KiB of its
// memory pool, not a worker thread (cpp-httplib's pool of 8 threads was
// starved by 8 idle connections: issue 53).
#include "fullburn/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

namespace fullburn {

// exporter-toolkit's rate limit: a bucket of `burst` tokens, one more every
// interval; shared by all connections.
class TokenBucket {
 public:
  TokenBucket(double interval_s, int burst) : interval_s_(interval_s), burst_(burst), tokens_(burst) {}
  bool Take() {
    if (interval_s_ <= 0) return true;
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    tokens_ = std::min<double>(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() / interval_s_);
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  double interval_s_;
  int burst_;
  std::mutex mu_;
  double tokens_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

struct HttpServer::Impl {
  Impl(const WebConfig& w) : web(w), auth(w.basic_auth_users), bucket(w.rate_limit_interval_s, w.rate_limit_burst) {}
  std::map<std::string, HttpHandler> routes;
  WebConfig web;  // libmicrohttpd keeps pointers into its PEM text
  BasicAuth auth;
  TokenBucket bucket;
  MHD_Daemon* daemon = nullptr;
  int listen_fd = -1;
};

namespace {

// Each connection is a descriptor: let the process have as many as its hard
// limit allows (often 1024 soft of 1M hard), or max_connections cannot hold.
void RaiseDescriptorLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// libmicrohttpd sends no body for HEAD by itself. A 401 goes out with
// WWW-Authenticate, so a browser asks for the password.
MHD_Result Reply(const HttpServer::Impl& impl, MHD_Connection* connection, const HttpResponse& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.body.size(), const_cast<char*>(reply.body.data()), MHD_RESPMEM_MUST_COPY);
  if (!response) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, reply.content_type.c_str());
  for (const auto& [name, value] : impl.web.headers) MHD_add_response_header(response, name.c_str(), value.c_str());
  if (reply.status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  MHD_Result queued = reply.status == MHD_HTTP_UNAUTHORIZED
                          ? MHD_queue_basic_auth_fail_response(connection, "fullburn", response)
                          : MHD_queue_response(connection, static_cast<unsigned>(reply.status), response);
  MHD_destroy_response(response);
  return queued;
}

HttpResponse Plain(int status, const char* text) {
  HttpResponse r;
  r.status = status;
  r.body = text;
  return r;
}

// libmicrohttpd asks for a certificate when it has a trust list; whether one
// came and is signed by the client CA is ours to check, before anything else.
bool ClientCertificateVerified(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (!info || !info->tls_session) return false;
  unsigned status = 0;
  auto session = static_cast<gnutls_session_t>(info->tls_session);
  return gnutls_certificate_verify_peers2(session, &status) == GNUTLS_E_SUCCESS && status == 0;
}

bool Authorized(HttpServer::Impl* impl, MHD_Connection* connection) {
  char* password = nullptr;
  char* user = MHD_basic_auth_get_username_password(connection, &password);
  bool ok = user && password && impl->auth.Check(user, password);
  if (user) MHD_free(user);
  if (password) MHD_free(password);
  return ok;
}

bool CarriesABody(MHD_Connection* connection) {
  const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (length && std::strtoull(length, nullptr, 10) > 0) return true;
  return MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != nullptr;
}

// Called when the request line and headers are in, then for each piece of
// body and once at the end. A request that brings a body or another method is
// answered on that first call: libmicrohttpd then closes the connection
// without reading the body. A GET or HEAD is answered on the call at its end,
// so the connection stays open for the next scrape (keep-alive).
MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                  void** request_state) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  static int headers_in, answered;
  if (*request_state == &answered) {  // body bytes after our answer: discard them
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*request_state == nullptr) {
    bool get_or_head = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 || std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (get_or_head && !CarriesABody(connection)) {
      *request_state = &headers_in;
      return MHD_YES;
    }
    *request_state = &answered;
    if (!get_or_head) return Reply(*impl, connection, Plain(405, "only GET and HEAD\n"));
    return Reply(*impl, connection, Plain(413, "a request to this exporter carries no body\n"));
  }
  *request_state = &answered;
  if (!impl->web.client_ca_pem.empty() && !ClientCertificateVerified(connection))
    return Reply(*impl, connection, Plain(403, "a client certificate signed by the client CA is required\n"));
  if (impl->auth.enabled() && !Authorized(impl, connection))
    return Reply(*impl, connection, Plain(401, "unauthorized\n"));
  if (!impl->bucket.Take()) return Reply(*impl, connection, Plain(429, "too many requests\n"));
  auto route = impl->routes.find(url);
  if (route == impl->routes.end()) return Reply(*impl, connection, Plain(404, "not found: try /metrics\n"));
  return Reply(*impl, connection, route->second());
}

// The listening socket is ours, so a failure to bind says why in one line.
Result<int> Listen(const std::string& host, int port, const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return Status::InvalidArgument("cannot listen on " + where + ": '" + host + "' is not an address (" +
                                   ::gai_strerror(rc) + "): give an IP address of this machine");
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    int yes = 1;
    // SO_REUSEADDR only: SO_REUSEPORT would let a second exporter bind the
    // same port silently; a port in use must be an error.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) return fd;
  std::string why = error == EADDRINUSE      ? "the address is in use (another fullburn serve or exporter?)"
                    : error == EADDRNOTAVAIL ? "it is not an address of this machine"
                    : error == EACCES        ? "a port below 1024 needs root"
                                             : std::strerror(error);
  return Status::Unavailable("cannot listen on " + where + ": " + why + ": choose another --listen");
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                      std::map<std::string, HttpHandler> routes) {
  std::string where = options.host + ":" + std::to_string(options.port);
  if (options.port < 0 || options.port > 65535)
    return Status::InvalidArgument("cannot listen on " + where + ": the port is not 0-65535");
  RaiseDescriptorLimit();
  Result<int> fd = Listen(options.host, options.port, where);
  if (!fd.ok()) return fd.status();
  auto impl = std::make_unique<Impl>(options.web);
  impl->routes = std::move(routes);
  impl->listen_fd = *fd;
  unsigned timeout_s = static_cast<unsigned>(std::max(1.0, std::ceil(options.idle_timeout_s)));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_LISTEN_SOCKET, *fd, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, static_cast<intptr_t>(timeout_s), nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, static_cast<intptr_t>(options.max_connections), nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(options.request_memory_bytes), nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, static_cast<intptr_t>(options.max_connections_per_ip), nullptr}};
  const WebConfig& web = impl->web;
  if (web.tls()) {
    flags |= MHD_USE_TLS;
    items.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(web.cert_pem.c_str())});
    items.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(web.key_pem.c_str())});
    items.push_back({MHD_OPTION_HTTPS_PRIORITIES, 0, const_cast<char*>(web.tls_priorities.c_str())});
    if (!web.client_ca_pem.empty())
      items.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0, const_cast<char*>(web.client_ca_pem.c_str())});
  }
  // A bcrypt takes tens of milliseconds on the thread that serves its
  // connection: with a few threads, a client trying passwords does not hold
  // up the scrape on another.
  if (impl->auth.enabled()) items.push_back({MHD_OPTION_THREAD_POOL_SIZE, 4, nullptr});
  items.push_back({MHD_OPTION_END, 0, nullptr});
  impl->daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Handle, impl.get(), MHD_OPTION_ARRAY,
                                  items.data(), MHD_OPTION_END);
  if (!impl->daemon) {
    ::close(*fd);
    return Status::Internal("cannot serve on " + where + ": libmicrohttpd did not start (" +
                            (web.tls() ? "the TLS settings were refused, or " : "") +
                            "out of memory or descriptors?)");
  }
  int port = BoundPort(*fd);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), port));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (!impl_->daemon) return;
  // Joins its thread (the handlers are done) and closes every socket, the
  // listening one we handed it included (a test binds the port again).
  MHD_stop_daemon(impl_->daemon);
  impl_->daemon = nullptr;
}

unsigned HttpServer::connections() const {
  if (!impl_->daemon) return 0;
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl_->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return info ? info->num_connections : 0;
}

}  // namespace fullburn
