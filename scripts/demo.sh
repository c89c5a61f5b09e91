#!/usr/bin/env bash
# demo.sh - the README's main job: build, pack the demo model's routed experts, and
# generate from it with the experts streamed from the pack through a RAM cache a
# quarter of their size, printing the text and the streaming statistics.
# The demo model is models/demo-moe: a small Qwen3-MoE (32 experts, top-4) trained by
# tools/train_demo.py on Moby-Dick and the State of the Union addresses
# (docs/demo-models.md). It is a language model of that text, trained for minutes,
# not an assistant: its chat replies are noise, so the prompt is plain text in the
# book's style.
# Without models/demo-moe (a checkout without the model files) it falls back to a
# random-weight Qwen3-MoE with the real Qwen3 tokenizer: well-formed tokens, no text.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
make -s B="$B" "$B/deltafin"
PROMPT="The whale"
if [ -f models/demo-moe/config.json ]; then
    M=models/demo-moe
    PROMPT="It was a cold grey morning when the ship left the harbour, and the whale"
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
# Routed experts go into a pack and stream from it through a cache a quarter of
# their size; the always-active weights stay in RAM.
# The pack directory is the demo's own: when it holds another model's pack (the
# model was retrained, or the fallback model was packed before), pack afresh.
P=$B/demo-pack
if ! "$B/deltafin" pack --model "$M" --out "$P" 2>/dev/null; then
    rm -rf "$P"
    "$B/deltafin" pack --model "$M" --out "$P"
fi
EXPERT_BYTES=$("$B/deltafin" inspect --model "$M" | sed -n 's/.*routed experts .*(\([0-9]*\)).*/\1/p')
CACHE=$(( EXPERT_BYTES / 4 ))
echo
echo "--- deltafin run --model $M --experts $P --expert-cache $CACHE --prompt '$PROMPT' --stats"
"$B/deltafin" run --model "$M" --experts "$P" --expert-cache "$CACHE" \
    --prompt "$PROMPT" --max-new 80 --temp 0.8 --top-p 0.95 --seed 7 --stats
