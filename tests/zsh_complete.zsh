# What zsh's completion system offers, for real: each LINE is put in the line editor of an
# interactive zsh (on a pseudo-terminal, zsh/zpty) whose fpath holds FPATH_DIR, and completed as
# TAB would. OUT gets "== LINE" and the candidates that reach compadd (a wrapper writes them down
# and passes them on), one a line.
#   zsh -f zsh_complete.zsh FPATH_DIR OUT LINE...
zmodload zsh/zpty || exit 77
dir=$1 out=$2
shift 2
: >"$out"
zpty z zsh -f -i
zpty -w z "PS1=''; fpath=($dir \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w z "compadd() { local -a hits; builtin compadd -O hits \"\$@\"; print -rl -- \$hits >>$out; builtin compadd \"\$@\"; }"
zpty -w z "zstyle ':completion:*' list-prompt ''; zstyle ':completion:*' menu no"
# ^T completes the line, then marks the end in OUT and empties the line. Nothing is typed while
# a completion runs (zsh cuts a completion short when keys are waiting): each step waits for the
# mark its command leaves, in the pseudo-terminal's output or in OUT.
zpty -w z "complete-then-mark() { zle complete-word; print -r -- '-- end' >>$out; BUFFER=''; zle -I; }"
zpty -w z "zle -N complete-then-mark; bindkey '^T' complete-then-mark"
n=0
for line in "$@"; do
  n=$((n + 1))
  zpty -w z "print -r -- '== $line' >>$out; print -r -- R\$((1000+$n))Y"
  zpty -r z reply "*R$((1000 + n))Y*"
  zpty -w -n z "$line"$'\x14'
  for ((tries = 0; tries < 400; tries++)); do
    (($(grep -c '^-- end$' "$out") >= n)) && break
    sleep 0.05
  done
  ((tries < 400)) || { print -u2 "zsh_complete: no answer for '$line'"; exit 1; }
done
zpty -d z
