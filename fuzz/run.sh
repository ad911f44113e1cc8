#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a bounded time each, as many at once as there are
# cores (FUZZ_JOBS overrides), and fails if any finds something. CI runs it from bootstrap.sh;
# README "Fuzzing and sanitizers" shows how to run one target for hours.
#
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]      e.g. fuzz/run.sh build-san 60 decode
#
# Per target NAME (BUILD_DIR/fuzz/fuzz_NAME):
#   BUILD_DIR/fuzz/corpus/NAME/    the working corpus: new inputs libFuzzer finds go here and stay
#                                  for the next run (read first, so runs build on each other)
#   BUILD_DIR/fuzz/seeds/NAME/     the seeds the build made (read only)
#   fuzz/NAME.dict                 the dictionary, when there is one
#   BUILD_DIR/fuzz/findings/NAME/  crash-*, timeout-*, oom-*, leak-*: the inputs that failed
#   BUILD_DIR/fuzz/logs/NAME.log   libFuzzer's output
# Replay a finding: BUILD_DIR/fuzz/fuzz_NAME BUILD_DIR/fuzz/findings/NAME/crash-...
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
seconds=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(checkpoint tokenizer pool_script options decode panel_cache plugin_stdio trace serve_trace block_store output
             replay_log)
fi
jobs=${FUZZ_JOBS:-$(nproc)}
# Sanitizer settings for the targets: a UB report stops the run (also compiled in), leaks count.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export KVLAB_THREADS=1

for t in "${targets[@]}"; do
    if [[ ! -x $build/fuzz/fuzz_$t ]]; then
        echo "fuzz/run.sh: $build/fuzz/fuzz_$t is not built (configure with clang and -DKVLAB_SANITIZE=ON)" >&2
        exit 2
    fi
done

# One target: libFuzzer for `seconds`, its exit status in logs/NAME.rc.
fuzz_one() {
    local t=$1
    local corpus=$build/fuzz/corpus/$t findings=$build/fuzz/findings/$t log=$build/fuzz/logs/$t.log
    mkdir -p "$corpus" "$findings" "$(dirname "$log")"
    local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
                -artifact_prefix="$findings/")
    [[ -f $src/$t.dict ]] && args+=(-dict="$src/$t.dict")
    "$build/fuzz/fuzz_$t" "${args[@]}" "$corpus" "$build/fuzz/seeds/$t" >"$log" 2>&1
    echo $? >"$build/fuzz/logs/$t.rc"
}

for t in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
    fuzz_one "$t" &
done
wait

failed=()
printf '%-12s %10s %8s %7s %s\n' target execs exec/s corpus result
for t in "${targets[@]}"; do
    log=$build/fuzz/logs/$t.log
    findings=$build/fuzz/findings/$t
    rc=$(cat "$build/fuzz/logs/$t.rc")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    size=$(find "$build/fuzz/corpus/$t" -type f | wc -l)
    if [[ $rc -eq 0 ]]; then
        printf '%-12s %10s %8s %7s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$size" ok
        continue
    fi
    failed+=("$t")
    printf '%-12s %10s %8s %7s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$size" \
        "FAILED (exit $rc): $(ls -t "$findings" | head -1) in $findings; log $log"
    # The report itself: from the first sanitizer or property line, at most 40 lines.
    grep -a -n -m1 -E '==ERROR|runtime error|fuzz: property|deadly signal|Timeout|out-of-memory' "$log" |
        cut -d: -f1 | { read -r at && tail -n +"$at" "$log" | head -40; } | cat -v | sed 's/^/    /'
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: ${#failed[@]} target(s) found something: ${failed[*]}" >&2
    exit 1
fi
