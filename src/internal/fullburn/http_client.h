// What fullburn's HTTP clients (fleet's Prometheus client, the MLflow
// client; both cpp-httplib) say when a request gets no answer, in one
// wording. Linked only into fullburn-net, with cpp-httplib.
//
// Contract: pure functions.
#pragma once

#include <string>

namespace httplib {
enum class Error;  // cpp-httplib's (an int enum): this header needs no httplib.h
}

namespace fullburn {

// "connection refused or host not found", "the TLS handshake failed", ...
std::string WhyUnreachable(httplib::Error e);
// `s` cut to `n` characters, "..." marking the cut.
std::string Trimmed(std::string s, size_t n);

}  // namespace fullburn
