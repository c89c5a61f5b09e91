#!/usr/bin/env bash
# bench/run.sh - `make bench`. Speed goals live here, never in timed tests.
#  1. kernels: memory read bandwidth, GEMV/GEMM throughput per ISA path
#  2. in-RAM decode on a synthetic Qwen3-MoE (hidden 2048, 128 experts, top-8,
#     expert size 768, 8 layers): active-weight bytes/token x tokens/s as a
#     fraction of the measured memory bandwidth; prefill (64 rows) vs decode.
# Arms run interleaved; medians are reported. Results go to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
B=${B:-build}
REPS=${REPS:-3}
OUT=bench/results/$(date +%Y-%m-%d)
mkdir -p "$OUT"
LOG=$OUT/bench-core.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }

say "# deltafin core benchmark, $(date -u +%FT%TZ)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
say ""
say "## kernels"
"$B/bench_kernels" 2>&1 | tee -a "$LOG"
MEMBW=$(grep -E '^membw_gbs' "$LOG" | tail -1 | awk '{print $2}')

M=$B/bench-models/moe-h2048-e128
if [ ! -f "$M/config.json" ]; then
    say "generating $M (about 10 GB)"
    /usr/bin/python3 tools/gen_checkpoint.py --out "$M" --arch qwen3_moe --seed 5 --dtype bf16 \
        --vocab 151936 --hidden 2048 --intermediate 6144 --layers 8 --heads 32 --kv-heads 4 \
        --head-dim 128 --experts 128 --top-k 8 --moe-intermediate 768 --norm-topk-prob 1 \
        --tie-embeddings 1 --max-pos 4096 --max-shard-size 4000000000 --fast-init
fi
# Only this model in the page cache (a pack left there by an earlier run would
# crowd it out), then warm it so this measures compute against RAM, not the disk.
# The engine itself warms it: its page faults bring the file in as 2 MiB folios,
# and where the page cache held it in small ones (which stream ~30% slower,
# src/engine.c huge_weights) it re-reads it as huge ones, once.
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
"$B/deltafin" run --model "$M" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null

PROMPT=$(/usr/bin/python3 -c 'import random; r=random.Random(3); print(",".join(str(r.randrange(1000, 100000)) for _ in range(64)))')
say ""
say "## in-RAM decode and prefill ($M, 64-token prompt, 32 new tokens, 2 threads)"
RAMEV=$OUT/inram-events
mkdir -p "$RAMEV"
for i in $(seq "$REPS"); do
    "$B/deltafin" run --model "$M" --prompt-tokens "$PROMPT" --max-new 32 --temp 0 --threads 2 \
        --print-ids --events "$RAMEV/$i.jsonl" >/dev/null
    say "rep $i: $(grep '"summary"' "$RAMEV/$i.jsonl")"
done
/usr/bin/python3 - "$RAMEV" "$MEMBW" <<'PYEOF' | tee -a "$LOG"
import glob, json, statistics, sys
rows = [json.loads(l) for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for l in open(f) if '"summary"' in l]
membw = float(sys.argv[2] or 0)
# A rep whose decode read from storage measured the disk, not RAM: the page
# cache lost part of the model mid-run (memory pressure, or the VM's proactive
# reclaim). Such reps are shown and counted but left out of the medians.
cold = [r for r in rows if r.get("storage_bytes_read", 0) > 0]
if cold and len(cold) < len(rows):
    print(f"{len(cold)} of {len(rows)} reps read from storage during decode "
          "(" + ", ".join("%.0f MB" % (r["storage_bytes_read"] / 1e6) for r in cold) + "): left out of the medians")
    rows = [r for r in rows if r.get("storage_bytes_read", 0) == 0]
elif cold:
    print(f"all {len(rows)} reps read from storage during decode: the medians below are not in-RAM figures")
