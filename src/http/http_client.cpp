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

std::string Trimmed(std::string s, size_t n) { return s.size() > n ? s.substr(0, n) + "..." : s; }

}  // namespace fullburn
