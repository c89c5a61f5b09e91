"""gen_kimi_linear - the Kimi-Linear / Kimi K3 half of gen_checkpoint.py.

Owns: config.json fields and the tensor plan of random-weight checkpoints for
model_type kimi_linear (KDA + gated NoPE MLA hybrid, latent MoE, SiTU,
attention residuals) and its Kimi K3 wrapper (`kimi_k3`: the text config in
text_config, every text tensor prefixed `language_model.`, a few vision
tensors nothing reads, routed experts optionally MXFP4). Names, shapes, dtypes
and fields follow the checkpoint contract (notes/k3-contract, written from
../shared/notes/ARCHITECTURES.md sections 1.2, 1.3, 4): Linear weights BF16;
conv1d weights, A_log, dt_bias, o_norm and the router's correction bias F32.

Scales are chosen so that a wrong reading moves the logits a lot: the KDA
decay gates span "almost no decay" to "forget at once" (dt_bias and A_log
spread), beta spans (0.1, 0.9), --kda-v-gain makes the KDA outputs small
enough that o_norm's eps matters (so q/k scaling mistakes are not normalised
away), --act-gain drives MLP pre-activations into SiTU's tanh range, AttnRes
pseudo-queries give softmax weights far from uniform, router logits spread ~2.
"""

import math
import re

import numpy as np

import gen_deepseek as ds
import gen_quant as gq

ARCHS = ("kimi_linear", "kimi_k3")
A_LOG_SHAPES = ("head", "head4d", "padded", "channel")
# The compressed-tensors ignore list for K3-style checkpoints: every Linear that
# is not a routed expert (w1/w2/w3) stays BF16.
K3_IGNORE = ["re:.*lm_head.*", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
             "re:.*routed_expert_(down|up)_proj$", "re:.*gate$", "re:.*_res_proj$",
             "re:.*vision_tower.*", "re:.*mm_projector.*"]
# Kimi K3's first specials after the base ranks (ARCHITECTURES.md 4.8; 163592 and
# 163594.. are not named there), as many as the test tokenizer has room for.
K3_SPECIALS = ("[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>",
               "[start_header_id]", "[end_header_id]", "<|reserved_token_8|>", "[EOT]",
               "<|reserved_token_10|>", "<|reserved_token_11|>", "<|reserved_token_12|>",
               "<|reserved_token_13|>", "[UNK]", "[PAD]")
EXPERT_RE = re.compile(r".*block_sparse_moe\.experts\.\d+\.w[123]\.weight$")


def add_args(p):
    g = p.add_argument_group("Kimi-Linear / Kimi K3 (--arch kimi_linear | kimi_k3); also uses the "
                             "DeepSeek group's --q-lora-rank, --kv-lora-rank, --qk-*-dim, --v-head-dim, "
                             "--n-shared-experts, --first-k-dense, --moe-layer-freq, "
                             "--routed-scaling-factor, --n-group, --topk-group, --router-bias-std")
    g.add_argument("--kda-layers", default="", help="1-based KDA layers, e.g. 1,2,3 (the rest are MLA)")
    g.add_argument("--mla-layers", default="", help="1-based MLA layers (the rest are KDA); "
                   "default: every 4th and the last")
    g.add_argument("--kda-heads", type=int, default=4)
    g.add_argument("--kda-head-dim", type=int, default=16)
    g.add_argument("--conv-kernel", type=int, default=4, help="short_conv_kernel_size")
    g.add_argument("--gate-lower-bound", type=float, default=None,
                   help="lower-bound gate form g = lb*sigmoid(a*(graw+dt_bias)) (K3: -5); "
                        "absent: softplus form")
    g.add_argument("--gate-rank", choices=("low", "full"), default="low",
                   help="KDA output gate: low = g_a_proj/g_b_proj (Kimi-Linear), full = g_proj (K3)")
    g.add_argument("--a-log-shape", choices=A_LOG_SHAPES, default="head4d",
                   help="head: [Hk]; head4d: [1,1,Hk,1] (Kimi-Linear); padded: [dk] with the "
                        "per-head values first and a zero tail (K3); channel: [dk] per key channel")
    g.add_argument("--mla-output-gate", action="store_true", help="mla_use_output_gate (K3)")
    g.add_argument("--hidden-act", choices=("silu", "situ"), default="silu")
    g.add_argument("--situ-beta", type=float, default=4.0)
    g.add_argument("--situ-linear-beta", type=float, default=25.0)
    g.add_argument("--latent-moe", type=int, default=0, help="routed_expert_hidden_size (0: none)")
    g.add_argument("--latent-norm", action="store_true", help="latent_moe_use_norm")
    g.add_argument("--attn-res-block", type=int, default=0, help="attn_res_block_size (0: none)")
    g.add_argument("--grouped-topk", action="store_true", help="use_grouped_topk (with --n-group)")
    g.add_argument("--attn-res-gain", type=float, default=1.0,
                   help="|norm_w * proj_w| of the AttnRes pseudo-queries (score spread)")
    g.add_argument("--kda-v-gain", type=float, default=0.1,
                   help="scale of v_proj; small values make o_norm's eps matter")
    g.add_argument("--act-gain", type=float, default=1.0,
                   help="scale of every gate/up projection (down divided by it): large values "
                        "reach SiTU's tanh range")


