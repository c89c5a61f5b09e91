#!/usr/bin/python3
"""qwen3_ref - an independent numpy forward pass of Hugging Face Qwen3 / Qwen3-MoE.

Owns: the reference logits the C engine is checked against. Written from the
transformers modeling semantics of Qwen3 (model_type "qwen3") and Qwen3-MoE
("qwen3_moe"), not from the engine's code, so that a shared misreading is
unlikely.

Precision: stored weights (BF16/F16/F32, or FP8 / INT4 / MXFP4 as the
checkpoint's quantization_config says, decoded by quant_np) are widened exactly
and all math runs in float64 by default, so the result is the mathematically intended forward pass up
to ~1e-15 and any float32 engine should land within float32 rounding of it.
Pass dtype=np.float32 (CLI --f32) to run the same code in float32; that is only
used to estimate how far a correct float32 implementation can drift.

Forward, per token sequence starting at position 0:
  x = embed_tokens[ids]
  per layer:  h = rmsnorm(x, input_layernorm)
              q, k, v = h Wq^T, h Wk^T, h Wv^T        (no biases)
              q, k = rmsnorm over head_dim with q_norm / k_norm, per head
              q, k = rotary (NeoX halves: x*cos + rotate_half(x)*sin)
              a = softmax(q k^T * head_dim^-0.5, causal) v   (GQA: head h reads
                  kv head h // (n_heads / n_kv_heads))
              x = x + a Wo^T
              h = rmsnorm(x, post_attention_layernorm)
              x = x + mlp(h)   dense: down(silu(gate h) * up h)
                               MoE:   softmax over all router logits, top-k,
                                      optional renormalisation, weighted expert sum
  logits = rmsnorm(x, model.norm) lm_head^T   (embed_tokens when tied)

CLI:
  qwen3_ref.py --model DIR --tokens 1,2,3 --out FILE   float32 LE logits [T*V]
  qwen3_ref.py --model DIR --tokens 1,2,3 --greedy N   prints the continuation ids
  qwen3_ref.py logits|run ...   imitates the engine's subcommands in float32 (for
                                testing check_model without the engine)
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


def is_linear(name):
    """Whether tensor `name` is the weight of a Linear layer (what a quantization
    config quantizes): anything but the embedding and the norms; Qwen3-MoE's
    router (mlp.gate) is an nn.Linear."""
    mod, _, suf = name.rpartition(".")
    last = mod.rpartition(".")[2]
    return suf == "weight" and last != "embed_tokens" and "norm" not in last


def _rope_params(cfg):
    """rope_scaling (legacy "type" or "rope_type" key) -> normalised dict or None."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not rs:
        return None
    rs = dict(rs)
    kind = rs.get("rope_type", rs.get("type", "default"))
    rs["rope_type"] = kind
    if kind == "default":
        return None
    return rs


class Config:
    """The fields of config.json the forward pass uses, with the transformers
    defaults for absent keys."""

    def __init__(self, cfg):
        self.raw = cfg
        self.model_type = cfg.get("model_type")
        if self.model_type not in ("qwen3", "qwen3_moe"):
            raise ValueError(f"config.json: model_type {self.model_type!r} is not qwen3/qwen3_moe")
        self.vocab = cfg["vocab_size"]
        self.hidden = cfg["hidden_size"]
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        # Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has no such field and
        # the attention module falls back to hidden/heads.
        default_hd = 128 if self.model_type == "qwen3" else self.hidden // self.n_heads
        self.head_dim = cfg.get("head_dim") or default_hd
        self.intermediate = cfg.get("intermediate_size")
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        if cfg.get("rope_parameters") and "rope_theta" in cfg["rope_parameters"]:
            self.theta = cfg["rope_parameters"]["rope_theta"]
        self.max_pos = cfg.get("max_position_embeddings", 32768)
        self.rope = _rope_params(cfg)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if cfg.get("attention_bias"):
            raise ValueError("config.json: attention_bias=true is not part of Qwen3")
        # Sliding window: Qwen3 ships with use_sliding_window=false; kept for
        # completeness (layers >= max_window_layers use the window).
        self.sliding_window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        self.max_window_layers = cfg.get("max_window_layers", self.n_layers)
        moe = self.model_type == "qwen3_moe"
        self.n_experts = cfg.get("num_experts", 128) if moe else 0
        self.top_k = cfg.get("num_experts_per_tok", 8) if moe else 0
        self.moe_intermediate = cfg.get("moe_intermediate_size", 768) if moe else 0
        self.sparse_step = cfg.get("decoder_sparse_step", 1) if moe else 1
        self.mlp_only = list(cfg.get("mlp_only_layers") or []) if moe else []
        self.norm_topk = bool(cfg.get("norm_topk_prob", False)) if moe else False

    def layer_is_moe(self, i):
        return (self.model_type == "qwen3_moe" and i not in self.mlp_only
                and self.n_experts > 0 and (i + 1) % self.sparse_step == 0)

    def layer_window(self, i):
        if self.sliding_window is not None and i >= self.max_window_layers:
            return self.sliding_window
        return None


