#!/usr/bin/env bash
# Resource limits as tests: each hostile input runs kvlab under a memory limit
# (ulimit -v) and a time limit (timeout -s KILL), and must end either in success or in a clean
# refusal: a non-zero exit below 124 and exactly one line of printable ASCII on stderr, starting
# "kvlab: error: " and naming the culprit. A crash (139), a hang (137), an allocation past the
# limit ("out of memory") or a second line fails the case. Every hostile input is made here.
#
# Usage: limits.sh KVLAB CASE MODELS_DIR
#   CASE: non-finite-floats, tokenizer-fifo, long-prompt, naive-memory, size-limit, messages
# Exit 0 when every check passes, 1 when one fails, 77 (skipped) when the case needs
# MODELS_DIR/tok512.bin and it is absent.
set -u
KVLAB=$1
CASE=$2
MODELS=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0

# limited MB SECONDS ARGS...: kvlab ARGS under both limits; sets rc, and out/err files in $dir.
limited() {
    local mb=$1 secs=$2
    shift 2
    (
        ulimit -v $((mb * 1024))
        exec timeout -s KILL "$secs" "$KVLAB" "$@"
    ) >"$dir/out" 2>"$dir/err" </dev/null
    rc=$?
}

# What the last run looked like, for a failure message (long arguments cut short).
describe() {
    local args="$*"
    ((${#args} > 160)) && args="${args:0:160}..."
    echo "  kvlab $args" | cat -v
    echo "  exit $rc; stderr ($(wc -l <"$dir/err") lines, first 300 bytes):"
    head -c 300 "$dir/err" | cat -v | sed 's/^/    /'
}

fail() {
    echo "FAIL: $1"
    failed=1
}

# refused NEEDLE MB SECONDS ARGS...: a clean one-line refusal whose text contains NEEDLE.
refused() {
    local needle=$1
    shift
    limited "$@"
    shift 2
    local why=""
    if ((rc == 0)); then
        why="exit 0, expected a refusal"
    elif ((rc >= 124)); then
        why="exit $rc: a timeout, a kill or a crash"
    elif [[ $(wc -l <"$dir/err") -ne 1 || $(tail -c 1 "$dir/err" | od -An -c | tr -d ' ') != '\n' ]]; then
        why="stderr is not exactly one line"
    elif LC_ALL=C grep -q '[^ -~]' "$dir/err"; then
        why="stderr has a byte that is not printable ASCII"
    elif ! grep -q '^kvlab: error: ' "$dir/err"; then
        why="stderr does not start with 'kvlab: error: '"
    elif ! grep -qF -- "$needle" "$dir/err"; then
        why="stderr does not name '$needle'"
    fi
    if [[ -n $why ]]; then
        fail "$why"
        describe "$@"
    else
        echo "ok: refused: $(cat "$dir/err")"
    fi
}

# quiet: the last run printed nothing on stdout (a refusal before any table).
quiet() {
    if [[ -s $dir/out ]]; then
        fail "stdout is not empty before the refusal ($(wc -l <"$dir/out") lines)"
    fi
}

# succeeds MB SECONDS ARGS...: exit 0 and no error on stderr (generate reports its speed there).
succeeds() {
    limited "$@"
    shift 2
    if ((rc != 0)) || grep -q 'error' "$dir/err"; then
        fail "expected success"
        describe "$@"
    else
        echo "ok: succeeded: kvlab ${*:1:3}..."
    fi
}

need_tokenizer() {
    if [[ ! -f $MODELS/tok512.bin || ! -f $MODELS/stories260K.bin ]]; then
        echo "skipped: needs $MODELS/tok512.bin and stories260K.bin"
        exit 77
    fi
}

case $CASE in
non-finite-floats)
    # CLI::Range lets NaN through: the viewer once indexed its steps with int(NaN).
    for v in nan NaN -nan inf -inf 1e999; do
        refused "--speed" 300 60 view --headless --frames 3 --speed "$v"
    done
    refused "--temperature" 300 30 generate --temperature nan --steps 2
    refused "--temperature" 300 30 generate --temperature inf --steps 2
    refused "--top-p" 300 30 generate --top-p nan --temperature 0.5 --steps 2
    ;;
tokenizer-fifo)
    # Opening a FIFO blocks until a writer comes, which never happens: kvlab once hung here.
    mkfifo "$dir/tok.fifo" "$dir/model.fifo"
    refused "not a regular file" 300 20 demo --tokenizer "$dir/tok.fifo" --steps 2
    refused "not a regular file" 300 20 generate --tokenizer "$dir/tok.fifo" --steps 2
    refused "not a regular file" 300 20 demo --model "$dir/model.fifo" --steps 2
    ;;
long-prompt)
    # A 100 kB prompt once took minutes of BPE merging before it was refused.
    need_tokenizer
    long=$(yes 'once upon a time there was a little girl' | tr '\n' ' ' | head -c 100000)
    ((${#long} == 100000)) || fail "the prompt is ${#long} bytes"
    refused "max_seq" 300 10 demo --prompt "$long"
    refused "max_seq" 300 10 generate --prompt "$long" --steps 2
    refused "max_seq" 300 10 speculate --prompt "$long" --steps 2
    refused "max_seq" 300 10 view --headless --frames 1 --prompt "$long"
    # A prompt whose bytes alone cannot prove it too long (max_seq 16384 >= 100000 / 7, tok512's
    # longest piece): it is encoded, fast, and then refused.
    "$KVLAB" export --shape dim=8,hidden_dim=8,n_layers=1,n_heads=1,n_kv_heads=1,vocab_size=512,max_seq=16384 \
        "$dir/long.bin" >/dev/null || fail "export"
    refused "max_seq" 300 10 generate --model "$dir/long.bin" --tokenizer "$MODELS/tok512.bin" --prompt "$long"
    # A long prompt that fits after merging still runs.
    succeeds 300 30 generate --prompt "${long:0:1200}" --steps 2
    ;;
naive-memory)
    # Naive decode of 20,000 tokens once allocated a T x T score matrix per head (and cached
    # prefill a T x T slot list). A valid 4 MB checkpoint with max_seq 131072, made here.
    "$KVLAB" export --shape dim=8,hidden_dim=8,n_layers=1,n_heads=1,n_kv_heads=1,vocab_size=32,max_seq=131072 \
        "$dir/big.bin" >/dev/null || fail "export"
    tokens=$(seq 0 19999 | awk '{ print $1 % 32 }' | paste -sd, -)
    [[ $(tr -cd , <<<"$tokens" | wc -c) == 19999 ]] || fail "not 20,000 tokens"
    succeeds 600 300 demo --model "$dir/big.bin" --tokens "$tokens" --steps 1
    ;;
size-limit)
    # One size limit (kMaxBytes in core/config.h) for every model, pool and cache, checked where each
    # is made.
    refused "limit" 400 30 view --headless --frames 1 --variant paged --n-blocks 1048576
    refused "limit" 400 30 view --headless --frames 1 --variant prefix-shared --n-blocks 1048576
    seven_b=dim=4096,hidden_dim=11008,n_layers=32,n_heads=32,n_kv_heads=32,vocab_size=32000,max_seq=2048
    refused "limit" 400 30 export --shape "$seven_b" "$dir/7b.bin"
    refused "limit" 400 30 bench --shape "$seven_b" --lengths 8 --reps 1
    refused "limit" 400 30 view --headless --frames 1 --shape "$seven_b"
    refused "limit" 400 30 pool --blocks 65536 --block-size 512 --script "new a 1,2"
    # A full-size pool in text mode: no JSON copy of its 65,536 blocks per show.
    script="new a 1,2,3"
    for i in $(seq 1 30); do script="$script; show"; done
    succeeds 400 120 pool --blocks 65536 --block-size 1 --script "$script"
    ;;
messages)
    # Every message one printable line naming the real culprit.
    refused "'6\n4' is not an integer for dim" 200 10 export --shape $'dim=6\n4' "$dir/x.bin"
    refused 'di\nm' 200 10 export --shape $'di\nm=6' "$dir/x.bin"
    refused 'fro\nb' 200 10 $'fro\nb'
    refused '\x1b[2J' 200 10 pool --script $'new a 1,2; bogus\e[2J'
    refused '\x1b[31m' 200 10 demo --steps $'\e[31m'
    refused '\x1b' 200 10 demo --model $'/nonexistent/\e[31m.bin'
    refused '--seed' 200 10 generate --seed -1 --steps 2
    refused '--model-seed' 200 10 demo --model-seed -1 --steps 2
    refused '--seed' 200 10 verify --seed -5
    refused '--seed' 200 10 memory --seed -1
    refused '--requests' 200 30 memory --requests 1048576 --context 16777216
    quiet
    refused '--context' 200 30 memory --batch 1048576 --context 16777216 --model gpt3-175b --precision fp32
    quiet
    ;;
*)
    echo "unknown case '$CASE'"
    exit 2
    ;;
esac
exit $failed
