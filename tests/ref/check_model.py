#!/usr/bin/python3
"""check_model - end-to-end check of the deltafin engine against the numpy reference.

Owns: the model-level correctness test `make test` runs. For one checkpoint:
  1. logits: a seeded random 64-token sequence inside the model's vocab goes
     through the reference (float64) and through
       ENGINE logits --model DIR --tokens a,b,... --out FILE [--threads N]
     (float32 little-endian [T*V]). Pass: max|eng-ref| / max|ref| <= --tol, all
     finite, and the same argmax on every row except near-ties (see below).
  2. greedy: the first 16 tokens as prompt,
       ENGINE run --model DIR --prompt-tokens a,b,... --max-new 32 --temp 0 --print-ids
     must print the reference's greedy ids (recomputed from scratch each step).

Tolerance: the engine computes in float32 with float32 accumulation. Running the
reference itself in float32 lands ~1e-7..1e-6 (relative to max|logit|) from the
float64 result on the suite's models, and the engine measured 2e-7..6e-7 when this
was written; --tol 2e-5 leaves a 20x-100x margin for summation order and
vectorised exp/sqrt, while real mistakes (rotary layout, a norm weight, GQA head
order, routing normalisation, YaRN attention factor) move logits by 1e-2 or more
(test_ref_selftest.py measures those).

Near-ties: if every logit is within d of the reference, the argmax can only differ
where the reference's top two are within 2d. An argmax mismatch on a row whose
reference gap is below 2*tol*max|ref| is reported as a near-tie, not a failure.
For greedy decoding, a step whose reference top-2 gap is below
max(1e-5, 4 * observed max|diff|) is a tie: a difference at or after the first
tie is reported and not counted (the sequences legitimately diverge there).

    check_model.py --model DIR --engine build/deltafin-san [--threads N]
    check_model.py --suite [--dir build/test-models] --engine build/deltafin-san
        [--threads N] [--batch N] [--determinism] [--jobs N] [--only a,b] [--set deepseek|formats|kimi|all]
The reference is qwen3_ref, deepseek_ref or kimi_linear_ref, by the checkpoint's model_type;
quantized weights are decoded by quant_np as the checkpoint's quantization_config
says. ENGINE "/usr/bin/python3 tests/ref/ref_engine.py" is the float32 reference
posing as the engine (any family).
Prints "PASS name ..." / "FAIL name ..." per model; --suite ends with
"N passed, N failed". Exit status 0 iff everything passed.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))
import deepseek_ref  # noqa: E402
import kimi_linear_ref  # noqa: E402
import qwen3_ref  # noqa: E402

SEQ_LEN = 64
PROMPT_LEN = 16
GREEDY_STEPS = 32
DEFAULT_TOL = 2e-5
# Kimi-Linear / K3: the float32 reference drifts 1e-6..1e-5 from float64 on the kimi set
# (AttnRes softmax mixing, o_norm and the latent norm renormalising vectors that came
# out of cancellations), against 1e-7..1e-6 for the other families; 5e-5 keeps a 5x+
# margin while the bugs test_kimi_linear_ref.py plants move logits by 1e-3 or more.
KIMI_TOL = 5e-5
ENGINE_TIMEOUT = 300

# name -> gen_checkpoint arguments. Tiny on purpose: the whole suite must run in
# well under a minute with the ASan engine. Shapes vary between models so that a
# mix-up of hidden size, head_dim and head counts cannot go unnoticed: q_proj is
# non-square (n_heads*head_dim != hidden) in most of them, as in real Qwen3.
SUITE = {
    "dense-bf16": ["--arch", "qwen3", "--seed", "11", "--dtype", "bf16", "--vocab", "1024",
                   "--hidden", "64", "--intermediate", "160", "--layers", "3", "--heads", "4",
                   "--kv-heads", "2", "--head-dim", "32"],
    "moe-bf16": ["--arch", "qwen3_moe", "--seed", "12", "--dtype", "bf16", "--vocab", "1280",
                 "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
                 "--kv-heads", "2", "--head-dim", "16", "--experts", "8", "--top-k", "2",
                 "--moe-intermediate", "32", "--norm-topk-prob", "1"],
    # decoder_sparse_step=2 makes layers 1,3,5 candidates; mlp_only_layers drops 3,
    # so layers 1 and 5 are MoE and 0,2,3,4 dense. norm_topk_prob off, top-4.
    "moe-sparse": ["--arch", "qwen3_moe", "--seed", "13", "--dtype", "bf16", "--vocab", "1024",
                   "--hidden", "64", "--intermediate", "96", "--layers", "6", "--heads", "4",
                   "--kv-heads", "1", "--head-dim", "16", "--experts", "8", "--top-k", "4",
                   "--moe-intermediate", "24", "--decoder-sparse-step", "2",
                   "--mlp-only-layers", "3", "--norm-topk-prob", "0"],
    "dense-tied": ["--arch", "qwen3", "--seed", "14", "--dtype", "bf16", "--vocab", "2048",
                   "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
                   "--kv-heads", "4", "--head-dim", "16", "--tie-embeddings", "1",
                   "--rms-eps", "1e-5"],
    "dense-f16": ["--arch", "qwen3", "--seed", "15", "--dtype", "f16", "--vocab", "1024",
                  "--hidden", "96", "--intermediate", "192", "--layers", "2", "--heads", "6",
                  "--kv-heads", "2", "--head-dim", "32"],
    "moe-f32": ["--arch", "qwen3_moe", "--seed", "16", "--dtype", "f32", "--vocab", "1536",
                "--hidden", "128", "--intermediate", "256", "--layers", "2", "--heads", "4",
                "--kv-heads", "2", "--head-dim", "32", "--experts", "8", "--top-k", "4",
                "--moe-intermediate", "48", "--norm-topk-prob", "1"],
    "moe-sharded": ["--arch", "qwen3_moe", "--seed", "17", "--dtype", "bf16", "--vocab", "1024",
                    "--hidden", "64", "--intermediate", "128", "--layers", "3", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "16", "--experts", "8", "--top-k", "2",
                    "--moe-intermediate", "32", "--max-shard-size", "60000"],
    # YaRN with max_position_embeddings = factor * original, so transformers
    # releases before and after the factor-override fix agree. theta 1e4 and
    # head_dim 32 put the ramp at dims 4..11 of 16: both regimes are exercised.
    "yarn": ["--arch", "qwen3", "--seed", "18", "--dtype", "bf16", "--vocab", "1024",
             "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--head-dim", "32", "--rope-theta", "10000", "--max-pos", "8192",
             "--rope-scaling", "yarn:factor=4,original_max_position_embeddings=2048"],
    # The optional YaRN keys: betas, no truncation, mscale / mscale_all_dim, and the
    # legacy "type" key instead of "rope_type".
    "yarn-opts": ["--arch", "qwen3_moe", "--seed", "19", "--dtype", "bf16", "--vocab", "1024",
                  "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
                  "--kv-heads", "2", "--head-dim", "32", "--experts", "8", "--top-k", "2",
                  "--moe-intermediate", "32", "--rope-theta", "10000", "--max-pos", "4096",
                  "--rope-scaling", "yarn:factor=8,original_max_position_embeddings=512,"
                  "beta_fast=16,beta_slow=2,truncate=false,mscale=1.0,mscale_all_dim=0.8",
                  "--rope-legacy-key"],
    "linear": ["--arch", "qwen3", "--seed", "20", "--dtype", "bf16", "--vocab", "1024",
               "--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4",
               "--kv-heads", "2", "--head-dim", "32", "--rope-theta", "10000",
               "--rope-scaling", "linear:factor=2"],
}


# The DeepSeek-V3 family (issue 21): not in `--suite` until the engine runs it;
# `--suite --set deepseek` checks these. Shapes scaled down from the shipped models
# with their field values kept where they matter (YaRN, router, scaling).
_DS = ["--dtype", "bf16", "--vocab", "1024", "--hidden", "64", "--intermediate", "128",
       "--kv-lora-rank", "32", "--qk-nope-dim", "16", "--qk-rope-dim", "8", "--v-head-dim", "16",
       "--moe-intermediate", "24"]
_YARN40 = "yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,"
DEEPSEEK_SUITE = {
    # V2-Lite-style: no q-LoRA, softmax greedy, 2 shared experts, YaRN mscale 0.707.
    "ds-v2": ["--arch", "deepseek_v2", "--seed", "31"] + _DS + [
        "--layers", "3", "--heads", "4", "--first-k-dense", "1", "--experts", "16", "--top-k", "4",
        "--n-shared-experts", "2", "--norm-topk-prob", "0", "--max-pos", "163840",
        "--rope-scaling", _YARN40 + "mscale=0.707,mscale_all_dim=0.707"],
    # V3-style: q-LoRA, sigmoid + correction bias, 8 groups keep 4, 1 shared, 3 dense
    # layers, scaling 2.5, YaRN, one MTP layer.
    "ds-v3": ["--arch", "deepseek_v3", "--seed", "32"] + _DS + [
        "--layers", "5", "--heads", "8", "--q-lora-rank", "48", "--first-k-dense", "3",
        "--experts", "32", "--top-k", "4", "--n-group", "8", "--topk-group", "4",
        "--n-shared-experts", "1", "--routed-scaling-factor", "2.5", "--mtp-layers", "1",
        "--max-pos", "163840", "--rope-scaling", _YARN40 + "mscale=1.0,mscale_all_dim=1.0"],
    # K2-style: half V3's heads, no groups, scaling 2.827, theta 5e4, YaRN beta_fast 1,
    # rms_norm_eps 1e-5 with a small q_a_proj so the latent norms' fixed 1e-6 matters,
    # rotary_emb.inv_freq buffers to skip.
    "kimi-k2": ["--arch", "kimi_k2", "--seed", "33"] + _DS + [
        "--layers", "3", "--heads", "4", "--q-lora-rank", "48", "--first-k-dense", "1",
        "--experts", "24", "--top-k", "4", "--routed-scaling-factor", "2.827", "--rms-eps", "1e-5",
        "--q-a-gain", "0.05", "--inv-freq-buffers", "--max-pos", "131072", "--rope-scaling",
        "yarn:factor=32,original_max_position_embeddings=4096,beta_fast=1,beta_slow=1,"
        "mscale=1.0,mscale_all_dim=1.0"],
    # DeepSeek-V2 (236B)-style router: softmax, group-limited greedy (4 groups keep 2),
    # no renormalisation, scaling 16; no rope scaling.
    "ds-group-softmax": ["--arch", "deepseek_v2", "--seed", "34"] + _DS + [
        "--layers", "3", "--heads", "4", "--q-lora-rank", "48", "--first-k-dense", "1",
        "--experts", "16", "--top-k", "4", "--topk-method", "group_limited_greedy",
        "--n-group", "4", "--topk-group", "2", "--norm-topk-prob", "0",
        "--routed-scaling-factor", "16"],
    # Router near-tie: experts 2 and 5 share gate rows, their selection values differ
    # by 4*2^-24 through the correction bias.
    "ds-near-tie": ["--arch", "deepseek_v3", "--seed", "35"] + _DS + [
        "--layers", "3", "--heads", "4", "--first-k-dense", "1", "--experts", "8", "--top-k", "2",
        "--routed-scaling-factor", "2.5", "--router-near-tie", "2,5,4"],
    # Kimi K2.5-style wrapper: text_config, language_model. prefix, vision tensors,
    # YaRN factor 64 with beta_fast 32, rms_norm_eps 1e-5, sharded.
    "kimi-k25-wrapper": ["--arch", "kimi_k2", "--seed", "36"] + _DS + [
        "--layers", "3", "--heads", "4", "--q-lora-rank", "48", "--first-k-dense", "1",
        "--experts", "24", "--top-k", "4", "--routed-scaling-factor", "2.827", "--rms-eps", "1e-5",
        "--wrap-language-model", "--max-shard-size", "300000", "--max-pos", "262144",
        "--rope-scaling", "yarn:factor=64,original_max_position_embeddings=4096,beta_fast=32,"
        "beta_slow=1,mscale=1.0,mscale_all_dim=1.0"],
}

# Weights as shipped in 8- and 4-bit formats (issue 22): `--suite --set formats` (run_all.sh
# runs it). Exact generator commands:
# `gen_checkpoint.py ARGS --out DIR`. Formats and configs: tools/gen_quant.py.
_KIMI = ["--dtype", "bf16", "--vocab", "1024", "--hidden", "64", "--intermediate", "128",
         "--layers", "3", "--heads", "4", "--q-lora-rank", "64", "--kv-lora-rank", "32",
         "--qk-nope-dim", "16", "--qk-rope-dim", "8", "--v-head-dim", "16", "--first-k-dense", "1",
         "--routed-scaling-factor", "2.827", "--rms-eps", "1e-5"]
_YARN64 = "yarn:factor=64,original_max_position_embeddings=4096,beta_slow=1,mscale=1.0,mscale_all_dim=1.0,"
FORMATS_SUITE = {
    # DeepSeek-V3 as shipped: every Linear FP8 with 128x128 block scales; router,
    # embeddings, head and norms BF16, correction bias F32; an MTP layer (FP8, skipped).
    # Sizes are not multiples of 128, so edge blocks are smaller: hidden 160 = 128+32,
    # dense 288, q-LoRA 144, q_b rows 192, kv_a rows 40, experts 24; o_proj's 128 input
    # columns and kv_b's 256 rows are whole blocks.
    "fp8-ds-v3": ["--arch", "deepseek_v3", "--seed", "41", "--dtype", "bf16", "--vocab", "1024",
                  "--hidden", "160", "--intermediate", "288", "--layers", "4", "--heads", "8",
                  "--q-lora-rank", "144", "--kv-lora-rank", "32", "--qk-nope-dim", "16",
                  "--qk-rope-dim", "8", "--v-head-dim", "16", "--first-k-dense", "1",
                  "--experts", "32", "--top-k", "4", "--n-group", "8", "--topk-group", "4",
                  "--n-shared-experts", "1", "--moe-intermediate", "24", "--routed-scaling-factor", "2.5",
                  "--mtp-layers", "1", "--max-pos", "163840",
                  "--rope-scaling", _YARN40 + "mscale=1.0,mscale_all_dim=1.0", "--quant", "fp8"],
    # Qwen3-MoE FP8 release style: q/k/v/o, experts and the dense layer FP8; the
    # routers (nn.Linear in Qwen3-MoE) listed in modules_to_not_convert with lm_head
    # and the norms; no fmt key. Edge blocks: hidden 160, q rows 192, k/v rows 96.
    "fp8-qwen3-moe": ["--arch", "qwen3_moe", "--seed", "42", "--dtype", "bf16", "--vocab", "1280",
                      "--hidden", "160", "--intermediate", "288", "--layers", "3", "--heads", "4",
                      "--kv-heads", "2", "--head-dim", "48", "--experts", "8", "--top-k", "2",
                      "--moe-intermediate", "40", "--mlp-only-layers", "1", "--norm-topk-prob", "1",
                      "--quant", "fp8"],
    # DeepSeek-V3.1 style: scale_fmt ue8m0, every block scale a power of two.
    "fp8-v31-ue8m0": ["--arch", "deepseek_v3", "--seed", "43", "--dtype", "bf16", "--vocab", "1024",
                      "--hidden", "192", "--intermediate", "320", "--layers", "3", "--heads", "4",
                      "--q-lora-rank", "96", "--kv-lora-rank", "32", "--qk-nope-dim", "16",
                      "--qk-rope-dim", "8", "--v-head-dim", "16", "--first-k-dense", "1",
                      "--experts", "16", "--top-k", "4", "--n-group", "4", "--topk-group", "2",
                      "--moe-intermediate", "48", "--routed-scaling-factor", "2.5",
                      "--quant", "fp8", "--fp8-scale-fmt", "ue8m0"],
    # Kimi K2-Thinking style: routed experts INT4 (pack-quantized, groups of 32), all
    # else BF16; top-level quantization_config with the shipped ignore list.
    "int4-k2-thinking": ["--arch", "kimi_k2", "--seed", "44"] + _KIMI + [
        "--experts", "16", "--top-k", "4", "--moe-intermediate", "32", "--max-pos", "262144",
        "--rope-scaling", _YARN64 + "beta_fast=1", "--quant", "int4"],
    # Kimi K2.5 style: the same inside the multimodal wrapper (text_config.quantization_config,
    # language_model. prefix, vision tensors BF16), sharded so companions may straddle files.
    "int4-k25-wrapper": ["--arch", "kimi_k2", "--seed", "45"] + _KIMI + [
        "--experts", "24", "--top-k", "4", "--moe-intermediate", "64", "--wrap-language-model",
        "--max-shard-size", "300000", "--max-pos", "262144",
        "--rope-scaling", _YARN64 + "beta_fast=32", "--quant", "int4"],
    # Routed experts MXFP4 (e2m1 + E8M0 scales per 32; Kimi K3's format and config
    # fields) in a K2-architecture wrapper.
    "mxfp4-k2": ["--arch", "kimi_k2", "--seed", "46"] + _KIMI + [
        "--experts", "16", "--top-k", "4", "--moe-intermediate", "64", "--wrap-language-model",
        "--max-pos", "131072", "--rope-scaling",
        "yarn:factor=32,original_max_position_embeddings=4096,beta_fast=1,beta_slow=1,"
        "mscale=1.0,mscale_all_dim=1.0", "--quant", "mxfp4"],
    # Mixed: routed experts INT4, every other decoder Linear (MLA projections, dense
    # layer, shared expert) MXFP4: compressed-tensors mixed-precision, one group each.
    "mixed-int4-mxfp4": ["--arch", "kimi_k2", "--seed", "47"] + _KIMI + [
        "--experts", "16", "--top-k", "4", "--moe-intermediate", "32",
        "--quant-experts", "int4", "--quant-dense", "mxfp4"],
}
# Kimi-Linear and Kimi K3 (KDA + NoPE MLA hybrid): `--suite --set kimi`; not in
# `make test` until the engine runs the family. Generator: tools/gen_kimi_linear.py;
# reference: kimi_linear_ref.py.
_KL = ["--vocab", "1024", "--heads", "4", "--kv-lora-rank", "32", "--qk-nope-dim", "16",
       "--qk-rope-dim", "8", "--v-head-dim", "16", "--first-k-dense", "1"]
_K3 = ["--arch", "kimi_k3"] + _KL + [
    "--hidden", "64", "--intermediate", "128", "--layers", "6", "--kda-layers", "1,2,4,5",
    "--kda-heads", "4", "--kda-head-dim", "16", "--gate-lower-bound", "-5", "--gate-rank", "full",
    "--a-log-shape", "padded", "--q-lora-rank", "48", "--mla-output-gate", "--hidden-act", "situ",
    "--act-gain", "3", "--experts", "16", "--top-k", "4", "--n-shared-experts", "2",
    "--moe-intermediate", "32", "--latent-moe", "32", "--latent-norm", "--attn-res-block", "2"]
KIMI_SUITE = {
    # Kimi-Linear-48B-shaped: softplus gate, low-rank g_a/g_b output gate, A_log
    # [1,1,Hk,1], q_proj, no MLA output gate, SiLU, 1 shared expert, scaling 2.446,
    # first layer dense, plain residuals; MLA on layer 4 of 4 (1-based).
    "kimi-linear": ["--arch", "kimi_linear", "--seed", "52"] + _KL + [
        "--hidden", "96", "--intermediate", "160", "--layers", "4", "--kda-layers", "1,2,3",
        "--kda-heads", "4", "--kda-head-dim", "16", "--a-log-shape", "head4d",
        "--experts", "16", "--top-k", "4", "--n-shared-experts", "1", "--moe-intermediate", "32",
        "--routed-scaling-factor", "2.446", "--kda-v-gain", "0.3"],
    # Kimi K3-shaped: wrapper (text_config, language_model. prefix, vision tensors),
    # lower-bound gate -5, full-rank g_proj, zero-padded A_log [dk], q-LoRA, MLA output
    # gate, SiTU 4/25 (pre-activations in the tanh range), 2 shared experts, latent MoE
    # with norm, AttnRes blocks of 2 over 6 layers (anchors: embedding, layers 2, 4),
    # MXFP4 routed experts; sharded.
    "k3": _K3 + ["--seed", "54", "--quant", "mxfp4", "--max-shard-size", "400000"],
    # The same model with BF16 experts (separates MXFP4 from the rest).
    "k3-bf16": _K3 + ["--seed", "54"],
    # A_log per key channel ([dk], non-zero tail) with the lower-bound gate and the
    # low-rank output gate; q-LoRA with the MLA output gate; grouped top-k (4 groups
    # keep 2), no renormalisation, scaling 2, latent MoE without norm, no shared expert.
    "kda-chan": ["--arch", "kimi_linear", "--seed", "55"] + _KL + [
        "--hidden", "64", "--intermediate", "128", "--layers", "3", "--kda-layers", "1,3",
        "--kda-heads", "2", "--kda-head-dim", "32", "--a-log-shape", "channel", "--gate-lower-bound", "-5",
        "--q-lora-rank", "32", "--mla-output-gate", "--experts", "16", "--top-k", "4",
        "--grouped-topk", "--n-group", "4", "--topk-group", "2", "--norm-topk-prob", "0",
        "--routed-scaling-factor", "2.0", "--n-shared-experts", "0", "--moe-intermediate", "32",
        "--latent-moe", "32"],
}
SUITES = {"qwen3": SUITE, "deepseek": DEEPSEEK_SUITE, "formats": FORMATS_SUITE, "kimi": KIMI_SUITE,
          "all": {**SUITE, **DEEPSEEK_SUITE}}


def load_ref(model_dir, dtype=np.float64):
    """The reference for the checkpoint's model_type."""
    if kimi_linear_ref.is_family(model_dir):
        return kimi_linear_ref.KimiLinearRef(model_dir, dtype)
    if deepseek_ref.is_family(model_dir):
        return deepseek_ref.DeepseekRef(model_dir, dtype)
    return qwen3_ref.Qwen3Ref(model_dir, dtype)


