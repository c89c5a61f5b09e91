#!/usr/bin/python3
"""deepseek_ref - an independent numpy forward pass of the DeepSeek-V3 family.

Owns: the reference logits for model_type deepseek_v2, deepseek_v3 and kimi_k2
(the DeepseekV3 architecture), also inside a Kimi K2.5-style wrapper (config
text_config, tensors prefixed `language_model.`). Written from the architecture
description (../shared/notes/ARCHITECTURES.md sections 2-3, 8), not from the C
engine, so that a shared misreading is unlikely.

Precision: stored weights (BF16/F16/F32, or FP8 / INT4 / MXFP4 as the
checkpoint's quantization_config says, decoded by quant_np) are widened exactly
and all math is float64 (dtype=np.float32 / --f32 runs the same code in float32, only to measure
drift). Routing is float64 too: a float32 router can only disagree where two
selection values are within float32 rounding (min_route_gap reports the closest).

Forward, positions p = 0..T-1:
  x = embed_tokens[ids]
  per layer i:
    h = rmsnorm(x, input_layernorm)
    MLA: q = q_b(rmsnorm(q_a(h), q_a_layernorm))   or q_proj(h) without q-LoRA;
         per head q = [q_nope | q_pe]; ckv = kv_a_proj_with_mqa(h) = [c | k_pe];
         c = rmsnorm(c, kv_a_layernorm) (the cached latent), k_pe one rope key
         shared by all heads; rotary on q_pe, k_pe in interleaved pairs (2j, 2j+1);
         kv_b(c) per head = [k_nope | v];
         score = (q_nope.k_nope + q_pe.k_pe) * mscale^2 / sqrt(nope + rope), causal;
         out = o_proj(concat_h softmax(score) v)
       Absorbed form (decode): q_lat = W_UK^T q_nope, score = q_lat.c + q_pe.k_pe,
         o = W_UV (sum_t p_t c_t); the same numbers to rounding.
    x += MLA;  h = rmsnorm(x, post_attention_layernorm)
    x += dense SwiGLU (i < first_k_dense_replace or i % moe_layer_freq != 0) or
         MoE: route(gate(h)) -> sum_k w_k expert_k(h) + shared_experts(h)
  logits = lm_head(rmsnorm(x, model.norm))
MTP layers, rotary_emb.inv_freq buffers and vision tensors are never read.

CLI:
  deepseek_ref.py --model DIR --tokens 1,2,3 --out FILE   float32 LE logits [T*V]
  deepseek_ref.py --model DIR --tokens 1,2,3 --greedy N   prints the continuation ids
  deepseek_ref.py logits|run ...   imitates the engine's subcommands in float32
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_np  # noqa: E402
import safetensors_np as st  # noqa: E402

FAMILY = ("deepseek_v2", "deepseek_v3", "kimi_k2")
SCORING = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
# HF DeepSeek builds q_a_layernorm / kv_a_layernorm without an eps argument, so
# they use RMSNorm's default 1e-6 whatever rms_norm_eps says (notes pitfall 7).
LATENT_NORM_EPS = 1e-6


read_config = st.read_text_config  # (text config, tensor prefix)


def is_linear(name):
    """Whether tensor `name` is the weight of a Linear layer (what a quantization
    config quantizes): not an embedding, a norm or the router, which DeepSeek's
    modelling code keeps as a plain parameter."""
    mod, _, suf = name.rpartition(".")
    last = mod.rpartition(".")[2]
    return suf == "weight" and last != "embed_tokens" and "norm" not in last \
        and not mod.endswith("mlp.gate")


def is_family(model_dir):
    cfg, _ = read_config(model_dir)
    return cfg.get("model_type") in FAMILY


def yarn_get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


class Config:
    """The text config fields the forward pass uses; inconsistent values raise
    ValueError naming config.json and the field."""

    def __init__(self, cfg, where="config.json"):
        def need(k):
            if cfg.get(k) is None:
                raise ValueError(f"{where}: field {k} missing")
            return cfg[k]

        def bad(k, why):
            raise ValueError(f"{where}: field {k}={cfg.get(k)!r}: {why}")

        self.raw = cfg
        self.model_type = cfg.get("model_type")
        if self.model_type not in FAMILY:
            bad("model_type", f"not one of {', '.join(FAMILY)}")
        self.vocab = need("vocab_size")
        self.hidden = need("hidden_size")
        self.n_layers = need("num_hidden_layers")
        self.n_heads = need("num_attention_heads")
        self.q_lora = cfg.get("q_lora_rank") or 0
        self.kv_lora = need("kv_lora_rank")
        self.nope = need("qk_nope_head_dim")
        self.rope_dim = need("qk_rope_head_dim")
        self.v_dim = need("v_head_dim")
        if self.rope_dim % 2:
            bad("qk_rope_head_dim", "must be even (rotary pairs)")
        self.intermediate = need("intermediate_size")
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.latent_eps = LATENT_NORM_EPS
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.mtp = cfg.get("num_nextn_predict_layers") or 0
        rs = cfg.get("rope_scaling")
        self.rope = None
        if rs:
            kind = rs.get("rope_type", rs.get("type", "default"))
            if kind == "yarn":
                self.rope = dict(rs)
                for k in ("factor", "original_max_position_embeddings"):
                    if rs.get(k) is None:
                        raise ValueError(f"{where}: field rope_scaling.{k} missing")
            elif kind != "default":
                raise ValueError(f"{where}: field rope_scaling.type={kind!r}: only yarn is supported")
        # MoE
        self.n_experts = cfg.get("n_routed_experts") or 0
        self.first_dense = cfg.get("first_k_dense_replace") or 0
        self.moe_freq = cfg.get("moe_layer_freq") or 1
        self.n_shared = cfg.get("n_shared_experts") or 0
        if self.n_experts:
            self.top_k = need("num_experts_per_tok")
            self.moe_intermediate = need("moe_intermediate_size")
            self.scoring = need("scoring_func")
            self.method = need("topk_method")
            self.n_group = cfg.get("n_group") or 1
            self.topk_group = cfg.get("topk_group") or 1
            self.norm_topk = bool(cfg.get("norm_topk_prob", False))
            self.scaling = float(cfg.get("routed_scaling_factor", 1.0))
            if self.scoring not in SCORING:
                bad("scoring_func", f"not one of {', '.join(SCORING)}")
            if self.method not in TOPK_METHODS:
                bad("topk_method", f"not one of {', '.join(TOPK_METHODS)}")
            if self.n_experts % self.n_group:
                bad("n_group", f"n_routed_experts={self.n_experts} is not a multiple of it")
            if not 1 <= self.topk_group <= self.n_group:
                bad("topk_group", f"must be in [1, n_group={self.n_group}]")
            per_group = self.n_experts // self.n_group
            if not 1 <= self.top_k <= self.topk_group * per_group:
                bad("num_experts_per_tok", f"must be in [1, {self.topk_group * per_group}] "
                    "(experts in the kept groups)")
            if self.method == "noaux_tc" and self.n_group > 1 and per_group < 2:
                bad("n_group", "noaux_tc scores a group by its top-2 experts: need >= 2 per group")

    @property
    def qk_dim(self):
        return self.nope + self.rope_dim

    def layer_is_moe(self, i):
        return bool(self.n_experts) and i >= self.first_dense and i % self.moe_freq == 0


def rope_inv_freq(c):
    """(inv_freq [rope_dim/2] float64, cos/sin magnitude factor). YaRN as in the
    notes section 2.5 (DSREF precompute_freqs_cis, HF _compute_yarn_parameters)."""
    d = c.rope_dim
    base = c.theta
    f = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = c.rope
    if rs is None:
        return f, 1.0
    factor = float(rs["factor"])
    orig = float(rs["original_max_position_embeddings"])
    beta_fast = float(rs.get("beta_fast") or 32)
    beta_slow = float(rs.get("beta_slow") or 1)

    def corr_dim(n):
        return d * math.log(orig / (2 * math.pi * n)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = f / factor * ramp + f * (1.0 - ramp)
    attn = rs.get("attention_factor")
    if attn is None:
        m, mall = rs.get("mscale"), rs.get("mscale_all_dim")
        attn = yarn_get_mscale(factor, m) / yarn_get_mscale(factor, mall) if m and mall \
            else yarn_get_mscale(factor)
    return inv, float(attn)


def softmax_scale(c):
    """1/sqrt(nope + rope), times mscale^2 with mscale = 0.1*mscale_all_dim*ln(factor)+1
    when rope_scaling gives mscale_all_dim (HF DeepseekV3Attention)."""
    s = c.qk_dim ** -0.5
    if c.rope is not None and c.rope.get("mscale_all_dim"):
        m = yarn_get_mscale(float(c.rope["factor"]), float(c.rope["mscale_all_dim"]))
        s *= m * m
    return s


def rope_cos_sin(c, pos, dtype=np.float64):
    """cos, sin [T, rope_dim/2] for absolute positions pos, times the magnitude factor."""
    inv, attn = rope_inv_freq(c)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    return (np.cos(ang) * attn).astype(dtype), (np.sin(ang) * attn).astype(dtype)


def rope_interleaved(x, cos, sin):
    """x [T, ..., d]: frequency j rotates the stored pair (2j, 2j+1)."""
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1] // 2,)
    cs, sn = cos.reshape(shape), sin.reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cs - b * sn
    out[..., 1::2] = a * sn + b * cs
    return out


def rmsnorm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + x.dtype.type(eps)) * w


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _top(values, k):
    """Indices of the k largest per row, largest first, equal values: lower index."""
    return np.argsort(-values, axis=-1, kind="stable")[:, :k]


def scores(c, logits):
    """The router's scores s [T, E]: softmax or sigmoid of the logits."""
    return softmax(logits) if c.scoring == "softmax" else 1.0 / (1.0 + np.exp(-logits))


