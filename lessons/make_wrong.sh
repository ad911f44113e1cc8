#!/usr/bin/env bash
# Builds a wrong solution written as sed edits of the reference solution:
#   make_wrong.sh wrong/NAME.sed solution/lab.cpp OUT.cpp
# A fixture whose edits change nothing would test nothing: that is an error.
set -euo pipefail
sed -f "$1" "$2" > "$3.tmp"
if cmp -s "$2" "$3.tmp"; then
  rm -f "$3.tmp"
  echo "make_wrong.sh: $1 changes nothing in $2 (its pattern no longer matches)" >&2
  exit 1
fi
mv "$3.tmp" "$3"
