#!/usr/bin/python3
"""kimi_linear_ref - an independent numpy forward pass of Kimi-Linear and Kimi K3.

Owns: the reference logits for model_type kimi_linear (KDA + gated NoPE MLA
hybrid) and its Kimi K3 wrapper (model_type kimi_k3: text_config, tensors
prefixed `language_model.`, vision tensors never read). Written from the
architecture description (../shared/notes/ARCHITECTURES.md sections 1.2, 1.3,
4, 8 and the checkpoint contract that fixes what they leave open), never from
the C engine, so that a shared misreading is unlikely. The checkpoint contract
(config fields and values, tensors and shapes) is kimi_linear_config.py.

Precision: stored weights (BF16/F32, MXFP4 routed experts decoded exactly by
quant_np) are widened and all math is float64 (dtype=np.float32 / --f32 runs
the same code in float32, only to measure drift).

Forward, positions 0..T-1 (no position enters anywhere: NoPE, recurrent KDA):
  KDA layer, per head h (dk = dv = head_dim):
    q,k,v = SiLU(causal depthwise conv_K(proj x)), zeros before the sequence
    q = q / sqrt(sum q^2 + 1e-6) / sqrt(dk);  k = k / sqrt(sum k^2 + 1e-6)
    z = f_b(f_a x) + dt_bias;  g = lb*sigmoid(a*z) (gate_lower_bound) or -a*softplus(z)
    a = exp(A_log) per head or per key channel (read_a below); beta = sigmoid(b_proj x)
    S = diag(exp g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
    out = o_proj(concat_h rmsnorm(o_h, o_norm) * sigmoid(gate_h)),
          gate = g_proj x or g_b(g_a x)
    kda_chunked() is the WY/UT chunked form of the same recurrence (section 4.4).
  MLA layer: DeepSeek MLA without any rotary: q = q_proj x or q_b(rmsnorm(q_a x));
    [c | k_pe] = kv_a x, c = rmsnorm(c); kv_b(c) per head = [k_nope | v];
    softmax((q_nope.k_nope + q_pe.k_pe) / sqrt(nope + rope)) causal; optional
    output gate sigmoid(g_proj x) on the heads' concat; o_proj.
  FFN: dense MLP (act(gate x) * up x), or MoE: sigmoid router + correction bias
    (optionally grouped), weights renormalised and scaled, routed experts on x
    or on the latent routed_expert_down_proj x (then routed_expert_up_proj of
    the optionally normed sum), plus shared experts. act = SiLU or SiTU.
  Residuals: plain pre-norm, or attention residuals (section 4.3).
  Every RMSNorm uses rms_norm_eps; AttnRes keys use 1e-5 without weight.

CLI (the same as deepseek_ref.py; --selftest: chunked vs token-by-token KDA):
  kimi_linear_ref.py --model DIR --tokens 1,2,3 --out FILE   float32 LE logits [T*V]
  kimi_linear_ref.py --model DIR --tokens 1,2,3 --greedy N   prints the continuation ids
  kimi_linear_ref.py logits|run ...   imitates the engine's subcommands in float32
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_linear_config import (Config, expected_tensors, is_family, is_linear,  # noqa: E402,F401
                                read_config, skipped_kind)
import quant_np  # noqa: E402
import safetensors_np as st  # noqa: E402

L2_EPS = 1e-6          # KDA q/k l2norm: x * rsqrt(sum x^2 + 1e-6)
ATTN_RES_EPS = 1e-5    # AttnRes keys: rsqrt(mean x^2 + 1e-5), no weight


# ---- elementwise pieces ---------------------------------------------------------

def rmsnorm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + x.dtype.type(eps)) * w


def sigmoid(x):
    """Overflow-free logistic function."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.logaddexp(x.dtype.type(0), x)


def situ(g, u, beta, lin_beta):
    """SiTU (section 1.2): [b*tanh(g/b)*sigmoid(g)] * [lb*tanh(u/lb)]; the sigmoid sees raw g."""
    t = g.dtype.type
    return (t(beta) * np.tanh(g / t(beta)) * sigmoid(g)) * (t(lin_beta) * np.tanh(u / t(lin_beta)))


