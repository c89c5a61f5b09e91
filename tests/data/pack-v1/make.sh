#!/usr/bin/env bash
# make.sh DELTAFIN_V1 - regenerates this fixture: a tiny qwen3_moe checkpoint
# (model/: 2 layers, layer 1 with 4 experts, no tokenizer) and its expert
# pack in format version 1 (pack/), written by a deltafin that writes
# version 1 (commit e5b23cc; e.g. /work/baseline/deltafin-e5b23cc). The
# checkpoint is committed too: numpy does not promise the same random
# stream across versions, and the pack's fingerprint covers its bytes.
# tests/test_pack_v1.c opens the pack with today's reader and streams from it.
set -euo pipefail
cd "$(dirname "$0")"
V1=$1
rm -rf model pack
/usr/bin/python3 ../../../tools/gen_checkpoint.py --out model --arch qwen3_moe --seed 21 --dtype bf16 \
    --vocab 32 --hidden 16 --intermediate 16 --layers 2 --heads 2 --kv-heads 1 --head-dim 8 \
    --experts 4 --top-k 2 --moe-intermediate 8 --mlp-only-layers 0 --norm-topk-prob 1 \
    --tie-embeddings 1 --max-pos 64 --no-tokenizer
"$V1" pack --quiet --model model --out pack
