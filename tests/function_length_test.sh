#!/usr/bin/env bash
# function_length.sh's counter-test: on a planted file it must flag the 81-line functions (file,
# line, length) and only them (braces in comments, a string and a character literal do not count),
# pass once the allowlist names them, and fail on a stale allowlist entry.
set -u
check=$(dirname "$0")/function_length.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

body() { for ((i = 0; i < $1; i++)); do echo "    x += $i;  // { a brace in a comment"; done; }
{
    echo 'namespace planted {'
    echo 'int long_one(int x) {'  # line 2: its body is lines 3..83
    body 81
    echo '}'
    echo 'int just_right(int x,'
    echo '               int y) {'
    echo "    if (y == '{') x++;  // a brace in a character literal"
    echo '    const char* s = "{";  // and in a string'
    body 78
    echo '}'
    echo 'struct S {'
    echo '    int member(int x) const {'
    body 80
    echo '        return x;'  # 81 lines
    echo '    }'
    echo '    const char* text() { return "}"; }'
    echo '};'
    echo 'const int table[] = {'
    body 90
    echo '};'
    echo '}  // namespace planted'
} >"$dir/planted.cpp"

fail() { echo "FAILED: $*"; echo "$out"; exit 1; }

out=$(bash "$check" "$dir/planted.cpp")
rc=$?
((rc == 1)) || fail "the check passed (or could not run: exit $rc) on an 81-line function"
grep -qxF "$dir/planted.cpp:2: long_one is 81 lines, over 80" <<<"$out" || fail "long_one not flagged at line 2 with 81 lines"
grep -qF "S::member is 81 lines" <<<"$out" || fail "the 81-line member function S::member not flagged"
(($(wc -l <<<"$out") == 2)) || fail "flagged more than long_one and S::member (the 80-line function or the table)"

printf '# planted: to be removed\n%s:long_one\n%s:S::member\n' "$dir/planted.cpp" "$dir/planted.cpp" >"$dir/allow"
out=$(bash "$check" --allow "$dir/allow" "$dir/planted.cpp") || fail "the check failed though the allowlist names both"

printf '%s:just_right\n' "$dir/planted.cpp" >>"$dir/allow"
out=$(bash "$check" --allow "$dir/allow" "$dir/planted.cpp") && fail "a stale allowlist entry (just_right, 80 lines) passed"
grep -qF "$dir/planted.cpp:just_right: in" <<<"$out" || fail "the stale entry was not named"

echo "the check flagged the planted 81-line functions, and only them"
