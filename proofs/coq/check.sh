#!/usr/bin/env bash
# The proofs' CI check.
#   check.sh OUT ALLOWED FILE.v...
# Compiles the files in order into OUT (logical root Kvlab), then:
#  - rejects any `Admitted`, `admit`, `Axiom`, `Parameter` or `Conjecture` (a proof that is not
#    one, or an assumption smuggled in);
#  - runs `Print Assumptions` on every theorem listed in a file's `(* main: name name *)` line and
#    rejects any axiom not listed in ALLOWED (one name per line). A `Variable` or `Hypothesis`
#    outside a Section is an axiom too, so this catches it.
# Exit 0 when every file passes; otherwise one line per problem and exit 1.
set -uo pipefail
out=$1
allowed=$2
shift 2
mkdir -p "$out"
status=0
for v in "$@"; do
  name=$(basename "$v" .v)
  # Comments are stripped first, so prose may say "Admitted".
  body=$(perl -0777 -pe 's/\(\*.*?\*\)//gs' "$v")
  if grep -nE '\b(Admitted|admit|Axiom|Axioms|Parameter|Parameters|Conjecture)\b' <<<"$body" >/dev/null; then
    echo "check.sh: $v: contains Admitted/admit/Axiom/Parameter/Conjecture: not a proof" >&2
    status=1
    continue
  fi
  cp "$v" "$out/$name.v"
  if ! (cd "$out" && coqc -Q . Kvlab "$name.v" >"$name.log" 2>&1); then
    echo "check.sh: $v does not compile:" >&2
    cat "$out/$name.log" >&2
    status=1
    continue
  fi
  mains=$(sed -n 's/^(\* main: \(.*\) \*)$/\1/p' "$v")
  for thm in $mains; do
    printf 'Require Import Kvlab.%s.\nPrint Assumptions %s.\n' "$name" "$thm" >"$out/assume_$thm.v"
    if ! (cd "$out" && coqc -Q . Kvlab "assume_$thm.v" >"assume_$thm.log" 2>&1); then
      echo "check.sh: $v: Print Assumptions $thm failed:" >&2
      cat "$out/assume_$thm.log" >&2
      status=1
      continue
    fi
    if grep -q "Closed under the global context" "$out/assume_$thm.log"; then
      echo "$name.$thm: closed under the global context (no axioms)"
      continue
    fi
    # An axiom is "name : type" on one line, or, with a long type, its name alone on a line and
    # the type indented below; either way the name starts a line ("Axioms:" itself does not match).
    axioms=$(grep -E '^[A-Za-z_][A-Za-z0-9_.]*( :|$)' "$out/assume_$thm.log" | sed 's/ :.*//' | sort -u)
    if [ -z "$axioms" ]; then
      echo "check.sh: $v: could not read the axioms $thm rests on:" >&2
      cat "$out/assume_$thm.log" >&2
      status=1
      continue
    fi
    for a in $axioms; do
      if ! grep -qxF "$a" "$allowed"; then
        echo "check.sh: $v: $thm rests on $a, which is not in $(basename "$allowed")" >&2
        status=1
      fi
    done
    echo "$name.$thm: axioms $(echo $axioms | tr ' ' ',')"
  done
done
exit $status
