#!/usr/bin/env bash
# The PTX audit: checks that compiled GPU code keeps kvlab's numeric contract (core/NUMERICS.md).
#   usage: ptx_audit.sh FILE.ptx
# Exit 0 when clean; 1 with one line per kind of offending instruction when not:
#   fused multiply-add   fma / mad on floating point: one rounding instead of two
#   approximation        any .approx (division, sqrt, reciprocal, ex2, lg2, sin, cos, ...)
#   denormals flushed    any .ftz
#   hardware function    ex2 lg2 sin cos tanh rsqrt: approximations (e^x is our exp_f32)
#   reciprocal           rcp other than rcp.rn.f32/f64 (rcp.rn is IEEE 1/x, as div.rn)
#   f32 without .rn      add sub mul div sqrt on f32 that name no rounding mode: PTX lets ptxas
#                        fuse (mul + add into fma) or approximate those, so every one must say .rn
set -u
ptx=${1:?usage: ptx_audit.sh FILE.ptx}
[[ -s $ptx ]] || { echo "ptx_audit: $ptx is missing or empty"; exit 2; }

# The opcodes: comments dropped, guard predicates (@%p1, @!%p1) stripped, directives (.reg,
# .visible, ...) and labels left out by starting at a lower-case letter.
opcodes=$(sed -e 's://.*$::' -e 's/^[[:space:]]*//' -e 's/^@!\{0,1\}%[a-z0-9_]*[[:space:]]*//' "$ptx" |
          grep -oE '^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*' | sort | uniq -c)
fail=0
# rule NAME MATCH [EXCEPT]: every opcode matching MATCH and not EXCEPT is a finding.
rule() {
    local hits
    hits=$(awk -v m="$2" -v x="${3:-^$}" '$2 ~ m && $2 !~ x { print }' <<<"$opcodes")
    [[ -z $hits ]] && return
    while read -r n opcode; do echo "ptx_audit: $1: $opcode ($n times)"; done <<<"$hits"
    fail=1
}
rule "fused multiply-add" '^(fma|mad)(\.[a-z0-9]+)*\.(f16|f16x2|bf16|bf16x2|f32|f64)$'
rule "approximation" '\.approx(\.|$)'
rule "denormals flushed" '\.ftz(\.|$)'
rule "hardware function" '^(ex2|lg2|sin|cos|tanh|rsqrt)(\.|$)'
rule "reciprocal" '^rcp(\.|$)' '^rcp\.rn\.(f32|f64)$'
rule "f32 without .rn" '^(add|sub|mul|div|sqrt)(\.[a-z0-9]+)*\.f32$' '^(add|sub|mul|div|sqrt)\.rn\.f32$'
if (( fail == 0 )); then
    echo "ptx_audit: $ptx keeps the contract ($(awk '{ n += $1 } END { print n }' <<<"$opcodes") instructions)"
fi
exit $fail