def rope_inv_freq(c, seq_len):
    """(inv_freq [head_dim/2] float64, attention_factor) for the configured rotary
    variant, following transformers' _compute_*_parameters functions."""
    dim = c.head_dim
    base = float(c.theta)
    exps = np.arange(0, dim, 2, dtype=np.float64) / dim
    rs = c.rope
    if rs is None:
        return 1.0 / base ** exps, 1.0
    kind = rs["rope_type"]
    if kind == "linear":
        return (1.0 / base ** exps) / float(rs["factor"]), 1.0
    if kind == "dynamic":
        # NTK-aware base stretch once the sequence outgrows the trained length;
        # recomputed from the current length (full-sequence semantics).
        factor = float(rs["factor"])
        mp = int(rs.get("original_max_position_embeddings") or c.max_pos)
        L = max(seq_len, mp)
        b = base * ((factor * L / mp) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / b ** exps, 1.0
    if kind == "yarn":
        factor = float(rs["factor"])
        # transformers >= 4.56 (PR #40320): the configured factor is used as is;
        # original_max_position_embeddings only sets the correction range. Older
        # releases replaced factor by max_position_embeddings / original when the
        # latter was present; gen_checkpoint's suite keeps the two equal.
        omax = int(rs.get("original_max_position_embeddings") or c.max_pos)
        attn = rs.get("attention_factor")
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attn is None:
            if mscale and mscale_all:
                attn = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
            else:
                attn = get_mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap_w = 1.0 - ramp            # 1: keep the original frequency
        pos_freqs = base ** exps
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap_w) + (1.0 / pos_freqs) * extrap_w
        return inv, float(attn)
    raise ValueError(f"rope_scaling: rope_type {kind!r} not supported by the reference")


def rope_cos_sin(c, T, dtype=np.float64):
    """cos, sin [T, head_dim] for positions 0..T-1 (halves duplicated, NeoX
    layout), already multiplied by the attention factor."""
    inv, attn = rope_inv_freq(c, T)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=1)
    return (np.cos(emb) * attn).astype(dtype), (np.sin(emb) * attn).astype(dtype)


def apply_rope(x, cos, sin):
    """x [T, heads, hd]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a)."""
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def rmsnorm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + x.dtype.type(eps)) * w


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


