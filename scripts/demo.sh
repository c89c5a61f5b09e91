#!/usr/bin/env bash
# demo.sh - the README's main job: build, then run a prompt on the demo model.
# The trained demo model (models/demo-moe) ships once its issue lands; until then
# this generates a small random-weight Qwen3-MoE checkpoint with the real Qwen3
# tokenizer, so the output is well-formed tokens but not meaningful text.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
make -s B="$B" "$B/deltafin"
if [ -f models/demo-moe/config.json ]; then
    M=models/demo-moe
else
    M=$B/demo-model
    if [ ! -f "$M/config.json" ]; then
        echo "demo: generating a random-weight Qwen3-MoE checkpoint in $M"
        /usr/bin/python3 tools/gen_checkpoint.py --out "$M" --arch qwen3_moe --seed 1 --dtype bf16 \
            --vocab 151936 --hidden 256 --intermediate 512 --layers 4 --heads 4 --kv-heads 2 \
            --head-dim 64 --experts 32 --top-k 4 --moe-intermediate 128 --norm-topk-prob 1 \
            --tie-embeddings 1 --max-pos 4096
    fi
fi
"$B/deltafin" inspect --model "$M" | sed -n '1,14p;/^bytes:/p'
# Routed experts go into a pack and stream from it through a cache a third of
# their size; the always-active weights stay in RAM.
P=$B/demo-pack
"$B/deltafin" pack --model "$M" --out "$P"
CACHE=$(( $("$B/deltafin" inspect --model "$M" | sed -n 's/.*routed experts .*(\([0-9]*\)).*/\1/p') / 3 ))
echo
echo "--- deltafin run --model $M --experts $P --expert-cache $CACHE --chat --prompt 'Tell me about whales.' --stats"
"$B/deltafin" run --model "$M" --experts "$P" --expert-cache "$CACHE" --chat \
    --prompt "Tell me about whales." --max-new 32 --temp 0.8 --seed 7 --stats
