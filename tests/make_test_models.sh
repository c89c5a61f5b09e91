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
# The DeepSeek-V3 family: V3-style (q-LoRA, sigmoid + correction bias, 4 groups keep 2,
# 1 shared expert, first layer dense, YaRN with mscale) and V2-style (q_proj, softmax
# greedy, 2 shared experts), sharded.
gen engine-ds --arch deepseek_v3 --seed 14 --dtype bf16 --vocab 1024 --hidden 96 --intermediate 160 \
    --layers 3 --heads 4 --q-lora-rank 48 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 \
    --v-head-dim 16 --first-k-dense 1 --experts 16 --top-k 4 --n-group 4 --topk-group 2 \
    --n-shared-experts 1 --moe-intermediate 32 --routed-scaling-factor 2.5 --max-pos 16384 \
    --rope-scaling yarn:factor=4,original_max_position_embeddings=4096,mscale=1.0,mscale_all_dim=1.0 \
    --max-shard-size 400000
gen engine-ds-v2 --arch deepseek_v2 --seed 15 --dtype bf16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 3 --heads 4 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 \
    --first-k-dense 1 --experts 8 --top-k 3 --n-shared-experts 2 --moe-intermediate 24 \
    --norm-topk-prob 0 --max-pos 4096
# Chat and the server on the family (test_cli.sh, test_server.sh): a DeepSeek-V3 with
# the real vocabulary, so its tokenizer's role markers (<｜User｜> = 128803) are in
# range; a Kimi K2 with a tiktoken.model (written from the Llama 3 vocabulary, Kimi's
# special names at the top of the 1024 ids); a Kimi K2.5-style wrapper (text_config,
# language_model. prefix, a vision tower that is never read).
gen engine-ds-chat --arch deepseek_v3 --seed 17 --dtype bf16 --vocab 129280 --hidden 32 --intermediate 64 \
    --layers 2 --heads 2 --q-lora-rank 16 --kv-lora-rank 16 --qk-nope-dim 8 --qk-rope-dim 8 --v-head-dim 8 \
    --first-k-dense 1 --experts 8 --top-k 2 --n-group 2 --topk-group 1 --n-shared-experts 1 \
    --moe-intermediate 16 --routed-scaling-factor 2.5 --max-pos 4096
gen engine-kimi --arch kimi_k2 --seed 18 --dtype bf16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 2 --heads 4 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 \
    --first-k-dense 1 --experts 8 --top-k 2 --n-shared-experts 1 --moe-intermediate 24 \
    --routed-scaling-factor 2.827 --max-pos 4096
gen engine-kimi-wrap --arch kimi_k2 --seed 19 --dtype bf16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 2 --heads 4 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 \
    --first-k-dense 1 --experts 8 --top-k 2 --n-shared-experts 1 --moe-intermediate 24 \
    --routed-scaling-factor 2.827 --max-pos 4096 --wrap-language-model
# Weights as shipped (issue 22), streamed in test_stream: a DeepSeek-V3 in FP8 (every
# Linear, 128x128 blocks, edge blocks smaller: hidden 160); a Kimi K2-Thinking (INT4
# routed experts); a mixed one (MXFP4 routed experts, INT4 attention and dense layers).
gen engine-fp8-ds --arch deepseek_v3 --seed 20 --dtype bf16 --vocab 1024 --hidden 160 --intermediate 160 \
    --layers 3 --heads 4 --q-lora-rank 48 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 \
    --v-head-dim 16 --first-k-dense 1 --experts 16 --top-k 4 --n-group 4 --topk-group 2 \
    --n-shared-experts 1 --moe-intermediate 48 --routed-scaling-factor 2.5 --max-pos 4096 --quant fp8 \
    --max-shard-size 400000
# DeepSeek-V3.1's FP8: every block scale a power of two (scale_fmt ue8m0), which the
# one-token products move onto the activations.
gen engine-fp8-ue8m0 --arch deepseek_v3 --seed 27 --dtype bf16 --vocab 1024 --hidden 160 --intermediate 160 \
    --layers 3 --heads 4 --q-lora-rank 48 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 \
    --v-head-dim 16 --first-k-dense 1 --experts 16 --top-k 4 --n-group 4 --topk-group 2 \
    --n-shared-experts 1 --moe-intermediate 48 --routed-scaling-factor 2.5 --max-pos 4096 --quant fp8 \
    --fp8-scale-fmt ue8m0
