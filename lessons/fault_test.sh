#!/usr/bin/env bash
# Wrong solutions made by program: draws fault sites of a lab's reference solution and a kind for
# each (lessons/common/fault.h: a crash, an abort or an endless loop at a function's entry; an
# integer returned one off, a block off, out of range or negated; a vector returned empty or
# oversized), arms each in turn in the labNN_faulty grader, and checks the grader:
#   - never ends by a signal or hangs itself, always prints its whole table (the score line);
#   - a crash, an abort or a hang that fired fails its check (status 1), saying how;
#   - a wrong value that fired fails a check (status 1), unless the lab names its site as one where
#     no value the faults make can be wrong (--equivalent TEXT: lab 8's hash, which any shift or
#     negation leaves a hash); such a survivor is listed, any other fails the test.
#   fault_test.sh GRADER SITES N [--equivalent TEXT] [SEED]
# SEED (default: the clock, printed) replays a run. KVLAB_FAULT_CASES sets the grader's --cases
# (default 20): the faults show within a few cases, and each run stays short.
set -uo pipefail
grader=$1 sites=$2 n=$3
shift 3
equivalent=""
if [ "${1:-}" = "--equivalent" ]; then
  equivalent=$2
  shift 2
fi
seed=${1:-$(date +%s)}
cases=${KVLAB_FAULT_CASES:-20}
limit=1  # the grader's --time-limit: seconds one generated case may take (each takes milliseconds)
[ -s "$sites" ] || { echo "fault_test: no sites in $sites" >&2; exit 1; }
mapfile -t all <"$sites"
RANDOM=$seed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fault_test: $n faults drawn from ${#all[@]} sites of $(basename "$grader") (seed $seed)"
bad=0 fired=0 caught=0
survivors=()
for ((i = 0; i < n; i++)); do
  site=${all[RANDOM % ${#all[@]}]}
  read -r id where line text <<<"$site"
  if [ "$where" = entry ]; then
    kinds=(segv abort hang)
  else
    kinds=(plus1 plus_block far negative empty oversized)
  fi
  kind=${kinds[RANDOM % ${#kinds[@]}]}
  rm -f "$tmp/hit"
  KVLAB_LAB_FAULT="$id $kind" KVLAB_LAB_FAULT_HIT="$tmp/hit" timeout 300 "$grader" --cases "$cases" \
    --time-limit "$limit" >"$tmp/out" 2>&1
  status=$?
  what="site $id ($where at line $line: $text), $kind"
  problem() {
    cat "$tmp/out"
    echo "fault_test: $what: $1" >&2
    bad=$((bad + 1))
  }
  if [ "$status" -ge 124 ]; then
    problem "the grader itself ended with status $status (124: it hung; 128+N: signal N)"
    continue
  fi
  if ! grep -qE '^score [0-9]+/[0-9]+$' "$tmp/out"; then
    problem "no score line: the table is not whole"
    continue
  fi
  [ -e "$tmp/hit" ] || { echo "  $what: did not fire (a kind that does not fit the site, or never reached)"; continue; }
  fired=$((fired + 1))
  if [ "$status" -eq 1 ] && grep -q 'FAIL$' "$tmp/out"; then
    caught=$((caught + 1))
    if [ "$where" = entry ] && ! grep -qE 'crashed the check with|no answer in [0-9]+ s|ended with exit status' "$tmp/out"; then
      problem "its check failed without saying it crashed or hung"
      continue
    fi
    echo "  $what: caught"
  elif [ "$where" = entry ]; then
    problem "a crash, abort or hang that fired was not a FAIL with status 1 (status $status)"
  elif [ -n "$equivalent" ] && [ "$text" = "$equivalent" ]; then
    survivors+=("$what")
    echo "  $what: survived, as the lab says it may (--equivalent '$equivalent')"
  else
    problem "a wrong value that fired passed every check (status $status): a check is missing"
  fi
done
echo "fault_test: $fired fired, $caught caught, ${#survivors[@]} survived, $bad broke the grader's promise"
[ "$bad" -eq 0 ]
