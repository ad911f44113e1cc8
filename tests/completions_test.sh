#!/usr/bin/env bash
# Shell completions and man pages against the program: the generated files (cli/CMakeLists.txt,
# target kvlab_share) must name every command and every long option that kvlab's own --help lists,
# and equal what kvlab writes now (not stale).
#   completions_test.sh KVLAB SHARE             check SHARE (the build's share/ folder)
#   completions_test.sh --counter KVLAB SHARE   plant staleness in a copy of SHARE: a command
#                                               gone from the bash script, an option from a man
#                                               page; the check must fail and name both
# Exit 0 when every check passes, 1 otherwise (each failure is a FAIL line on stderr).
set -euo pipefail
export LC_ALL=C  # sort and comm agree on one order

counter=0
if [[ ${1:-} == --counter ]]; then counter=1; shift; fi
(($# == 2)) || { echo "usage: $0 [--counter] KVLAB SHARE" >&2; exit 2; }
kvlab=$1
share=$2
bash_script=$share/bash-completion/completions/kvlab
zsh_script=$share/zsh/vendor-completions/_kvlab
man_dir=$share/man/man1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The commands `kvlab --help` lists (the first word of each entry under "Subcommands:").
help_commands() {
    "$kvlab" --help | awk '/^[A-Za-z]/ { on = ($0 == "Subcommands:"); next } on && /^  [^ ]/ { print $1 }'
}

# The long options `kvlab [CMD] --help` lists: each entry's first field ("-h,--help", "--x{false}").
help_options() {
    "$kvlab" "$@" --help | awk '/^  -/ { print $1 }' | grep -oE -- '--[A-Za-z0-9][A-Za-z0-9_-]*' | sort -u
}

# What the bash script completes for the words given (the last is the word being typed): the
# function run for real in a clean bash, COMP_* set as bash sets them; COMPREPLY one a line.
bash_complete() {
    bash --norc --noprofile -c '
        source "$1"; shift
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
        _kvlab
        for w in "${COMPREPLY[@]}"; do printf "%s\n" "$w"; done' _ "$bash_script" "$@"
}

# A man page name or option as roff writes it: every "-" as \-.
roff() { printf '%s' "${1//-/\\-}"; }

# The commands a man page lists in its COMMANDS section (".B name" after each ".TP").
man_commands() {
    awk '/^\.SH / { on = ($0 == ".SH COMMANDS"); next } on && prev == ".TP" && /^\.B / { print $2 } { prev = $0 }' "$1" |
        sed 's/\\-/-/g'
}

# The lines of a zsh function (from "NAME() {" to its closing "}").
zsh_section() {
    awk -v head="$1() {" '$0 == head { on = 1 } on { print } on && $0 == "}" { exit }' "$zsh_script"
}

status=0
fail() { echo "FAIL: $*" >&2; status=1; }

# The staleness the counter-test plants, then the check run on it: it must fail and name both.
if ((counter)); then
    mapfile -t commands < <(help_commands)
    gone=${commands[1]}   # a command in the middle of the list
    victim=${commands[0]} # and an option of the first command
    option=$(help_options "$victim" | grep -vx -- --help | head -n 1)
    cp -r "$share" "$tmp/share"
    sed -i "/else _kvlab_words/ s/ $gone / /" "$tmp/share/bash-completion/completions/kvlab"
    grep -vF "\\fB$(roff "$option")\\fR" "$man_dir/kvlab-$victim.1" >"$tmp/share/man/man1/kvlab-$victim.1"
    # With zsh: the zsh script no longer dispatches the last command to its function, which only
    # running zsh's completion shows (the function and its options are all still in the file).
    last=${commands[-1]}
    sed -i "s/^        $last) /        $last-gone) /" "$tmp/share/zsh/vendor-completions/_kvlab"
    if bash "$0" "$kvlab" "$tmp/share" >"$tmp/out" 2>&1; then
        cat "$tmp/out"
        echo "FAIL: the check passed on a bash script without '$gone' and a page without $option" >&2
        exit 1
    fi
    grep -q "FAIL: bash.*'$gone'" "$tmp/out" || fail "the check did not name the command '$gone' the bash script lost"
    grep -q -- "FAIL: kvlab-$victim.1.*$option" "$tmp/out" || fail "the check did not name $option, gone from kvlab-$victim.1"
    if command -v zsh >/dev/null; then
        grep -q -- "FAIL: zsh: 'kvlab $last --' does not offer" "$tmp/out" ||
            fail "the check did not see zsh offer nothing after 'kvlab $last --'"
    fi
    ((status)) && cat "$tmp/out"
    ((status)) || echo "ok: the check fails on planted staleness and names '$gone', kvlab-$victim.1's $option and the command '$last' zsh lost"
    exit $status
fi

for f in "$bash_script" "$zsh_script" "$man_dir/kvlab.1"; do
    [[ -f $f ]] || { echo "FAIL: $f is missing (build the kvlab_share target)" >&2; exit 1; }
done
mapfile -t commands < <(help_commands)
((${#commands[@]} > 0)) || { echo "FAIL: kvlab --help lists no commands" >&2; exit 1; }
expected=$(printf '%s\n' "${commands[@]}")

# Syntax: bash -n always, zsh -n where zsh is installed.
bash -n "$bash_script" || fail "bash -n $bash_script"
if command -v zsh >/dev/null; then
    zsh -n "$zsh_script" || fail "zsh -n $zsh_script"
else
    echo "skip: zsh is not installed, so zsh -n is not run on $zsh_script"
fi

# zsh for real, where it is installed: after "kvlab " it offers exactly the --help list, and after
# "kvlab [CMD] --" every long option that command's --help lists (tests/zsh_complete.zsh).
if command -v zsh >/dev/null; then
    lines=("kvlab " "kvlab --")
    for cmd in "${commands[@]}"; do lines+=("kvlab $cmd --"); done
    timeout 60 zsh -f "$(dirname "$0")/zsh_complete.zsh" "$(dirname "$zsh_script")" "$tmp/zsh.out" "${lines[@]}" ||
        fail "zsh: the completion run failed or hung"
    offered() { awk -v head="== $1" '/^== / { on = ($0 == head); next } on && $0 != "-- end"' "$tmp/zsh.out" | sort -u; }
    got=$(offered "kvlab ")
    [[ $got == "$(sort <<<"$expected")" ]] || fail "zsh completes 'kvlab ' to: $(paste -sd' ' <<<"$got")"
    for cmd in "" "${commands[@]}"; do
        got=$(offered "kvlab ${cmd:+$cmd }--")
        missing=$(comm -23 <(help_options ${cmd:+"$cmd"}) <(cat <<<"$got") | paste -sd' ')
        [[ -z $missing ]] || fail "zsh: 'kvlab ${cmd:+$cmd }--' does not offer $missing"
    done
fi

# The commands: bash completes exactly the --help list after "kvlab ", the zsh script describes
# each, kvlab.1 lists each, and there is one page per command and no other.
completed=$(bash_complete kvlab "")
if [[ $completed != "$expected" ]]; then
    missing=$(comm -23 <(sort <<<"$expected") <(sort <<<"$completed") | sed "s/.*/'&'/" | paste -sd' ')
    extra=$(comm -13 <(sort <<<"$expected") <(sort <<<"$completed") | sed "s/.*/'&'/" | paste -sd' ')
    fail "bash completes 'kvlab ' to other commands than --help lists (missing: ${missing:-none}; extra: ${extra:-none})"
fi
listed=$(man_commands "$man_dir/kvlab.1")
[[ $listed == "$expected" ]] || fail "kvlab.1 lists other commands than --help: $(paste -sd' ' <<<"$listed")"
pages=$(cd "$man_dir" && { ls kvlab-*.1 2>/dev/null || true; } | sed 's/^kvlab-//; s/\.1$//' | sort)
if [[ $pages != "$(sort <<<"$expected")" ]]; then
    missing=$(comm -23 <(sort <<<"$expected") <(cat <<<"$pages") | sed 's/.*/kvlab-&.1/' | paste -sd' ')
    extra=$(comm -13 <(sort <<<"$expected") <(cat <<<"$pages") | sed 's/.*/kvlab-&.1/' | paste -sd' ')
    fail "the pages are not one kvlab-COMMAND.1 per command (missing: ${missing:-none}; extra: ${extra:-none})"
fi
for cmd in "${commands[@]}"; do
    grep -qF "            '$cmd:" "$zsh_script" || fail "zsh: the command list lacks '$cmd'"
done

# The options, of kvlab itself ("") and of each command: every long option --help lists is
# completed by bash after "--" and after its shortest unique prefix, and is in the zsh function
# and the man page of the command; bash completes no long option --help does not list.
for cmd in "" "${commands[@]}"; do
    words=(kvlab ${cmd:+"$cmd"})
    page=kvlab${cmd:+-$cmd}.1
    fn=_kvlab${cmd:+_cmd_${cmd//-/_}}
    mapfile -t options < <(help_options ${cmd:+"$cmd"})
    completed=$(bash_complete "${words[@]}" --)
    section=$(zsh_section "$fn")
    [[ -n $section ]] || fail "zsh: no function $fn for '${words[*]}'"
    for opt in "${options[@]}"; do
        grep -qxF -- "$opt" <<<"$completed" || fail "bash: '${words[*]} --' does not complete $opt"
        prefix=$opt
        for ((n = 3; n < ${#opt}; n++)); do
            if (($(printf '%s\n' "${options[@]}" | grep -c -- "^${opt:0:n}") == 1)); then prefix=${opt:0:n}; break; fi
        done
        got=$(bash_complete "${words[@]}" "$prefix")
        if [[ $prefix != "$opt" ]]; then
            [[ $got == "$opt" ]] || fail "bash: '${words[*]} $prefix' completes to '$(paste -sd' ' <<<"$got")', not $opt"
        else
            grep -qxF -- "$opt" <<<"$got" || fail "bash: '${words[*]} $opt' does not complete $opt"
        fi
        grep -qE -- "[',{)*]${opt}[=[,}]" <<<"$section" || fail "zsh: $fn lacks $opt"
        [[ -f $man_dir/$page ]] && { grep -qF -- "\\fB$(roff "$opt")\\fR" "$man_dir/$page" || fail "$page lacks $opt"; }
    done
    extra=$(comm -13 <(printf '%s\n' "${options[@]}") <(grep -- '^--' <<<"$completed" | sort))
    [[ -z $extra ]] || fail "bash: '${words[*]} --' completes options --help does not list: $(paste -sd' ' <<<"$extra")"
done

# A value with choices (CLI::IsMember) completes to them.
[[ $(bash_complete kvlab completions --shell "" | paste -sd' ') == "bash zsh" ]] ||
    fail "bash: 'kvlab completions --shell ' does not complete bash and zsh"

# Every page formats without a warning (-ww: all of them).
if command -v groff >/dev/null; then
    for page in "$man_dir"/*.1; do
        warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1 >/dev/null) || fail "groff failed on $page"
        [[ -z $warnings ]] || fail "groff warns on $page: $warnings"
    done
else
    echo "skip: groff is not installed, so the pages are not formatted"
fi

# Not stale: the files equal what this kvlab writes now.
# (Written to a file first: cmp stops reading at the first difference.)
for shell in bash zsh; do
    "$kvlab" completions --shell $shell >"$tmp/$shell"
    script=$bash_script
    [[ $shell == zsh ]] && script=$zsh_script
    cmp -s "$tmp/$shell" "$script" || fail "$script differs from kvlab completions --shell $shell"
done
"$kvlab" man --out "$tmp/man1" >/dev/null
diff -r "$tmp/man1" "$man_dir" >"$tmp/man.diff" || fail "$man_dir differs from kvlab man: $(head -c 300 "$tmp/man.diff" | tr '\n' ' ')"

((status)) || echo "ok: ${#commands[@]} commands; completions and man pages match kvlab --help and kvlab's output"
exit $status
