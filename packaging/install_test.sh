#!/usr/bin/env bash
# kvlab as an installed package: `cmake --install` into a scratch prefix, then one check.
#   install_test.sh BUILD SOURCE find_package   examples/consumer built with find_package(kvlab)
#   install_test.sh BUILD SOURCE pkg_config     the same through pkg-config (kvlab.pc)
#   install_test.sh BUILD SOURCE headers        every installed header compiles on its own
#   install_test.sh BUILD SOURCE headers_counter  ... and a tree missing one header is caught
#   install_test.sh BUILD SOURCE python         the installed Python module finds the installed kvlab
# The consumer decodes random models (seeds drawn here, printed) naively and on every exact cache
# variant, bit for bit; an approximate variant must make it fail (its counter-check).
set -euo pipefail
build=$1 src=$2 mode=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" || { cat "$scratch/install.log"; exit 1; }
seeds="$((RANDOM + 1)) $((RANDOM + 1))"
echo "seeds: $seeds"

fail() { echo "FAIL: $*" >&2; exit 1; }

# The consumer at $1 decodes bitwise equal for each seed, and catches the window cache differing.
check_consumer() {
  for seed in $seeds; do "$1" "$seed" 12 || fail "decode_both $seed 12: cached differs from naive decode"; done
  if out=$("$1" 1 40 window); then fail "decode_both did not catch the window cache differing: $out"; fi
  grep -q "DIFFERS" <<<"$out" || fail "decode_both failed without naming the difference: $out"
}

# The flags a consumer's compile line must carry: C++20 (GNU mode too: the explicit
# -ffp-contract=off is what keeps a*b+c unfused) and the numeric contract's, so that inline
# arithmetic from kvlab's headers rounds as the library's does.
check_contract_flags() {
  local flag
  grep -qE -- "-std=(c|gnu)\+\+20" <<<"$1" || fail "$2 lacks -std=c++20: $1"
  for flag in -ffp-contract=off -fno-fast-math -fno-associative-math; do
    grep -qF -- "$flag" <<<"$1" || fail "$2 lacks $flag: $1"
  done
}

# Each header compiles alone with kvlab.pc's flags: the installed set is closed.
check_headers() {
  local inc=$1 h n=0 cflags
  cflags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags kvlab) || fail "pkg-config --cflags kvlab"
  for h in "$inc"/kvlab/*.h; do
    echo "#include <kvlab/$(basename "$h")>" >"$scratch/one.cpp"
    # shellcheck disable=SC2086  # cflags: several words
    g++ $cflags -fsyntax-only "$scratch/one.cpp" 2>"$scratch/err" ||
      fail "$(basename "$h") does not compile from the installed tree: $(grep -m1 error "$scratch/err")"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || fail "no headers installed under include/kvlab"
  echo "$n installed headers each compile on their own"
}

case "$mode" in
find_package)
  cp -r "$src/examples/consumer" "$scratch/consumer"
  cmake -S "$scratch/consumer" -B "$scratch/b" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$scratch/cfg.log" || { cat "$scratch/cfg.log"; fail "find_package(kvlab) did not configure"; }
  cmake --build "$scratch/b" >"$scratch/build.log" || { cat "$scratch/build.log"; fail "the consumer did not build"; }
  check_contract_flags "$(grep '"command"' "$scratch/b/compile_commands.json")" "the consumer's compile line"
  check_consumer "$scratch/b/decode_both"
  # A version the package cannot give is refused by kvlabConfigVersion.cmake.
  sed -i 's/find_package(kvlab 0\.[0-9]*/find_package(kvlab 99.0/' "$scratch/consumer/CMakeLists.txt"
  if cmake -S "$scratch/consumer" -B "$scratch/b99" >/dev/null 2>&1; then fail "find_package(kvlab 99.0) was accepted"; fi
  ;;
pkg_config)
  cp -r "$src/examples/consumer" "$scratch/consumer"
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  check_contract_flags "$(pkg-config --cflags kvlab)" "pkg-config --cflags kvlab"
  make -s -C "$scratch/consumer" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; fail "make did not build"; }
  check_consumer "$scratch/consumer/decode_both"
  want=$("$prefix/bin/kvlab" --version | awk '{print $2}')
  [ "$(pkg-config --modversion kvlab)" = "$want" ] || fail "kvlab.pc says $(pkg-config --modversion kvlab), kvlab $want"
  ;;
headers)
  check_headers "$prefix/include"
  ;;
headers_counter)
  # backend.h is included by most others: without it the check must fail and name it.
  rm "$prefix/include/kvlab/backend.h"
  if out=$(check_headers "$prefix/include" 2>&1); then fail "a tree without backend.h passed: $out"; fi
  grep -q "backend.h" <<<"$out" || fail "the failure did not name backend.h: $out"
  echo "caught: $out"
  ;;
python)
  site=$prefix/lib/python3/dist-packages
  [ -d "$site/kvlab" ] || { echo "no Python module in this build: skipped"; exit 77; }
  PYTHONPATH=$site PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 - "$prefix/bin/kvlab" "${seeds%% *}" <<'PY'
# The installed module finds the installed program (its _paths.py), both are the same kvlab, and
# cached decode equals naive decode bit for bit through it.
import os, subprocess, sys
import numpy as np
import kvlab
want, seed = sys.argv[1], int(sys.argv[2])
assert os.path.realpath(kvlab._binary()) == os.path.realpath(want), (kvlab._binary(), want)
line = subprocess.run([kvlab._binary(), "--version"], capture_output=True, text=True, check=True).stdout
assert line.split()[1] == kvlab.__version__, (line, kvlab.__version__)
assert kvlab.build_info()["commit"] in line, (line, kvlab.build_info())
m = kvlab.random_model(seed=seed)
tokens = [1, 5, 9, 3]
d = kvlab.Decoder(m, "paged")
cached = d.prefill(tokens[:2])
for i in range(2, len(tokens) + 1):
    naive = kvlab.naive_logits(m, tokens[:i])
    assert np.array_equal(naive.view(np.uint32), cached.view(np.uint32)), f"position {i - 1} differs"
    if i < len(tokens):
        cached = d.decode(tokens[i])
print("installed module", kvlab.__version__, "runs", kvlab._binary(), "and decodes bit for bit")
PY
  ;;
*) echo "usage: $0 BUILD SOURCE find_package|pkg_config|headers|headers_counter|python" >&2; exit 2 ;;
esac
echo "ok: $mode"