gen engine-int4-kimi --arch kimi_k2 --seed 21 --dtype bf16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 3 --heads 4 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 \
    --first-k-dense 1 --experts 16 --top-k 4 --n-shared-experts 1 --moe-intermediate 32 \
    --routed-scaling-factor 2.827 --max-pos 4096 --quant int4
gen engine-mixed-kimi --arch kimi_k2 --seed 22 --dtype bf16 --vocab 1024 --hidden 64 --intermediate 128 \
    --layers 3 --heads 4 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 \
    --first-k-dense 1 --experts 16 --top-k 4 --n-shared-experts 1 --moe-intermediate 32 \
    --routed-scaling-factor 2.827 --max-pos 4096 --quant-experts mxfp4 --quant-dense int4
# Kimi-Linear and Kimi K3 (KDA + NoPE MLA hybrid; tools/gen_kimi_linear.py), the same
# shapes as check_model.py's kimi set: a Kimi-Linear-48B-shaped model (softplus gate,
# low-rank output gate, A_log [1,1,Hk,1], q_proj, SiLU, 1 shared expert, scaling 2.446);
# a K3-shaped wrapper (lower-bound gate, g_proj, zero-padded A_log [dk], q-LoRA, MLA
# output gate, SiTU, 2 shared experts, latent MoE with norm, AttnRes blocks of 2 over
# 6 layers, MXFP4 routed experts, sharded); per-channel A_log [dk] with grouped top-k.
KL=(--vocab 1024 --heads 4 --kv-lora-rank 32 --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 --first-k-dense 1)
gen engine-kimi-linear --arch kimi_linear --seed 23 "${KL[@]}" --hidden 96 --intermediate 160 --layers 4 \
    --kda-layers 1,2,3 --kda-heads 4 --kda-head-dim 16 --a-log-shape head4d --experts 16 --top-k 4 \
    --n-shared-experts 1 --moe-intermediate 32 --routed-scaling-factor 2.446 --kda-v-gain 0.3 --max-pos 4096
gen engine-k3 --arch kimi_k3 --seed 24 "${KL[@]}" --hidden 64 --intermediate 128 --layers 6 --kda-layers 1,2,4,5 \
    --kda-heads 4 --kda-head-dim 16 --gate-lower-bound -5 --gate-rank full --a-log-shape padded --q-lora-rank 48 \
    --mla-output-gate --hidden-act situ --act-gain 3 --experts 16 --top-k 4 --n-shared-experts 2 \
    --moe-intermediate 32 --latent-moe 32 --latent-norm --attn-res-block 2 --quant mxfp4 --max-pos 4096 \
    --max-shard-size 400000
# Streamed in test_stream (two MoE layers): K3's shape with MXFP4 experts, 3 layers.
gen engine-k3-stream --arch kimi_k3 --seed 26 "${KL[@]}" --hidden 64 --intermediate 128 --layers 3 --kda-layers 1,3 \
    --kda-heads 4 --kda-head-dim 16 --gate-lower-bound -5 --gate-rank full --a-log-shape padded --q-lora-rank 48 \
    --mla-output-gate --hidden-act situ --act-gain 3 --experts 16 --top-k 4 --n-shared-experts 2 \
    --moe-intermediate 32 --latent-moe 32 --latent-norm --attn-res-block 2 --quant mxfp4 --max-pos 4096
gen engine-kda-chan --arch kimi_linear --seed 25 "${KL[@]}" --hidden 64 --intermediate 128 --layers 3 \
    --kda-layers 1,3 --kda-heads 2 --kda-head-dim 32 --a-log-shape channel --gate-lower-bound -5 --q-lora-rank 32 \
    --mla-output-gate --experts 16 --top-k 4 --grouped-topk --n-group 4 --topk-group 2 --norm-topk-prob 0 \
    --routed-scaling-factor 2.0 --n-shared-experts 0 --moe-intermediate 32 --latent-moe 32 --max-pos 4096
