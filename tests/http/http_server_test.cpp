// HttpServer against the clients a shared network brings: connections that
// send nothing or a byte now and then, huge headers, bodies, other methods.
// Real sockets on loopback; no assertion on how fast anything is (that is
// bench/serve_hostile): only on what is answered, what stays open, what is
// closed.
#include "fullburn/http_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>

#include "replay_env.h"

namespace fullburn {
namespace {

using Clock = std::chrono::steady_clock;

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Everything the server sends until it closes or `wait_s` passes.
std::string ReadUntilClosed(int fd, double wait_s, bool* closed) {
  std::string out;
  *closed = false;
  auto end = Clock::now() + std::chrono::duration<double>(wait_s);
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (::poll(&p, 1, std::max(left, 1)) <= 0) break;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int StatusOf(const std::string& response) {
  if (response.compare(0, 9, "HTTP/1.1 ") != 0 && response.compare(0, 9, "HTTP/1.0 ") != 0) return -1;
  return std::atoi(response.c_str() + 9);
}

// One request on a fresh connection, "Connection: close", the whole answer.
std::string Request(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, request);
  bool closed = false;
  std::string out = ReadUntilClosed(fd, 60, &closed);
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path) {
  return Request(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
}

// Still open: nothing to read and no end of stream.
bool StillOpen(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

class HttpServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<HttpServer> Start(HttpServerOptions options) {
    options.port = 0;
    auto server = HttpServer::Start(options, {{"/metrics", [this] {
                                                 ++scrapes_;
                                                 HttpResponse r;
                                                 r.body = "fullburn_up 1\n";
                                                 return r;
                                               }}});
    EXPECT_TRUE(server.ok()) << server.status().message();
    return server.ok() ? std::move(*server) : nullptr;
  }
  std::atomic<int> scrapes_{0};
};

TEST_F(HttpServerTest, ServesGetAndHeadAndRefusesTheRest) {
  auto server = Start({});
  ASSERT_TRUE(server);
  std::string ok = Get(server->port(), "/metrics");
  EXPECT_EQ(StatusOf(ok), 200) << ok;
  EXPECT_NE(ok.find("\r\n\r\nfullburn_up 1\n"), std::string::npos) << ok;
  std::string head = Request(server->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusOf(head), 200) << head;
  EXPECT_EQ(head.find("fullburn_up"), std::string::npos) << "HEAD carried a body: " << head;
  std::string post = Request(server->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusOf(post), 405) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos) << post;
  EXPECT_EQ(StatusOf(Get(server->port(), "/nothing")), 404);
  EXPECT_EQ(scrapes_.load(), 2);  // GET and HEAD; the refused ones never reach the handler
}

TEST_F(HttpServerTest, ARequestWithAnEndlessBodyGets413AndIsClosedUnread) {
  auto server = Start({});
  ASSERT_TRUE(server);
  int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n"));
  // Keep sending body while reading: the server must answer and close, not
  // read 100 GB. The send fails once it has closed.
  std::string chunk(64 * 1024, 'x');
  std::string out;
  bool closed = false;
  for (int i = 0; i < 2000 && !closed; ++i) {
    if (!SendAll(fd, chunk)) break;
    out += ReadUntilClosed(fd, 0.01, &closed);
  }
  out += ReadUntilClosed(fd, 30, &closed);
  ::close(fd);
  EXPECT_EQ(StatusOf(out), 413) << out;
  EXPECT_TRUE(closed);
  EXPECT_EQ(scrapes_.load(), 0);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);  // and it still serves
}

TEST_F(HttpServerTest, AHugeHeaderGetsA4xxWithinItsMemory) {
  HttpServerOptions o;
  o.request_memory_bytes = 16 * 1024;
  auto server = Start(o);
  ASSERT_TRUE(server);
  std::string big = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 2000; ++i) big += "X-Filler-" + std::to_string(i) + ": " + std::string(100, 'a') + "\r\n";
  big += "\r\n";  // 230 KB of headers
  int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, big);  // may fail part-way: the server closes once its memory is full
  bool closed = false;
  std::string out = ReadUntilClosed(fd, 30, &closed);
  ::close(fd);
  int status = StatusOf(out);
  EXPECT_TRUE(status >= 400 && status < 500) << out.substr(0, 200);
  EXPECT_TRUE(closed);
  EXPECT_EQ(scrapes_.load(), 0);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
}