def l2norm(x, eps=L2_EPS):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_conv(x, w, tail=None):
    """Depthwise causal conv per channel: y_t = sum_j w[c,0,j] * x_{t-K+1+j}, zeros
    before the sequence (or `tail`, the K-1 inputs before x). x [T, C], w [C, 1, K].
    Returns (y [T, C], the last K-1 inputs for the next call)."""
    C, _, K = w.shape
    T = x.shape[0]
    prev = np.zeros((K - 1, C), dtype=x.dtype) if tail is None else tail
    xp = np.concatenate([prev, x])
    y = np.zeros_like(x)
    for j in range(K):
        y += w[:, 0, j] * xp[j:j + T]
    return y, xp[xp.shape[0] - (K - 1):].copy()


def attn_res(cands, norm_w, proj_w):
    """AttnRes (section 4.3): per position, softmax over candidates of
    score_i = sum_d key_i[d] * norm_w[d] * proj_w[d], key_i = cand_i * rsqrt(mean cand_i^2 + 1e-5),
    returning the softmax-weighted sum of the un-normalized candidates. cands: list of [T, D]."""
    X = np.stack(cands)                                   # [N, T, D]
    keys = X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + X.dtype.type(ATTN_RES_EPS))
    q = norm_w * proj_w.reshape(-1)
    p = softmax(keys @ q, axis=0)                         # [N, T]
    return np.sum(p[:, :, None] * X, axis=0)


def read_a(A_log, Hk, dk, where="A_log"):
    """The contract's A_log reading: (a [Hk, dk] float64-or-input dtype, 'head' | 'channel').
    numel == Hk (any shape, e.g. [Hk] or [1,1,Hk,1]): per head a_h = exp(A_log[h]);
    shape [dk] with Hk < dk and entries [Hk:] exactly zero: per head from the first Hk
    (K3's zero-padded layout); other [dk]: per key channel a[h][d] = exp(A_log[d])."""
    v = np.asarray(A_log)
    if v.size == Hk:
        return np.repeat(np.exp(v.reshape(Hk))[:, None], dk, axis=1), "head"
    if v.shape == (dk,):
        if Hk < dk and np.all(v[Hk:] == 0):
            return np.repeat(np.exp(v[:Hk])[:, None], dk, axis=1), "head"
        return np.repeat(np.exp(v)[None, :], Hk, axis=0), "channel"
    raise ValueError(f"tensor {where}: shape {list(v.shape)}, expected {Hk} elements (per head) "
                     f"or [{dk}] (head_dim)")


# ---- KDA recurrence, two forms --------------------------------------------------