def compare_logits(ref, eng, tol):
    """(ok, summary, details dict). ref, eng: [T, V]."""
    d = {}
    if eng.shape != ref.shape:
        return False, f"shape {eng.shape} != {ref.shape}", d
    if not np.all(np.isfinite(eng)):
        bad = np.argwhere(~np.isfinite(eng))[0]
        return False, f"non-finite logit at row {bad[0]} col {bad[1]}", d
    diff = np.abs(eng.astype(np.float64) - ref)
    scale = float(np.max(np.abs(ref)))
    maxdiff = float(diff.max())
    rel = maxdiff / scale if scale > 0 else maxdiff
    d.update(maxdiff=maxdiff, scale=scale, rel=rel)
    where = np.unravel_index(int(diff.argmax()), diff.shape)
    ref_arg = ref.argmax(axis=1)
    eng_arg = eng.argmax(axis=1)
    ties, bad_rows = [], []
    allowed_gap = 2 * tol * scale
    for t in np.nonzero(ref_arg != eng_arg)[0]:
        gap = float(ref[t, ref_arg[t]] - ref[t, eng_arg[t]])
        (ties if gap <= allowed_gap else bad_rows).append((int(t), gap))
    T = ref.shape[0]
    d.update(argmax_ok=T - len(ties) - len(bad_rows), near_ties=ties)
    summ = f"rel={rel:.2e} maxdiff={maxdiff:.2e} (row {where[0]} col {where[1]}) " \
           f"argmax={T - len(ties) - len(bad_rows)}/{T}"
    if ties:
        summ += f" near-ties={len(ties)}"
    if rel > tol:
        return False, summ + f" > tol {tol:g}", d
    if bad_rows:
        t, gap = bad_rows[0]
        return False, summ + f"; argmax differs at row {t} (ref gap {gap:.3g})", d
    return True, summ, d


