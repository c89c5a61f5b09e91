# bench/sections/k3.sh - the suite's `k3` section (issue 23). Sourced by bench/suite.sh;
# it uses the suite's settings and helpers (the K3_* settings, B, ENG, TRACE, ARMS, LOG and say, drop,
# drop_for_ram, run_arm, prepare, pack, model_bytes, model_shape, measure_iobw, room_for, q); not a script of its own.
#
# Kimi K3's layer kinds scaled to this machine, shaped like the routing trace so
# that real routing replays: 27 layers, the first dense, then the trace's 26 MoE
# layers of 64 experts top-6; KDA (K3_KDA_HEADS x 128, lower-bound gate, full-rank
# output gate) with gated NoPE MLA at every 4th layer and the last, as K3
# schedules them; latent MoE (width hidden/2, SiTU, normed sum, 1 shared expert),
# attention residuals in depth blocks of 4 (K3: 12 of 93), MXFP4 routed experts
# whose width makes K3_BENCH_GIB of experts (3.5: width 1376, 2.2 MiB each);
# vocabulary 163,840. Per repetition, interleaved (the streamed arms reversed on
# even ones):
#   resident-prefill-{own,replay}  a K3_PREFILL-token prompt with every expert in
#            RAM, warm: the in-RAM compute of the prefill
#   prefill-{own,replay}[-prefetch]  the same prompt streamed from the pack at
#            K3_FRAC % of the expert bytes as cache, cold: time to first token
#            against one read of the experts it touched at the measured bandwidth
#            + the in-RAM prefill (goal: at most 1.3x)
#   decode-{own,replay}[-prefetch]  K3_PROMPT prompt, K3_NEW decoded (teacher
#            forced), streamed at K3_FRAC %, cold: tokens/s against the I/O bound
#            (the O_DIRECT bandwidth measured this repetition / expert bytes missed
#            per token), and the per-token split of the time
# own: the model's routers; replay: routing replayed from K3_TRACE. The caches are
# dropped before every streamed arm; the in-RAM arms run after a warm-up.
K3_TRACE=${K3_TRACE:-$TRACE}
if [ -z "$K3_TRACE" ] || [ ! -f "$K3_TRACE" ]; then
    K3_TRACE=tests/data/traces/intent-excerpt.trace
    say "note: no routing trace at \$TRACE: k3 replays the excerpt $K3_TRACE (263 tokens, wrapped)"
fi
# the trace's shape and the expert width that makes K3_BENCH_GIB of MXFP4 experts
# (3 matrices of width x latent, 4.25 bits per value: E2M1 + an E8M0 scale per 32)
read -r K3_NL K3_NE K3_I < <(/usr/bin/python3 - "$K3_TRACE" "$K3_BENCH_GIB" $((K3_HIDDEN / 2)) <<'PYEOF'
import re, sys
hdr = "".join(l for l in open(sys.argv[1]) if l.startswith("#"))
nl, ne = int(re.search(r"moe_layers:\s*(\d+)", hdr).group(1)), int(re.search(r"experts_per_layer:\s*(\d+)", hdr).group(1))
per_value = 3 * int(sys.argv[3]) * 17 / 32
i = round(float(sys.argv[2]) * 2**30 / (nl * ne * per_value) / 32) * 32
print(nl, ne, max(32, i))
PYEOF
)
K3_I=${K3_MOE_I:-$K3_I}
KM=$B/bench-models/k3-h$K3_HIDDEN-i$K3_I-v$K3_VOCAB
K3_GEN=(--arch kimi_k3 --seed 27 --dtype bf16 --vocab "$K3_VOCAB" --hidden "$K3_HIDDEN"
    --intermediate $((K3_HIDDEN * 4)) --match-trace "$K3_TRACE" --heads "$K3_KDA_HEADS" --q-lora-rank $((K3_HIDDEN / 4))
    --kv-lora-rank 512 --qk-nope-dim 128 --qk-rope-dim 64 --v-head-dim 128 --kda-heads "$K3_KDA_HEADS"
    --kda-head-dim 128 --gate-lower-bound -5 --gate-rank full --a-log-shape padded --mla-output-gate
    --hidden-act situ --n-shared-experts 1 --moe-intermediate "$K3_I" --latent-moe $((K3_HIDDEN / 2))
    --latent-norm --attn-res-block 4 --routed-scaling-factor 1.0 --norm-topk-prob 1 --quant mxfp4
    --max-pos 8192 --max-shard-size 4000000000 --fast-init)
