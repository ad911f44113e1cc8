# What zsh's completion system offers, for real: each LINE is typed into an interactive zsh (on a
# pseudo-terminal, zsh/zpty) whose fpath holds FPATH_DIR, then TAB. OUT gets "== LINE" and the
# candidates that reach compadd (a wrapper writes them down and passes them on), one a line.
#   zsh -f zsh_complete.zsh FPATH_DIR OUT LINE...
zmodload zsh/zpty || exit 77
dir=$1 out=$2
shift 2
: >"$out"
zpty z zsh -f -i
zpty -w z "PS1=''; fpath=($dir \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w z "compadd() { local -a hits; builtin compadd -O hits \"\$@\"; print -rl -- \$hits >>$out; builtin compadd \"\$@\"; }"
zpty -w z "zstyle ':completion:*' list-prompt ''; zstyle ':completion:*' menu no"
# Each line waits for a marker that only running the command prints (R<n>Y, typed as an
# arithmetic expression), then types the line, TAB, and ^U (kill the line; ^C would be a signal
# that interrupts the completion).
n=0
for line in "$@"; do
  n=$((n + 1))
  zpty -w z "print -r -- '== $line' >>$out; print -r -- R\$((1000+$n))Y"
  zpty -r z reply "*R$((1000 + n))Y*"
  zpty -w -n z "$line"$'\t'$'\x15'
done
zpty -w z "print -r -- E\$((1+1))D"
zpty -r z reply '*E2D*'
zpty -d z
