#!/usr/bin/env bash
# CI for the course: a grader run that must FAIL, saying each of the given phrases.
#   expect_fail.sh GRADER PHRASE...
# Exits 0 when GRADER exits non-zero and its output contains every phrase; 1 otherwise.
set -uo pipefail
grader=$1
shift
out=$("$grader" 2>&1)
status=$?
if [ "$status" -eq 0 ]; then
  printf '%s\n' "$out"
  echo "expect_fail: $grader passed; it must fail" >&2
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