def compare_greedy(ref_ids, gaps, eng_ids, margin):
    """(ok, summary). A mismatch at or after the first step whose reference top-2
    gap is below margin is not a failure."""
    first_tie = next((i for i, g in enumerate(gaps) if g < margin), None)
    n = len(ref_ids)
    for i in range(max(n, len(eng_ids))):
        r = ref_ids[i] if i < n else None
        e = eng_ids[i] if i < len(eng_ids) else None
        if r != e:
            if first_tie is not None and i >= first_tie:
                return True, f"greedy={i}/{n} (tie at step {first_tie}, gap " \
                             f"{gaps[first_tie]:.2e}; unchecked after)"
            return False, f"greedy differs at step {i}: engine {e} ref {r} " \
                          f"(ref gap {gaps[i] if i < n else float('nan'):.3g}); " \
                          f"engine {eng_ids[:i + 3]} ref {ref_ids[:i + 3]}"
    return True, f"greedy={n}/{n}"


def show(cmd):
    """The command for messages, long id lists abbreviated."""
    return shlex.join(a if len(a) < 60 else f"<{a.count(',') + 1} ids>" for a in cmd)


def run_engine(cmd, timeout):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s: {show(cmd)}", 0.0
    except OSError as e:
        return None, f"cannot run {cmd[0]}: {e}", 0.0
    dt = time.time() - t0
    if p.returncode != 0:
        tail = (p.stderr.decode(errors="replace").strip().splitlines() or ["(no stderr)"])[-3:]
        return None, f"exit {p.returncode}: {show(cmd)}: " + " | ".join(tail), dt
    return p, None, dt


