// exporter-toolkit's web configuration file, read with yaml-cpp; the key and
// certificate checked with GnuTLS (libmicrohttpd's TLS library) so a mismatch
// is named here, not as libmicrohttpd's "did not start"; bcrypt by Nettle
// (GnuTLS's own crypto library: libxcrypt's needs glibc 2.36, which would
// keep the wheel off Ubuntu 22.04).
#include "fullburn/web_config.h"

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <nettle/blowfish.h>
#include <yaml-cpp/yaml.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace fullburn {
namespace {

namespace fs = std::filesystem;

struct Reader {
  std::string path;  // the web config file, for messages
  fs::path folder;   // relative paths are relative to it

  Status Error(const std::string& field, const std::string& what) const {
    return Status::InvalidArgument("web config " + path + ": " + (field.empty() ? "" : field + ": ") + what);
  }

  // Fields of `node` outside `known` are errors, as in exporter-toolkit.
  Status OnlyKnown(const YAML::Node& node, const std::string& where, const std::set<std::string>& known,
                   const std::set<std::string>& refused = {}) const {
    if (!node.IsMap()) return Error(where, "expected a mapping of fields");
    for (const auto& entry : node) {
      std::string name = entry.first.as<std::string>();
      std::string field = where.empty() ? name : where + "." + name;
      if (refused.count(name)) {
        bool empty = entry.second.IsNull() || (entry.second.IsSequence() && entry.second.size() == 0);
        if (!empty)
          return Error(field, "not supported by fullburn serve (GnuTLS chooses them); remove it, or "
                              "put the exporter behind a proxy that honours it");
        continue;
      }
      if (!known.count(name)) return Error(field, "unknown field (exporter-toolkit's fields: docs/metrics.md)");
    }
    return Status::Ok();
  }

  Result<std::string> Text(const YAML::Node& node, const std::string& field) const {
    if (!node || node.IsNull()) return std::string();
    if (!node.IsScalar()) return Error(field, "expected a string");
    return node.as<std::string>();
  }

