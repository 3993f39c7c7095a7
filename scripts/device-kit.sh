#!/usr/bin/env bash
# Packs what a build needs besides libtorch into .kit/, for a machine that
# has no Debian packages and no network (the GPU machine: docs in
# DEVELOPERS.md, "On a GPU machine"). Run here, on Debian bookworm; carry
# .kit with the working tree and build there with scripts/device-build.sh.
#   .kit/root   the packages' files (headers, libraries, CMake configs)
#   .kit/gloo   libgloo-dev's headers, used only where libtorch ships none
set -euo pipefail
cd "$(dirname "$0")/.."
kit="$PWD/.kit"
packages=(
  libsqlite3-dev libsqlite3-0 libcli11-dev nlohmann-json3-dev libfmt-dev libfmt9
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1
  libmicrohttpd-dev libmicrohttpd12               # fullburn serve (GnuTLS: the machine's own)
  libyaml-cpp-dev libyaml-cpp0.7 libgnutls28-dev nettle-dev  # serve --web-config (GnuTLS, Nettle: the machine's own)
  libtomlplusplus-dev                           # header-only there (no pkg-config)
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 zlib1g-dev zlib1g
  libgtest-dev libgmock-dev libgloo-dev
)
rm -rf "$kit"
mkdir -p "$kit/debs" "$kit/root" "$kit/gloo"
(cd "$kit/debs" && apt-get download -qq -o APT::Sandbox::User=root "${packages[@]}")
for deb in "$kit"/debs/*.deb; do dpkg -x "$deb" "$kit/root"; done
rm -rf "$kit/debs" "$kit"/root/usr/share/{doc,man,lintian,bug} "$kit"/root/usr/src
mv "$kit/root/usr/include/gloo" "$kit/gloo/gloo"
# Not carried: gloo's library is libtorch's own, toml++ is used header-only,
# static libraries and pkg-config files (no pkg-config there).
rm -rf "$kit"/root/usr/lib/libgloo* "$kit"/root/usr/lib/x86_64-linux-gnu/{libgloo*,libtomlplusplus*,pkgconfig,engines-3,ossl-modules}
find "$kit/root" -name '*.a' ! -name 'libg*' -delete
# zlib's library is under /lib (bookworm is not usr-merged): moved under
# usr/lib, and every absolute link (zlib's -dev one points to /lib) is
# pointed at the same file inside the kit.
if [[ -d "$kit/root/lib" ]]; then
  cp -a "$kit/root/lib/." "$kit/root/usr/lib/"
  rm -rf "$kit/root/lib"
fi
while IFS= read -r link; do
  target=$(readlink "$link")
  [[ $target == /* ]] || continue
  ln -sfn "$(realpath --relative-to="$(dirname "$link")" -m "$kit/root/usr${target#/usr}")" "$link"
done < <(find "$kit/root" -type l)
# py-spy (fullburn run's stack sampler, docs/stacks.md): Debian has no
# package and the GPU machine no network, so its static binary from the
# PyPI wheel rides along; there, FULLBURN_PY_SPY=.kit/bin/py-spy.
mkdir -p "$kit/bin"
spy_venv="${FULLBURN_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fullburn/torch-2.11.0}"
if [[ -x $spy_venv/bin/py-spy ]]; then
  cp "$spy_venv/bin/py-spy" "$kit/bin/py-spy"
elif ! (cd "$kit" && pip download -q --no-deps --only-binary=:all: -d wheel py-spy >/dev/null 2>&1 &&
        python3 -m zipfile -e wheel/py_spy-*.whl wheel/x &&
        cp wheel/x/py_spy-*.data/scripts/py-spy bin/py-spy && chmod +x bin/py-spy); then
  echo "device-kit: no py-spy (scripts/torch2-venv.sh installs it; or pip download py-spy): the GPU machine's runs will have no stacks" >&2
fi
rm -rf "$kit/wheel"
broken=$(find "$kit" -xtype l)
if [[ -n $broken ]]; then
  echo "device-kit: broken links: $broken" >&2
  exit 1
fi
echo "device-kit: $(du -sh "$kit" | cut -f1) in $kit (carry it: .kit)"
