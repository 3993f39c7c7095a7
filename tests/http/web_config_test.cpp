// exporter-toolkit's web configuration file as `fullburn serve --web-config`
// reads it: what is taken, what is refused and how each refusal names the
// field. The certificates in fixtures/ are EC P-256, valid for a century,
// made with openssl (server.pem for 127.0.0.1; client.pem signed by
// client-ca.pem; rogue.pem self-signed; encrypted.key is rogue.key under a
// passphrase).
#include "fullburn/web_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "replay_env.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = SOURCE_DIR "/tests/http/fixtures/";
// bcrypt (cost 5) of "fleet-secret", as Python's crypt wrote it; Prometheus
// accepts the same hash in the fleet tests.
const std::string kFleetHash = "$2b$05$abcdefghijklmnopqrstuuiz1Y.0Qtk59V/ZKMvf0YaAfVnLcEY7q";

class WebConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("fb_webconfig");
    for (const char* f : {"server.pem", "server.key", "client-ca.pem", "rogue.key", "encrypted.key"})
      fs::copy_file(kFixtures + f, dir_ + "/" + f);
  }
  std::string Write(const std::string& yaml) {
    std::string path = dir_ + "/web.yml";
    std::ofstream(path) << yaml;
    return path;
  }
  // The message a config is refused with, or "" when it is taken.
  std::string Refusal(const std::string& yaml) {
    Result<WebConfig> c = ReadWebConfig(Write(yaml));
    return c.ok() ? "" : c.status().message();
  }
  std::string dir_;
};