def route_weights(c, s, idx):
    """Routing weights [T, k] of experts idx [T, k] from the scores s alone:
    renormalised to sum 1 when norm_topk_prob (and k > 1), times
    routed_scaling_factor (deepseek_v2 scales only when it does not renormalise)."""
    w = np.take_along_axis(s, idx, axis=-1)
    normed = c.top_k > 1 and c.norm_topk
    if normed:
        w = w / (np.sum(w, axis=-1, keepdims=True) + w.dtype.type(1e-20))
    if c.model_type != "deepseek_v2" or not normed:
        w = w * w.dtype.type(c.scaling)
    return w


def route(c, logits, bias=None):
    """(idx [T,k], weights [T,k], min gap) for router logits [T, E].
    scores s = softmax or sigmoid(logits); selection values = s + bias for
    noaux_tc, else s. Groups (n_group > 1, group_limited_greedy / noaux_tc): a
    group's score is its max (group_limited_greedy) or the sum of its top-2
    selection values (noaux_tc); the topk_group best groups stay, the rest can
    never be picked. idx = top-k selection values (slot order: value descending,
    ties to the lower id); weights come from s alone, renormalised to sum 1 when
    norm_topk_prob (and k > 1), times routed_scaling_factor (deepseek_v2 scales
    only when it does not renormalise). The gap is the smallest distance between
    the last kept and first dropped value, groups and experts, over all rows."""
    T, E = logits.shape
    s = scores(c, logits)
    sel = s + bias[None, :] if c.method == "noaux_tc" else s.copy()
    gap = math.inf
    if c.method != "greedy" and c.n_group > 1:
        G = c.n_group
        g = sel.reshape(T, G, E // G)
        gs = g.max(axis=-1) if c.method == "group_limited_greedy" else \
            np.sort(g, axis=-1)[:, :, -2:].sum(axis=-1)
        order = np.argsort(-gs, axis=-1, kind="stable")
        keep = np.zeros((T, G), dtype=bool)
        np.put_along_axis(keep, order[:, :c.topk_group], True, axis=-1)
        if c.topk_group < G:
            gv = np.take_along_axis(gs, order, axis=-1)
            gap = min(gap, float(np.min(gv[:, c.topk_group - 1] - gv[:, c.topk_group])))
        sel = np.where(np.repeat(keep, E // G, axis=1), sel, -np.inf)
    order = np.argsort(-sel, axis=-1, kind="stable")
    idx = order[:, :c.top_k]
    if c.top_k < E:
        sv = np.take_along_axis(sel, order[:, c.top_k - 1:c.top_k + 1], axis=-1)
        fin = np.isfinite(sv[:, 1])
        if fin.any():
            gap = min(gap, float(np.min(sv[fin, 0] - sv[fin, 1])))
    return idx, route_weights(c, s, idx), gap


def expected_tensors(c, prefix=""):
    """{name: shape} of every tensor the forward pass reads."""
    H, V, nH = c.hidden, c.vocab, c.n_heads
    m = prefix + "model."
    t = {m + "embed_tokens.weight": (V, H), m + "norm.weight": (H,)}
    if not c.tied:
        t[prefix + "lm_head.weight"] = (V, H)
    for i in range(c.n_layers):
        p = f"{m}layers.{i}."
        a = p + "self_attn."
        if c.q_lora:
            t[a + "q_a_proj.weight"] = (c.q_lora, H)
            t[a + "q_a_layernorm.weight"] = (c.q_lora,)
            t[a + "q_b_proj.weight"] = (nH * c.qk_dim, c.q_lora)
        else:
            t[a + "q_proj.weight"] = (nH * c.qk_dim, H)
        t[a + "kv_a_proj_with_mqa.weight"] = (c.kv_lora + c.rope_dim, H)
        t[a + "kv_a_layernorm.weight"] = (c.kv_lora,)
        t[a + "kv_b_proj.weight"] = (nH * (c.nope + c.v_dim), c.kv_lora)
        t[a + "o_proj.weight"] = (H, nH * c.v_dim)
        t[p + "input_layernorm.weight"] = (H,)
        t[p + "post_attention_layernorm.weight"] = (H,)
        if c.layer_is_moe(i):
            E, mI = c.n_experts, c.moe_intermediate
            t[p + "mlp.gate.weight"] = (E, H)
            if c.method == "noaux_tc":
                t[p + "mlp.gate.e_score_correction_bias"] = (E,)
            for e in range(E):
                for n, shp in (("gate_proj", (mI, H)), ("up_proj", (mI, H)), ("down_proj", (H, mI))):
                    t[f"{p}mlp.experts.{e}.{n}.weight"] = shp
            if c.n_shared:
                sI = c.n_shared * mI
                for n, shp in (("gate_proj", (sI, H)), ("up_proj", (sI, H)), ("down_proj", (H, sI))):
                    t[f"{p}mlp.shared_experts.{n}.weight"] = shp
        else:
            I = c.intermediate
            for n, shp in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t[f"{p}mlp.{n}.weight"] = shp
    return t


def skipped_kind(c, prefix, name):
    """Why a tensor the forward pass does not read may be in the checkpoint:
    'mtp', 'inv_freq', 'vision', or None (unexplained)."""
    if name.endswith("rotary_emb.inv_freq"):
        return "inv_freq"
    if name.startswith(("vision_tower.", "mm_projector.")):
        return "vision"
    lp = prefix + "model.layers."
    if name.startswith(lp):
        layer = name[len(lp):].split(".", 1)[0]
        if layer.isdigit() and c.n_layers <= int(layer) < c.n_layers + c.mtp:
            return "mtp"
    return None


class Cache:
    """Per layer, the normalised latent c and the rotated rope key k_pe of every
    position so far: all MLA keeps between steps."""

    def __init__(self, n_layers):
        self.c = [None] * n_layers
        self.k_pe = [None] * n_layers
        self.length = 0


class DeepseekRef:
    def __init__(self, model_dir, dtype=np.float64):
        self.dir = model_dir
        self.dtype = np.dtype(dtype)
        text, self.prefix = read_config(model_dir)
        where = os.path.join(model_dir, "config.json") + (" text_config" if self.prefix else "")
        self.cfg = Config(text, where)
        self.gen = {}
        gp = os.path.join(model_dir, "generation_config.json")
        if os.path.exists(gp):
            with open(gp) as f:
                self.gen = json.load(f)
        self.ckpt = st.Checkpoint(model_dir)
        self.quant = quant_np.read_quant_config(model_dir)
        self.weights = quant_np.Weights(self.ckpt, self.quant, is_linear)
        self.shapes = expected_tensors(self.cfg, self.prefix)
        self.W = {}   # widened weights, filled on first use; tests may overwrite
        self.min_route_gap = math.inf
        self.route_log = []   # (layer, idx) per routed call, for tests
        self.scale = softmax_scale(self.cfg)

    def close(self):
        self.ckpt.close()

    def w(self, name):
        """Tensor `name` (without the wrapper prefix), shape-checked, widened
        (decoded when quantized)."""
        full = self.prefix + name
        if full not in self.W:
            if full not in self.weights:
                raise ValueError(f"{self.dir}: tensor {full} missing")
            a = self.weights.get(full, self.dtype)
            want = self.shapes.get(full)
            if want is not None and a.shape != tuple(want):
                raise ValueError(f"{self.dir}: tensor {full} has shape {a.shape}, config implies {tuple(want)}")
            self.W[full] = a
        return self.W[full]

    def eos_ids(self):
        e = self.gen.get("eos_token_id", self.cfg.raw.get("eos_token_id"))
        if e is None:
            return set()
        return set(e) if isinstance(e, list) else {e}

    # ---- MLA ---------------------------------------------------------------
    def mla_inputs(self, i, h, cos, sin):
        """q_nope [T,H,nope], q_pe [T,H,rope] (rotated), c [T,kv_lora] (normalised),
        k_pe [T,rope] (rotated)."""
        c = self.cfg
        T = h.shape[0]
        a = f"model.layers.{i}.self_attn."
        if c.q_lora:
            cq = rmsnorm(h @ self.w(a + "q_a_proj.weight").T, self.w(a + "q_a_layernorm.weight"),
                         c.latent_eps)
            q = cq @ self.w(a + "q_b_proj.weight").T
        else:
            q = h @ self.w(a + "q_proj.weight").T
        q = q.reshape(T, c.n_heads, c.qk_dim)
        q_nope, q_pe = q[..., :c.nope], rope_interleaved(q[..., c.nope:], cos, sin)
        ckv = h @ self.w(a + "kv_a_proj_with_mqa.weight").T
        lat = rmsnorm(ckv[:, :c.kv_lora], self.w(a + "kv_a_layernorm.weight"), c.latent_eps)
        k_pe = rope_interleaved(ckv[:, c.kv_lora:], cos, sin)
        return q_nope, q_pe, lat, k_pe

    def mla_attend(self, i, q_nope, q_pe, lat, k_pe, pos, form):
        """Causal attention of queries at absolute positions pos over keys 0..S-1
        given by the latents lat [S, kv_lora] and k_pe [S, rope]."""
        c = self.cfg
        T, S, nH = q_nope.shape[0], lat.shape[0], c.n_heads
        a = f"model.layers.{i}.self_attn."
        wkv = self.w(a + "kv_b_proj.weight").reshape(nH, c.nope + c.v_dim, c.kv_lora)
        w_uk, w_uv = wkv[:, :c.nope, :], wkv[:, c.nope:, :]
        rope_s = np.einsum("thr,sr->hts", q_pe, k_pe)
        if form == "expanded":
            k_nope = np.einsum("hnc,sc->shn", w_uk, lat)
            v = np.einsum("hvc,sc->shv", w_uv, lat)
            s = np.einsum("thn,shn->hts", q_nope, k_nope) + rope_s
        elif form == "absorbed":
            q_lat = np.einsum("thn,hnc->thc", q_nope, w_uk)
            s = np.einsum("thc,sc->hts", q_lat, lat) + rope_s
        else:
            raise ValueError(f"MLA form {form!r}")
        s = s * self.dtype.type(self.scale)
        allowed = np.arange(S)[None, :] <= np.asarray(pos)[:, None]
        p = softmax(np.where(allowed[None], s, -np.inf), axis=-1)
        if form == "expanded":
            o = np.einsum("hts,shv->thv", p, v)
        else:
            o = np.einsum("thc,hvc->thv", np.einsum("hts,sc->thc", p, lat), w_uv)
        return o.reshape(T, nH * c.v_dim) @ self.w(a + "o_proj.weight").T

    # ---- MLP / MoE ---------------------------------------------------------
    def swiglu(self, prefix, h):
        g = h @ self.w(prefix + "gate_proj.weight").T
        u = h @ self.w(prefix + "up_proj.weight").T
        return (silu(g) * u) @ self.w(prefix + "down_proj.weight").T

    def route(self, i, h):
        c = self.cfg
        p = f"model.layers.{i}.mlp.gate."
        logits = h @ self.w(p + "weight").T
        bias = self.w(p + "e_score_correction_bias") if c.method == "noaux_tc" else None
        idx, wts, gap = route(c, logits, bias)
        self.min_route_gap = min(self.min_route_gap, gap)
        self.route_log.append((i, idx))
        return idx, wts

    def moe(self, i, h):
        c = self.cfg
        idx, wts = self.route(i, h)
        out = np.zeros_like(h)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            y = self.swiglu(f"model.layers.{i}.mlp.experts.{e}.", h[rows])
            out[rows] += wts[rows, slot][:, None] * y
        if c.n_shared:
            out += self.swiglu(f"model.layers.{i}.mlp.shared_experts.", h)
        return out

    # ---- model -------------------------------------------------------------
    def forward(self, tokens, cache=None, form="expanded"):
        """Final-norm hidden states [T, hidden] of tokens at positions
        cache.length.. (0.. without a cache); the cache gains their latents."""
        c = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("tokens: need a non-empty 1-D sequence")
        if tokens.min() < 0 or tokens.max() >= c.vocab:
            raise ValueError(f"tokens: ids must be in [0, {c.vocab})")
        start = cache.length if cache else 0
        pos = np.arange(start, start + tokens.size)
        cos, sin = rope_cos_sin(c, pos, self.dtype)
        x = self.w("model.embed_tokens.weight")[tokens].copy()
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            h = rmsnorm(x, self.w(p + "input_layernorm.weight"), c.eps)
            q_nope, q_pe, lat, k_pe = self.mla_inputs(i, h, cos, sin)
            if cache is not None:
                if cache.c[i] is not None:
                    lat = np.concatenate([cache.c[i], lat])
                    k_pe = np.concatenate([cache.k_pe[i], k_pe])
                cache.c[i], cache.k_pe[i] = lat, k_pe
            x = x + self.mla_attend(i, q_nope, q_pe, lat, k_pe, pos, form)
            h = rmsnorm(x, self.w(p + "post_attention_layernorm.weight"), c.eps)
            x = x + (self.moe(i, h) if c.layer_is_moe(i) else self.swiglu(p + "mlp.", h))
        if cache is not None:
            cache.length += tokens.size
        return rmsnorm(x, self.w("model.norm.weight"), c.eps)

    def head(self, x):
        return x @ self.w("model.embed_tokens.weight" if self.cfg.tied else "lm_head.weight").T

    def logits(self, tokens, form="expanded"):
        """[T, V] logits, the whole sequence at once."""
        return self.head(self.forward(tokens, form=form))

    def logits_stepwise(self, tokens, chunk=1, form="absorbed"):
        """[T, V] logits computed `chunk` tokens at a time through the latent
        cache, as an engine decodes."""
        cache = Cache(self.cfg.n_layers)
        rows = [self.head(self.forward(tokens[s:s + chunk], cache, form))
                for s in range(0, len(tokens), chunk)]
        return np.concatenate(rows)

    def greedy(self, prompt, n, stop_at_eos=True):
        """Greedy continuation, recomputing the whole sequence every step.
        Returns (ids, gaps): gaps[i] = top-1 minus top-2 logit at step i."""
        seq = list(prompt)
        ids, gaps = [], []
        eos = self.eos_ids() if stop_at_eos else set()
        for _ in range(n):
            row = self.logits(seq)[-1]
            top2 = np.argsort(-row, kind="stable")[:2]
            nxt = int(top2[0])
            ids.append(nxt)
            gaps.append(float(row[top2[0]] - row[top2[1]]))
            seq.append(nxt)
            if nxt in eos:
                break
        return ids, gaps


def ref_logits(model_dir, token_ids, dtype=np.float64):
    m = DeepseekRef(model_dir, dtype)
    try:
        return m.logits(token_ids)
    finally:
        m.close()


def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t.strip()]


def engine_mode(argv):
    """Imitates the engine's `logits` and `run` subcommands in float32 (logits
    --batch N: N tokens at a time through the latent cache, absorbed form)."""
    ap = argparse.ArgumentParser(prog="deepseek_ref.py " + argv[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=0)
    if argv[0] == "logits":
        ap.add_argument("--tokens", required=True)
        ap.add_argument("--out", required=True)
        ap.add_argument("--batch", type=int, default=0)
    else:
        ap.add_argument("--prompt-tokens", required=True)
        ap.add_argument("--max-new", type=int, default=32)
        ap.add_argument("--temp", type=float, default=0.0)
        ap.add_argument("--print-ids", action="store_true")
    a = ap.parse_args(argv[1:])
    m = DeepseekRef(a.model, np.float32)
    if argv[0] == "logits":
        toks = parse_ids(a.tokens)
        L = m.logits_stepwise(toks, a.batch) if a.batch else m.logits(toks)
        L.astype("<f4").tofile(a.out)
    else:
        if a.temp != 0 or not a.print_ids:
            ap.error("the reference only imitates --temp 0 --print-ids")
        ids, _ = m.greedy(parse_ids(a.prompt_tokens), a.max_new)
        print(" ".join(map(str, ids)))
    m.close()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("logits", "run"):
        return engine_mode(argv)
    ap = argparse.ArgumentParser(description="numpy reference forward pass for the DeepSeek-V3 family")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 little-endian logits [T*V] here")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    ap.add_argument("--ignore-eos", action="store_true", help="greedy: do not stop at EOS")
    ap.add_argument("--f32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="--out: N tokens at a time through the latent cache (absorbed MLA)")
    a = ap.parse_args(argv)
    toks = parse_ids(a.tokens)
    if not a.out and not a.greedy:
        ap.error("give --out and/or --greedy")
    m = DeepseekRef(a.model, np.float32 if a.f32 else np.float64)
    if a.out:
        L = m.logits_stepwise(toks, a.decode) if a.decode else m.logits(toks)
        L.astype("<f4").tofile(a.out)
    if a.greedy:
        ids, _ = m.greedy(toks, a.greedy, not a.ignore_eos)
        print(" ".join(map(str, ids)))
    m.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, OSError, st.FormatError) as e:
        print(f"deepseek_ref: {e}", file=sys.stderr)
        sys.exit(2)