pf = statistics.median(r["prompt_tokens"] / r["prefill_s"] for r in rows)
dc = statistics.median(r["tokens_per_s"] for r in rows)
act = rows[0]["active_bytes_per_token"]
gbs = dc * act / 1e9
print(f"median prefill {pf:.2f} tok/s, decode {dc:.2f} tok/s (min {min(r['tokens_per_s'] for r in rows):.2f}, max {max(r['tokens_per_s'] for r in rows):.2f}); prefill/decode per token {pf/dc:.2f}x")
print(f"decode: {act/1e6:.1f} MB active weights/token x {dc:.2f} tok/s = {gbs:.2f} GB/s = {gbs/membw:.2f} of measured memory bandwidth {membw:.2f} GB/s")
PYEOF

# ---- expert streaming: experts >= 3x the budget, cold cache ------------------------
PACK=$M-pack
if [ ! -f "$PACK/manifest.json" ]; then
    say "packing $M into $PACK"
    "$B/deltafin" pack --model "$M" --out "$PACK"
fi
BUDGET=${BUDGET:-3G}
NEW=${NEW:-128}
EXPERT_BYTES=$("$B/deltafin" inspect --model "$M" | sed -n 's/.*routed experts .*(\([0-9]*\)).*/\1/p')
RECORD=$((EXPERT_BYTES / 1024))  # 8 layers x 128 experts: one record
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || say "(cannot drop caches: not root)"; }
say ""
say "## streaming decode: budget $BUDGET, experts $((EXPERT_BYTES / 1048576)) MiB, $NEW tokens, teacher-forced, cold cache"
P16=$(/usr/bin/python3 -c 'import random; r=random.Random(4); print(",".join(str(r.randrange(1000, 100000)) for _ in range(16)))')
EV=$OUT/stream-events
rm -rf "$EV"; mkdir -p "$EV"
for i in $(seq "$REPS"); do
    for arm in pack pagecache; do
        extra=()
        [ $arm = pack ] && extra=(--experts "$PACK")
        drop
        # the device bandwidth, measured next to every arm: a virtual disk drifts
        IOBW=$("$B/bench_io" -s "$RECORD" -d 8 -t 4 "$PACK/experts.bin" | awk '{print $2}')
        echo "$IOBW" >>"$EV/iobw.txt"
        drop
        dfrun "$B/deltafin" --model "$M" --prompt-tokens "$P16" --max-new "$NEW" --temp 0 --threads 2 \
            --print-ids --ram-budget "$BUDGET" --teacher-force 7 --io-bw "$IOBW" \
            --events "$EV/$arm-$i.jsonl" "${extra[@]}" >/dev/null 2>"$EV/$arm-$i.err" || {
            say "run failed: $(tail -1 "$EV/$arm-$i.err")"; continue; }
        say "$arm rep $i: $(grep '"summary"' "$EV/$arm-$i.jsonl")"
    done
done
/usr/bin/python3 - "$EV" <<'PYEOF' | tee -a "$LOG"
import glob, json, statistics, sys
ev = sys.argv[1]
iobw = statistics.median(float(x) for x in open(f"{ev}/iobw.txt"))
print(f"O_DIRECT read bandwidth, measured before every arm: median {iobw:.3f} GB/s")
for arm in ("pack", "pagecache"):
    rows = []
    for f in sorted(glob.glob(f"{ev}/{arm}-*.jsonl")):
        for line in open(f):
            d = json.loads(line)
            if d.get("event") == "summary":
                rows.append(d)
    if not rows:
        continue
    med = lambda k: statistics.median(r[k] for r in rows)
    tps, per_tok = med("tokens_per_s"), med("bytes_missed_per_token")
    bound = iobw * 1e9 / per_tok if per_tok else 0
    hit = med("expert_hits") / max(1, med("expert_hits") + med("expert_misses"))
    print(f"{arm:9s}: median {tps:.3f} tok/s (min {min(r['tokens_per_s'] for r in rows):.3f}, max {max(r['tokens_per_s'] for r in rows):.3f}), "
          f"{per_tok/1e6:.1f} MB missed/token, hit rate {hit:.3f}, read wait {med('read_wait_s'):.1f} s, "
          f"peak RSS {med('peak_rss_bytes')/2**20:.0f} MiB; I/O bound {bound:.3f} tok/s -> {tps/bound if bound else 0:.2f} of bound")
PYEOF
say "results in $OUT"