def kda_recurrent(q, k, v, g, beta, S):
    """Token by token. q, k [T, Hk, dk] (normalised, q scaled), v [T, Hk, dv],
    g [T, Hk, dk] log-decay (<= 0), beta [T, Hk], S [Hk, dk, dv] entering state.
    Returns (o [T, Hk, dv], S after the last token)."""
    o = np.empty_like(v)
    S = S.copy()
    for t in range(q.shape[0]):
        S *= np.exp(g[t])[:, :, None]                         # decay rows (key channels)
        kS = np.einsum("hk,hkv->hv", k[t], S)
        u = beta[t][:, None] * (v[t] - kS)                    # delta rule
        S += k[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", q[t], S)
    return o, S


def _solve_unit_lower(A, B):
    """X with (I + A) X = B, A strictly lower triangular: forward substitution."""
    X = B.copy()
    for r in range(1, X.shape[0]):
        X[r] -= A[r, :r] @ X[:r]
    return X


def kda_chunked(q, k, v, g, beta, S, C):
    """The WY/UT chunked form (section 4.4), chunks of C tokens, same arguments and
    result as kda_recurrent. Decay ratios are always formed as exp(G_r - G_c) with
    r >= c (<= 1), never exp(G_r) * exp(-G_c)."""
    T, Hk, dk = q.shape
    o = np.empty_like(v)
    S = S.copy()
    ninf = q.dtype.type(-np.inf)
    for c0 in range(0, T, C):
        n = min(C, T - c0)
        sl = slice(c0, c0 + n)
        low = np.tril(np.ones((n, n), dtype=bool))            # c <= r
        strict = np.tril(np.ones((n, n), dtype=bool), -1)     # c < r
        for h in range(Hk):
            Q, K, V, B = q[sl, h], k[sl, h], v[sl, h], beta[sl, h]
            G = np.cumsum(g[sl, h], axis=0)                   # [n, dk], within the chunk
            D = np.exp(np.where(low[:, :, None], G[:, None, :] - G[None, :, :], ninf))  # [r, c, dk]
            A = np.where(strict, B[:, None] * np.einsum("rd,rcd,cd->rc", K, D, K), 0)
            U = _solve_unit_lower(A, B[:, None] * V)
            W = _solve_unit_lower(A, B[:, None] * K * np.exp(G))
            Vn = U - W @ S[h]
            P = np.einsum("rd,rcd,cd->rc", Q, D, K)           # zero above the diagonal
            o[sl, h] = (Q * np.exp(G)) @ S[h] + P @ Vn
            S[h] = np.exp(G[-1])[:, None] * S[h] + (K * np.exp(G[-1][None, :] - G)).T @ Vn
    return o, S


def kda_selftest(seed=0, T=150, Hk=3, dk=8, dv=8, chunks=(1, 3, 16, 64)):
    """Chunked vs token-by-token KDA on random inputs (q, k normalised, random entering
    state, per-channel gates mixing ~0, the -5 bound, and -30 spikes). Returns the
    largest relative difference of outputs and final states over `chunks`."""
    rng = np.random.default_rng(seed)
    q = l2norm(rng.standard_normal((T, Hk, dk))) / math.sqrt(dk)
    k = l2norm(rng.standard_normal((T, Hk, dk)))
    v = rng.standard_normal((T, Hk, dv))
    g = -5.0 * sigmoid(3.0 * rng.standard_normal((T, Hk, dk)))
    g[rng.random((T, Hk, dk)) < 0.05] = -30.0
    g[:, 0, :2] = -1e-4                       # channels that barely decay
    beta = sigmoid(2.0 * rng.standard_normal((T, Hk)))
    S0 = 0.3 * rng.standard_normal((Hk, dk, dv))
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, S0)
    worst = 0.0
    for C in chunks:
        o, s = kda_chunked(q, k, v, g, beta, S0, C)
        if not (np.all(np.isfinite(o)) and np.all(np.isfinite(s))):
            raise AssertionError(f"chunk {C}: non-finite output")
        worst = max(worst, float(np.max(np.abs(o - o_ref)) / np.max(np.abs(o_ref))),
                    float(np.max(np.abs(s - s_ref)) / np.max(np.abs(s_ref))))
    return worst


