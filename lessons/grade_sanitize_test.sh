#!/usr/bin/env bash
# `lessons/grade N --sanitize --wrong NAME` on an already-built sanitized build folder (CI's
# build-san: it builds nothing there that is up to date). NAME's memory error passes the checks
# unsanitized; here the check that runs into it must FAIL, the grader's table stay whole (status
# 1, the score line), and the sanitizer's report name the fixture's line in the lab file.
#   grade_sanitize_test.sh BUILD N NAME
#   grade_sanitize_test.sh BUILD --every-lab   `lessons/grade N --sanitize --solution` passes for
#                                              every lab (a few cases each): the command works everywhere
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${2:-}" = "--every-lab" ]; then
  status=0
  for dir in "$root"/lessons/[0-9][0-9]-*/; do
    n=$((10#$(basename "$dir" | cut -c1-2)))
    out=$(KVLAB_SANITIZE_BUILD_DIR=$1 "$root/lessons/grade" "$n" --sanitize --solution --cases 3 2>&1)
    code=$?
    if [ "$code" -ne 0 ] || ! grep -qE '^score ([0-9]+)/\1$' <<<"$out"; then
      printf '%s\n' "$out"
      echo "grade_sanitize_test: lessons/grade $n --sanitize --solution ended with status $code" >&2
      status=1
    else
      echo "grade_sanitize_test: lab $n: $(grep -E '^score' <<<"$out")"
    fi
  done
  exit $status
fi
build=$1 n=$2 name=$3
nn=$(printf '%02d' "$n")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
KVLAB_SANITIZE_BUILD_DIR=$build "$root/lessons/grade" "$n" --sanitize --wrong "$name" >"$out" 2>&1
status=$?
problem() {
  cat "$out"
  echo "grade_sanitize_test: lessons/grade $n --sanitize --wrong $name: $1" >&2
  exit 1
}
[ "$status" -eq 1 ] || problem "exit status $status: the grader's failing status is 1"
grep -qE '^score [0-9]+/[0-9]+$' "$out" || problem "no score line: the table is not whole"
grep -q 'FAIL$' "$out" || problem "no check FAILs"
grep -qE 'AddressSanitizer|runtime error' "$out" || problem "no sanitizer report"
# The report points into the lab file (the wrong solution compiled from solution/lab.cpp).
grep -qE "wrong_$name\.cpp:[0-9]+" "$out" || problem "the report names no line of wrong_$name.cpp"
# An unsanitized folder is refused in one line.
plain=$(mktemp -d)
trap 'rm -rf "$out" "$plain"' EXIT
printf 'KVLAB_SANITIZE:BOOL=OFF\n' >"$plain/CMakeCache.txt"
: >"$plain/build.ninja"
err=$(KVLAB_SANITIZE_BUILD_DIR=$plain "$root/lessons/grade" "$n" --sanitize 2>&1 >/dev/null)
[ $? -eq 2 ] || problem "an unsanitized folder was not refused with status 2"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || problem "the refusal is not one line: $err"
grep -qF 'is not a sanitized build' <<<"$err" || problem "the refusal does not say why: $err"
echo "grade_sanitize_test: lab $nn, $name: caught by the sanitizer at its line"