# checkpoint + pack: the experts twice, the always-active weights in BF16 (embeddings
# and LM head, 27 layers of at most 7 x hidden^2 values, the shared experts)
K3_EXPERTS=$((K3_NL * K3_NE * 3 * (K3_HIDDEN / 2) * K3_I * 17 / 32))
K3_NEED=$((2 * K3_EXPERTS + 4 * K3_VOCAB * K3_HIDDEN + 27 * 14 * K3_HIDDEN * K3_HIDDEN + K3_NL * 6 * K3_HIDDEN * K3_I))
if [ -f "$KM/config.json" ] || { room_for "$KM" "$K3_NEED" "checkpoint + pack" &&
    say "generating $KM (experts about $((K3_EXPERTS >> 20)) MiB): tools/gen_checkpoint.py --out $KM ${K3_GEN[*]}" &&
    nice /usr/bin/python3 tools/gen_checkpoint.py --out "$KM" "${K3_GEN[@]}" >>"$LOG"; }; then
    pack "$KM"
    read -r EB DB < <(model_bytes "$KM")
    read -r NL NE NK < <(model_shape "$KM")
    say ""
    say "## k3: $KM, experts $((EB >> 20)) MiB (MXFP4), always-active $((DB >> 20)) MiB; cache $K3_FRAC %; replay from $K3_TRACE"
    "$ENG" inspect --model "$KM" | grep -E '^(layer schedule|KDA|attention |latent cache|experts|MoE layers|expert formats)' | tee -a "$LOG"
    # the recurrent state per sequence (fixed, whatever the context) and the latent
    # cache per token, from the config
    /usr/bin/python3 - "$KM/config.json" "$EB" "$NL" "$NE" >>"$ARMS" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))["text_config"]
la = c["linear_attn_config"]
hk, dk, kk = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
n_kda, n_mla = len(la["kda_layers"]), len(la["full_attn_layers"])
per_layer = 4 * hk * dk * dk + 4 * 3 * hk * dk * (kk - 1)   # F32 state S + q/k/v conv windows
print(json.dumps({"section": "k3", "event": "state", "kda_layers": n_kda, "mla_layers": n_mla,
                  "kda_state_bytes": n_kda * per_layer, "kda_state_bytes_per_layer": per_layer,
                  "latent_bytes_per_token": 4 * n_mla * (c["kv_lora_rank"] + c["qk_rope_head_dim"]),
                  "expert_bytes": int(sys.argv[2]) // (int(sys.argv[3]) * int(sys.argv[4]))}))
PYEOF
    say "KDA state per sequence: $(tail -1 "$ARMS" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print("%d B (%.2f MiB, %d KDA layers)" % (d["kda_state_bytes"], d["kda_state_bytes"] / 2**20, d["kda_layers"]))')"
    K3_STREAMED=(decode-own decode-replay decode-own-prefetch decode-replay-prefetch
        prefill-own prefill-replay prefill-own-prefetch prefill-replay-prefetch)
    for rep in $(seq "$K3_REPS"); do
        IOBW=$(measure_iobw "$KM"); say "rep $rep: O_DIRECT read bandwidth $IOBW GB/s"
        echo "{\"section\":\"k3\",\"event\":\"iobw\",\"rep\":$rep,\"gbs\":$IOBW}" >>"$ARMS"
        # in RAM, warm: the warm-up reads every weight into the page cache
        drop_for_ram
        "$ENG" run --model "$KM" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
        for r in own replay; do
            fl=(); [ "$r" = replay ] && fl=(--replay-routing "$K3_TRACE")
            run_arm k3 "resident-prefill-$r" "$KM" 100 "$EB" "$DB" 0 "$rep" "$K3_PREFILL" 2 "${fl[@]}"
        done
        ORDER=("${K3_STREAMED[@]}")
        if [ $((rep % 2)) = 0 ]; then mapfile -t ORDER < <(printf '%s\n' "${K3_STREAMED[@]}" | tac); fi
        for a in "${ORDER[@]}"; do
            fl=(--experts "$KM-pack" --prefetch off)
            [[ $a == *-prefetch ]] && fl=(--experts "$KM-pack" --prefetch on)
            [[ $a == *-replay* ]] && fl+=(--replay-routing "$K3_TRACE")
            if [[ $a == prefill-* ]]; then plen=$K3_PREFILL new=2; else plen=$K3_PROMPT new=$K3_NEW; fi
            run_arm k3 "$a" "$KM" "$K3_FRAC" "$EB" "$DB" "$IOBW" "$rep" "$plen" "$new" "${fl[@]}"
        done
    done
fi
