#!/usr/bin/env bash
# test_real_layout.sh ENGINE - full-size checkpoints of real models, as sparse
# files (every tensor a hole of zero bytes: nothing is computed), opened by
# `deltafin inspect`: the tensor names, shapes and config fields of
# DeepSeek-V2-Lite, DeepSeek-V3 (with its MTP layer), Kimi K2-Instruct and a
# Kimi K2.5-style wrapper (text_config, language_model. prefix, vision tower),
# their parameter counts against the published ones, and the softmax scales and
# latent cache sizes ../shared/notes/ARCHITECTURES.md works out by hand.
# Then as shipped: DeepSeek-V3 in FP8 (128x128 block scales) and Kimi K2-Thinking
# with INT4 routed experts, whose expert bytes are worked out by hand below.
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/df-layout.XXXXXX")
trap 'rm -rf "$T"' EXIT
. tests/lib.sh

COMMON=(--sparse --dtype bf16 --qk-nope-dim 128 --qk-rope-dim 64 --v-head-dim 128 --kv-lora-rank 512
        --max-shard-size 50000000000)
V3DIMS=(--hidden 7168 --layers 61 --q-lora-rank 1536 --intermediate 18432 --moe-intermediate 2048
        --n-shared-experts 1)
gen() { local name=$1; shift; $PY tools/gen_checkpoint.py --out "$T/$name" "${COMMON[@]}" "$@" >"$T/gen.log" 2>&1 ||
        bad "gen-$name" "$(tail -3 "$T/gen.log")"; }

gen v2-lite --arch deepseek_v2 --vocab 102400 --hidden 2048 --layers 27 --heads 16 --intermediate 10944 \
    --moe-intermediate 1408 --experts 64 --top-k 6 --n-shared-experts 2 --first-k-dense 1 --norm-topk-prob 0 \
    --max-pos 163840 --rope-scaling yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=0.707,mscale_all_dim=0.707
gen v3 --arch deepseek_v3 --vocab 129280 "${V3DIMS[@]}" --heads 128 --experts 256 --top-k 8 --n-group 8 \
    --topk-group 4 --first-k-dense 3 --routed-scaling-factor 2.5 --mtp-layers 1 --max-pos 163840 \
    --rope-scaling yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1.0,mscale_all_dim=1.0
gen k2 --arch kimi_k2 --vocab 163840 "${V3DIMS[@]}" --heads 64 --experts 384 --top-k 8 --first-k-dense 1 \
    --routed-scaling-factor 2.827 --max-pos 131072 --inv-freq-buffers \
    --rope-scaling yarn:factor=32,original_max_position_embeddings=4096,beta_fast=1,beta_slow=1,mscale=1.0,mscale_all_dim=1.0
gen k25 --arch kimi_k2 --vocab 163840 "${V3DIMS[@]}" --heads 64 --experts 384 --top-k 8 --first-k-dense 1 \
    --routed-scaling-factor 2.827 --max-pos 262144 --rms-eps 1e-5 --wrap-language-model \
    --rope-scaling yarn:factor=64,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1.0,mscale_all_dim=1.0

gen v3-fp8 --arch deepseek_v3 --vocab 129280 "${V3DIMS[@]}" --heads 128 --experts 256 --top-k 8 --n-group 8 \
    --topk-group 4 --first-k-dense 3 --routed-scaling-factor 2.5 --mtp-layers 1 --max-pos 163840 \
    --rope-scaling yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1.0,mscale_all_dim=1.0 \
    --quant fp8
gen k2-thinking --arch kimi_k2 --vocab 163840 "${V3DIMS[@]}" --heads 64 --experts 384 --top-k 8 --first-k-dense 1 \
    --routed-scaling-factor 2.827 --max-pos 262144 \
    --rope-scaling yarn:factor=64,original_max_position_embeddings=4096,beta_fast=1,beta_slow=1,mscale=1.0,mscale_all_dim=1.0 \
    --quant int4

# check NAME PATTERN... : inspect NAME's output has every pattern
check() {
    local name=$1; shift
    if ! "$ENG" inspect --model "$T/$name" >"$T/$name.out" 2>&1; then
        bad "inspect-$name" "$(tail -3 "$T/$name.out")"; return
    fi
    local p
    for p in "$@"; do
        grep -qE -- "$p" "$T/$name.out" || { bad "inspect-$name" "no /$p/ in: $(grep -v '^  ' "$T/$name.out")"; return; }
    done
    ok "inspect-$name"
}
# params NAME LO HI : the used parameters (always-active + routed, BF16) in [LO, HI] billions
params() {
    local got
    got=$(sed -n 's/^bytes: total .*always-active [^(]*(\([0-9]*\)).*routed experts [^(]*(\([0-9]*\)).*/\1 \2/p' \
          "$T/$1.out" | awk '{ printf "%.2f", ($1 + $2) / 2e9 }')
    awk -v g="$got" -v lo="$2" -v hi="$3" 'BEGIN { exit !(g != "" && g >= lo && g <= hi) }' &&
        ok "params-$1 ${got}B" || bad "params-$1" "${got}B outside [$2, $3]B"
}

# softmax scales and YaRN as worked out in the notes (section 2.4)
check v2-lite "softmax scale +0\.114721" "latent cache +576 values" "MLA, 16 heads, q_proj" \
    "64 routed, top-6, 2 shared" "softmax, greedy" "MoE layers +26 of 27"
params v2-lite 15.6 15.8        # DeepSeek-V2-Lite: 15.7B
check v3 "softmax scale +0\.135234" "MLA, 128 heads, q-LoRA 1536" "expanded K/V: 40960" \
    "sigmoid, noaux_tc, 8 groups keep 4" "MoE layers +58 of 61" "not used: [0-9]+ tensors"
params v3 670.5 671.5           # DeepSeek-V3: 671B, plus the 14B MTP layer (not used)
check k2 "softmax scale +0\.130861" "MLA, 64 heads" "384 routed, top-8, 1 shared" "not used: 61 tensors"
params k2 1025 1035             # Kimi K2: 1.03T (scale tensors of the FP8 release aside)
check k25 "softmax scale +0\.144680" "tensors under 'language_model\.'" "rms_norm_eps +1e-05" \
    "not used: [0-9]+ tensors"
params k25 1025 1035
# As shipped. DeepSeek-V3 FP8, one expert matrix [2048 x 7168]: 2048 * 7168 e4m3 bytes +
# 16 x 56 F32 block scales = 14,683,648 B; 3 per expert, 256 experts, 58 MoE layers.
check v3-fp8 "^weights +fp8 \(e4m3" "gate F8_E4M3/F32\[128x128\]" "routed experts .*\(654068416512\)" \
    "always-active dtypes .*F8_E4M3" "not used: [0-9]+ tensors"
# Kimi K2-Thinking INT4 experts: 2048 * 7168 / 2 packed bytes + 2048 x 224 BF16 scales =
# 8,257,536 B per matrix (weight_shape aside); 3 per expert, 384 experts, 60 MoE layers.
check k2-thinking "pack-quantized: int4" "gate I4/BF16\[1x32\]" "routed experts .*\(570760888320\)" \
    "always-active dtypes +F32 [^ ]+ [^ ]+ BF16"
finish
