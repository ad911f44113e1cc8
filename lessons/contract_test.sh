#!/usr/bin/env bash
# Every clause of a lab's contract is checked: the tables under "## What you implement" in
# lessons/NN-slug/README.md headed `| function | contract |` (or `| argument | meaning |`), their
# cells split into clauses at "; ",
# against lessons/NN-slug/contract.tsv, one line per clause: "ROW<TAB>CLAUSE<TAB>CHECK | CHECK".
#   contract_test.sh LAB_DIR...
# Fails, naming it, for a clause no line maps, a mapped clause the table no longer states, a
# check name the lab's grade.cpp does not define, and a clause mapped to NONE (no check covers it:
# write one, or take the clause out of the table). On success it prints which check covers which
# clause.
set -uo pipefail
status=0
for dir in "$@"; do
  lab=$(basename "$dir")
  readme=$dir/README.md tsv=$dir/contract.tsv grader=$dir/grade.cpp
  problem() {
    echo "contract_test: $lab: $1" >&2
    status=1
  }
  [ -f "$tsv" ] || { problem "no contract.tsv"; continue; }
  # The table's rows, as "ROW<TAB>CLAUSE" lines.
  clauses=$(awk '
    /^## What you implement/ { inside = 1; next }
    /^## / { inside = 0 }
    inside && !/^\|/ { row = 0; table = 0 }
    inside && /^\|/ {
      # Only a contract table: its header is "function | contract" (or "argument | meaning"); a
      # table of the tools a lab hands out (lab 11: "call | what it does") is not one.
      if (++row == 1) table = $0 ~ /^\| *(function|argument) *\| *(contract|meaning) *\|/
      if (row <= 2 || !table) next  # the header and its rule
      line = $0
      sub(/^\| */, "", line); sub(/ *\| *$/, "", line)
      split_at = index(line, " | ")
      name = substr(line, 1, split_at - 1); contract = substr(line, split_at + 3)
      n = split(contract, parts, "; ")
      for (i = 1; i <= n; i++) print name "\t" parts[i]
    }' "$readme")
  [ -n "$clauses" ] || { problem "README.md has no table under '## What you implement'"; continue; }
  # The grader's check names: the first string of each entry of lab.checks.
  checks=$(grep -oE '\{"[^"]+", *[0-9]+,' "$grader" | sed -E 's/^\{"(.*)", *[0-9]+,$/\1/')
  mapped=$(grep -v '^#' "$tsv" | grep -v '^$' | cut -f1,2)
  while IFS= read -r clause; do
    grep -qxF -- "$clause" <<<"$mapped" || problem "no check is named for: ${clause//$'\t'/: }"
  done <<<"$clauses"
  while IFS=$'\t' read -r row text covered; do
    [[ -z "$row" || "$row" == \#* ]] && continue
    grep -qxF -- "$row"$'\t'"$text" <<<"$clauses" || problem "contract.tsv maps a clause the table does not state: $row: $text"
    if [ "$covered" = NONE ]; then
      problem "no check covers: $row: $text"
      continue
    fi
    IFS='|' read -ra names <<<"$covered"
    for name in "${names[@]}"; do
      name=$(sed -E 's/^ +| +$//g' <<<"$name")
      grep -qxF -- "$name" <<<"$checks" || problem "contract.tsv names a check grade.cpp does not have: '$name'"
    done
    echo "$lab: $row: $text -> $covered"
  done <"$tsv"
done
exit $status
