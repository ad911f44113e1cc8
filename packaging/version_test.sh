#!/usr/bin/env bash
# Which kvlab produced a result: `kvlab --version` names the version CMake set and the checkout's
# commit, and every --json output and trace manifest carries both under "kvlab".
#   version_test.sh KVLAB SOURCE VERSION            the checks
#   version_test.sh KVLAB SOURCE VERSION --counter  the JSON check must catch a document without them
set -euo pipefail
kvlab=$1 src=$2 version=$3 mode=${4:-}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-version.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The commit this build should name: the checkout's HEAD; "" (printed as unknown) outside a git
# checkout. Whether it ends in "-dirty" depends on the tree when it was built, which this test
# cannot see: the binary's own answer is taken, and cmake/commit.cmake's rule is checked apart.
commit=""
if top=$(git -C "$src" rev-parse --show-toplevel 2>/dev/null) && [ "$(realpath "$top")" = "$(realpath "$src")" ]; then
  commit=$(git -C "$src" rev-parse --short=12 HEAD)
  if "$kvlab" --version | grep -q "(commit $commit-dirty, "; then commit+="-dirty"; fi
fi

# cmake/commit.cmake on a scratch repository: a clean checkout, the same with a tracked file
# changed (-dirty), an untracked file (still clean), and a folder inside it (not a checkout: "").
check_commit_rule() {
  local repo=$scratch/repo out=$scratch/commit.cpp head
  mkdir -p "$repo/sub"
  git -C "$repo" init -q && echo one >"$repo/file" && git -C "$repo" add file &&
    git -C "$repo" -c user.name=t -c user.email=t@t commit -qm one || fail "cannot make a scratch git repository"
  head=$(git -C "$repo" rev-parse --short=12 HEAD)
  run_rule() { cmake -DSRC="$1" -DOUT="$out" -P "$src/cmake/commit.cmake" && grep -o 'kBuildCommit = "[^"]*"' "$out"; }
  [ "$(run_rule "$repo")" = "kBuildCommit = \"$head\"" ] || fail "commit.cmake on a clean checkout: $(run_rule "$repo")"
  echo new >"$repo/untracked"
  [ "$(run_rule "$repo")" = "kBuildCommit = \"$head\"" ] || fail "commit.cmake counts an untracked file as a change"
  echo two >"$repo/file"
  [ "$(run_rule "$repo")" = "kBuildCommit = \"$head-dirty\"" ] || fail "commit.cmake missed a changed file"
  [ "$(run_rule "$repo/sub")" = 'kBuildCommit = ""' ] || fail "commit.cmake named a commit for a folder inside a checkout"
}

# FILE is a JSON document whose "kvlab" member names this version and commit.
check_json() {
  /usr/bin/python3 - "$1" "$version" "$commit" <<'PY' || return 1
import json, sys
path, version, commit = sys.argv[1:]
doc = json.load(open(path))
k = doc.get("kvlab") if isinstance(doc, dict) else None
if not isinstance(k, dict):
    sys.exit(f"{path}: no \"kvlab\" member naming the version")
for key, want in (("version", version), ("commit", commit)):
    if k.get(key) != want:
        sys.exit(f"{path}: kvlab.{key} is {k.get(key)!r}, want {want!r}")
for key in ("compiler", "build_type", "sanitizers", "native"):
    if key not in k:
        sys.exit(f"{path}: kvlab.{key} is missing")
PY
}

if [ "$mode" = --counter ]; then
  echo '{"steps": 2}' >"$scratch/bare.json"
  if check_json "$scratch/bare.json" 2>"$scratch/err"; then fail "a document without \"kvlab\" passed"; fi
  echo '{"kvlab": {"version": "0.0.0", "commit": "'"$commit"'"}}' >"$scratch/old.json"
  if check_json "$scratch/old.json" 2>>"$scratch/err"; then fail "a document naming version 0.0.0 passed"; fi
  echo "caught: $(tr '\n' ' ' <"$scratch/err")"
  exit 0
fi

check_commit_rule
line=$("$kvlab" --version)
echo "$line"
[[ "$line" == "kvlab $version (commit ${commit:-unknown: not built from a git checkout}, "* ]] ||
  fail "kvlab --version says '$line', want version $version and commit ${commit:-unknown}"

# One quick run of every command that has --json; a command with --json that this table lacks fails.
declare -A runs=(
  [demo]="demo --json --steps 2"
  [generate]="generate --json --steps 2"
  [speculate]="speculate --json --steps 4 --reps 1"
  [bench]="bench --json --shape stories260K --lengths 8 --reps 1 --naive-max 8"
  [verify]="verify paged --json --cases 2"
  [memory]="memory --json"
  [pool]="pool --json --script 'new a 1,2,3;show'"
  [trace]="trace --json --shape stories260K --steps 2 --out $scratch/t1"
  [diff-trace]="diff-trace --json $scratch/t1 $scratch/t1"
  [serve-sim]="serve-sim --json"
  [beam]="beam --json"
  [frontier]="frontier --json --prompts 1 --length 8 --prefill 4"
)
order="demo generate speculate bench verify memory pool trace diff-trace serve-sim beam frontier"
for cmd in $("$kvlab" --help | awk '/^Subcommands:/ {f = 1; next} f && NF {print $1}'); do
  if "$kvlab" "$cmd" --help 2>/dev/null | grep -q -- "--json"; then
    [ -n "${runs[$cmd]:-}" ] || fail "kvlab $cmd has --json but this test does not run it: add it to the table"
  fi
done
for cmd in $order; do
  read -ra args <<<"${runs[$cmd]}"
  [ "$cmd" = pool ] && args=(pool --json --script "new a 1,2,3;show")  # one argument with spaces
  "$kvlab" "${args[@]}" >"$scratch/$cmd.json" 2>"$scratch/err" || { cat "$scratch/err"; fail "kvlab ${runs[$cmd]}"; }
  check_json "$scratch/$cmd.json" || fail "kvlab $cmd --json"
done
check_json "$scratch/t1/manifest.json" || fail "the trace manifest"
echo "ok: --version, and the version and commit in the JSON of: $order, and a trace manifest"