def _layers(spec):
    return sorted({int(x) for x in spec.split(",") if x.strip()})


def check_args(p, a):
    """Fills the schedule, special ids and tokenizer choice; rejects shapes the
    contract cannot express."""
    n = a.layers
    every = set(range(1, n + 1))
    kda, mla = _layers(a.kda_layers), _layers(a.mla_layers)
    if not kda and not mla:
        mla = sorted({i for i in every if i % 4 == 0} | {n})
    if not kda:
        kda = sorted(every - set(mla))
    if not mla:
        mla = sorted(every - set(kda))
    if not a.allow_invalid and (set(kda) & set(mla) or set(kda) | set(mla) != every):
        p.error(f"--kda-layers {kda} / --mla-layers {mla}: every layer 1..{n} in exactly one")
    a.kda_list, a.mla_list = kda, mla
    Hk, dk = a.kda_heads, a.kda_head_dim
    if not a.allow_invalid:
        if a.a_log_shape in ("padded", "channel") and Hk >= dk:
            p.error(f"--a-log-shape {a.a_log_shape} needs --kda-heads < --kda-head-dim "
                    "(with Hk == dk the [dk] shape reads per head)")
        if a.latent_norm and not a.latent_moe:
            p.error("--latent-norm needs --latent-moe")
        if a.experts and not 1 <= a.top_k <= a.experts:
            p.error("--top-k must be in [1, experts]")
        if a.grouped_topk and a.n_group > 1:
            if a.experts % a.n_group or not 1 <= a.topk_group <= a.n_group:
                p.error("--n-group must divide --experts and --topk-group be in [1, n-group]")
            if a.experts // a.n_group < 2:
                p.error("grouped top-k scores a group by its top-2: need >= 2 experts per group")
            if a.top_k > a.topk_group * (a.experts // a.n_group):
                p.error("--top-k must be at most the experts in the kept groups")
    if a.qdense != "bf16" or a.qexperts not in ("bf16", "mxfp4"):
        p.error("kimi_linear / kimi_k3: only --quant mxfp4 (routed experts) is written")
    if a.tie_embeddings:
        p.error("--tie-embeddings: the Kimi-Linear family never ties lm_head")
    if a.dtype != "bf16":
        p.error("--dtype: the Kimi-Linear family is written as shipped (BF16, F32 small tensors)")
    a.test_tiktoken = not a.no_tokenizer
    n_ranks = ds.test_tiktoken_ranks(a.vocab)
    # K3 stops on <|end_of_msg|> (base+2), Kimi-Linear on [EOS] (base+1); the test
    # tokenizer puts Kimi's specials right after its ranks.
    a.bos = n_ranks if a.bos_id == "auto" else (None if a.bos_id == "none" else int(a.bos_id))
    if a.eos_ids == "auto":
        a.eos = [n_ranks + (2 if a.arch == "kimi_k3" else 1)]
    else:
        a.eos = [] if a.eos_ids == "none" else [int(x) for x in a.eos_ids.split(",") if x.strip()]
    a.mlp_only = []
    return a


def layer_is_moe(cfg, li):
    """The contract's rule: experts exist, li >= first_k_dense_replace, li % moe_layer_freq == 0."""
    return bool(cfg.get("num_experts")) and li >= cfg.get("first_k_dense_replace", 0) \
        and li % cfg.get("moe_layer_freq", 1) == 0


def build_config(a):
    """The text model's config.json (for K3 the wrapper's text_config)."""
    lac = {"full_attn_layers": a.mla_list, "head_dim": a.kda_head_dim, "kda_layers": a.kda_list,
           "num_heads": a.kda_heads, "short_conv_kernel_size": a.conv_kernel}
    if a.gate_lower_bound is not None:
        lac["gate_lower_bound"] = a.gate_lower_bound
    if a.gate_rank == "full":
        lac["use_full_rank_gate"] = True
    cfg = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "num_hidden_layers": a.layers,
        "intermediate_size": a.intermediate, "rms_norm_eps": a.rms_eps, "tie_word_embeddings": False,
        "max_position_embeddings": a.max_pos, "torch_dtype": "bfloat16", "use_cache": True,
        "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
        "q_lora_rank": a.q_lora_rank or None, "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.qk_nope_dim, "qk_rope_head_dim": a.qk_rope_dim, "v_head_dim": a.v_head_dim,
        "mla_use_nope": True,
        "num_experts": a.experts, "num_experts_per_token": a.top_k,
        "num_shared_experts": a.n_shared_experts, "moe_intermediate_size": a.moe_intermediate,
        "moe_renormalize": bool(a.norm_topk_prob), "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": a.routed_scaling_factor, "first_k_dense_replace": a.first_k_dense,
        "moe_layer_freq": a.moe_layer_freq, "use_grouped_topk": bool(a.grouped_topk),
        "num_expert_group": a.n_group, "topk_group": a.topk_group,
        "hidden_act": a.hidden_act,
        "linear_attn_config": dict(sorted(lac.items())),
    }
    if a.mla_output_gate:
        cfg["mla_use_output_gate"] = True
    if a.hidden_act == "situ":
        cfg["activation_situ_beta"] = a.situ_beta
        cfg["activation_situ_linear_beta"] = a.situ_linear_beta
    if a.latent_moe:
        cfg["routed_expert_hidden_size"] = a.latent_moe
        cfg["latent_moe_use_norm"] = bool(a.latent_norm)
    if a.attn_res_block:
        cfg["attn_res_block_size"] = a.attn_res_block
    if a.bos is not None:
        cfg["bos_token_id"] = a.bos
    if a.eos:
        cfg["eos_token_id"] = a.eos[0]
    return dict(sorted(cfg.items()))