TEST_F(HttpServerTest, AScrapeIsAnsweredWhileAThousandConnectionsSitIdleOrTrickle) {
  HttpServerOptions o;
  o.idle_timeout_s = 600;  // none of them may be closed to let the scrape through
  auto server = Start(o);
  ASSERT_TRUE(server);
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    int fd = Connect(server->port());
    ASSERT_GE(fd, 0) << "connection " << i;
    // Half send a request line and stop (a slow client), half nothing (a scanner).
    if (i % 2 == 0) SendAll(fd, "GET /metrics HTTP/1.1\r\n");
    idle.push_back(fd);
  }
  std::vector<int> trickle;
  for (int i = 0; i < 20; ++i) {
    int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "G");
    trickle.push_back(fd);
  }
  for (int round = 0; round < 3; ++round) {
    for (int fd : trickle) SendAll(fd, "E");  // a byte now and then
    std::string out = Get(server->port(), "/metrics");
    EXPECT_EQ(StatusOf(out), 200) << "round " << round << ": " << out;
  }
  // The thousand were not closed to make room: the scrapes went past them.
  int open = 0;
  for (int fd : idle) open += StillOpen(fd);
  EXPECT_EQ(open, 1000);
  EXPECT_GE(server->connections(), 1000u);
  for (int fd : idle) ::close(fd);
  for (int fd : trickle) ::close(fd);
}

TEST_F(HttpServerTest, IdleConnectionsAreClosedAfterTheTimeout) {
  HttpServerOptions o;
  o.idle_timeout_s = 1;
  auto server = Start(o);
  ASSERT_TRUE(server);
  auto opened = Clock::now();
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    if (i % 2) SendAll(fd, "GET /metrics HTTP/1.1\r\n");
    fds.push_back(fd);
  }
  for (int fd : fds) {
    bool closed = false;
    ReadUntilClosed(fd, 60, &closed);
    EXPECT_TRUE(closed) << "an idle connection was kept past 60 s with a 1 s timeout";
    ::close(fd);
  }
  double held_s = std::chrono::duration<double>(Clock::now() - opened).count();
  EXPECT_GE(held_s, 0.9) << "closed before its idle timeout";
}

TEST_F(HttpServerTest, OneAddressHoldsAtMostItsShareOfConnections) {
  HttpServerOptions o;
  o.max_connections_per_ip = 4;
  o.idle_timeout_s = 600;
  auto server = Start(o);
  ASSERT_TRUE(server);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connect(server->port()));
  // The server accepts them (the kernel would too): wait until it holds all four.
  for (int wait = 0; wait < 600 && server->connections() < 4; ++wait) ::usleep(10000);
  ASSERT_EQ(server->connections(), 4u);
  // A fifth from the same address is closed unanswered, whatever it asks.
  std::string fifth = Get(server->port(), "/metrics");
  EXPECT_EQ(StatusOf(fifth), -1) << fifth;
  EXPECT_EQ(scrapes_.load(), 0);
  ::close(held.back());
  held.pop_back();
  for (int wait = 0; wait < 600 && server->connections() > 3; ++wait) ::usleep(10000);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
  for (int fd : held) ::close(fd);
}

TEST_F(HttpServerTest, APortInUseOrAForeignAddressIsOneLine) {
  auto first = Start({});
  ASSERT_TRUE(first);
  HttpServerOptions same;
  same.port = first->port();
  auto second = HttpServer::Start(same, {});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("the address is in use"), std::string::npos)
      << second.status().message();
  int port = first->port();
  first->Stop();  // gives the port back
  auto again = HttpServer::Start(same, {});
  EXPECT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(port, same.port);
  HttpServerOptions foreign;
  foreign.host = "192.0.2.1";  // TEST-NET-1: bound to no interface here; nothing is sent
  foreign.port = 0;
  auto none = HttpServer::Start(foreign, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not an address of this machine"), std::string::npos)
      << none.status().message();
}

// --web-config's TLS, basic auth, headers and rate limit, through a real TLS
// client (cpp-httplib over OpenSSL) against the certificates in fixtures/.
const std::string kFixtures = SOURCE_DIR "/tests/http/fixtures/";

WebConfig Web(const std::string& yaml) {
  std::string path = testing::FreshTestDir("fb_web") + "/web.yml";
  std::ofstream(path) << yaml;
  Result<WebConfig> c = ReadWebConfig(path);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : WebConfig();
}

const std::string kTls = "tls_server_config:\n  cert_file: " + kFixtures + "server.pem\n  key_file: " + kFixtures +
                         "server.key\n";

std::unique_ptr<httplib::SSLClient> TlsClient(int port) {
  auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
  c->set_ca_cert_path((kFixtures + "server.pem").c_str());
  c->enable_server_certificate_verification(true);
  c->set_read_timeout(30);
  return c;
}