TEST_F(WebConfigTest, TakesTlsUsersHeadersAndARateLimitWithPathsRelativeToTheFile) {
  Result<WebConfig> c = ReadWebConfig(Write(
      "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS13\n"
      "  prefer_server_cipher_suites: true\n  cipher_suites: []\n"
      "http_server_config:\n  http2: true\n  headers:\n    X-Frame-Options: deny\n"
      "    Strict-Transport-Security: max-age=31536000\n    X-XSS-Protection: ''\n"
      "basic_auth_users:\n  fleet: '" +
      kFleetHash + "'\n  alice: '$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG'\n"
      "rate_limit:\n  interval: 1m30s\n  burst: 5\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->cert_pem, testing::ReadText(kFixtures + "server.pem"));
  EXPECT_EQ(c->key_pem, testing::ReadText(kFixtures + "server.key"));
  EXPECT_EQ(c->tls_versions, "1.3");
  EXPECT_EQ(c->tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3");
  ASSERT_EQ(c->basic_auth_users.size(), 2u);
  EXPECT_EQ(c->basic_auth_users.at("fleet"), kFleetHash);
  // The empty X-XSS-Protection is unset, as exporter-toolkit leaves it.
  ASSERT_EQ(c->headers.size(), 2u);
  EXPECT_EQ(c->headers[0].first, "X-Frame-Options");
  EXPECT_EQ(c->headers[1].second, "max-age=31536000");
  EXPECT_DOUBLE_EQ(c->rate_limit_interval_s, 90);
  EXPECT_EQ(c->rate_limit_burst, 5);
  EXPECT_EQ(c->Describe(), "TLS 1.3, basic auth (2 users), rate limited");
}

TEST_F(WebConfigTest, AnEmptyFileOrEmptyTlsSectionMeansPlainHttp) {
  Result<WebConfig> empty = ReadWebConfig(Write(""));
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_FALSE(empty->tls());
  Result<WebConfig> users_only =
      ReadWebConfig(Write("tls_server_config: {}\nbasic_auth_users:\n  fleet: '" + kFleetHash + "'\n"));
  ASSERT_TRUE(users_only.ok()) << users_only.status().message();
  EXPECT_FALSE(users_only->tls());
  EXPECT_EQ(users_only->Describe(), "plain HTTP, basic auth (1 user)");
}

TEST_F(WebConfigTest, ClientCertificatesNeedTheirCaAndOnlyTheVerifyingPolicy) {
  const std::string tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
  Result<WebConfig> c =
      ReadWebConfig(Write(tls + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->client_ca_pem, testing::ReadText(kFixtures + "client-ca.pem"));
  EXPECT_NE(Refusal(tls + "  client_auth_type: RequireAndVerifyClientCert\n")
                .find("tls_server_config.client_ca_file: RequireAndVerifyClientCert needs the CA"),
            std::string::npos);
  EXPECT_NE(Refusal(tls + "  client_ca_file: client-ca.pem\n")
                .find("a client CA without client_auth_type: set RequireAndVerifyClientCert"),
            std::string::npos);
  EXPECT_NE(Refusal(tls + "  client_auth_type: RequireAnyClientCert\n  client_ca_file: client-ca.pem\n")
                .find("tls_server_config.client_auth_type: 'RequireAnyClientCert' lets unverified clients in"),
            std::string::npos);
  EXPECT_NE(Refusal(tls + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: server.key\n")
                .find("tls_server_config.client_ca_file: holds no PEM certificate"),
            std::string::npos);
}

TEST_F(WebConfigTest, EachRefusalNamesTheFileTheFieldAndTheFix) {
  const std::string path = dir_ + "/web.yml";
  const std::string tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tls_config:\n  cert_file: a\n", "web config " + path + ": tls_config: unknown field"},
      {tls + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
       "tls_server_config.cipher_suites: not supported by fullburn serve"},
      {tls + "  curve_preferences: [X25519]\n", "tls_server_config.curve_preferences: not supported"},
      {tls + "  min_version: TLS14\n", "tls_server_config.min_version: 'TLS14' is not one of TLS10, TLS11, TLS12, TLS13"},
      {tls + "  min_version: TLS13\n  max_version: TLS12\n", "tls_server_config.min_version: is above max_version"},
      {"tls_server_config:\n  cert_file: server.pem\n  key_file: rogue.key\n",
       "tls_server_config: the certificate and key do not load: "},
      {"tls_server_config:\n  cert_file: server.pem\n  key_file: encrypted.key\n",
       "tls_server_config.key_file: the key is encrypted"},
      {"tls_server_config:\n  cert_file: missing.pem\n  key_file: server.key\n",
       "tls_server_config.cert_file: cannot read " + dir_ + "/missing.pem (No such file or directory)"},
      {"tls_server_config:\n  key_file: server.key\n", "tls_server_config.cert_file: missing"},
      {"tls_server_config:\n  cert_file: server.pem\n  cert: x\n  key_file: server.key\n",
       "tls_server_config.cert_file: give cert or cert_file, not both"},
      {"basic_auth_users:\n  bob: hunter2\n", "basic_auth_users.bob: not a bcrypt hash"},
      {"basic_auth_users:\n  bob: [1, 2]\n", "basic_auth_users.bob: expected a string"},
      {"http_server_config:\n  headers:\n    Server: fullburn\n",
       "http_server_config.headers.Server: not one of the headers exporter-toolkit allows"},
      {"http_server_config:\n  headers:\n    X-Frame-Options: always\n",
       "http_server_config.headers.X-Frame-Options: 'always' is not deny or sameorigin"},
      {"http_server_config:\n  http3: true\n", "http_server_config.http3: unknown field"},
      {"rate_limit:\n  interval: fast\n  burst: 1\n", "rate_limit.interval: 'fast' is not a duration"},
      {"rate_limit:\n  interval: 1s\n", "rate_limit.burst: must be 1 or more with an interval"},
      {"rate_limit:\n  interval: 1s\n  burst: many\n", "rate_limit.burst: expected a whole number"},
      {"basic_auth_users:\n  fleet: [a\n", "web config " + path + ": not YAML at line 3"},
      {"- a\n- b\n", "web config " + path + ": expected a mapping of fields"},
  };
  for (const auto& [yaml, expected] : cases) {
    std::string message = Refusal(yaml);
    EXPECT_NE(message.find(expected), std::string::npos) << "for:\n" << yaml << "got: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  Result<WebConfig> missing = ReadWebConfig(dir_ + "/nowhere.yml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("web config " + dir_ + "/nowhere.yml: cannot read it"),
            std::string::npos)
      << missing.status().message();
}

// The file shipped in examples/prometheus (which promtool also checks, in
// prometheus_examples_check): fullburn takes it as it is.
TEST_F(WebConfigTest, TheShippedExampleIsTakenAndItsHashIsTheDocumentedPassword) {
  fs::copy_file(SOURCE_DIR "/examples/prometheus/web-config.yml", dir_ + "/example.yml");
  fs::copy_file(kFixtures + "server.pem", dir_ + "/tls.crt");
  fs::copy_file(kFixtures + "server.key", dir_ + "/tls.key");
  Result<WebConfig> c = ReadWebConfig(dir_ + "/example.yml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->tls());
  EXPECT_EQ(c->Describe(), "TLS 1.2-1.3, basic auth (1 user)");
  BasicAuth auth(c->basic_auth_users);
  EXPECT_TRUE(auth.Check("prometheus", "change-this-password"));
}

TEST(BasicAuthTest, ChecksBcryptHashesAndAnswersTheSameTwice) {
  BasicAuth auth({{"fleet", kFleetHash}});
  ASSERT_TRUE(auth.enabled());
  for (int round = 0; round < 2; ++round) {  // the second round comes from the remembered answers
    EXPECT_TRUE(auth.Check("fleet", "fleet-secret"));
    EXPECT_FALSE(auth.Check("fleet", "fleet-secreT"));
    EXPECT_FALSE(auth.Check("fleet", ""));
    EXPECT_FALSE(auth.Check("other", "fleet-secret"));
    EXPECT_FALSE(auth.Check("fleet", std::string("fleet-secret\0x", 14)));
  }
  EXPECT_FALSE(BasicAuth({}).enabled());
  // htpasswd writes $2y$, older tools $2a$: the same hash under each prefix.
  for (const char* prefix : {"$2y$", "$2a$"}) {
    BasicAuth other({{"fleet", prefix + kFleetHash.substr(4)}});
    EXPECT_TRUE(other.Check("fleet", "fleet-secret")) << prefix;
    EXPECT_FALSE(other.Check("fleet", "fleet-secreT")) << prefix;
  }
}

// Messages true to the input (issue 53): the line and column are those of
// the character that is wrong, counted from 1 as an editor does.
TEST_F(WebConfigTest, LinesAndColumnsAreWhereTheFileIsWrong) {
  const std::string path = dir_ + "/web.yml";
  EXPECT_EQ(Refusal("rate_limit:\n  interval: 1s\n\tburst: 2\n"),
            "web config " + path + ": not YAML at line 3, column 1: illegal tab when looking for indentation");
  // The ']' closing a '{' is the 36th character of the line.
  EXPECT_EQ(Refusal("rate_limit: {interval: 1s, burst: 1]\n"),
            "web config " + path + ": not YAML at line 1, column 36: illegal flow end");
  // YAML, but a user name that is a list: the line of that key.
  EXPECT_EQ(Refusal("rate_limit:\n  interval: 1s\n  burst: 1\nbasic_auth_users:\n  ? [a, b]\n  : x\n"),
            "web config " + path + ": line 5: bad conversion");
}

}  // namespace
}  // namespace fullburn
