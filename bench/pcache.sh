#!/usr/bin/env bash
# bench/pcache.sh MODEL [N] [NEW] [DISK_GBPS] - the prompt cache's speed (a
# benchmark, not a timed test): time to first token for an N-token prompt cold,
# then, in a new process (a restart), for the same prompt plus a NEW-token turn,
# which restores N - 1 positions and prefills the rest; the state bytes read and
# the restore's time, against the time reading them at DISK_GBPS would take (the
# files are in the page cache here, so that is the bound a cold disk would add).
# Extra engine options (--experts, --ram-budget, ...) go in $ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
M=$1 N=${2:-2048} NEW=${3:-64} BW=${4:-3}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
ids() { awk -v n="$1" -v s="$2" 'BEGIN { for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
        printf "%s%d", (i ? "," : ""), s % 1000 } }'; }
P=$(ids "$N" 1)
run() { "$B/deltafin" run --model "$M" --prompt-tokens "$1" --max-new 1 --temp 0 --print-ids --stats \
        --prompt-cache "$D" ${ARGS:-} 2>&1 >/dev/null | grep -E '^summary|^prompt cache'; }
field() { sed -n "s/.*$1 \([0-9.]*\) $2.*/\1/p" | head -1; }
cold=$(run "$P")
warm=$(run "$P,$(ids "$NEW" 2)")
plain=$("$B/deltafin" run --model "$M" --prompt-tokens "$(ids "$NEW" 2)" --max-new 1 --temp 0 --stats \
        ${ARGS:-} 2>&1 >/dev/null | grep '^summary')
t_cold=$(echo "$cold" | field "prefill $N tokens" s)
t_warm=$(echo "$warm" | field "prefill $((N + NEW)) tokens" s)
t_new=$(echo "$plain" | field "prefill $NEW tokens" s)
mb=$(echo "$warm" | sed -n 's/.*read \([0-9.]*\) MB.*/\1/p')
t_rest=$(echo "$warm" | sed -n 's/.*from RAM) in \([0-9.]*\) s.*/\1/p')
echo "model $M, prompt $N tokens, new turn $NEW tokens; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
echo "cold TTFT (prefill $N):                 $t_cold s"
echo "after a restart, prompt + turn:         $t_warm s (restore $t_rest s of it, $mb MB of state)"
echo "the turn's own prefill ($NEW rows, cold): $t_new s (at position 0: a lower bound for rows at $N)"
awk -v mb="$mb" -v bw="$BW" 'BEGIN { printf "reading %.1f MB at %.1f GB/s:           %.4f s\n", mb, bw, mb / 1000 / bw }'
