#!/usr/bin/env bash
# bench/prefetch.sh - issue 4's benchmark: does reading ahead hide the disk?
#
#  decode: cold cache, experts >= 3x the budget, seeded random-token teacher
#          forcing; arms --prefetch on / off (and router / prev with ARMS=...),
#          run interleaved; tokens/s against the I/O bound measured next to
#          every arm (bandwidth / bytes missed per token), read wait per token.
#  prefill: time to first token of a 512-token prompt, streamed, cold, against
#          (every expert the prompt touches read once at the measured bandwidth)
#          + (the same prompt's in-RAM compute time, warm).
#
# usage: bench/prefetch.sh [MODEL_DIR [PACK_DIR]]   (defaults: the make-bench model)
# env:   REPS (3), NEW (48), BUDGET (2G), ARMS ("on off"), PROMPT_LEN (512), B (build),
#        CACHE (size the expert cache directly instead of BUDGET, for small models),
#        SKIP_PREFILL=1, SIM_GBS (read the pack through a simulated disk of that
#        bandwidth, `bench run --sim-disk`: a known, constant bandwidth for the bound),
#        OTHER (another deltafin binary, e.g. an older build: an arm named
#        MODE-other runs it with --prefetch MODE), OUT (results directory),
#        SUMMARY_ONLY=1 (only summarise the runs already in OUT)
# Every arm starts from the pack's heat file as it was when the script started
# (each run rewrites it, which moved the demo model's numbers from batch to
# batch), and the script leaves it so.
# Results: bench/results/<date>/prefetch-<model>/ (events JSON lines + summary.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
M=${1:-$B/bench-models/moe-h2048-e128}
PACK=${2:-$M-pack}
REPS=${REPS:-3}
NEW=${NEW:-48}
BUDGET=${BUDGET:-2G}
ARMS=${ARMS:-on off}
if [ -n "${CACHE:-}" ]; then MEM=(--expert-cache "$CACHE"); else MEM=(--ram-budget "$BUDGET"); fi
[ -n "${SIM_GBS:-}" ] && MEM+=(--sim-disk "$SIM_GBS")
PLEN=${PROMPT_LEN:-512}
OUT=${OUT:-bench/results/$(date +%Y-%m-%d)/prefetch-$(basename "$M")}
mkdir -p "$OUT"
LOG=$OUT/summary.txt
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then REPS=0; SKIP_PREFILL=1; sed -i '/^## decode/,$d' "$LOG"
else rm -f "$OUT"/*.jsonl "$OUT"/*.err "$OUT"/iobw.txt; : >"$LOG"; fi
say() { echo "$*" | tee -a "$LOG"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || { echo "need root to drop caches" >&2; exit 1; }; }

make -s B="$B" "$B/deltafin" "$B/bench_io"
[ -f "$M/config.json" ] || { echo "no model at $M (make bench generates it)" >&2; exit 1; }
[ -f "$PACK/manifest.json" ] || "$B/deltafin" pack --model "$M" --out "$PACK"
HEAT_TMP=$(mktemp -d)
. bench/heat.sh
. bench/lib.sh
heat_keep "$HEAT_TMP" "$PACK"
trap 'heat_reset; rm -rf "$HEAT_TMP"' EXIT
arm_bin() { case $1 in *-other) echo "${OTHER:?arm $1 needs OTHER=binary}" ;; *) echo "$B/deltafin" ;; esac; }
EXPERT_BYTES=$("$B/deltafin" inspect --model "$M" | sed -n 's/.*routed experts .*(\([0-9]*\)).*/\1/p')
NREC=$(/usr/bin/python3 -c "import json; print(len(json.load(open('$PACK/manifest.json'))['records']))" 2>/dev/null || echo 1024)
RECORD=$((EXPERT_BYTES / NREC))
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
say "# prefetch benchmark, $(date -u +%FT%TZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
say "model $M: experts $((EXPERT_BYTES / 1048576)) MiB in $NREC records; ${MEM[*]}; $NEW tokens; reps $REPS"
fi
iobw() {
    if [ -n "${SIM_GBS:-}" ]; then echo "$SIM_GBS"; return; fi
    "$B/bench_io" -s "$RECORD" -d 8 -t 4 "$PACK/experts.bin" | awk '{print $2}'
}
VOCAB=$(/usr/bin/python3 -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
ids() { /usr/bin/python3 -c "import random; r=random.Random($1); v=$VOCAB; print(','.join(str(r.randrange(min(1000, v // 8), v)) for _ in range($2)))"; }
P16=$(ids 4 16)
P512=$(ids 5 "$PLEN")

for i in $(seq "$REPS"); do
    for arm in $ARMS; do
        drop
        BW=$(iobw)
        echo "$arm $BW" >>"$OUT/iobw.txt"
        heat_reset
        drop
        dfrun "$(arm_bin "$arm")" --model "$M" --experts "$PACK" "${MEM[@]}" --prompt-tokens "$P16" \
            --max-new "$NEW" --temp 0 --print-ids --teacher-force 7 --prefetch "${arm%-other}" --io-bw "$BW" \
            --events "$OUT/decode-$arm-$i.jsonl" >/dev/null 2>"$OUT/decode-$arm-$i.err"
        say "decode $arm rep $i: bw $BW GB/s: $(grep '"summary"' "$OUT/decode-$arm-$i.jsonl" | cut -c1-160)..."
    done
done

# prefill: streamed arms, then the two halves of the reference time
[ "${SKIP_PREFILL:-0}" = 1 ] && PREPS=0 || PREPS=$REPS
for i in $(seq "$PREPS"); do
    for arm in $ARMS; do
        heat_reset
        drop
        dfrun "$(arm_bin "$arm")" --model "$M" --experts "$PACK" "${MEM[@]}" --prompt-tokens "$P512" \
            --max-new 1 --temp 0 --print-ids --prefetch "${arm%-other}" --events "$OUT/prefill-$arm-$i.jsonl" \
            >/dev/null 2>"$OUT/prefill-$arm-$i.err"
    done
done
if [ "$PREPS" -gt 0 ]; then
drop
BW=$(iobw)
echo "touched $BW" >>"$OUT/iobw.txt"
drop
# every expert the prompt touches, each read exactly once (a cache that holds them all)
dfrun "$B/deltafin" --model "$M" --experts "$PACK" ${SIM_GBS:+--sim-disk "$SIM_GBS"} --expert-cache "$((EXPERT_BYTES + EXPERT_BYTES / 4))" \
    --prompt-tokens "$P512" --max-new 1 --temp 0 --print-ids --prefetch off \
    --events "$OUT/touched.jsonl" >/dev/null 2>"$OUT/touched.err"
# in-RAM compute: the checkpoint in the page cache, experts used in place
drop
"$B/deltafin" run --model "$M" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
for i in $(seq "$REPS"); do
    "$B/deltafin" run --model "$M" --prompt-tokens "$P512" --max-new 1 --temp 0 --print-ids \
        --events "$OUT/inram-$i.jsonl" >/dev/null 2>&1
done
fi

/usr/bin/python3 - "$OUT" "$ARMS" <<'PYEOF' | tee -a "$LOG"
import glob, json, statistics as S, sys
out, arms = sys.argv[1], sys.argv[2].split()
def ev(path, kind):
    for line in open(path):
        d = json.loads(line)
        if d.get("event") == kind:
            return d
bws = {}
for line in open(f"{out}/iobw.txt"):
    a, b = line.split()
    bws.setdefault(a, []).append(float(b))
print("\n## decode (cold, teacher-forced)")
print("| prefetch | tok/s median (min-max) | fraction of I/O bound median (min-max) | MB missed/token | MB wasted/token | read wait s/token | recall | precision | time gate (last probe) |")
print("|---|---|---|---|---|---|---|---|---|")
for arm in arms:
    rows = []
    for f in sorted(glob.glob(f"{out}/decode-{arm}-[0-9]*.jsonl")):
        s, p = ev(f, "summary"), ev(f, "prefetch")
        if s: rows.append((s, p))
    if not rows: continue
    tps = [s["tokens_per_s"] for s, _ in rows]
    frac = [s["fraction_of_bound"] for s, _ in rows]
    n = rows[0][0]["decode_tokens"]
    miss = S.median(s["bytes_missed_per_token"] for s, _ in rows) / 1e6
    waste = S.median(s["prefetch_bytes_wasted"] / n for s, _ in rows) / 1e6
    wait = S.median(s["read_wait_s"] / n for s, _ in rows)
    rec = S.median(p["recall"] for _, p in rows if p) if rows[0][1] else 0
    prec = S.median(p["precision"] for _, p in rows if p) if rows[0][1] else 0
    gates = ", ".join(f"{p['gate']} {p['gate_speedup']:.2f}x" for _, p in rows
                      if p and p.get("mode") == "on" and p.get("gate") != "forced")
    print(f"| {arm} | {S.median(tps):.3f} ({min(tps):.3f}-{max(tps):.3f}) | {S.median(frac):.3f} ({min(frac):.3f}-{max(frac):.3f}) "
          f"| {miss:.1f} | {waste:.1f} | {wait:.4f} | {rec:.3f} | {prec:.3f} | {gates or '-'} |")
print("I/O bandwidth (GB/s) measured before each decode arm: " +
      ", ".join(f"{a} median {S.median(v):.3f}" for a, v in bws.items() if a in arms))
import os
if not os.path.exists(f"{out}/touched.jsonl"):
    sys.exit(0)
t = ev(f"{out}/touched.jsonl", "summary")
touched = ev(f"{out}/touched.jsonl", "prefill")["expert_bytes_read"]
inram = [ev(f, "summary")["prefill_s"] for f in sorted(glob.glob(f"{out}/inram-*.jsonl"))]
bw = bws["touched"][0]
read_s = touched / (bw * 1e9)
ref = read_s + S.median(inram)
print(f"\n## prefill, {t['prompt_tokens']}-token prompt, streamed, cold")
print(f"every expert it touches: {touched/1e9:.2f} GB, read once at {bw:.3f} GB/s = {read_s:.2f} s; "
      f"in-RAM compute {S.median(inram):.2f} s (min {min(inram):.2f}); reference {ref:.2f} s")
for arm in arms:
    tt = [ev(f, "summary")["prefill_s"] for f in sorted(glob.glob(f"{out}/prefill-{arm}-[0-9]*.jsonl"))]
    if tt:
        print(f"prefetch {arm}: time to first token median {S.median(tt):.2f} s (min {min(tt):.2f}, max {max(tt):.2f}) "
              f"= {S.median(tt)/ref:.2f}x the reference (target <= 1.3x)")
PYEOF
say "results in $OUT"
