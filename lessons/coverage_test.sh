#!/usr/bin/env bash
# The counter-test of coverage.sh: on reports written here, it passes when every check fails for
# some wrong solution, and fails, naming what is wrong, when the one wrong solution that fails a
# check is left out, when a report is missing, when two reports list different checks, and when a
# line does not parse.
#   coverage_test.sh   (exit 0: every case behaved)
set -uo pipefail
coverage="$(dirname "$0")/coverage.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Lab 99: check "alpha" is failed by both wrong solutions, "beta" by 'only_beta' alone.
printf '1\tFAIL\talpha\n2\tpass\tbeta\n' >"$dir/lab99_wrong_only_alpha.tsv"
printf '1\tFAIL\talpha\n2\tFAIL\tbeta\n' >"$dir/lab99_wrong_only_beta.tsv"
printf '1\tFAIL\talpha\n2\tFAIL\tgamma\n' >"$dir/lab99_wrong_other_table.tsv"
printf '1\tFAIL\talpha\n2 FAIL beta\n' >"$dir/lab99_wrong_malformed.tsv"

failures=0
# expect STATUS PHRASE NAME...: coverage.sh over those wrong solutions exits STATUS and says PHRASE
# (and, with exit 1, in one line per problem on stderr).
expect() {
  local want=$1 phrase=$2
  shift 2
  local out status
  out=$(bash "$coverage" "$dir" 99 "$@" 2>&1)
  status=$?
  if [ "$status" -ne "$want" ] || ! grep -qF -- "$phrase" <<<"$out"; then
    printf '%s\n' "$out"
    echo "coverage_test: coverage.sh over [$*] exited $status (expected $want) or did not say '$phrase'" >&2
    failures=$((failures + 1))
  fi
}
expect 0 "only_alpha, only_beta" only_alpha only_beta
expect 0 "beta   only_beta" only_alpha only_beta
# The counter-test proper: without the one wrong solution that fails "beta", beta is uncovered.
expect 1 'no wrong solution fails the check "beta"' only_alpha
if bash "$coverage" "$dir" 99 only_alpha 2>&1 | grep -qF 'fails the check "alpha"'; then
  echo "coverage_test: coverage.sh called alpha uncovered, though only_alpha fails it" >&2
  failures=$((failures + 1))
fi
expect 1 "no report from the wrong solution 'missing'" only_alpha only_beta missing
expect 1 "the graders disagree" only_alpha only_beta other_table
expect 1 "line 2: not" only_beta malformed
[ "$failures" -eq 0 ] && echo "coverage_test: coverage.sh passed full coverage and caught each of 4 faults"
exit $((failures > 0))