def wrap_config(text_cfg):
    """Kimi K3's multimodal wrapper around the text config."""
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": text_cfg,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 32, "model_type": "moonvit3d", "num_attention_heads": 2,
                          "num_hidden_layers": 1, "patch_size": 2},
    }


def test_tokenizer(a):
    """(specials, eos name) of the test tiktoken tokenizer: K3's or Kimi K2's."""
    if a.arch == "kimi_k3":
        return K3_SPECIALS, "<|end_of_msg|>"
    return ds.KIMI_SPECIALS, "[EOS]"


def generation_config(a):
    g = {"do_sample": True, "temperature": 1.0, "top_p": 0.95}
    if a.bos is not None:
        g["bos_token_id"] = a.bos
    if a.eos:
        g["eos_token_id"] = a.eos if len(a.eos) != 1 else a.eos[0]
    return dict(sorted(g.items()))


# ---- fills for the KDA gate parameters (varied on purpose) -----------------------

def _a_log_fill(a):
    """A_log as --a-log-shape lays it out. Per-head values spread a = exp(A_log)
    over a decade or more so that heads decay at very different rates."""
    Hk, dk = a.kda_heads, a.kda_head_dim
    lo, hi = (math.log(0.1), math.log(4.0)) if a.gate_lower_bound is None else (math.log(0.3), math.log(3.0))

    def fill(rng):
        n = dk if a.a_log_shape == "channel" else Hk
        v = rng.uniform(lo, hi, n).astype(np.float32)
        v[v == 0] = np.float32(0.25)      # a per-channel tail must not be all zero by chance
        if a.a_log_shape == "head":
            return v
        if a.a_log_shape == "head4d":
            return v.reshape(1, 1, Hk, 1)
        if a.a_log_shape == "padded":
            out = np.zeros(dk, dtype=np.float32)
            out[:Hk] = v
            return out
        return v
    return fill


def a_log_shape(a):
    Hk, dk = a.kda_heads, a.kda_head_dim
    return {"head": (Hk,), "head4d": (1, 1, Hk, 1), "padded": (dk,), "channel": (dk,)}[a.a_log_shape]


def _dt_bias_fill(a, n):
    """Softplus form: softplus(graw + dt) from ~0.003 to ~2; lower-bound form: the
    sigmoid argument from about -20 (no decay) to +10 (g at the bound)."""
    lo, hi = (-6.0, 1.5) if a.gate_lower_bound is None else (-6.0, 4.0)

    def fill(rng):
        return rng.uniform(lo, hi, n).astype(np.float32)
    return fill


