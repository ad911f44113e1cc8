#!/usr/bin/env bash
# Function length check: no function in core/ or cli/ is over about 80 lines, so each reads top to bottom:
#   function_length.sh [--max N] [--allow FILE] PATH...   (or --list: every function and its length)
# Each PATH is a C++ file, or a folder whose *.cpp, *.h, *.cu files are read. Prints each function
# whose body is more than N lines (default 80) as "file:line: name is L lines, over N", where line
# is that of its opening brace and L counts the lines strictly between its braces. Exit 1 on an
# offender not in the allowlist, or on an allowlist entry that no longer offends (the entry is to
# be removed then), else 0.
#
# The allowlist has one `file:function` a line (file as given on the command line, function as
# printed); `#` starts a comment.
#
# It reads clang-formatted sources (.clang-format: namespaces not indented), without parsing C++:
# braces are counted with comments, string and character literals left out (raw strings are not
# understood). Namespaces, classes, structs, unions and extern "C" are scopes whose braces do not
# count; any other brace at their level opens a function (its header has a parenthesis, or it is
# a lambda, `name = [...](...) {`) or data (an initializer, an enum), whose braces nest inside it.
# A member function defined in its class is named Class::function. Lambdas inside a function count
# as part of it. Known limit: a constructor whose member initializers use braces (`: a{x} {`) is
# measured wrong; none does in core/ or cli/.
set -euo pipefail

max=80
allow=/dev/null
list=0
paths=()
while (($#)); do
    case $1 in
        --max) max=$2; shift 2 ;;
        --allow) allow=$2; shift 2 ;;
        --list) list=1; shift ;;
        *) paths+=("$1"); shift ;;
    esac