  Result<std::string> ReadFile(const std::string& field, const std::string& name) const {
    fs::path p = name;
    if (p.is_relative()) p = folder / p;
    std::ifstream in(p, std::ios::binary);
    if (!in) return Error(field, "cannot read " + p.string() + " (" + std::strerror(errno) + ")");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The inline field or the file field, exactly one of them, as PEM text.
  Result<std::string> Pem(const YAML::Node& tls, const std::string& inline_name,
                          const std::string& file_name) const {
    Result<std::string> text = Text(tls[inline_name], "tls_server_config." + inline_name);
    if (!text.ok()) return text.status();
    Result<std::string> file = Text(tls[file_name], "tls_server_config." + file_name);
    if (!file.ok()) return file.status();
    if (!text->empty() && !file->empty())
      return Error("tls_server_config." + file_name, "give " + inline_name + " or " + file_name + ", not both");
    if (file->empty()) return text;
    return ReadFile("tls_server_config." + file_name, *file);
  }
};

// "TLS12" -> 2 (TLS 1.2).
Result<int> TlsVersion(const Reader& r, const std::string& field, const std::string& v) {
  static const char* kVersions[] = {"TLS10", "TLS11", "TLS12", "TLS13"};
  for (int i = 0; i < 4; ++i)
    if (v == kVersions[i]) return i;
  return r.Error(field, "'" + v + "' is not one of TLS10, TLS11, TLS12, TLS13");
}

Status CheckKeyPair(const Reader& r, const std::string& cert, const std::string& key) {
  if (key.find("ENCRYPTED") != std::string::npos)
    return r.Error("tls_server_config.key_file",
                   "the key is encrypted; give an unencrypted PEM key (as exporter-toolkit needs), "
                   "readable by this user only");
  gnutls_certificate_credentials_t creds = nullptr;
  if (gnutls_certificate_allocate_credentials(&creds) != GNUTLS_E_SUCCESS)
    return Status::Internal("GnuTLS could not allocate credentials (out of memory?)");
  gnutls_datum_t c{reinterpret_cast<unsigned char*>(const_cast<char*>(cert.data())),
                   static_cast<unsigned>(cert.size())};
  gnutls_datum_t k{reinterpret_cast<unsigned char*>(const_cast<char*>(key.data())),
                   static_cast<unsigned>(key.size())};
  int rc = gnutls_certificate_set_x509_key_mem(creds, &c, &k, GNUTLS_X509_FMT_PEM);
  gnutls_certificate_free_credentials(creds);
  if (rc < 0)
    return r.Error("tls_server_config", std::string("the certificate and key do not load: ") +
                                            gnutls_strerror(rc) + " (PEM files, the key matching the certificate)");
  return Status::Ok();
}

Status CheckCa(const Reader& r, const std::string& ca) {
  gnutls_certificate_credentials_t creds = nullptr;
  if (gnutls_certificate_allocate_credentials(&creds) != GNUTLS_E_SUCCESS)
    return Status::Internal("GnuTLS could not allocate credentials (out of memory?)");
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(const_cast<char*>(ca.data())),
                   static_cast<unsigned>(ca.size())};
  int n = gnutls_certificate_set_x509_trust_mem(creds, &d, GNUTLS_X509_FMT_PEM);
  gnutls_certificate_free_credentials(creds);
  if (n <= 0)
    return r.Error("tls_server_config.client_ca_file", "holds no PEM certificate" +
                                                           (n < 0 ? std::string(" (") + gnutls_strerror(n) + ")" : ""));
  return Status::Ok();
}

Status ReadTls(const Reader& r, const YAML::Node& tls, WebConfig* out) {
  if (Status s = r.OnlyKnown(tls, "tls_server_config",
                             {"cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
                              "client_ca_file", "min_version", "max_version", "prefer_server_cipher_suites"},
                             {"cipher_suites", "curve_preferences", "client_allowed_sans"});
      !s.ok())
    return s;
  Result<std::string> cert = r.Pem(tls, "cert", "cert_file");
  if (!cert.ok()) return cert.status();
  Result<std::string> key = r.Pem(tls, "key", "key_file");
  if (!key.ok()) return key.status();
  // Neither: plain HTTP, as exporter-toolkit treats an empty TLS section.
  if (cert->empty() && key->empty()) return Status::Ok();
  if (cert->empty()) return r.Error("tls_server_config.cert_file", "missing (a key_file needs its certificate)");
  if (key->empty()) return r.Error("tls_server_config.key_file", "missing (a cert_file needs its key)");
  if (Status s = CheckKeyPair(r, *cert, *key); !s.ok()) return s;
  out->cert_pem = *cert;
  out->key_pem = *key;

  Result<std::string> auth = r.Text(tls["client_auth_type"], "tls_server_config.client_auth_type");
  if (!auth.ok()) return auth.status();
  Result<std::string> ca = r.Pem(tls, "client_ca", "client_ca_file");
  if (!ca.ok()) return ca.status();
  if (auth->empty() || *auth == "NoClientCert") {
    if (!ca->empty())
      return r.Error("tls_server_config.client_ca_file",
                     "a client CA without client_auth_type: set RequireAndVerifyClientCert");
  } else if (*auth == "RequireAndVerifyClientCert") {
    if (ca->empty())
      return r.Error("tls_server_config.client_ca_file", "RequireAndVerifyClientCert needs the CA that signs clients");
    if (Status s = CheckCa(r, *ca); !s.ok()) return s;
    out->client_ca_pem = *ca;
  } else if (*auth == "RequestClientCert" || *auth == "RequireAnyClientCert" || *auth == "VerifyClientCertIfGiven") {
    return r.Error("tls_server_config.client_auth_type",
                   "'" + *auth + "' lets unverified clients in and is not supported: use RequireAndVerifyClientCert "
                   "or NoClientCert");
  } else {
    return r.Error("tls_server_config.client_auth_type",
                   "'" + *auth + "' is not one of NoClientCert, RequireAndVerifyClientCert");
  }

  Result<std::string> min_v = r.Text(tls["min_version"], "tls_server_config.min_version");
  Result<std::string> max_v = r.Text(tls["max_version"], "tls_server_config.max_version");
  if (!min_v.ok()) return min_v.status();
  if (!max_v.ok()) return max_v.status();
  auto lo = TlsVersion(r, "tls_server_config.min_version", min_v->empty() ? "TLS12" : *min_v);
  if (!lo.ok()) return lo.status();
  auto hi = TlsVersion(r, "tls_server_config.max_version", max_v->empty() ? "TLS13" : *max_v);
  if (!hi.ok()) return hi.status();
  if (*lo > *hi) return r.Error("tls_server_config.min_version", "is above max_version");
  out->tls_priorities = "NORMAL:-VERS-ALL";
  for (int v = *hi; v >= *lo; --v) out->tls_priorities += ":+VERS-TLS1." + std::to_string(v);
  out->tls_versions = "1." + std::to_string(*lo) +
                      (*lo == *hi ? "" : "-1." + std::to_string(*hi));
  return Status::Ok();
}

Status ReadHttp(const Reader& r, const YAML::Node& http, WebConfig* out) {
  if (Status s = r.OnlyKnown(http, "http_server_config", {"http2", "headers"}); !s.ok()) return s;
  // http2 is accepted and means nothing here: serve speaks HTTP/1.1, which
  // every Prometheus and browser also speaks.
  const YAML::Node headers = http["headers"];
  if (!headers || headers.IsNull()) return Status::Ok();
  if (!headers.IsMap()) return r.Error("http_server_config.headers", "expected a mapping of header: value");
  for (const auto& h : headers) {
    std::string name = h.first.as<std::string>();
    std::string field = "http_server_config.headers." + name;
    Result<std::string> value = r.Text(h.second, field);
    if (!value.ok()) return value.status();
    std::string lower = *value;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == "X-Frame-Options" && !value->empty() && lower != "deny" && lower != "sameorigin")
      return r.Error(field, "'" + *value + "' is not deny or sameorigin");
    if (name == "X-Content-Type-Options" && !value->empty() && lower != "nosniff")
      return r.Error(field, "'" + *value + "' is not nosniff");
    if (name != "Content-Security-Policy" && name != "X-Frame-Options" && name != "X-Content-Type-Options" &&
        name != "X-XSS-Protection" && name != "Strict-Transport-Security")
      return r.Error(field, "not one of the headers exporter-toolkit allows (Content-Security-Policy, "
                            "X-Frame-Options, X-Content-Type-Options, X-XSS-Protection, Strict-Transport-Security)");
    if (value->find_first_of("\r\n") != std::string::npos) return r.Error(field, "a value cannot span lines");
    if (!value->empty()) out->headers.emplace_back(name, *value);
  }
  return Status::Ok();
}