def _normal(shape, mean, std):
    def fill(rng):
        x = rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
        x *= np.float32(std)
        x += np.float32(mean)
        return x.reshape(shape)
    return fill


def tensor_plan(cfg, a, prefix=""):
    """[(name, shape, mean, std[, extra])] in module registration order.
    extra: {"dtype": safetensors dtype, "fill": rng -> array}."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    norm = (1.0, 0.1)

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    m = prefix + "model."
    plan = [(m + "embed_tokens.weight", (V, H), 0.0, 1.0)]
    for li in range(cfg["num_hidden_layers"]):
        p = f"{m}layers.{li}."
        plan += kda_plan(cfg, a, p + "self_attn.") if li + 1 in a.kda_list else mla_plan(cfg, a, p + "self_attn.")
        plan += ffn_plan(cfg, a, p, li)
        plan += [(p + "input_layernorm.weight", (H,)) + norm,
                 (p + "post_attention_layernorm.weight", (H,)) + norm]
        if a.attn_res_block:
            # pseudo-query norm_w * proj_w of norm ~ --attn-res-gain: softmax over
            # anchors far from uniform
            plan += [(p + "self_attention_res_norm.weight", (H,)) + norm,
                     (p + "self_attention_res_proj.weight", (1, H)) + proj(H, a.attn_res_gain),
                     (p + "mlp_res_norm.weight", (H,)) + norm,
                     (p + "mlp_res_proj.weight", (1, H)) + proj(H, a.attn_res_gain)]
    plan.append((m + "norm.weight", (H,)) + norm)
    if a.attn_res_block:
        plan += [(m + "output_attn_res_norm.weight", (H,)) + norm,
                 (m + "output_attn_res_proj.weight", (1, H)) + proj(H, a.attn_res_gain)]
    plan.append((prefix + "lm_head.weight", (V, H)) + proj(H, 2.0))
    if a.arch == "kimi_k3":
        plan += [("vision_tower.patch_embed.proj.weight", (32, 3, 2, 2)) + proj(12),
                 ("vision_tower.encoder.blocks.0.wqkv.weight", (96, 32)) + proj(32),
                 ("vision_tower.encoder.final_layernorm.weight", (32,)) + norm,
                 ("mm_projector.pre_norm.weight", (32,)) + norm,
                 ("mm_projector.proj.0.weight", (H, 128)) + proj(128)]
    return plan


def kda_plan(cfg, a, s):
    H = cfg["hidden_size"]
    Hk, dk, K = a.kda_heads, a.kda_head_dim, a.conv_kernel
    C = Hk * dk

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    t = [(s + "q_proj.weight", (C, H)) + proj(H),
         (s + "k_proj.weight", (C, H)) + proj(H),
         (s + "v_proj.weight", (C, H)) + proj(H, a.kda_v_gain)]
    for n in ("q", "k", "v"):
        t.append((s + f"{n}_conv1d.weight", (C, 1, K), 0.0, 0.6, {"dtype": "F32"}))
    # graw = f_b(f_a x) ~ N(0, 1.5^2) per channel
    t += [(s + "f_a_proj.weight", (dk, H)) + proj(H),
          (s + "f_b_proj.weight", (C, dk)) + proj(dk, 1.5),
          (s + "b_proj.weight", (Hk, H)) + proj(H, 1.5)]
    shp = a_log_shape(a)
    t += [(s + "A_log", shp, 0.0, 0.0, {"dtype": "F32", "fill": _a_log_fill(a)}),
          (s + "dt_bias", (C,), 0.0, 0.0, {"dtype": "F32", "fill": _dt_bias_fill(a, C)})]
    if a.gate_rank == "full":
        t.append((s + "g_proj.weight", (C, H)) + proj(H, 1.5))
    else:
        t += [(s + "g_a_proj.weight", (dk, H)) + proj(H),
              (s + "g_b_proj.weight", (C, dk)) + proj(dk, 1.5)]
    t += [(s + "o_norm.weight", (dk,), 1.0, 0.1, {"dtype": "F32"}),
          (s + "o_proj.weight", (H, C)) + proj(C)]
    return t


def mla_plan(cfg, a, s):
    H, nH = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    norm = (1.0, 0.1)

    def proj(fan_in, gain=1.0):
        return (0.0, gain / math.sqrt(fan_in))

    t = []
    if qr:
        t += [(s + "q_a_proj.weight", (qr, H)) + proj(H),
              (s + "q_a_layernorm.weight", (qr,)) + norm,
              (s + "q_b_proj.weight", (nH * (nope + rope), qr)) + proj(qr)]
    else:
        t.append((s + "q_proj.weight", (nH * (nope + rope), H)) + proj(H))
    t += [(s + "kv_a_proj_with_mqa.weight", (kvr + rope, H)) + proj(H),
          (s + "kv_a_layernorm.weight", (kvr,)) + norm,
          (s + "kv_b_proj.weight", (nH * (nope + vd), kvr)) + proj(kvr)]
    if cfg.get("mla_use_output_gate"):
        t.append((s + "g_proj.weight", (nH * vd, H)) + proj(H, 1.5))
    t.append((s + "o_proj.weight", (H, nH * vd)) + proj(nH * vd))
    return t


def _mlp(s, names, rows, cols, g):
    """gate/up [rows, cols] scaled by g, down [cols, rows] by 1/g."""
    gate, up, down = names
    return [(s + gate, (rows, cols), 0.0, g / math.sqrt(cols)),
            (s + up, (rows, cols), 0.0, g / math.sqrt(cols)),
            (s + down, (cols, rows), 0.0, 1.0 / (g * math.sqrt(rows)))]


def ffn_plan(cfg, a, p, li):
    H = cfg["hidden_size"]
    g = a.act_gain
    hf = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    if not layer_is_moe(cfg, li):
        return _mlp(p + "mlp.", hf, cfg["intermediate_size"], H, g)
    s = p + "block_sparse_moe."
    E, mI, nS = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["num_shared_experts"]
    Lh = cfg.get("routed_expert_hidden_size") or 0
    X = Lh or H
    t = [(s + "gate.weight", (E, H), 0.0, 2.0 / math.sqrt(H)),
         (s + "gate.e_score_correction_bias", (E,), 0.0, a.router_bias_std,
          {"dtype": "F32", "fill": _normal((E,), 0.0, a.router_bias_std)})]
    for e in range(E):
        t += _mlp(f"{s}experts.{e}.", ("w1.weight", "w3.weight", "w2.weight"), mI, X, g)
    if Lh:
        t += [(s + "routed_expert_down_proj.weight", (Lh, H), 0.0, 1.0 / math.sqrt(H)),
              (s + "routed_expert_up_proj.weight", (H, Lh), 0.0, 1.0 / math.sqrt(Lh))]
        if cfg.get("latent_moe_use_norm"):
            t.append((s + "routed_expert_norm.weight", (Lh,), 1.0, 0.1))
    if nS:
        t += _mlp(s + "shared_experts.", hf, nS * mI, H, g)
    return t


# ---- MXFP4 routed experts (K3) -------------------------------------------------

def quant_config():
    """K3's text_config.quantization_config: MXFP4 for every Linear the ignore list
    leaves, i.e. the routed experts' w1/w2/w3."""
    g = {"format": gq.CT_FORMAT["mxfp4"], "input_activations": None, "output_activations": None,
         "targets": ["Linear"], "weights": gq._ct_weights("mxfp4")}
    return {"config_groups": {"group_0": dict(sorted(g.items()))}, "format": gq.CT_FORMAT["mxfp4"],
            "global_compression_ratio": None, "ignore": list(K3_IGNORE), "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def apply_quant(plan, a, make_source, make_fast_rng=None):
    """(plan with routed experts replaced by MXFP4 companions, quantization_config)
    or (plan, None) for BF16. Each tensor's format is read back from the config
    (gen_quant's matcher) and must be MXFP4 exactly for the routed experts.
    make_fast_rng (--fast-init): random codes instead of quantized values."""
    if a.qexperts == "bf16":
        return plan, None
    qc = quant_config()
    out = []
    for t in plan:
        name, shape = t[0], tuple(t[1])
        kind = gq.kind_from_config(qc, a.arch, name, shape)
        want = "mxfp4" if EXPERT_RE.match(name) else "bf16"
        if kind != want:
            raise SystemExit(f"gen_checkpoint: {name}: quantization_config gives {kind}, want {want}")
        if kind == "bf16":
            out.append(t)
            continue
        if shape[1] % gq.GROUP:
            raise SystemExit(f"gen_checkpoint: {name}: {shape[1]} input columns, not a multiple of "
                             f"{gq.GROUP} (MXFP4 groups); pick other sizes")
        pk = gq.Packed("mxfp4", name, shape, make_source(t), fast_rng=make_fast_rng(t) if make_fast_rng else None,
                       std=float(t[3]) or 1.0)
        for cname, dtype, cshape in pk.parts:
            out.append((cname, cshape, 0.0, 0.0, {"dtype": dtype, "packed": pk}))
    return out, qc
