#!/usr/bin/env bash
# Counter-test for the peer check: a kvlab whose generate prints other text must make
# bench/llama2c.sh fail, naming the difference. Usage: peer_counter.sh path/to/kvlab (77: no peer).
set -u
real=$1
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/kvlab" <<FAKE
#!/usr/bin/env bash
# export as kvlab does; generate prints a story of its own
if [ "\$1" = generate ]; then echo "Once upon a time there was a planted bug."; exit 0; fi
exec "$real" "\$@"
FAKE
chmod +x "$dir/kvlab"
out=$(KVLAB="$dir/kvlab" bash "$here/bench/llama2c.sh" short 1 2>&1)
rc=$?
[ $rc = 77 ] && { echo "$out"; exit 77; }
if [ $rc = 1 ] && grep -q "print different text" <<<"$out"; then
  echo "caught: $out"
  exit 0
fi
echo "peer_counter.sh: a kvlab printing other text was not caught (exit $rc): $out"
exit 1
