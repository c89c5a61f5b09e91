#!/usr/bin/env bash
# bench/pcache.sh MODEL [N] [NEW] [REPS] - the prompt cache's speed (issue 25; a
# benchmark, not a timed test). Per repetition, as root (the page cache is dropped
# before every arm, so the state file and the model come from the disk):
#   cold     time to first token of an N-token prompt, no cached state (it stores one)
#   restart  a new process: the same prompt plus a NEW-token turn, which restores the
#            N - 1 cached positions from the disk and prefills the rest
#   turn0    the turn's NEW tokens alone, at position 0 (the old, too low, reference)
# and the disk's sequential read bandwidth (O_DIRECT, 4 MiB records, 256 MiB file on
# the cache directory's file system). The bound for the restarted turn is the new
# turn's own prefill (its rows at positions N..N+NEW, evaluated in the restarted
# process: `prefill_eval_s`) plus the state bytes read at that bandwidth. Extra engine
# options (--experts PACK --expert-cache BYTES, ...) go in $ARGS. Medians of REPS
# (3); every repetition is printed, and $OUT (a directory) keeps the events files.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
M=$1 N=${2:-2048} NEW=${3:-64} REPS=${4:-3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
W=$(mktemp -d -p "${PCACHE_TMP:-/var/tmp}")
trap 'rm -rf "$W"' EXIT
ids() { awk -v n="$1" -v s="$2" 'BEGIN { for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
        printf "%s%d", (i ? "," : ""), s % 1000 } }'; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
P=$(ids "$N" 1) T=$(ids "$NEW" 2)
run() { # EVENTS_FILE CACHE_DIR|- TOKENS
    local pc=()
    [ "$2" != - ] && pc=(--prompt-cache "$2")
    "$B/deltafin" run --model "$M" --prompt-tokens "$3" --max-new 1 --temp 0 --print-ids "${pc[@]}" \
        --events "$1" ${ARGS:-} >/dev/null 2>>"$OUT/stderr.log"
}
dd if=/dev/urandom of="$W/bw.bin" bs=4M count=64 status=none
for r in $(seq "$REPS"); do
    drop
    dd if="$W/bw.bin" of=/dev/null bs=4M iflag=direct 2>&1 | awk -v r="$r" '/copied/ {
        for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1); print "{\"event\":\"disk\",\"rep\":" r ",\"gbs\":" 268435456 / s / 1e9 "}" }' \
        >"$OUT/disk-$r.jsonl"
    rm -rf "$W/pc"
    mkdir "$W/pc"
    drop
    run "$OUT/cold-$r.jsonl" "$W/pc" "$P"
    drop
    run "$OUT/restart-$r.jsonl" "$W/pc" "$P,$T"
    drop
    run "$OUT/turn0-$r.jsonl" - "$T"
done
/usr/bin/python3 - "$OUT" "$REPS" "$M" "$N" "$NEW" <<'PYEOF'
import json, statistics as st, sys
out, reps, m, n, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def ev(arm, r, kind):
    for l in open(f"{out}/{arm}-{r}.jsonl"):
        e = json.loads(l)
        if e.get("event") == kind: return e
    return {}
rows = []
for r in range(1, reps + 1):
    c, w, t0 = ev("cold", r, "summary"), ev("restart", r, "summary"), ev("turn0", r, "summary")
    pw, pc = ev("restart", r, "prompt_cache"), ev("cold", r, "prompt_cache")
    bw = ev("disk", r, "disk")["gbs"]
    x = dict(cold=c["ttft_s"], restart=w["ttft_s"], eval=w["prefill_eval_s"], restore=pw["restore_s"],
             mb=pw["bytes_read"] / 1e6, bw=bw, turn0=t0["ttft_s"], store_cold=pc["store_s"], store=pw["store_s"])
    x["read"] = x["mb"] / 1e3 / bw
    x["bound"] = x["eval"] + x["read"]
    rows.append(x)
    print(f"rep {r}: cold {x['cold']:.4f} s | restart {x['restart']:.4f} s (restore {x['restore']:.4f}, new rows "
          f"{x['eval']:.4f}) | {x['mb']:.3f} MB at {bw:.2f} GB/s = {x['read']:.4f} s | bound {x['bound']:.4f} s | "
          f"turn alone at 0 {x['turn0']:.4f} s | stores (after the first token) cold {x['store_cold']:.4f}, restart {x['store']:.4f} s")
med = {k: st.median(x[k] for x in rows) for k in rows[0]}
print(f"model {m}, prompt {n} tokens, new turn {new} tokens; medians of {reps}:")
print(f"  cold TTFT                      {med['cold']:.4f} s")
print(f"  restart TTFT (prompt + turn)   {med['restart']:.4f} s  (restore {med['restore']:.4f} s of it)")
print(f"  state bytes                    {med['mb']:.3f} MB; disk {med['bw']:.2f} GB/s -> {med['read']:.4f} s")
print(f"  bound: new rows {med['eval']:.4f} s + read {med['read']:.4f} s = {med['bound']:.4f} s; "
      f"restart / bound {med['restart'] / med['bound']:.2f}")
print(f"  the turn alone at position 0   {med['turn0']:.4f} s")
PYEOF
