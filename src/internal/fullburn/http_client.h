// What fullburn's HTTP clients (fleet's Prometheus client, the MLflow
// client; both cpp-httplib) share: how a base URL is split, and what they
// say when a request gets no answer, in one wording. Linked only into
// fullburn-net, with cpp-httplib.
//
// Contract: pure functions.
#pragma once

#include <string>

namespace httplib {
enum class Error;  // cpp-httplib's (an int enum): this header needs no httplib.h
}

namespace fullburn {

// A server's base URL ("https://host:9090/sub/") as cpp-httplib's Client
// takes it: "https://host:9090" and the path prefix of every request
// ("/sub", no trailing '/'; "" for none).
struct HttpBase {
  enum class Problem { kNone, kNotHttp, kNoHost, kNoTls };
  Problem problem = Problem::kNone;  // kNoTls: https in a cpp-httplib built without TLS
  std::string scheme_host_port, prefix;
};
// Each client words a problem for its own option (--prometheus, --mlflow).
HttpBase SplitHttpBase(const std::string& url);

// "connection refused or host not found", "the TLS handshake failed", ...
std::string WhyUnreachable(httplib::Error e);
// `s` cut to `n` characters, "..." marking the cut.
std::string Trimmed(std::string s, size_t n);

}  // namespace fullburn