done
((${#paths[@]})) || { echo "usage: $0 [--max N] [--allow FILE | --list] PATH..." >&2; exit 2; }

files=()
for p in "${paths[@]}"; do
    if [[ -d $p ]]; then
        while IFS= read -r f; do files+=("$f"); done < <(find "$p" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) | LC_ALL=C sort)
    elif [[ -f $p ]]; then
        files+=("$p")
    else
        echo "function_length.sh: no such file or folder: $p" >&2
        exit 2
    fi
done

# One line per function: file, line of its opening brace, name, body lines (tab-separated).
# (The program is in single quotes: a single quote reaches it as sq.)
measure() {
    awk -v sq="'" '
    function reset_header() { header = "" }
    # The line with comments, string and character literals blanked (their braces do not count).
    function strip(s,    out, i, c, n, q) {
        out = ""; n = length(s)
        for (i = 1; i <= n; i++) {
            c = substr(s, i, 1)
            if (in_comment) {
                if (c == "*" && substr(s, i + 1, 1) == "/") { in_comment = 0; i++ }
                continue
            }
            if (c == "/" && substr(s, i + 1, 1) == "/") break
            if (c == "/" && substr(s, i + 1, 1) == "*") { in_comment = 1; i++; continue }
            if (c == "\"" || (c == sq && substr(s, i - 1, 1) !~ /[0-9A-Fa-f]/)) {
                q = c
                for (i++; i <= n && substr(s, i, 1) != q; i++) if (substr(s, i, 1) == "\\") i++
                out = out q q
                continue
            }
            out = out c
        }
        return out
    }
    # The kind of scope a brace opens at a scope level: "N" namespace-like, "F" function, "D" data.
    function kind_of(h,    flat, i, c, d, eq) {
        if (h ~ /(^|[^A-Za-z0-9_])namespace([^A-Za-z0-9_]|$)/ || h ~ /extern[ \t]*""/) return "N"
        if (h ~ /^[ \t]*(template[ \t]*<.*>[ \t]*)?(struct|class|union)([^A-Za-z0-9_]|$)/ && h !~ /\(/) return "N"
        if (h ~ /(^|[^A-Za-z0-9_])enum([^A-Za-z0-9_]|$)/) return "D"
        if (h ~ /[A-Za-z_][A-Za-z0-9_]*[ \t]*=[ \t]*\[/) return "F"  # a lambda
        if (h !~ /\(/) return "D"
        # An "=" outside parentheses (not a comparison, not an operator name) is an initializer.
        flat = h; gsub(/operator[ \t]*[^A-Za-z0-9_ \t(]*/, "operator", flat)
        gsub(/==|!=|<=|>=/, "", flat)
        d = 0; eq = 0
        for (i = 1; i <= length(flat); i++) {
            c = substr(flat, i, 1)
            if (c == "(") d++
            else if (c == ")") d--
            else if (c == "=" && d == 0) eq = 1
        }
        return eq ? "D" : "F"
    }
    function name_of(h,    pre, k) {
        if (match(h, /[A-Za-z_][A-Za-z0-9_]*[ \t]*=[ \t]*\[/)) {
            pre = substr(h, RSTART, RLENGTH); sub(/[ \t]*=.*/, "", pre); return pre
        }
        if (match(h, /[A-Za-z0-9_:~]*operator[ \t]*\(\)/)) { pre = substr(h, RSTART, RLENGTH); gsub(/[ \t]/, "", pre); return pre }
        pre = substr(h, 1, index(h, "(") - 1); sub(/[ \t]+$/, "", pre)
        if (match(pre, /[A-Za-z0-9_:~]*operator[^A-Za-z0-9_]*$/) || match(pre, /[A-Za-z_~][A-Za-z0-9_:~]*$/))
            return substr(pre, RSTART, RLENGTH)
        return "?"
    }
    function class_name(h,    t) {
        if (h !~ /^[ \t]*(template[ \t]*<.*>[ \t]*)?(struct|class|union)([^A-Za-z0-9_]|$)/) return ""
        t = h; sub(/^[ \t]*(template[ \t]*<.*>[ \t]*)?(struct|class|union)[ \t]+/, "", t)
        if (match(t, /^[A-Za-z_][A-Za-z0-9_]*/)) return substr(t, RSTART, RLENGTH)
        return ""
    }
    FNR == 1 { depth = 0; in_comment = 0; continued = 0; reset_header() }
    {
        raw = $0
        if (continued) { continued = raw ~ /\\$/; next }  # a macro continued
        if (!in_comment && raw ~ /^[ \t]*#/) { continued = raw ~ /\\$/; next }
        code = strip(raw)
        # At a scope level (depth 0, or right inside a namespace or class), gather the header.
        at_scope = depth == 0 || kind[depth] == "N"
        if (at_scope && code ~ /^[ \t]*(public|private|protected)[ \t]*:/) { reset_header(); next }
        for (i = 1; i <= length(code); i++) {
            c = substr(code, i, 1)
            at_scope = depth == 0 || kind[depth] == "N"
            if (c == "{") {
                depth++
                if (at_scope) {
                    h = header substr(code, 1, i - 1)
                    kind[depth] = kind_of(h)
                    cls[depth] = kind[depth] == "N" ? class_name(h) : ""
                    if (kind[depth] == "F") {
                        prefix = ""
                        for (k = 1; k < depth; k++) if (cls[k] != "") prefix = prefix cls[k] "::"
                        fname[depth] = prefix name_of(h); fline[depth] = FNR
                    }
                    reset_header(); code = substr(code, i + 1); i = 0
                } else kind[depth] = "B"  # a block, or data, inside a function or data
            } else if (c == "}") {
                if (depth > 0 && kind[depth] == "F") {
                    n = FNR - fline[depth] - 1
                    printf "%s\t%d\t%s\t%d\n", FILENAME, fline[depth], fname[depth], n < 0 ? 0 : n
                }
                if (depth > 0) depth--
                if (depth == 0 || kind[depth] == "N") { reset_header(); code = substr(code, i + 1); i = 0 }
            } else if (c == ";" && at_scope) {
                reset_header(); code = substr(code, i + 1); i = 0
            }
        }
        if (depth == 0 || kind[depth] == "N") header = header " " code
    }
    ' "$@"
}

if ((list)); then
    measure "${files[@]}" | sort -t$'\t' -k4,4nr
    exit 0
fi

declare -A allowed=() seen=()
while IFS= read -r entry; do
    entry=${entry%%#*}
    entry=${entry//[[:space:]]/}
    [[ -n $entry ]] && allowed[$entry]=1
done <"$allow"

status=0
while IFS=$'\t' read -r file line name length; do
    ((length > max)) || continue
    seen["$file:$name"]=1
    if [[ -n ${allowed["$file:$name"]:-} ]]; then
        echo "$file:$line: $name is $length lines, over $max (allowed for now: $allow)"
    else
        echo "$file:$line: $name is $length lines, over $max"
        status=1
    fi
done < <(measure "${files[@]}")

for entry in "${!allowed[@]}"; do
    if [[ -z ${seen[$entry]:-} ]]; then
        echo "$entry: in $allow but not over $max lines (or gone): remove it from the allowlist"
        status=1
    fi
done
exit $status
