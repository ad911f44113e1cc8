#!/usr/bin/env bash
# contract_test.sh can fail: on a copy of lab 7's README, contract.tsv and grader, a clause added
# to the table, a check name the grader lacks, and a clause mapped to NONE must each be named.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lab=$tmp/07-paging
fresh() {
  rm -rf "$lab" && mkdir -p "$lab"
  cp "$root"/lessons/07-paging/{README.md,contract.tsv,grade.cpp} "$lab"/
}
expect() {  # expect PHRASE: contract_test.sh fails on $lab, saying PHRASE
  if out=$(bash "$root/lessons/contract_test.sh" "$lab" 2>&1); then
    echo "contract_test_test: contract_test.sh passed a lab that $1" >&2
    exit 1
  fi
  grep -qF -- "$2" <<<"$out" || { echo "$out"; echo "contract_test_test: no '$2' in its output" >&2; exit 1; }
}
fresh
bash "$root/lessons/contract_test.sh" "$lab" >/dev/null || { echo "contract_test_test: lab 7 as it is fails" >&2; exit 1; }
sed -i 's/| every block starts free |/| every block starts free; blocks are handed out lowest first |/' "$lab/README.md"
expect "states a clause no check covers" "no check is named for: \`LabAllocator(n_blocks)\`: blocks are handed out lowest first"
fresh
awk -F'\t' 'BEGIN { OFS = FS } !/^#/ && NF == 3 && !done { $3 = "a check that is not there"; done = 1 } { print }' \
  "$lab/contract.tsv" >"$lab/c" && mv "$lab/c" "$lab/contract.tsv"
expect "names a check its grader lacks" "names a check grade.cpp does not have: 'a check that is not there'"
fresh
awk -F'\t' 'BEGIN { OFS = FS } !/^#/ && NF == 3 && !done { $3 = "NONE"; done = 1 } { print }' \
  "$lab/contract.tsv" >"$lab/c" && mv "$lab/c" "$lab/contract.tsv"
expect "maps a clause to NONE" "no check covers:"
echo "contract_test_test: each planted gap was named"
