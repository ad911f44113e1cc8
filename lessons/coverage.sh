#!/usr/bin/env bash
# CI for the course: every check of a lab's grader must fail for at least one wrong solution, so
# that a check which silently stopped checking (or never could fail) shows up.
#   coverage.sh REPORTS NN NAME...
# REPORTS/labNN_wrong_NAME.tsv is the --report each wrong solution's grader wrote (its test in
# lessons/CMakeLists.txt writes it). Prints, per check, the wrong solutions it catches; exits 1
# naming each check no wrong solution fails, or a report that is missing or does not parse.
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: coverage.sh REPORTS NN NAME...   (the reports' folder, the lab, its wrong solutions)" >&2
  exit 2
fi
reports=$1
nn=$2
shift 2
files=()
for name in "$@"; do
  f=$reports/lab${nn}_wrong_$name.tsv
  if [ ! -s "$f" ]; then
    echo "coverage: lab $nn: no report from the wrong solution '$name' ($f): its test did not run, or its grader died" >&2
    exit 1
  fi
  files+=("$f")
done
# One line per check, "<index>\t<result>\t<name>"; every report must list the same checks.
awk -F'\t' -v lab="$nn" '
  function die(msg) { printf "coverage: lab %s: %s\n", lab, msg > "/dev/stderr"; failed = 1; exit 1 }
  FNR == 1 {
    files++
    fixture = FILENAME
    sub(/^.*\/lab[0-9]+_wrong_/, "", fixture)
    sub(/\.tsv$/, "", fixture)
    fixtures[files] = fixture
  }
  {
    if (NF != 3 || $1 != FNR || ($2 != "pass" && $2 != "FAIL" && $2 != "not implemented"))
      die(sprintf("%s, line %d: not \"<index>\\t<pass|FAIL|not implemented>\\t<check>\": %s", FILENAME, FNR, $0))
    if (files == 1) {
      name[FNR] = $3
      n = FNR
    } else if (FNR > n || name[FNR] != $3) {
      die(sprintf("%s lists check %d as \"%s\", the first report \"%s\": the graders disagree (rebuild them)",
                  FILENAME, FNR, $3, FNR > n ? "(none)" : name[FNR]))
    }
    if ($2 == "FAIL") caught[FNR] = caught[FNR] (caught[FNR] == "" ? "" : ", ") fixture
    lines[files] = FNR
  }
  END {
    if (failed) exit 1
    for (f = 1; f <= files; f++)
      if (lines[f] != n) die(sprintf("the report of %s lists %d checks, the first %d: the graders disagree", fixtures[f], lines[f], n))
    w = 5
    for (i = 1; i <= n; i++) if (length(name[i]) > w) w = length(name[i])
    printf "lab %s: the wrong solutions each grader check catches (%d checks, %d wrong solutions)\n", lab, n, files
    printf "%-" w "s  %s\n", "check", "caught by"
    for (i = 1; i <= n; i++) printf "%-" w "s  %s\n", name[i], caught[i] == "" ? "NOTHING" : caught[i]
    for (i = 1; i <= n; i++)
      if (caught[i] == "") {
        printf "coverage: lab %s: no wrong solution fails the check \"%s\": add one it catches to wrong/, or the check cannot fail\n", lab, name[i] > "/dev/stderr"
        uncovered = 1
      }
    exit uncovered
  }
' "${files[@]}"
