#!/usr/bin/env bash
# The Debian package: cpack -G DEB, unpacked into a scratch root with dpkg -x, runs `kvlab demo`
# on the shared model there; its Depends name the Debian package of every library the program
# loads; its man pages, completions and headers are where Debian looks for them.
# A program built against the unpacked package with pkg-config decodes bit for bit.
#   deb_test.sh BUILD MODELS_DIR SOURCE      (77: skipped, no dpkg-deb or no model files)
set -euo pipefail
build=$1 models=$2 src=$3
command -v dpkg-deb >/dev/null && command -v cpack >/dev/null || { echo "no dpkg-deb or cpack: skipped"; exit 77; }
[ -f "$models/stories260K.bin" ] && [ -f "$models/tok512.bin" ] || { echo "no stories260K.bin in $models: skipped"; exit 77; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-deb.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$scratch/pkg" >"$scratch/cpack.log" 2>&1 ||
  { cat "$scratch/cpack.log"; fail "cpack -G DEB failed"; }
deb=$(ls "$scratch"/pkg/kvlab_*.deb)
echo "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
dpkg -x "$deb" "$scratch/root"
root=$scratch/root

# The program runs from the unpacked tree, and is the build's kvlab.
"$root/usr/bin/kvlab" --version | grep -q "^kvlab $(dpkg-deb -f "$deb" Version) " ||
  fail "kvlab --version does not name the package's version $(dpkg-deb -f "$deb" Version)"
out=$("$root/usr/bin/kvlab" demo --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --steps 24 2>&1) ||
  { echo "$out"; fail "kvlab demo from the package failed"; }
grep -qi "bitwise equal" <<<"$out" || { echo "$out"; fail "kvlab demo did not report bitwise equality"; }
echo "kvlab demo from the package: $(grep -i "bitwise" <<<"$out" | tail -1)"

# Every library the program links (its NEEDED; theirs come with their own packages' Depends)
# belongs to a Debian package that the Depends field $1 names. Prints what is missing, if any.
missing_depends() {
  local names needed lib pkg
  names=$(sed 's/([^)]*)//g; s/|/,/g' <<<"$1" | tr ',' '\n' | tr -d ' ')  # package names, one a line
  needed=$(objdump -p "$root/usr/bin/kvlab" | awk '$1 == "NEEDED" {print $2}')
  [ -n "$needed" ] || { echo "objdump found no NEEDED libraries in kvlab"; return; }
  for lib in $(ldd "$root/usr/bin/kvlab" | awk -v want=" $(tr '\n' ' ' <<<"$needed")" '/=>/ && index(want, " " $1 " ") {print $3}'); do
    pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1) ||
      pkg=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1) || true
    if [ -z "$pkg" ]; then echo "$lib belongs to no Debian package"; continue; fi
    grep -Fxq "$pkg" <<<"$names" || echo "$lib is $pkg's, which Depends does not name"
  done
}
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
gaps=$(missing_depends "$depends")
[ -z "$gaps" ] || fail "kvlab links libraries its package does not depend on: $gaps"
# Counter-check: the same field without libfmt9 must be caught, naming it.
gaps=$(missing_depends "$(sed 's/libfmt9[^,]*,\? *//' <<<"$depends")")
grep -q "libfmt" <<<"$gaps" || fail "a Depends without libfmt9 was not caught: '$gaps'"

# Where Debian looks: man pages, completions, the CMake and pkg-config files, the headers.
for f in usr/share/man/man1/kvlab.1 usr/share/man/man1/kvlab-demo.1 usr/share/bash-completion/completions/kvlab \
         usr/share/zsh/vendor-completions/_kvlab usr/include/kvlab/decode.h usr/include/kvlab/cache_plugin.h \
         usr/share/doc/kvlab/README.md usr/share/doc/kvlab/lessons/README.md \
         usr/share/doc/kvlab/examples/consumer/CMakeLists.txt; do
  [ -f "$root/$f" ] || fail "the package lacks /$f"
done
[ -n "$(find "$root/usr/lib" -path "*/cmake/kvlab/kvlabConfig.cmake")" ] || fail "the package lacks kvlabConfig.cmake"
cp -r "$src/examples/consumer" "$scratch/consumer"
PKG_CONFIG_PATH=$root/usr/lib/pkgconfig make -s -C "$scratch/consumer" >"$scratch/make.log" 2>&1 ||
  { cat "$scratch/make.log"; fail "examples/consumer did not build against the package"; }
"$scratch/consumer/decode_both" "$((RANDOM + 1))" 12 || fail "decode_both built against the package"
echo "ok: the package installs, runs kvlab demo, and builds a program that decodes bit for bit"