def route(c, logits, bias):
    """(idx [T,k], weights [T,k], min gap) for router logits [T, E] (contract
    "Router"): s = sigmoid(logits); selection s + bias; with use_grouped_topk and
    num_expert_group > 1 a group scores the sum of its top-2 selection values and
    only the topk_group best groups stay; top-k in slot order (value descending,
    ties to the lower id); weights s[idx], / (sum + 1e-20) when moe_renormalize,
    times routed_scaling_factor. gap: closest kept-vs-dropped distance."""
    T, E = logits.shape
    s = sigmoid(logits)
    sel = s + bias[None, :]
    gap = math.inf
    if c.grouped and c.n_group > 1:
        G = c.n_group
        gs = np.sort(sel.reshape(T, G, E // G), axis=-1)[:, :, -2:].sum(axis=-1)
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
    w = np.take_along_axis(s, idx, axis=-1)
    if c.renorm:
        w = w / (np.sum(w, axis=-1, keepdims=True) + w.dtype.type(1e-20))
    return idx, w * w.dtype.type(c.scaling), gap


class State:
    """Everything carried between calls: per KDA layer the state S [Hk, dk, dv] and
    the conv tails of q, k, v; per MLA layer the normalised latents and k_pe of
    every position so far."""

    def __init__(self, n_layers):
        self.kda = [None] * n_layers
        self.lat = [None] * n_layers
        self.k_pe = [None] * n_layers
        self.length = 0


class KimiLinearRef:
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
        self.route_log = []
        self.a_kind = {}   # KDA layer -> 'head' | 'channel' (the A_log reading used)

    def close(self):
        self.ckpt.close()

    def w(self, name):
        """Tensor `name` (without the wrapper prefix), shape-checked, widened."""
        full = self.prefix + name
        if full not in self.W:
            if full not in self.weights:
                raise ValueError(f"{self.dir}: tensor {full} missing")
            a = self.weights.get(full, self.dtype)
            want = self.shapes.get(full)
            if want is not None and a.shape != tuple(want):
                raise ValueError(f"{self.dir}: tensor {full} has shape {list(a.shape)}, "
                                 f"config implies {list(want)}")
            self.W[full] = a
        return self.W[full]

    def eos_ids(self):
        e = self.gen.get("eos_token_id", self.cfg.raw.get("eos_token_id"))
        if e is None:
            return set()
        return set(e) if isinstance(e, list) else {e}

    # ---- KDA -----------------------------------------------------------------
    def kda_decay(self, i, h):
        """Log-decay g [T, Hk, dk] of KDA layer i for normed inputs h [T, H]."""
        c = self.cfg
        Hk, dk = c.kda_heads, c.kda_dim
        a_ = f"model.layers.{i}.self_attn."
        z = (h @ self.w(a_ + "f_a_proj.weight").T) @ self.w(a_ + "f_b_proj.weight").T
        z = z.reshape(-1, Hk, dk) + self.w(a_ + "dt_bias").reshape(Hk, dk)
        a, kind = read_a(self.w(a_ + "A_log"), Hk, dk, self.prefix + a_ + "A_log")
        self.a_kind[i] = kind
        t = self.dtype.type
        if c.gate_lb is not None:
            return t(c.gate_lb) * sigmoid(a * z)
        return -a * softplus(z)

    def kda_qk(self, q, k):
        """Per head: q = l2norm(q) / sqrt(dk), k = l2norm(k). q, k [T, Hk, dk]."""
        return l2norm(q) / self.dtype.type(math.sqrt(q.shape[-1])), l2norm(k)

    def kda(self, i, h, st=None, chunk=0):
        """KDA layer i on normed inputs h [T, H]; st: State (updated) or None
        (the sequence starts here). chunk > 0: the chunked form."""
        c = self.cfg
        T = h.shape[0]
        Hk, dk = c.kda_heads, c.kda_dim
        a_ = f"model.layers.{i}.self_attn."
        prev = st.kda[i] if st is not None else None
        tails, out = {}, {}
        for n in ("q", "k", "v"):
            x = h @ self.w(f"{a_}{n}_proj.weight").T
            y, tails[n] = causal_conv(x, self.w(f"{a_}{n}_conv1d.weight"), prev["tail"][n] if prev else None)
            out[n] = silu(y).reshape(T, Hk, dk)
        q, k = self.kda_qk(out["q"], out["k"])
        g = self.kda_decay(i, h)
        beta = sigmoid(h @ self.w(a_ + "b_proj.weight").T)
        S0 = prev["S"] if prev else np.zeros((Hk, dk, dk), dtype=self.dtype)
        o, S = kda_chunked(q, k, out["v"], g, beta, S0, chunk) if chunk else \
            kda_recurrent(q, k, out["v"], g, beta, S0)
        if st is not None:
            st.kda[i] = {"S": S, "tail": tails}
        o = rmsnorm(o, self.w(a_ + "o_norm.weight"), c.eps)
        if c.full_rank_gate:
            gate = h @ self.w(a_ + "g_proj.weight").T
        else:
            gate = (h @ self.w(a_ + "g_a_proj.weight").T) @ self.w(a_ + "g_b_proj.weight").T
        o = o * sigmoid(gate.reshape(T, Hk, dk))
        return o.reshape(T, Hk * dk) @ self.w(a_ + "o_proj.weight").T

    # ---- MLA (NoPE, optionally gated) ------------------------------------------
    def mla(self, i, h, st=None):
        c = self.cfg
        T, nH = h.shape[0], c.n_heads
        a_ = f"model.layers.{i}.self_attn."
        if c.q_lora:
            q = rmsnorm(h @ self.w(a_ + "q_a_proj.weight").T, self.w(a_ + "q_a_layernorm.weight"), c.eps)
            q = q @ self.w(a_ + "q_b_proj.weight").T
        else:
            q = h @ self.w(a_ + "q_proj.weight").T
        q = q.reshape(T, nH, c.qk_dim)
        kv_a = h @ self.w(a_ + "kv_a_proj_with_mqa.weight").T
        lat = rmsnorm(kv_a[:, :c.kv_lora], self.w(a_ + "kv_a_layernorm.weight"), c.eps)
        k_pe = kv_a[:, c.kv_lora:]
        start = 0
        if st is not None:
            start = st.length
            if st.lat[i] is not None:
                lat = np.concatenate([st.lat[i], lat])
                k_pe = np.concatenate([st.k_pe[i], k_pe])
            st.lat[i], st.k_pe[i] = lat, k_pe
        S = lat.shape[0]
        kv = (lat @ self.w(a_ + "kv_b_proj.weight").T).reshape(S, nH, c.nope + c.v_dim)
        k_nope, v = kv[..., :c.nope], kv[..., c.nope:]
        s = np.einsum("thn,shn->hts", q[..., :c.nope], k_nope) + \
            np.einsum("thr,sr->hts", q[..., c.nope:], k_pe)
        s = s * self.dtype.type(1.0 / math.sqrt(c.qk_dim))
        allowed = np.arange(S)[None, :] <= (start + np.arange(T))[:, None]
        p = softmax(np.where(allowed[None], s, -np.inf), axis=-1)
        o = np.einsum("hts,shv->thv", p, v).reshape(T, nH * c.v_dim)
        if c.mla_gate:
            o = o * sigmoid(h @ self.w(a_ + "g_proj.weight").T)
        return o @ self.w(a_ + "o_proj.weight").T

    # ---- FFN ------------------------------------------------------------------
    def act(self, g, u):
        c = self.cfg
        return situ(g, u, c.situ_beta, c.situ_lin) if c.act == "situ" else silu(g) * u

    def mlp(self, prefix, x, names=("gate_proj", "up_proj", "down_proj")):
        g = x @ self.w(f"{prefix}{names[0]}.weight").T
        u = x @ self.w(f"{prefix}{names[1]}.weight").T
        return self.act(g, u) @ self.w(f"{prefix}{names[2]}.weight").T

    def route(self, i, x):
        s = f"model.layers.{i}.block_sparse_moe.gate."
        idx, wts, gap = route(self.cfg, x @ self.w(s + "weight").T, self.w(s + "e_score_correction_bias"))
        self.min_route_gap = min(self.min_route_gap, gap)
        self.route_log.append((i, idx))
        return idx, wts

    def moe(self, i, x):
        c = self.cfg
        s = f"model.layers.{i}.block_sparse_moe."
        idx, wts = self.route(i, x)                  # the router sees the full-width x
        u = x @ self.w(s + "routed_expert_down_proj.weight").T if c.latent else x
        y = np.zeros_like(u)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            y[rows] += wts[rows, slot][:, None] * self.mlp(f"{s}experts.{e}.", u[rows], ("w1", "w3", "w2"))
        if c.latent:
            if c.latent_norm:
                y = rmsnorm(y, self.w(s + "routed_expert_norm.weight"), c.eps)
            y = y @ self.w(s + "routed_expert_up_proj.weight").T
        if c.n_shared:
            y = y + self.mlp(s + "shared_experts.", x)
        return y

    def ffn(self, i, x):
        return self.moe(i, x) if self.cfg.layer_is_moe(i) else self.mlp(f"model.layers.{i}.mlp.", x)

    def attn(self, i, h, st, chunk):
        return self.kda(i, h, st, chunk) if self.cfg.layer_is_kda(i) else self.mla(i, h, st)

    # ---- model ----------------------------------------------------------------
    def forward(self, tokens, st=None, chunk=0):
        """Hidden states after the final norm [T, hidden] of tokens at positions
        st.length.. (0.. without a State); st gains their KDA/MLA state.
        chunk > 0: KDA in the chunked form with chunks of that many tokens."""
        c = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("tokens: need a non-empty 1-D sequence")
        if tokens.min() < 0 or tokens.max() >= c.vocab:
            raise ValueError(f"tokens: ids must be in [0, {c.vocab})")
        x = self.w("model.embed_tokens.weight")[tokens].copy()
        x = self.stack_attn_res(x, st, chunk) if c.attn_res else self.stack_plain(x, st, chunk)
        if st is not None:
            st.length += tokens.size
        return rmsnorm(x, self.w("model.norm.weight"), c.eps)

    def stack_plain(self, x, st, chunk):
        """Pre-norm residual: h += Attn(norm h); h += FFN(norm h)."""
        c = self.cfg
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            x = x + self.attn(i, rmsnorm(x, self.w(p + "input_layernorm.weight"), c.eps), st, chunk)
            x = x + self.ffn(i, rmsnorm(x, self.w(p + "post_attention_layernorm.weight"), c.eps))
        return x

    def stack_attn_res(self, x, st, chunk):
        """Attention residuals, section 4.3 verbatim: `part` sums the sublayer outputs
        of the current depth block, `anchors` holds the completed blocks (the embedding
        is anchor 0); a new block starts when L % B == 0."""
        c = self.cfg
        B = c.attn_res
        part, anchors = x, []
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            a_in = part if not anchors else attn_res(
                anchors + [part], self.w(p + "self_attention_res_norm.weight"),
                self.w(p + "self_attention_res_proj.weight"))
            if i % B == 0:
                anchors.append(part)
                pre = np.zeros_like(part)
            else:
                pre = part
            pre = pre + self.attn(i, rmsnorm(a_in, self.w(p + "input_layernorm.weight"), c.eps), st, chunk)
            m_in = attn_res(anchors + [pre], self.w(p + "mlp_res_norm.weight"), self.w(p + "mlp_res_proj.weight"))
            part = pre + self.ffn(i, rmsnorm(m_in, self.w(p + "post_attention_layernorm.weight"), c.eps))
        return attn_res(anchors + [part], self.w("model.output_attn_res_norm.weight"),
                        self.w("model.output_attn_res_proj.weight"))

    def head(self, x):
        return x @ self.w("lm_head.weight").T

    def logits(self, tokens, chunk=0):
        """[T, V] logits, the whole sequence at once (KDA token by token, or chunked)."""
        return self.head(self.forward(tokens, chunk=chunk))

    def logits_stepwise(self, tokens, step=1, chunk=0):
        """[T, V] logits computed `step` tokens per call through a State, as an
        engine prefills in pieces and decodes."""
        st = State(self.cfg.n_layers)
        rows = [self.head(self.forward(tokens[s:s + step], st, chunk)) for s in range(0, len(tokens), step)]
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
    m = KimiLinearRef(model_dir, dtype)
    try:
        return m.logits(token_ids)
    finally:
        m.close()


def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t.strip()]


def engine_mode(argv):
    """Imitates the engine's `logits` and `run` subcommands in float32 (logits
    --batch N: N tokens per call through the recurrent state, KDA chunked by 16)."""
    ap = argparse.ArgumentParser(prog="kimi_linear_ref.py " + argv[0])
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
    m = KimiLinearRef(a.model, np.float32)
    if argv[0] == "logits":
        toks = parse_ids(a.tokens)
        L = m.logits_stepwise(toks, a.batch, chunk=16) if a.batch else m.logits(toks)
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
    if argv == ["--selftest"]:
        worst = max(kda_selftest(s) for s in range(3))
        ok = worst < 1e-10
        print(f"kda chunked (1, 3, 16, 64) vs token by token: max rel diff {worst:.1e} "
              f"{'ok' if ok else 'FAIL'}")
        return 0 if ok else 1
    ap = argparse.ArgumentParser(description="numpy reference forward pass for Kimi-Linear / Kimi K3")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 little-endian logits [T*V] here")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    ap.add_argument("--ignore-eos", action="store_true", help="greedy: do not stop at EOS")
    ap.add_argument("--f32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="--out: N tokens per call through the recurrent state and latent cache")
    ap.add_argument("--kda-chunk", type=int, default=0, metavar="C",
                    help="--out: KDA in the chunked WY/UT form, C tokens per chunk (0: token by token)")
    a = ap.parse_args(argv)
    toks = parse_ids(a.tokens)
    if not a.out and not a.greedy:
        ap.error("give --out and/or --greedy")
    m = KimiLinearRef(a.model, np.float32 if a.f32 else np.float64)
    if a.out:
        L = m.logits_stepwise(toks, a.decode, a.kda_chunk) if a.decode else m.logits(toks, a.kda_chunk)
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
        print(f"kimi_linear_ref: {e}", file=sys.stderr)
        sys.exit(2)
