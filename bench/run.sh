#!/usr/bin/env bash
# bench/run.sh - `make bench`. Speed goals live here, never in timed tests.
#  1. kernels: memory read bandwidth, GEMV/GEMM throughput per ISA path
#  2. in-RAM decode on a synthetic Qwen3-MoE (hidden 2048, 128 experts, top-8,
#     expert size 768, 8 layers): active-weight bytes/token x tokens/s as a
#     fraction of the measured memory bandwidth; prefill (64 rows) vs decode.
# Arms run interleaved; medians are reported. Results go to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
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
        --tie-embeddings 1 --max-pos 4096 --max-shard-size 4000000000
fi
# Warm the page cache so this measures compute against RAM, not the disk.
cat "$M"/*.safetensors >/dev/null

PROMPT=$(/usr/bin/python3 -c 'import random; r=random.Random(3); print(",".join(str(r.randrange(1000, 100000)) for _ in range(64)))')
say ""
say "## in-RAM decode and prefill ($M, 64-token prompt, 32 new tokens, 2 threads)"
for i in $(seq "$REPS"); do
    "$B/deltafin" run --model "$M" --prompt-tokens "$PROMPT" --max-new 32 --temp 0 --threads 2 \
        --print-ids --stats 2>&1 >/dev/null | tee -a "$LOG"
done
/usr/bin/python3 - "$LOG" "$MEMBW" <<'PYEOF' | tee -a "$LOG"
import re, statistics, sys
log, membw = open(sys.argv[1]).read(), float(sys.argv[2] or 0)
rows = re.findall(r"prefill (\d+) tokens in [\d.]+ s \(([\d.]+) tok/s\); decode \d+ tokens in [\d.]+ s \(([\d.]+) tok/s\); active weights ([\d.]+) MB/token -> ([\d.]+) GB/s", log)
pf = statistics.median(float(r[1]) for r in rows)
dc = statistics.median(float(r[2]) for r in rows)
gbs = statistics.median(float(r[4]) for r in rows)
print(f"median prefill {pf:.2f} tok/s, decode {dc:.2f} tok/s, prefill/decode per token {pf/dc:.2f}x")
print(f"decode active-weight bandwidth {gbs:.2f} GB/s = {gbs/membw:.2f} of measured memory bandwidth {membw:.2f} GB/s" if membw else "no memory bandwidth measured")
PYEOF
