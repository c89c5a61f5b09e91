#!/usr/bin/env bash
# make_test_models.sh DIR - synthetic checkpoints for the C tests (seeded, tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
D=$1
PY=/usr/bin/python3
gen() { local out=$1; shift; [ -f "$D/$out/config.json" ] || $PY tools/gen_checkpoint.py --out "$D/$out" "$@"; }
# MoE: 3 layers, layer 1 dense via mlp_only_layers; sharded.
gen engine-moe --arch qwen3_moe --seed 11 --dtype bf16 --vocab 1024 --hidden 96 --intermediate 160 \
    --layers 3 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --top-k 3 --moe-intermediate 48 \
    --mlp-only-layers 1 --norm-topk-prob 1 --max-pos 512 --max-shard-size 400000
gen engine-dense --arch qwen3 --seed 12 --dtype f16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 2 --heads 4 --kv-heads 1 --head-dim 16 --tie-embeddings 1 --max-pos 512
# Speculative decoding: a draft whose vocabulary differs from the targets' (rejected).
gen draft-v512 --arch qwen3 --seed 13 --dtype f16 --vocab 512 --hidden 32 --intermediate 64 \
    --layers 1 --heads 2 --kv-heads 1 --head-dim 16 --tie-embeddings 1 --max-pos 512
