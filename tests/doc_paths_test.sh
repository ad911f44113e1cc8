#!/usr/bin/env bash
# Counter-test of doc_paths.sh: a Markdown file naming one real and one missing path must fail,
# naming exactly the missing one.
set -uo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'See core/decode.cpp and `core/gone.h`, or lessons/NN-*/lab.h.\n' > "$dir/x.md"
out=$(bash "$(dirname "$0")/doc_paths.sh" "$root" "$dir/x.md")
status=$?
want="$dir/x.md: names core/gone.h, which does not exist"
if [ $status -ne 1 ] || [ "$out" != "$want" ]; then
  echo "doc_paths.sh should have failed with: $want"
  echo "it said (status $status): $out"
  exit 1
fi
echo "caught: $out"
