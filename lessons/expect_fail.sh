#!/usr/bin/env bash
# CI for the course: a grader run that must FAIL, saying each of the given phrases.
#   expect_fail.sh [--report FILE] GRADER PHRASE...
# Exits 0 when GRADER exits with status 1 (a failing check: not a signal, not a usage error),
# printed its whole table (the score line), and its output contains every phrase; 1 otherwise.
# --report FILE is passed on to the grader (each check's result, for lessons/coverage.sh).
set -uo pipefail
args=()
if [ "${1:-}" = "--report" ]; then
  args=(--report "$2")
  shift 2
fi
grader=$1
shift
out=$("$grader" "${args[@]}" 2>&1)
status=$?
if [ "$status" -eq 0 ]; then
  printf '%s\n' "$out"
  echo "expect_fail: $grader passed; it must fail" >&2
  exit 1
fi
if [ "$status" -ne 1 ]; then
  printf '%s\n' "$out"
  echo "expect_fail: $grader ended with status $status; a failing check ends the grader with 1 (a signal is 128+N)" >&2
  exit 1
fi
if ! grep -qE '^score [0-9]+/[0-9]+$' <<<"$out"; then
  printf '%s\n' "$out"
  echo "expect_fail: $grader printed no score line: its table is not whole" >&2
  exit 1
fi
for phrase in "$@"; do
  if ! grep -qF -- "$phrase" <<<"$out"; then
    printf '%s\n' "$out"
    echo "expect_fail: $grader failed, but without saying '$phrase'" >&2
    exit 1
  fi
done
printf '%s\n' "$out"
