// fullburn/web_config.h: TLS, basic auth, response headers and a rate limit
// for `fullburn serve`, read from the web configuration file of Prometheus's
// exporter-toolkit (`--web.config.file` of node_exporter, dcgm-exporter and
// Prometheus itself), so one file serves them all (docs/metrics.md, "Serving
// on a network", lists the fields taken and the ones refused).
//
// Contract
// - ReadWebConfig reads the YAML file and every file it names (relative paths
//   are relative to the file's folder, as exporter-toolkit resolves them),
//   checks that the key matches the certificate and that each password is a
//   bcrypt hash, and returns a WebConfig that owns all of it: nothing is read
//   again while serving. Unknown fields are errors (exporter-toolkit parses
//   strictly too), and so are fields fullburn cannot honour: a config that
//   asks for a cipher list must not be served with another one silently.
// - Errors: one line naming the file, the field and the fix.
// - BasicAuth is thread-safe; Check() costs one bcrypt (tens of ms at cost
//   10) the first time a user and password are seen, then a hash look-up.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fullburn/status.h"

namespace fullburn {

struct WebConfig {
  // TLS when cert_pem is set; PEM text, as read from the files.
  std::string cert_pem;
  std::string key_pem;
  // Set: every client must present a certificate signed by this CA
  // (client_auth_type: RequireAndVerifyClientCert).
  std::string client_ca_pem;
  // GnuTLS priority string for min_version/max_version (TLS 1.2-1.3 unless set).
  std::string tls_priorities;
  std::string tls_versions;  // "1.2-1.3", for messages
  // User -> bcrypt hash; empty: no authentication.
  std::map<std::string, std::string> basic_auth_users;
  // Extra response headers (exporter-toolkit's five security headers).
  std::vector<std::pair<std::string, std::string>> headers;
  // A token bucket over all requests: one token per interval, up to burst;
  // a request without a token gets 429. interval 0: no limit.
  double rate_limit_interval_s = 0;
  int rate_limit_burst = 0;

  bool tls() const { return !cert_pem.empty(); }
  std::string Describe() const;  // e.g. "TLS 1.2-1.3, basic auth (2 users)"
};

Result<WebConfig> ReadWebConfig(const std::string& path);

// Checks basic-auth credentials against bcrypt hashes, remembering recent
// answers by a SHA-256 of the password (never the password itself), so a
// scraper's every request costs a look-up, not a bcrypt.
class BasicAuth {
 public:
  explicit BasicAuth(std::map<std::string, std::string> users);
  bool enabled() const { return !users_.empty(); }
  bool Check(const std::string& user, const std::string& password);

 private:
  std::map<std::string, std::string> users_;
  std::mutex mu_;
  std::unordered_map<std::string, bool> answers_;  // user + '\0' + sha256(password)
};

}  // namespace fullburn