TEST_F(HttpServerTest, TlsWithBasicAuthServesOnlyTheRightPasswordAndRefusesPlainHttp) {
  HttpServerOptions o;
  o.web = Web(kTls + "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
                     "basic_auth_users:\n  fleet: '$2b$05$abcdefghijklmnopqrstuuiz1Y.0Qtk59V/ZKMvf0YaAfVnLcEY7q'\n");
  auto server = Start(o);
  ASSERT_TRUE(server);
  auto client = TlsClient(server->port());
  auto anonymous = client->Get("/metrics");
  ASSERT_TRUE(anonymous) << httplib::to_string(anonymous.error());
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(anonymous->get_header_value("WWW-Authenticate"), "Basic realm=\"fullburn\"");
  EXPECT_EQ(anonymous->body.find("fullburn_up"), std::string::npos);
  client->set_basic_auth("fleet", "wrong");
  auto wrong = client->Get("/metrics");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(wrong->body.find("fullburn_up"), std::string::npos);
  EXPECT_EQ(scrapes_.load(), 0);
  client->set_basic_auth("fleet", "fleet-secret");
  for (int i = 0; i < 2; ++i) {  // the second on the kept-alive TLS connection
    auto right = client->Get("/metrics");
    ASSERT_TRUE(right) << httplib::to_string(right.error());
    EXPECT_EQ(right->status, 200);
    EXPECT_EQ(right->body, "fullburn_up 1\n");
    EXPECT_EQ(right->get_header_value("X-Content-Type-Options"), "nosniff");
  }
  EXPECT_EQ(scrapes_.load(), 2);
  // Plain HTTP to the TLS port: closed at the handshake, nothing answered.
  std::string plain = Get(server->port(), "/metrics");
  EXPECT_EQ(plain.find("fullburn_up"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("HTTP/1.1 200"), std::string::npos) << plain;
  // A client that does not trust the certificate sends nothing.
  httplib::SSLClient untrusting("127.0.0.1", server->port());
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_ca_cert_path((kFixtures + "client-ca.pem").c_str());
  auto refused = untrusting.Get("/metrics");
  EXPECT_FALSE(refused);
  EXPECT_EQ(scrapes_.load(), 2);
}

TEST_F(HttpServerTest, ClientCertificatesMustBeSignedByTheClientCa) {
  HttpServerOptions o;
  o.web = Web(kTls + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: " + kFixtures +
              "client-ca.pem\n");
  auto server = Start(o);
  ASSERT_TRUE(server);
  auto signed_client = std::make_unique<httplib::SSLClient>("127.0.0.1", server->port(),
                                                            kFixtures + "client.pem", kFixtures + "client.key");
  signed_client->set_ca_cert_path((kFixtures + "server.pem").c_str());
  signed_client->enable_server_certificate_verification(true);
  auto ok = signed_client->Get("/metrics");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  auto rogue = std::make_unique<httplib::SSLClient>("127.0.0.1", server->port(),
                                                    kFixtures + "rogue.pem", kFixtures + "rogue.key");
  rogue->set_ca_cert_path((kFixtures + "server.pem").c_str());
  auto refused = rogue->Get("/metrics");
  EXPECT_TRUE(!refused || refused->status == 403);
  auto none = TlsClient(server->port())->Get("/metrics");
  EXPECT_TRUE(!none || none->status == 403);
  EXPECT_EQ(scrapes_.load(), 1);
}

TEST_F(HttpServerTest, PastTheRateLimitA429) {
  HttpServerOptions o;
  o.web = Web("rate_limit:\n  interval: 1h\n  burst: 2\n");
  auto server = Start(o);
  ASSERT_TRUE(server);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 429);
  EXPECT_EQ(scrapes_.load(), 2);
}

TEST_F(HttpServerTest, AScraperKeepsItsConnectionBetweenScrapes) {
  auto server = Start({});
  ASSERT_TRUE(server);
  int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::string out;
    bool closed = false;
    for (int wait = 0; wait < 600 && out.find("fullburn_up 1\n") == std::string::npos && !closed; ++wait)
      out += ReadUntilClosed(fd, 0.05, &closed);
    EXPECT_EQ(StatusOf(out), 200) << out;
    EXPECT_FALSE(closed) << "scrape " << i << " closed the connection";
  }
  ::close(fd);
  EXPECT_EQ(scrapes_.load(), 3);
}

}  // namespace
}  // namespace fullburn