Status ReadUsers(const Reader& r, const YAML::Node& users, WebConfig* out) {
  if (!users || users.IsNull()) return Status::Ok();
  if (!users.IsMap()) return r.Error("basic_auth_users", "expected a mapping of user: bcrypt hash");
  // What htpasswd -B, Python's bcrypt and Go's x/crypto/bcrypt write.
  static const std::regex kBcrypt(R"(\$2[aby]\$[0-3][0-9]\$[./A-Za-z0-9]{53})");
  for (const auto& u : users) {
    std::string user = u.first.as<std::string>();
    std::string field = "basic_auth_users." + user;
    Result<std::string> hash = r.Text(u.second, field);
    if (!hash.ok()) return hash.status();
    if (!std::regex_match(*hash, kBcrypt))
      return r.Error(field, "not a bcrypt hash ($2y$10$ and 53 more characters): make one with "
                            "htpasswd -nBC 10 \"\" | tr -d ':\\n'");
    if (user.find(':') != std::string::npos) return r.Error(field, "a user name cannot hold ':' (basic auth splits there)");
    out->basic_auth_users[user] = *hash;
  }
  return Status::Ok();
}

// Go's time.ParseDuration for what a rate limit needs: "1s", "100ms", "1m30s".
Result<double> GoDuration(const Reader& r, const std::string& field, const std::string& text) {
  if (text == "0") return 0.0;
  static const std::regex kPart(R"((\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))");
  double total = 0;
  size_t at = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), kPart), end; it != end; ++it) {
    if (static_cast<size_t>(it->position()) != at) break;
    static const std::map<std::string, double> kUnit = {{"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3},
                                                        {"s", 1},     {"m", 60},    {"h", 3600}};
    total += std::stod((*it)[1]) * kUnit.at((*it)[2]);
    at += static_cast<size_t>(it->length());
  }
  if (text.empty() || at != text.size()) return r.Error(field, "'" + text + "' is not a duration such as 1s or 100ms");
  return total;
}

