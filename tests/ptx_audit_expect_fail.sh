#!/usr/bin/env bash
# The PTX audit's counter-test: ptx_audit.sh must reject FILE.ptx, naming every rule given.
#   usage: ptx_audit_expect_fail.sh FILE.ptx "RULE" ["RULE" ...]
set -u
here=$(dirname "$0")
ptx=${1:?usage: ptx_audit_expect_fail.sh FILE.ptx RULE...}
shift
out=$(bash "$here/ptx_audit.sh" "$ptx")
rc=$?
echo "$out"
if (( rc != 1 )); then
    echo "FAILED: the audit passed (or could not run: exit $rc) on code that breaks the contract"
    exit 1
fi
for rule in "$@"; do
    if ! grep -qF "ptx_audit: $rule:" <<<"$out"; then
        echo "FAILED: the audit did not report '$rule'"
        exit 1
    fi
done
echo "the audit rejected $ptx, naming: $*"
