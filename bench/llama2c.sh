#!/usr/bin/env bash
# kvlab against llama2.c's run.c (the speed yardstick): whole process, best of RUNS, after checking
# that both print the same greedy text on the same random weights.
#   bench/llama2c.sh [short|long] [RUNS] [--background-load N]
#   short: stories15M shape, 255 tokens; long: max_seq 8192, $TOKENS tokens (default 8000; minutes)
#   --background-load N: both programs idle and beside N busy-looping processes this script starts
#   and stops (each bounded to 10 minutes), in one interleaved run: every run times every program
#   idle, then loaded, so that noise hits all alike. Without it, the peer's own compare.sh runs.
# KVLAB names the kvlab binary (default build/kvlab), KVLAB_PEER the peer's folder (default
# ../shared/peers/llama2c beside the checkout). Without the peer it says so and exits 77 (skipped).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
peer=${KVLAB_PEER:-$root/../shared/peers/llama2c}
kvlab=${KVLAB:-$root/build/kvlab}
mode=short runs=3 load=
positional=0
while [ $# -gt 0 ]; do
  case $1 in
    --background-load)
      [ $# -ge 2 ] || { echo "bench/llama2c.sh: --background-load takes a count" >&2; exit 2; }
      load=$2; shift 2 ;;
    --background-load=*) load=${1#*=}; shift ;;
    *)
      case $positional in
        0) mode=$1 ;;
        1) runs=$1 ;;
        *) echo "bench/llama2c.sh: usage: bench/llama2c.sh [short|long] [RUNS] [--background-load N]" >&2; exit 2 ;;
      esac
      positional=$((positional + 1)); shift ;;
  esac
done
case $mode in short|long) ;; *) echo "bench/llama2c.sh: the mode is short or long" >&2; exit 2 ;; esac
case $runs in ''|*[!0-9]*|0) echo "bench/llama2c.sh: RUNS is a count of 1 or more" >&2; exit 2 ;; esac
if [ -n "$load" ]; then
  case $load in *[!0-9]*|'') echo "bench/llama2c.sh: --background-load takes a count 0..64" >&2; exit 2 ;; esac
  [ "$load" -le 64 ] || { echo "bench/llama2c.sh: --background-load takes a count 0..64" >&2; exit 2; }
fi
if [ ! -f "$peer/compare.sh" ] || [ ! -f "$peer/run.c" ]; then
  echo "bench/llama2c.sh: no llama2.c peer at $peer (set KVLAB_PEER to its folder); nothing compared"
  exit 77
fi
command -v "${CC:-gcc}" >/dev/null || { echo "bench/llama2c.sh: no C compiler (${CC:-gcc}) to build run.c"; exit 77; }
[ -x "$kvlab" ] || { echo "bench/llama2c.sh: $kvlab is not built (cmake --build build)" >&2; exit 2; }
[ -n "$load" ] || exec bash "$peer/compare.sh" "$kvlab" "$mode" "$runs"

# The loaded comparison: the peer's build and weights, as compare.sh makes them, timed here.
k=$(realpath "$kvlab")
w=$("$peer/build.sh")
case $mode in
  short) shape=stories15M; n=256; m=$w/rand15M.bin ;;
  long)  shape=dim=288,hidden_dim=768,n_layers=6,n_heads=6,n_kv_heads=6,vocab_size=32000,max_seq=8192
         n=$(( ${TOKENS:-8000} + 1 )); m=$w/rand15M-8k.bin ;;
esac
[ -f "$m" ] || "$k" export --shape "$shape" --seed 1 "$m" >/dev/null
ours() { "$k" generate --model "$m" --tokenizer "$w/tokenizer.bin" --prompt "Once" --steps $((n - 1)) --threads "$1" 2>/dev/null; }
peer() { OMP_NUM_THREADS=$2 "$w/$1" "$m" -z "$w/tokenizer.bin" -t 0 -n $n -i "Once" 2>/dev/null; }
[ "$(ours 1)" = "$(peer run 1)" ] || { echo "bench/llama2c.sh: kvlab and llama2.c print different text on the same weights" >&2; exit 1; }
[ "$(ours 2)" = "$(ours 1)" ] || { echo "bench/llama2c.sh: kvlab prints different text on 2 threads" >&2; exit 1; }

busy=()
stop_load() { for p in "${busy[@]+"${busy[@]}"}"; do kill "$p" 2>/dev/null || true; done
              for p in "${busy[@]+"${busy[@]}"}"; do wait "$p" 2>/dev/null || true; done; busy=(); }
start_load() { for _ in $(seq "$1"); do timeout 600 sh -c 'while :; do :; done' & busy+=($!); done; sleep 0.2; }
trap stop_load EXIT
secs() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
declare -A best
keep() { local key=$1 t; shift; t=$(secs "$@"); [ -z "${best[$key]:-}" ] || [ "$t" -lt "${best[$key]}" ] && best[$key]=$t || true; }
loads=(0); [ "$load" -gt 0 ] && loads+=("$load")
for _ in $(seq "$runs"); do
  for l in "${loads[@]}"; do
    start_load "$l"
    keep "k1 $l" ours 1; keep "fast $l" peer runfast 1; keep "k2 $l" ours 2; keep "omp $l" peer runomp 2
    stop_load
  done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "mode $mode ($((n - 1)) tokens), best of $runs, milliseconds, whole process; load: busy-looping processes beside"
printf '%5s %9s %9s %13s %14s %16s %14s\n' load "kvlab 1t" "kvlab 2t" "2t vs 1t" "runfast 1t" "runomp 2t" "vs runomp"
for l in "${loads[@]}"; do
  printf '%5s %9s %9s %12sx %14s %16s %13sx\n' "$l" "${best[k1 $l]}" "${best[k2 $l]}" "$(ratio "${best[k1 $l]}" "${best[k2 $l]}")" \
    "${best[fast $l]}" "${best[omp $l]}" "$(ratio "${best[omp $l]}" "${best[k2 $l]}")"
done
echo "2t vs 1t: kvlab 1 thread's time over its 2 threads' (above 1: 2 threads faster); runfast and runomp:"
echo "llama2.c's fast builds (the peer's build.sh); vs runomp: its OpenMP build on 2 threads over kvlab on 2"
echo "threads (above 1: kvlab faster)"