Status ReadRateLimit(const Reader& r, const YAML::Node& limit, WebConfig* out) {
  if (Status s = r.OnlyKnown(limit, "rate_limit", {"interval", "burst"}); !s.ok()) return s;
  Result<std::string> interval = r.Text(limit["interval"], "rate_limit.interval");
  if (!interval.ok()) return interval.status();
  Result<double> seconds = GoDuration(r, "rate_limit.interval", interval->empty() ? "0" : *interval);
  if (!seconds.ok()) return seconds.status();
  int burst = 0;
  if (limit["burst"]) {
    try {
      burst = limit["burst"].as<int>();
    } catch (const YAML::Exception&) {
      return r.Error("rate_limit.burst", "expected a whole number");
    }
  }
  if (*seconds > 0 && burst < 1) return r.Error("rate_limit.burst", "must be 1 or more with an interval");
  out->rate_limit_interval_s = *seconds;
  out->rate_limit_burst = burst;
  return Status::Ok();
}

std::string Sha256(const std::string& text) {
  unsigned char digest[32];
  gnutls_hash_fast(GNUTLS_DIG_SHA256, text.data(), text.size(), digest);
  return std::string(reinterpret_cast<char*>(digest), sizeof digest);
}

}  // namespace

Result<WebConfig> ReadWebConfig(const std::string& path) {
  Reader r{path, fs::path(path).parent_path()};
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status::NotFound("web config " + path + ": cannot read it (" + std::strerror(errno) +
                            "): give the path of exporter-toolkit's web configuration file");
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("web config " + path + ": not YAML at line " + std::to_string(e.mark.line + 1) +
                                   ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  WebConfig out;
  if (root.IsNull()) return out;  // an empty file: plain HTTP, no auth, as in exporter-toolkit
  try {
    if (Status s = r.OnlyKnown(root, "", {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"});
        !s.ok())
      return s;
    if (root["tls_server_config"] && !root["tls_server_config"].IsNull())
      if (Status s = ReadTls(r, root["tls_server_config"], &out); !s.ok()) return s;
    if (root["http_server_config"] && !root["http_server_config"].IsNull())
      if (Status s = ReadHttp(r, root["http_server_config"], &out); !s.ok()) return s;
    if (Status s = ReadUsers(r, root["basic_auth_users"], &out); !s.ok()) return s;
    if (root["rate_limit"] && !root["rate_limit"].IsNull())
      if (Status s = ReadRateLimit(r, root["rate_limit"], &out); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("web config " + path + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return out;
}

std::string WebConfig::Describe() const {
  std::string d;
  if (tls()) {
    d = "TLS " + tls_versions;
    if (!client_ca_pem.empty()) d += " with client certificates";
  } else {
    d = "plain HTTP";
  }
  if (!basic_auth_users.empty())
    d += ", basic auth (" + std::to_string(basic_auth_users.size()) +
         (basic_auth_users.size() == 1 ? " user)" : " users)");
  if (rate_limit_interval_s > 0) d += ", rate limited";
  return d;
}

BasicAuth::BasicAuth(std::map<std::string, std::string> users) : users_(std::move(users)) {}

bool BasicAuth::Check(const std::string& user, const std::string& password) {
  std::string key = user + '\0' + Sha256(password);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = answers_.find(key); it != answers_.end()) return it->second;
  }
  // An unknown user costs a bcrypt too, so timing does not tell which users
  // exist (exporter-toolkit does the same).
  static const std::string kUnknownUser = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
  auto found = users_.find(user);
  const std::string& hash = found != users_.end() ? found->second : kUnknownUser;
  bool matches = nettle_blowfish_bcrypt_verify(password.size(), reinterpret_cast<const uint8_t*>(password.data()),
                                               hash.size(), reinterpret_cast<const uint8_t*>(hash.data())) == 1;
  bool ok = found != users_.end() && matches && password.find('\0') == std::string::npos;
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded: a client trying many passwords cannot grow it past this.
  if (answers_.size() >= 4096) answers_.clear();
  answers_[key] = ok;
  return ok;
}

}  // namespace fullburn
