#!/usr/bin/env bash
# Only fullburn-net (serve, fleet) loads the HTTP and TLS libraries; every
# other command runs in fullburn, which must load none of them (they were
# 6.5 MB of a small analyze's 14 MB peak: docs/architecture.md).
#   network_libraries.sh PATH/fullburn PATH/fullburn-net
set -uo pipefail
names='lib(ssl|crypto|gnutls|microhttpd|cpp-httplib|yaml-cpp)\.so'
main=$(ldd "$1") || { echo "ldd $1 failed"; exit 1; }
net=$(ldd "$2") || { echo "ldd $2 failed"; exit 1; }
if loaded=$(grep -E "$names" <<<"$main"); then
  echo "$1 loads network libraries; link them into fullburn-net only:"
  echo "$loaded"
  exit 1
fi
# The names must still match what fullburn-net loads, or the check above
# would pass whatever fullburn linked.
grep -E "$names" <<<"$net" >/dev/null || { echo "$2 loads none of $names: update this check"; exit 1; }
echo "fullburn loads none of $names; fullburn-net loads $(grep -cE "$names" <<<"$net") of them"
