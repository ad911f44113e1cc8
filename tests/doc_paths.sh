#!/usr/bin/env bash
# Docs name real files: every repository path a Markdown file mentions (core/..., tests/..., a
# doc's picture) must exist, so a moved or renamed file cannot leave a stale pointer behind.
#   tests/doc_paths.sh ROOT FILE.md...
# Paths with wildcards or placeholders (lessons/NN-*/, <target>) are skipped. Prints each stale
# path with the file that names it; exit 1 if there is one.
set -uo pipefail
root=$1
shift
status=0
for doc in "$@"; do
  dir=$(dirname "$doc")
  # A path starts after a space, backtick, parenthesis or bracket, at a top-level folder.
  while IFS= read -r path; do
    case "$path" in *'*'* | *'<'* | *NN* | *'{'* | *'$'*) continue ;; esac
    path=${path%.}  # the end of a sentence
    [ -e "$root/$path" ] || [ -e "$dir/$path" ] && continue
    echo "$doc: names $path, which does not exist"
    status=1
  done < <(grep -oE "(^|[ \`(\[])(core|gpu|cli|viz|proofs|lessons|tests|fuzz|docs)/[^] \`)\",:;']*" "$doc" |
           sed -E 's/^[ `(\[]//' | sort -u)
done
exit $status
