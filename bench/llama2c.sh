#!/usr/bin/env bash
# kvlab against llama2.c's run.c (the speed yardstick): the peer's compare.sh on the same random
# weights, whole process, best of RUNS, after checking that both print the same greedy text.
#   bench/llama2c.sh [short|long] [RUNS]
#   short: stories15M shape, 255 tokens; long: max_seq 8192, $TOKENS tokens (default 8000; minutes)
# KVLAB names the kvlab binary (default build/kvlab), KVLAB_PEER the peer's folder (default
# ../shared/peers/llama2c beside the checkout). Without the peer it says so and exits 77 (skipped).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
peer=${KVLAB_PEER:-$root/../shared/peers/llama2c}
kvlab=${KVLAB:-$root/build/kvlab}
if [ ! -f "$peer/compare.sh" ] || [ ! -f "$peer/run.c" ]; then
  echo "bench/llama2c.sh: no llama2.c peer at $peer (set KVLAB_PEER to its folder); nothing compared"
  exit 77
fi
command -v "${CC:-gcc}" >/dev/null || { echo "bench/llama2c.sh: no C compiler (${CC:-gcc}) to build run.c"; exit 77; }
[ -x "$kvlab" ] || { echo "bench/llama2c.sh: $kvlab is not built (cmake --build build)" >&2; exit 2; }
case ${1:-short} in short|long) ;; *) echo "bench/llama2c.sh: the mode is short or long" >&2; exit 2 ;; esac
exec bash "$peer/compare.sh" "$kvlab" "${1:-short}" "${2:-3}"
