#!/usr/bin/env bash
# The proofs checker's counter-check: check.sh must reject FIXTURE.v, saying PHRASE.
#   check_rejects.sh OUT ALLOWED FIXTURE.v PHRASE
set -uo pipefail
out=$(bash "$(dirname "$0")/check.sh" "$1" "$2" "$3" 2>&1)
if [ $? -eq 0 ]; then
  printf '%s\n' "$out"
  echo "check_rejects.sh: check.sh accepted $3; it must reject it" >&2
  exit 1
fi
if ! grep -qF -- "$4" <<<"$out"; then
  printf '%s\n' "$out"
  echo "check_rejects.sh: check.sh rejected $3, but without saying '$4'" >&2
  exit 1
fi
printf '%s\n' "$out"