class Qwen3Ref:
    def __init__(self, model_dir, dtype=np.float64):
        self.dir = model_dir
        self.dtype = np.dtype(dtype)
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = Config(json.load(f))
        self.gen = {}
        gp = os.path.join(model_dir, "generation_config.json")
        if os.path.exists(gp):
            with open(gp) as f:
                self.gen = json.load(f)
        self.ckpt = st.Checkpoint(model_dir)
        self.quant = quant_np.read_quant_config(model_dir)
        self.weights = quant_np.Weights(self.ckpt, self.quant, is_linear)
        self.W = {}   # widened weights, filled on first use; tests may overwrite
        # Smallest gap between the k-th and (k+1)-th expert probability seen so far:
        # where it is tiny, a float32 engine may legitimately route differently.
        self.min_route_gap = math.inf

    def close(self):
        self.ckpt.close()

    def w(self, name, shape=None):
        if name not in self.W:
            a = self.weights.get(name, self.dtype)
            if shape is not None and a.shape != tuple(shape):
                raise ValueError(f"{self.dir}: tensor {name} has shape {a.shape}, config implies {tuple(shape)}")
            self.W[name] = a
        return self.W[name]

    def eos_ids(self):
        e = self.gen.get("eos_token_id", self.cfg.raw.get("eos_token_id"))
        if e is None:
            return set()
        return set(e) if isinstance(e, list) else {e}

    # ---- blocks ------------------------------------------------------------
    def attention(self, i, h, cos, sin):
        c = self.cfg
        T = h.shape[0]
        nH, nKV, hd, H = c.n_heads, c.n_kv, c.head_dim, c.hidden
        p = f"model.layers.{i}.self_attn."
        q = (h @ self.w(p + "q_proj.weight", (nH * hd, H)).T).reshape(T, nH, hd)
        k = (h @ self.w(p + "k_proj.weight", (nKV * hd, H)).T).reshape(T, nKV, hd)
        v = (h @ self.w(p + "v_proj.weight", (nKV * hd, H)).T).reshape(T, nKV, hd)
        q = rmsnorm(q, self.w(p + "q_norm.weight", (hd,)), c.eps)
        k = rmsnorm(k, self.w(p + "k_norm.weight", (hd,)), c.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = nH // nKV
        scale = self.dtype.type(hd ** -0.5)
        qi = np.arange(T)[:, None]
        kj = np.arange(T)[None, :]
        allowed = kj <= qi
        win = c.layer_window(i)
        if win is not None:
            allowed &= kj > qi - win
        out = np.empty((T, nH, hd), dtype=self.dtype)
        for hh in range(nH):
            kv = hh // rep
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale
            s = np.where(allowed, s, -np.inf)
            out[:, hh, :] = softmax(s, axis=-1) @ v[:, kv, :]
        return out.reshape(T, nH * hd) @ self.w(p + "o_proj.weight", (H, nH * hd)).T

    def mlp_dense(self, prefix, h, inter):
        H = self.cfg.hidden
        g = h @ self.w(prefix + "gate_proj.weight", (inter, H)).T
        u = h @ self.w(prefix + "up_proj.weight", (inter, H)).T
        return (silu(g) * u) @ self.w(prefix + "down_proj.weight", (H, inter)).T

    def route(self, i, h):
        """(expert ids [T, k], weights [T, k]): softmax over all experts, top-k by
        probability (equal probabilities: lower expert id first), optional
        renormalisation of the k weights."""
        c = self.cfg
        logits = h @ self.w(f"model.layers.{i}.mlp.gate.weight", (c.n_experts, c.hidden)).T
        probs = softmax(logits, axis=-1)
        order = np.argsort(-probs, axis=-1, kind="stable")
        idx = order[:, :c.top_k]
        wts = np.take_along_axis(probs, idx, axis=-1)
        if c.top_k < c.n_experts:
            nxt = np.take_along_axis(probs, order[:, c.top_k:c.top_k + 1], axis=-1)
            self.min_route_gap = min(self.min_route_gap, float(np.min(wts[:, -1:] - nxt)))
        if c.norm_topk:
            wts = wts / np.sum(wts, axis=-1, keepdims=True)
        return idx, wts

    def mlp_moe(self, i, h):
        c = self.cfg
        idx, wts = self.route(i, h)
        out = np.zeros_like(h)
        for e in range(c.n_experts):
            rows, slot = np.nonzero(idx == e)
            if rows.size == 0:
                continue
            y = self.mlp_dense(f"model.layers.{i}.mlp.experts.{e}.", h[rows], c.moe_intermediate)
            out[rows] += wts[rows, slot][:, None] * y
        return out

    # ---- model -------------------------------------------------------------
    def hidden_states(self, tokens):
        c = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("tokens: need a non-empty 1-D sequence")
        if tokens.min() < 0 or tokens.max() >= c.vocab:
            raise ValueError(f"tokens: ids must be in [0, {c.vocab})")
        T = tokens.size
        x = self.w("model.embed_tokens.weight", (c.vocab, c.hidden))[tokens].copy()
        cos, sin = rope_cos_sin(c, T, self.dtype)
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            h = rmsnorm(x, self.w(p + "input_layernorm.weight", (c.hidden,)), c.eps)
            x = x + self.attention(i, h, cos, sin)
            h = rmsnorm(x, self.w(p + "post_attention_layernorm.weight", (c.hidden,)), c.eps)
            if c.layer_is_moe(i):
                x = x + self.mlp_moe(i, h)
            else:
                x = x + self.mlp_dense(p + "mlp.", h, c.intermediate)
        return rmsnorm(x, self.w("model.norm.weight", (c.hidden,)), c.eps)

    def logits(self, tokens):
        c = self.cfg
        x = self.hidden_states(tokens)
        head = "model.embed_tokens.weight" if c.tied else "lm_head.weight"
        return x @ self.w(head, (c.vocab, c.hidden)).T

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
    """[T, V] logits of token_ids (positions 0..T-1) in `dtype`."""
    m = Qwen3Ref(model_dir, dtype)
    try:
        return m.logits(token_ids)
    finally:
        m.close()


def ref_greedy(model_dir, prompt, n, stop_at_eos=True, dtype=np.float64):
    m = Qwen3Ref(model_dir, dtype)
    try:
        return m.greedy(prompt, n, stop_at_eos)
    finally:
        m.close()


def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t.strip()]


def engine_mode(argv):
    """Imitates the engine's `logits` and `run` subcommands, computing in float32,
    so check_model's plumbing can be exercised without the C engine:
        check_model.py --suite --engine "/usr/bin/python3 tests/ref/qwen3_ref.py"
    """
    ap = argparse.ArgumentParser(prog="qwen3_ref.py " + argv[0])
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
    m = Qwen3Ref(a.model, np.float32)
    if argv[0] == "logits":
        m.logits(parse_ids(a.tokens)).astype("<f4").tofile(a.out)
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
    ap = argparse.ArgumentParser(description="numpy reference forward pass for Qwen3 / Qwen3-MoE")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 little-endian logits [T*V] here")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    ap.add_argument("--ignore-eos", action="store_true", help="greedy: do not stop at EOS")
    ap.add_argument("--f32", action="store_true", help="compute in float32 instead of float64")
    a = ap.parse_args(argv)
    dtype = np.float32 if a.f32 else np.float64
    toks = parse_ids(a.tokens)
    if not a.out and not a.greedy:
        ap.error("give --out and/or --greedy")
    m = Qwen3Ref(a.model, dtype)
    if a.out:
        m.logits(toks).astype("<f4").tofile(a.out)
    if a.greedy:
        ids, _ = m.greedy(toks, a.greedy, not a.ignore_eos)
        print(" ".join(map(str, ids)))
    m.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, OSError, st.FormatError) as e:
        print(f"qwen3_ref: {e}", file=sys.stderr)
        sys.exit(2)
