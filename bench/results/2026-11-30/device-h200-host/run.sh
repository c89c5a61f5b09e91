#!/bin/bash
# device check for issue 2: in-RAM decode vs memory bandwidth, 2 threads, quiet 16-core machine
export LD_LIBRARY_PATH=$PWD/.dev/lib
set -x
nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2; df -h /tmp | tail -1; uname -r
M=/tmp/m
t0=$(date +%s)
[ -f $M/config.json ] || python3 tools/gen_checkpoint.py --out $M --arch qwen3_moe --seed 5 --dtype bf16 --vocab 151936 --hidden 2048 \
  --intermediate 6144 --layers 8 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --top-k 8 \
  --moe-intermediate 768 --norm-topk-prob 1 --tie-embeddings 1 --max-pos 4096 --max-shard-size 4000000000 --fast-init --no-tokenizer > /dev/null || exit 1
cp .dev/tok/* $M/
echo "generated in $(( $(date +%s) - t0 )) s"
.dev/deltafin run --model $M --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
.dev/bench_kernels --membw-only | tee $OUT/kernels.txt
for i in 1 2 3 4 5 6; do
  bw=$(.dev/bench_kernels --membw-only | awk '/^membw_gbs/{print $2}')
  .dev/deltafin bench --model $M --random-prompt 64 --max-new 65 --threads 2 > $OUT/run$i.json
  echo "membw $bw $(cat $OUT/run$i.json)" >> $OUT/core.txt
done
.dev/deltafin bench --model $M --random-prompt 64 --max-new 65 --threads 8 > $OUT/run-t8.json
python3 - $OUT <<'PY'
import json, sys, statistics as st
rows = []
for l in open(sys.argv[1] + "/core.txt"):
    _, bw, js = l.split(" ", 2)
    d = json.loads(js); bw = float(bw)
    rows.append((d["tokens_per_s"], d["prompt_tokens"] / d["prefill_s"], bw, d["tokens_per_s"] * d["active_bytes_per_token"] / 1e9 / bw, d["storage_bytes_read"]))
for r in rows: print("decode %.2f tok/s prefill %.1f tok/s membw %.1f GB/s fraction %.3f storage %d" % r)
print("median decode %.2f, prefill/decode %.2fx, fraction %.3f" % (st.median(r[0] for r in rows), st.median(r[1] / r[0] for r in rows), st.median(r[3] for r in rows)))
d = json.load(open(sys.argv[1] + "/run-t8.json")); print("8 threads: decode %.2f tok/s" % d["tokens_per_s"])
PY
