#include "fullburn/http_client.h"

#include <httplib.h>

namespace fullburn {

std::string WhyUnreachable(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection refused or host not found";
    case httplib::Error::ConnectionTimeout:
      return "no answer to the connection";
    case httplib::Error::Read:
      return "the connection broke or timed out while reading the answer";
    case httplib::Error::SSLConnection:
      return "the TLS handshake failed";
    case httplib::Error::SSLLoadingCerts:
      return "the CA certificates could not be loaded";
    case httplib::Error::SSLServerVerification:
      return "the server's certificate did not verify";
    default:
      return httplib::to_string(e);
  }
}

HttpBase SplitHttpBase(const std::string& url) {
  HttpBase b;
  size_t scheme_end = url.find("://");
  std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    b.problem = HttpBase::Problem::kNotHttp;
    return b;
  }
  size_t host_start = scheme_end + 3;
  size_t path = url.find('/', host_start);
  if (path == host_start || host_start >= url.size()) {
    b.problem = HttpBase::Problem::kNoHost;
    return b;
  }
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
  if (scheme == "https") {
    b.problem = HttpBase::Problem::kNoTls;
    return b;
  }
#endif
  b.scheme_host_port = url.substr(0, path);
  b.prefix = path == std::string::npos ? "" : url.substr(path);
  // "http://host:5000/" is the server's root: "//api/..." would be another path.
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  return b;
}

std::string Trimmed(std::string s, size_t n) { return s.size() > n ? s.substr(0, n) + "..." : s; }

}  // namespace fullburn