def parse_id_line(stdout):
    """The last stdout line that is all integers (other output is ignored)."""
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        parts = line.replace(",", " ").split()
        if parts and all(x.lstrip("-").isdigit() for x in parts):
            return [int(x) for x in parts]
    return None


def check_model(model_dir, engine, name=None, threads=None, seed=1234, tol=None,
                seq_len=SEQ_LEN, prompt_len=PROMPT_LEN, steps=GREEDY_STEPS, verbose=False,
                determinism=False, batch=0):
    """Returns (ok, line). tol None: the family's (DEFAULT_TOL, KIMI_TOL)."""
    name = name or os.path.basename(os.path.normpath(model_dir))
    eng = shlex.split(engine)
    extra = ["--threads", str(threads)] if threads else []
    try:
        ref = load_ref(model_dir)
        if tol is None:
            tol = KIMI_TOL if isinstance(ref, kimi_linear_ref.KimiLinearRef) else DEFAULT_TOL
        V = ref.cfg.vocab
        rng = np.random.default_rng(seed)
        toks = [int(x) for x in rng.integers(0, V, size=seq_len)]
        ref_l = ref.logits(toks)
    except Exception as e:  # a broken test model is a failure to report, not a crash
        return False, f"FAIL {name} reference cannot run the model: {e}"

    with tempfile.TemporaryDirectory(prefix="df-check-") as tmp:
        out = os.path.join(tmp, "logits.f32")
        cmd = eng + ["logits", "--model", model_dir, "--tokens", ",".join(map(str, toks)),
                     "--out", out] + extra + (["--batch", str(batch)] if batch else [])
        p, err, t_logits = run_engine(cmd, ENGINE_TIMEOUT)
        if err:
            return False, f"FAIL {name} logits: {err}"
        if not os.path.exists(out):
            return False, f"FAIL {name} logits: engine wrote no {out}"
        raw = np.fromfile(out, dtype="<f4")
    if raw.size != seq_len * V:
        return False, f"FAIL {name} logits: {raw.size} floats, expected {seq_len}*{V}"
    ok, summ, det = compare_logits(ref_l, raw.reshape(seq_len, V), tol)
    if not ok:
        if ref.min_route_gap < 1e-5:
            summ += f" (note: a routing near-tie, prob gap {ref.min_route_gap:.1e}, may explain it)"
        return False, f"FAIL {name} {summ}"

    prompt = toks[:prompt_len]
    ref_ids, gaps = ref.greedy(prompt, steps)
    ref.close()
    if determinism and threads != 1:
        # The kernels promise the same sums whatever the thread count: demand
        # bit-identical logits from a single-threaded run.
        with tempfile.TemporaryDirectory(prefix="df-check-") as tmp:
            out1 = os.path.join(tmp, "logits1.f32")
            cmd = eng + ["logits", "--model", model_dir, "--tokens", ",".join(map(str, toks)),
                         "--out", out1, "--threads", "1"] + (["--batch", str(batch)] if batch else [])
            p, err, _ = run_engine(cmd, ENGINE_TIMEOUT)
            if err:
                return False, f"FAIL {name} logits --threads 1: {err}"
            one = np.fromfile(out1, dtype="<f4")
        if one.size != raw.size or not np.array_equal(one.view(np.uint32), raw.view(np.uint32)):
            return False, f"FAIL {name} logits with --threads 1 differ bitwise from --threads {threads or 'default'}"
        summ += " threads-bitwise=ok"
    cmd = eng + ["run", "--model", model_dir, "--prompt-tokens", ",".join(map(str, prompt)),
                 "--max-new", str(steps), "--temp", "0", "--print-ids"] + extra
    p, err, t_run = run_engine(cmd, ENGINE_TIMEOUT)
    if err:
        return False, f"FAIL {name} run: {err}"
    eng_ids = parse_id_line(p.stdout)
    if eng_ids is None:
        tail = p.stdout.decode(errors="replace").strip().splitlines()[-1:] or ["(empty)"]
        return False, f"FAIL {name} run: no line of ids on stdout (last line: {tail[0][:120]!r})"
    margin = max(1e-5, 4 * det["maxdiff"])
    gok, gsum = compare_greedy(ref_ids, gaps, eng_ids, margin)
    if not gok and ref.min_route_gap < 1e-5:
        gsum += f" (note: a routing near-tie, prob gap {ref.min_route_gap:.1e}, may explain it)"
    line = f"{summ} {gsum}"
    if verbose:
        line += f" [engine {t_logits:.1f}s+{t_run:.1f}s]"
    return gok, f"{'PASS' if gok else 'FAIL'} {name} {line}"


