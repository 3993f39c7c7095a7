#!/usr/bin/env bash
# The repaired wheel on a machine that has only Python and pip: a bare Debian
# root made by debootstrap --variant=minbase with python3 and python3-venv (no
# compiler, no -dev package, none of the libraries fullburn links), entered with
# chroot, a venv made there, the wheel installed into it, then
# tests/pip/use_installed.sh inside: fullburn run, analyze, ImageLoader, serve.
#   tests/pip/portable_test.sh WHEEL...      (as root; on demand, not in CTest)
# Each suite of SUITES (default: bookworm trixie) takes the wheel whose cpXY tag
# is its Python's (scripts/build-wheel.sh makes one per Python); a suite the
# archive does not serve, or with no wheel for its Python, is said and skipped.
# Roots are kept in ROOTS (default /var/tmp/fullburn-roots) for the next run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
roots=${ROOTS:-/var/tmp/fullburn-roots}
read -r -a suites <<<"${SUITES:-bookworm trixie}"
wheels=()
for w in "$@"; do wheels+=("$(readlink -f "$w")"); done
[[ ${#wheels[@]} -gt 0 ]] || { echo "usage: portable_test.sh WHEEL... (scripts/build-wheel.sh makes them)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "portable-test: debootstrap, chroot and mount need root: sudo $0 $*" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null ||
  { echo "portable-test: apt-get install debootstrap failed" >&2; exit 1; }
# The archive this machine's apt uses (its sources), not a host named here.
mirror=$(grep -rhoE '^(URIs:|deb) +[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null |
         awk '{print $2}' | head -n1 || true)
[[ -n $mirror ]] || { echo "portable-test: no Debian archive in /etc/apt/sources*: set one up for apt first" >&2; exit 1; }

mounted=()
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT

passed=0
for suite in "${suites[@]}"; do
  root=$roots/$suite
  if [[ ! -x $root/usr/bin/python3 ]]; then
    echo "portable-test: $suite: debootstrap --variant=minbase with python3 and python3-venv into $root"
    rm -rf "$root"
    mkdir -p "$roots"
    if ! debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$root" "$mirror" \
        >"$roots/$suite.log" 2>&1; then
      echo "portable-test: $suite: skipped, debootstrap failed ($(tail -n1 "$roots/$suite.log"))"
      continue
    fi
  fi
  py=$(chroot "$root" python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
  wheel=""
  for w in "${wheels[@]}"; do [[ $(basename "$w") == *-cp$py-cp$py-* ]] && wheel=$w; done
  if [[ -z $wheel ]]; then
    echo "portable-test: $suite: skipped, no wheel for its Python (cp$py) among: ${wheels[*]##*/}"
    continue
  fi
  echo "portable-test: $suite (Python cp$py, $(du -sh "$root" | cut -f1)): $(basename "$wheel")"
  # Not a compiler nor a library of fullburn's in there: the wheel brings its own.
  # (Python's own libsqlite3 and libssl are there; the wheel brings its own copies.)
  for absent in /usr/bin/cc /usr/bin/g++ /usr/lib/x86_64-linux-gnu/libjpeg.so.62 \
                /usr/lib/x86_64-linux-gnu/libpng16.so.16 /usr/lib/x86_64-linux-gnu/libfmt.so.9 \
                /usr/lib/x86_64-linux-gnu/libsimdjson.so.14 /usr/lib/x86_64-linux-gnu/libcpp-httplib.so.0.11; do
    [[ ! -e $root$absent ]] || { echo "portable-test: $suite: $absent is in the root: not bare" >&2; exit 1; }
  done
  # numpy for that Python, fetched here (the root has no DNS), installed offline there.
  rm -rf "$root/opt/fb" && mkdir -p "$root/opt/fb/wheels" "$root/proc" "$root/dev"
  python3 -m pip download -q numpy --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$root/opt/fb/wheels" ||
    { echo "portable-test: pip download numpy for cp$py failed: is PyPI reachable?" >&2; exit 1; }
  cp "$wheel" "$root/opt/fb/wheels/"
  cp "$here/use_installed.sh" "$root/opt/fb/"
  cp "$src/tests/analyze/fixtures/torch211_h200_starved.pt.trace.json.gz" "$root/opt/fb/"
  mount -t proc proc "$root/proc" && mounted+=("$root/proc")
  mount --bind /dev "$root/dev" && mounted+=("$root/dev")
  in_root() { chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 TMPDIR=/tmp "$@"; }
  in_root python3 -m venv /opt/fb/venv
  in_root /opt/fb/venv/bin/pip install -q --no-index --find-links /opt/fb/wheels "/opt/fb/wheels/$(basename "$wheel")"
  in_root bash /opt/fb/use_installed.sh /opt/fb/venv /opt/fb/torch211_h200_starved.pt.trace.json.gz
  umount -l "$root/dev" "$root/proc"
  mounted=()
  passed=$((passed + 1))
done
echo "portable-test: $passed of ${#suites[@]} suites ran the wheel"
[[ $passed -gt 0 ]]
