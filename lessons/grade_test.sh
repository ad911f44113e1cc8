#!/usr/bin/env bash
# Tests of lessons/grade against an already-built build folder (it builds nothing there that is
# up to date, and configures nothing: the targets exist).
#   grade_test.sh BUILD N NAME            `lessons/grade N --wrong NAME` grades wrong/NAME (.cpp or
#                                         .sed): the grader's failing status 1, FAIL and the phrase
#                                         of the fixture's first line, the fixture named as graded
#   grade_test.sh BUILD N NAME --refused  NAME is refused: status 2, one line on stderr naming it and
#                                         listing the lab's wrong solutions, nothing on stdout
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 n=$2 name=$3 mode=${4:-}
nn=$(printf '%02d' "$n")
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
KVLAB_BUILD_DIR=$build "$root/lessons/grade" "$n" --wrong "$name" >"$out" 2>"$err"
status=$?
problem() {
  cat "$out" "$err"
  echo "grade_test: lessons/grade $n --wrong $name: $1" >&2
  exit 1
}
if [ "$mode" = "--refused" ]; then
  [ "$status" -eq 2 ] || problem "exit status $status, not 2"
  [ ! -s "$out" ] || problem "printed on stdout"
  [ "$(wc -l <"$err")" -eq 1 ] || problem "$(wc -l <"$err") lines on stderr, not one"
  grep -qF "no wrong solution '$name'" "$err" || problem "the error does not name '$name'"
  # Every wrong solution of the lab is offered, .cpp and .sed alike.
  for f in "$root"/lessons/"$nn"-*/wrong/*.cpp "$root"/lessons/"$nn"-*/wrong/*.sed; do
    [ -e "$f" ] || continue
    w=$(basename "$f")
    grep -qw -- "${w%.*}" "$err" || problem "the error does not list ${w%.*} (wrong/$w)"
  done
  exit 0
fi
file=$(ls "$root"/lessons/"$nn"-*/wrong/"$name".{cpp,sed} 2>/dev/null | head -n 1)
[ -n "$file" ] || problem "no fixture wrong/$name.cpp or .sed (a broken test)"
phrase=$(head -n 1 "$file" | sed -n 's@^\(//\|#\) expect: @@p')
[ -n "$phrase" ] || problem "$file has no '# expect: ' or '// expect: ' first line"
[ "$status" -eq 1 ] || problem "exit status $status: the grader's failing status is 1"
grep -qF "grading ${file#"$root"/} " "$out" || problem "the grader did not grade ${file#"$root"/}"
grep -qF "building lab${nn}_wrong_$name " "$err" || problem "did not build lab${nn}_wrong_$name"
! grep -q "configuring" "$err" || problem "configured the build folder again"
grep -qF "FAIL" "$out" || problem "no check says FAIL"
grep -qF -- "$phrase" "$out" || problem "the grader did not say '$phrase'"
echo "grade_test: lessons/grade $n --wrong $name graded ${file#"$root"/}: status 1, saying '$phrase'"