def ensure_model(dirpath, args):
    """Generates the model unless dirpath already holds one made from the same
    arguments by the same generator code."""
    import zlib
    import gen_checkpoint
    src = b""
    for f in (gen_checkpoint.__file__, os.path.join(REPO, "tools", "gen_deepseek.py"),
              os.path.join(REPO, "tools", "gen_kimi_linear.py"),
              os.path.join(REPO, "tools", "gen_quant.py"), os.path.join(HERE, "safetensors_np.py")):
        with open(f, "rb") as fh:
            src += fh.read()
    want = {"args": args, "generator_crc32": zlib.crc32(src)}
    stamp = os.path.join(dirpath, ".gen-args.json")
    if os.path.exists(stamp) and os.path.exists(os.path.join(dirpath, "config.json")):
        with open(stamp) as f:
            try:
                if json.load(f) == want:
                    return
            except json.JSONDecodeError:
                pass
    if os.path.exists(stamp):
        os.remove(stamp)
    gen_checkpoint.generate(gen_checkpoint.parse_args(args + ["--out", dirpath]))
    with open(stamp, "w") as f:
        json.dump(want, f)


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare deltafin against the numpy reference")
    ap.add_argument("--engine", required=True,
                    help="engine binary (may include leading arguments, shell-quoted)")
    ap.add_argument("--model", help="checkpoint directory to check")
    ap.add_argument("--name", help="name printed for --model")
    ap.add_argument("--suite", action="store_true", help="generate and check the standard models")
    ap.add_argument("--dir", default=os.path.join(REPO, "build", "test-models"),
                    help="--suite: where the models live")
    ap.add_argument("--only", default="", help="--suite: comma list of model names")
    ap.add_argument("--set", default="qwen3", choices=sorted(SUITES),
                    help="--suite: which models (deepseek: the DeepSeek-V3 family; formats: FP8, "
                         "INT4 and MXFP4 weights; kimi: Kimi-Linear and Kimi K3)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234, help="token sequence seed")
    ap.add_argument("--tol", type=float, default=None,
                    help=f"default {DEFAULT_TOL:g} ({KIMI_TOL:g} for Kimi-Linear / K3)")
    ap.add_argument("--determinism", action="store_true",
                    help="also require bit-identical logits from a --threads 1 run")
    ap.add_argument("--batch", type=int, default=0,
                    help="pass --batch N to `logits` (prefill in chunks of N; 1 = token by token "
                         "through the KV cache)")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="--suite: models checked in parallel")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if bool(a.model) == bool(a.suite):
        ap.error("give exactly one of --model and --suite")

    if a.model:
        ok, line = check_model(a.model, a.engine, a.name, a.threads, a.seed, a.tol,
                               verbose=a.verbose, determinism=a.determinism, batch=a.batch)
        print(line, flush=True)
        return 0 if ok else 1

    suite = SUITES[a.set]
    names = [n for n in a.only.split(",") if n] or list(suite)
    unknown = [n for n in names if n not in suite]
    if unknown:
        ap.error(f"unknown suite model(s): {', '.join(unknown)}; known: {', '.join(suite)}")
    # Models are independent: check them concurrently (the engine's start-up, not
    # the tiny forward passes, dominates), printing in suite order.
    from concurrent.futures import ThreadPoolExecutor
    passed = failed = 0
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        futs = []
        for n in names:
            d = os.path.join(a.dir, n)
            try:
                ensure_model(d, suite[n])
            except (Exception, SystemExit) as e:
                futs.append((n, None, f"FAIL {n} cannot generate the model: {e}"))
                continue
            futs.append((n, ex.submit(check_model, d, a.engine, n, a.threads, a.seed, a.tol,
                                      verbose=a.verbose, determinism=a.determinism,
                                      batch=a.batch), None))
        for n, fut, msg in futs:
            ok, line = (False, msg) if fut is None else fut.result()
            print(line, flush=True)
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
