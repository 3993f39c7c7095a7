#!/usr/bin/env bash
# What a user of a venv with fullburn pip-installed can do, checked: the
# command on the venv's PATH and its version (the module's too), `fullburn run`
# with the step markers from the installed package, `fullburn analyze` on a
# shipped trace, `import fullburn` reading an image folder through ImageLoader,
# `fullburn serve` answering /metrics on loopback. Run by tests/pip/pip_test.sh
# in a venv, and by tests/pip/portable_test.sh inside a bare Debian root.
# usage: use_installed.sh VENV TRACE   (needs only bash, sed, grep and the venv)
set -euo pipefail
venv=$1
trace=$2
bin=$venv/bin
export PATH="$bin:/usr/local/bin:/usr/bin:/bin"
export FULLBURN_STORE=$venv.runs.db
scratch=$(mktemp -d "${TMPDIR:-/tmp}/fb_use_XXXXXX")
serve_pid=""
cleanup() {
  if [[ -n $serve_pid ]]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
step() { echo "use-installed: $venv: $*"; }
fail() { echo "use-installed: FAIL: $venv: $*" >&2; exit 1; }

[[ -x $bin/fullburn ]] || fail "no fullburn command in $bin"
site=$(python -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
version=$(fullburn version | sed -n 's/^fullburn //p')
module_version=$(python -c "import fullburn; print(fullburn.__version__)")
[[ -n $version && $version == "$module_version" ]] ||
  fail "fullburn version says '$version', fullburn.__version__ '$module_version'"
[[ $(python -m fullburn --version) == "fullburn $version" ]] ||
  fail "python -m fullburn --version is not 'fullburn $version'"
step "fullburn $version, the same in fullburn.__version__ and python -m fullburn"

# The job finds the step markers inside the installed package (no source
# tree), and its marked steps are recorded.
out=$(fullburn run --quiet -- python -c "
import fullburn_markers, time
print('MARKERS', fullburn_markers.__file__)
for _ in fullburn_markers.steps(range(6)):
    time.sleep(0.01)
" 2>&1) || fail "fullburn run failed: $out"
grep -q "^MARKERS $site/fullburn/_python/fullburn_markers.py" <<<"$out" ||
  fail "the job's markers are not the installed package's ($site/fullburn/_python): $out"
out=$(fullburn runs show 1 2>&1) || fail "fullburn runs show 1: $out"
grep -Eq "^ *steps: +6 " <<<"$out" || fail "run 1 has not its 6 marked steps: $out"
step "fullburn run recorded a run, its 6 steps marked through the installed helpers"

out=$(fullburn analyze "$trace" 2>&1) || fail "fullburn analyze $trace failed: $out"
grep -q "idle while the host was in: data loader" <<<"$out" ||
  fail "fullburn analyze did not find the starved loader in $trace: $out"
step "fullburn analyze read $(basename "$trace")"

fullburn make-dataset images "$scratch/images" --classes 2 --per-class 6 --size 64x48 >/dev/null ||
  fail "fullburn make-dataset failed"
out=$(python -c "
import fullburn, sys
n = 0
for x, y in fullburn.ImageLoader(sys.argv[1], 4, crop=32, threads=2, output='numpy'):
    assert x.shape == (4, 3, 32, 32) and x.dtype.name == 'float32', (x.shape, x.dtype)
    n += len(y)
print('IMAGES', n)
" "$scratch/images" 2>&1) || fail "ImageLoader failed: $out"
[[ $out == "IMAGES 12" ]] || fail "ImageLoader read '$out', not 12 images"
step "import fullburn: ImageLoader read an image folder's 12 images"

# On a port the kernel picks: the address is read from what serve says.
fullburn serve --listen 127.0.0.1:0 --interval 0.2 2>"$scratch/serve.log" &
serve_pid=$!
url=""
for _ in $(seq 150); do
  url=$(sed -n 's|.*serving \(http://[^ ]*/metrics\).*|\1|p' "$scratch/serve.log")
  [[ -n $url ]] && break
  sleep 0.1
done
[[ -n $url ]] || fail "fullburn serve did not say where it listens: $(cat "$scratch/serve.log")"
out=$(python -c "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())" "$url") ||
  fail "no answer from $url"
grep -q "^fullburn_host_cpu_util" <<<"$out" || fail "$url answered without fullburn_host_cpu_util"
step "fullburn serve answered $url"
