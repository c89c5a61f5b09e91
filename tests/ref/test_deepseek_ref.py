#!/usr/bin/python3
"""test_deepseek_ref - checks the DeepSeek-V3 family reference on its own.

Owns: evidence that deepseek_ref.py and gen_checkpoint's deepseek family deserve
trust, without the C engine. YaRN frequencies and softmax scales against the
numbers worked out by hand in ARCHITECTURES.md; absorbed vs expanded MLA and the
latent cache; each router against a brute-force search over expert and group
subsets; a float64 PyTorch re-implementation in the Hugging Face style
(de-interleave + rotate_half rotary, torch.topk routing) as a second opinion;
the generated checkpoints (names, shapes, dtypes, what must be skipped, planted
near-tie); bad configs; and the checker: it passes the float32 reference posing
as the engine and fails plausible engine bugs.

    /usr/bin/python3 tests/ref/test_deepseek_ref.py      (exit 0 = all passed)
"""

import itertools
import json
import math
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))
import check_model  # noqa: E402
import deepseek_ref as D  # noqa: E402
import reftest  # noqa: E402
from reftest import gen, rel_err, test, tmp, toks  # noqa: E402
import safetensors_np as st  # noqa: E402

TOL = check_model.DEFAULT_TOL


def suite_model(name):
    """A DEEPSEEK_SUITE checkpoint under the scratch directory (generated once)."""
    return reftest.suite_model(check_model.DEEPSEEK_SUITE, name)


def cfg_of(**kw):
    """A Config from a minimal V3-style dict plus overrides."""
    base = {"model_type": "deepseek_v3", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "q_lora_rank": None, "kv_lora_rank": 4, "qk_nope_head_dim": 4,
            "qk_rope_head_dim": 64, "v_head_dim": 4, "intermediate_size": 8, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 4, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1}
    base.update(kw)
    return D.Config(base)


# ---- YaRN and the softmax scale against the notes (section 2.4, 2.5) ----------

def yarn_cfg(theta, factor, beta_fast, mscale):
    return cfg_of(rope_theta=theta, qk_nope_head_dim=128, rope_scaling={
        "type": "yarn", "factor": factor, "original_max_position_embeddings": 4096,
        "beta_fast": beta_fast, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale})


@test
def yarn_matches_the_notes():
    # (theta, factor, beta_fast, mscale) -> (low, high, mscale, softmax scale) from the notes
    cases = {"DS-V3": ((1e4, 40, 32, 1.0), (10, 23, 1.368888, 0.135234)),
             "V2-Lite": ((1e4, 40, 32, 0.707), (10, 23, 1.260804, 0.114721)),
             "K2-Instruct": ((5e4, 32, 1, 1.0), (19, 20, 1.346574, 0.130861)),
             "K2.5": ((5e4, 64, 32, 1.0), (8, 20, 1.415888, 0.144680))}
    for name, ((theta, factor, bf, ms), (low, high, mscale, scale)) in cases.items():
        c = yarn_cfg(theta, factor, bf, ms)
        inv, attn = D.rope_inv_freq(c)
        f = theta ** (-np.arange(0, 64, 2) / 64.0)
        ramp = (f - inv) / (f - f / factor)      # 0: original frequency, 1: divided by factor
        assert np.allclose(ramp[:low + 1], 0, atol=1e-12), f"{name}: ramp starts after dim {low}"
        assert np.allclose(ramp[high:], 1, atol=1e-12), f"{name}: ramp ends at dim {high}"
        inner = ramp[low + 1:high]
        assert np.allclose(inner, (np.arange(low + 1, high) - low) / (high - low), atol=1e-12), name
        assert attn == 1.0, f"{name}: cos/sin factor {attn} (mscale == mscale_all_dim gives 1)"
        assert abs(D.yarn_get_mscale(factor, ms) - mscale) < 1e-6, name
        assert abs(D.softmax_scale(c) - scale) < 1e-6, f"{name}: scale {D.softmax_scale(c)}"
    assert abs(D.softmax_scale(cfg_of(qk_nope_head_dim=128)) - 0.072169) < 1e-6
    assert D.rope_inv_freq(cfg_of())[1] == 1.0
    # no mscale keys: transformers' default yarn attention factor multiplies cos/sin
    c = cfg_of(rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 64})
    assert abs(D.rope_inv_freq(c)[1] - (0.1 * math.log(4) + 1)) < 1e-15
    assert D.softmax_scale(c) == c.qk_dim ** -0.5


@test
def rotary_is_interleaved_pairs():
    """Against complex multiplication of stored pairs, and against the HF form
    (de-interleave to [evens | odds], then rotate_half) whose dot products agree."""
    rng = np.random.default_rng(1)
    c = cfg_of(qk_rope_head_dim=8, rope_theta=100.0)
    pos = np.arange(5)
    x = rng.standard_normal((5, 3, 8))
    cos, sin = D.rope_cos_sin(c, pos)
    got = D.rope_interleaved(x, cos, sin)
    inv, _ = D.rope_inv_freq(c)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * pos[:, None, None] * inv[None, None, :])
    assert np.allclose(got[..., 0::2], z.real, atol=1e-14) and np.allclose(got[..., 1::2], z.imag, atol=1e-14)
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
    hf_cos = np.concatenate([cos, cos], 1)[:, None, :]
    hf_sin = np.concatenate([sin, sin], 1)[:, None, :]
    xp = x[..., perm]
    hf = xp * hf_cos + np.concatenate([-xp[..., 4:], xp[..., :4]], -1) * hf_sin
    assert np.allclose(hf, got[..., perm], atol=1e-14)


# ---- MLA -------------------------------------------------------------------

@test
def absorbed_equals_expanded():
    worst = 0.0
    for name in ("ds-v2", "ds-v3"):
        m = D.DeepseekRef(suite_model(name))
        t = toks(2)
        full = m.logits(t)
        for other in (m.logits(t, form="absorbed"), m.logits_stepwise(t, 1),
                      m.logits_stepwise(t, 7, form="expanded"), m.logits_stepwise(t, 5)):
            worst = max(worst, rel_err(other, full))
        cache = D.Cache(m.cfg.n_layers)
        m.forward(t[:10], cache)
        for i in range(m.cfg.n_layers):
            assert cache.c[i].shape == (10, m.cfg.kv_lora) and cache.k_pe[i].shape == (10, m.cfg.rope_dim)
        m.close()
    assert worst < 1e-12, f"absorbed vs expanded {worst:.1e}"
    return f"max rel diff {worst:.1e}"


@test
def rows_do_not_see_the_future():
    m = D.DeepseekRef(suite_model("ds-v3"))
    t = toks(3, 12)
    full = m.logits(t)
    for n in range(1, len(t) + 1):
        assert rel_err(m.logits(t[:n])[-1], full[n - 1]) < 1e-12, f"row {n - 1} depends on later tokens"
    m.close()


# ---- routers against brute force ---------------------------------------------

def brute_route(c, logits, bias):
    """Direct search: the best topk_group groups by group score, then the k-subset of
    experts in them with the largest sum of selection values; weights by formula."""
    E, k = logits.shape[0], c.top_k
    if c.scoring == "softmax":
        s = np.exp(logits - logits.max())
        s /= s.sum()
    else:
        s = np.array([1 / (1 + math.exp(-v)) for v in logits])
    sel = s + bias if c.method == "noaux_tc" else s
    allowed = list(range(E))
    if c.method != "greedy" and c.n_group > 1:
        per = E // c.n_group
        groups = [list(range(g * per, (g + 1) * per)) for g in range(c.n_group)]
        if c.method == "group_limited_greedy":
            gscore = [max(sel[e] for e in grp) for grp in groups]
        else:
            gscore = [max(sel[a] + sel[b] for a, b in itertools.combinations(grp, 2)) for grp in groups]
        best = max(itertools.combinations(range(c.n_group), c.topk_group),
                   key=lambda gs: sum(gscore[g] for g in gs))
        allowed = [e for g in best for e in groups[g]]
    pick = max(itertools.combinations(allowed, k), key=lambda es: sum(sel[e] for e in es))
    w = {e: s[e] for e in pick}
    total = sum(w.values())
    for e in w:
        if k > 1 and c.norm_topk:
            w[e] /= total
        if c.model_type != "deepseek_v2" or not (k > 1 and c.norm_topk):
            w[e] *= c.scaling
    return w


@test
def routers_match_brute_force():
    rng = np.random.default_rng(4)
    variants = [
        dict(model_type="deepseek_v2", scoring_func="softmax", topk_method="greedy", n_routed_experts=12,
             num_experts_per_tok=3, norm_topk_prob=False, routed_scaling_factor=1.0),
        dict(model_type="deepseek_v2", scoring_func="softmax", topk_method="group_limited_greedy",
             n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=False,
             routed_scaling_factor=16.0),
        dict(model_type="deepseek_v2", scoring_func="softmax", topk_method="greedy", n_routed_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=3.0),
        dict(model_type="deepseek_v3", scoring_func="sigmoid", topk_method="noaux_tc", n_routed_experts=32,
             num_experts_per_tok=4, n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5),
        dict(model_type="kimi_k2", scoring_func="sigmoid", topk_method="noaux_tc", n_routed_experts=12,
             num_experts_per_tok=4, norm_topk_prob=True, routed_scaling_factor=2.827),
        dict(model_type="deepseek_v3", scoring_func="sigmoid", topk_method="greedy", n_routed_experts=10,
             num_experts_per_tok=3, norm_topk_prob=False, routed_scaling_factor=2.0),
        dict(model_type="deepseek_v3", scoring_func="softmax", topk_method="noaux_tc", n_routed_experts=12,
             num_experts_per_tok=1, n_group=3, topk_group=2, norm_topk_prob=True, routed_scaling_factor=1.5),
    ]
    rows = 0
    for v in variants:
        c = cfg_of(**v)
        E = c.n_experts
        logits = rng.standard_normal((40, E)) * 2
        bias = rng.standard_normal(E) * 0.3
        idx, w, _ = D.route(c, logits, bias)
        for t in range(logits.shape[0]):
            want = brute_route(c, logits[t], bias)
            got = dict(zip(idx[t].tolist(), w[t].tolist()))
            assert set(got) == set(want), f"{v}: row {t} picks {sorted(got)}, brute force {sorted(want)}"
            for e in got:
                assert abs(got[e] - want[e]) <= 1e-14 * max(1.0, abs(want[e])), f"{v}: weight of {e}"
            sel = (np.exp(logits[t] - logits[t].max()) / np.exp(logits[t] - logits[t].max()).sum()
                   if c.scoring == "softmax" else 1 / (1 + np.exp(-logits[t])))
            if c.method == "noaux_tc":
                sel = sel + bias
            assert all(sel[idx[t][j]] >= sel[idx[t][j + 1]] for j in range(c.top_k - 1)), "slot order"
            rows += 1
    # ties go to the lower id, in the group stage and the expert stage
    c = cfg_of(scoring_func="softmax", topk_method="greedy", n_routed_experts=4, num_experts_per_tok=1)
    assert D.route(c, np.array([[0.0, 1.0, 1.0, 0.0]]))[0].tolist() == [[1]]
    return f"{len(variants)} router variants, {rows} rows"


# ---- a second opinion in PyTorch, written the Hugging Face way -----------------

def torch_rope(cfg, T):
    """HF-style cos, sin [T, rope_dim] (halves duplicated) and the softmax scale."""
    import torch

    def get_mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    rd, base = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    pos_freqs = base ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    inv_freq, af = 1.0 / pos_freqs, 1.0
    scaling = (cfg["qk_nope_head_dim"] + rd) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs:
        fac, omax = rs["factor"], rs["original_max_position_embeddings"]

        def corr(n):
            return (rd * math.log(omax / (n * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(rs["beta_fast"])), 0), min(math.ceil(corr(rs["beta_slow"])), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=torch.float64) - lo) / ((hi + 0.001 if lo == hi else hi) - lo))
        extra = 1 - ramp.clamp(0, 1)
        inv_freq = (1.0 / (fac * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
        af = get_mscale(fac, rs["mscale"]) / get_mscale(fac, rs["mscale_all_dim"])
        scaling *= get_mscale(fac, rs["mscale_all_dim"]) ** 2
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)] * 2, -1)
    return emb.cos() * af, emb.sin() * af, scaling


def torch_moe(cfg, p, h, W, mlp):
    """HF-style router (torch.topk, masked_fill) and a per-token expert loop."""
    import torch
    T = h.shape[0]
    logits = torch.nn.functional.linear(h, W(p + "mlp.gate.weight"))
    scores = logits.softmax(-1) if cfg["scoring_func"] == "softmax" else logits.sigmoid()
    choice = scores + W(p + "mlp.gate.e_score_correction_bias") \
        if cfg["topk_method"] == "noaux_tc" else scores
    G, k = cfg["n_group"], cfg["num_experts_per_tok"]
    if cfg["topk_method"] != "greedy" and G > 1:
        grouped = choice.view(T, G, -1)
        gsc = grouped.max(-1).values if cfg["topk_method"] == "group_limited_greedy" \
            else grouped.topk(2, -1)[0].sum(-1)
        gmask = torch.zeros_like(gsc).scatter_(1, gsc.topk(cfg["topk_group"], -1)[1], 1)
        emask = gmask.unsqueeze(-1).expand(grouped.shape).reshape(T, -1)
        choice = choice.masked_fill(emask == 0, float("-inf"))
    idx = choice.topk(k, -1)[1]
    wts = scores.gather(1, idx)
    normed = k > 1 and cfg["norm_topk_prob"]
    if normed:
        wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
    if cfg["model_type"] != "deepseek_v2" or not normed:
        wts = wts * cfg["routed_scaling_factor"]
    y = torch.zeros_like(h)
    for t in range(T):
        for j in range(k):
            y[t] += wts[t, j] * mlp(f"{p}mlp.experts.{int(idx[t, j])}.", h[t])
    if cfg["n_shared_experts"]:
        y = y + mlp(p + "mlp.shared_experts.", h)
    return y


def torch_logits(model_dir, ids):
    """The family's forward pass in float64 torch: HF-style rotary (de-interleave,
    rotate_half), torch.topk routing, per-token expert loop, expanded MLA."""
    import torch
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    cfg, pre = (raw["text_config"], "language_model.") if "text_config" in raw else (raw, "")
    ck = st.Checkpoint(model_dir)

    def W(n):
        return torch.from_numpy(ck.get(pre + n, np.float64))

    def rms(x, w, eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def mlp(p, x):
        return torch.nn.functional.linear(torch.nn.functional.silu(
            torch.nn.functional.linear(x, W(p + "gate_proj.weight"))) *
            torch.nn.functional.linear(x, W(p + "up_proj.weight")), W(p + "down_proj.weight"))

    nH, nope, rd, vd = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                          "v_head_dim"))
    kvr, qr, eps = cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["rms_norm_eps"]
    T = len(ids)
    cos, sin, scaling = torch_rope(cfg, T)

    def rot(x):   # [.., T, rd] in the checkpoint's interleaved layout
        x = x.view(*x.shape[:-1], rd // 2, 2).transpose(-1, -2).reshape(x.shape)
        return x * cos + torch.cat([-x[..., rd // 2:], x[..., :rd // 2]], -1) * sin

    x = W("model.embed_tokens.weight")[torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    lin = torch.nn.functional.linear
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rms(x, W(p + "input_layernorm.weight"), eps)
        q = lin(rms(lin(h, W(a + "q_a_proj.weight")), W(a + "q_a_layernorm.weight"), 1e-6),
                W(a + "q_b_proj.weight")) if qr else lin(h, W(a + "q_proj.weight"))
        q = q.view(T, nH, nope + rd).transpose(0, 1)
        q_pass, q_rot = q.split([nope, rd], -1)
        kv_pass, k_rot = lin(h, W(a + "kv_a_proj_with_mqa.weight")).split([kvr, rd], -1)
        kv = lin(rms(kv_pass, W(a + "kv_a_layernorm.weight"), 1e-6), W(a + "kv_b_proj.weight"))
        k_pass, val = kv.view(T, nH, nope + vd).transpose(0, 1).split([nope, vd], -1)
        q_rot, k_rot = rot(q_rot), rot(k_rot.view(1, T, rd)).expand(nH, T, rd)
        qs, ks = torch.cat([q_pass, q_rot], -1), torch.cat([k_pass, k_rot], -1)
        att = torch.softmax(qs @ ks.transpose(-1, -2) * scaling + mask, -1) @ val
        x = x + lin(att.transpose(0, 1).reshape(T, nH * vd), W(a + "o_proj.weight"))
        h = rms(x, W(p + "post_attention_layernorm.weight"), eps)
        if cfg["n_routed_experts"] and i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0:
            x = x + torch_moe(cfg, p, h, W, mlp)
        else:
            x = x + mlp(p + "mlp.", h)
    out = lin(rms(x, W("model.norm.weight"), eps), W("lm_head.weight")).numpy()
    ck.close()
    return out


@test
def torch_second_opinion():
    try:
        import torch  # noqa: F401
    except ImportError:
        return "skipped: no torch"
    report = []
    for name in ("ds-v2", "ds-v3", "ds-group-softmax", "kimi-k25-wrapper"):
        t = toks(5, 24)
        r = rel_err(torch_logits(suite_model(name), t), D.ref_logits(suite_model(name), t))
        assert r < 1e-12, f"{name}: torch vs numpy {r:.1e}"
        report.append(f"{name} {r:.0e}")
    return ", ".join(report)


# ---- the generated checkpoints ------------------------------------------------

def check_layout(d):
    """Every tensor the forward reads exists with its shape and dtype; everything
    else is a recognised skip. Returns (config, Counter of skip kinds)."""
    text, prefix = D.read_config(d)
    c = D.Config(text)
    ck = st.Checkpoint(d)
    want = D.expected_tensors(c, prefix)
    kinds = {}
    for name in ck.keys():
        if name in want:
            dt, shape = ck.info(name)
            assert shape == tuple(want.pop(name)), f"{d}: {name} shape {shape}"
            assert dt == ("F32" if name.endswith("e_score_correction_bias") else "BF16"), f"{name}: {dt}"
        else:
            k = D.skipped_kind(c, prefix, name)
            assert k is not None, f"{d}: unexplained tensor {name}"
            kinds[k] = kinds.get(k, 0) + 1
    assert not want, f"{d}: missing {sorted(want)[:3]}"
    ck.close()
    return text, prefix, kinds


@test
def generated_checkpoints():
    report = []
    for name in check_model.DEEPSEEK_SUITE:
        d = suite_model(name)
        cfg, prefix, kinds = check_layout(d)
        report.append(f"{name} skips {kinds or '-'}")
        if name == "ds-v2":
            assert cfg["q_lora_rank"] is None and cfg["topk_method"] == "greedy"
            assert cfg["scoring_func"] == "softmax" and cfg["n_shared_experts"] == 2
            assert cfg["rope_scaling"]["mscale_all_dim"] == 0.707 and cfg["rope_scaling"]["type"] == "yarn"
        if name == "ds-v3":
            assert cfg["q_lora_rank"] == 48 and (cfg["n_group"], cfg["topk_group"]) == (8, 4)
            assert cfg["first_k_dense_replace"] == 3 and cfg["n_shared_experts"] == 1
            assert kinds == {"mtp": len([n for n in st.Checkpoint(d).keys() if ".layers.5." in n])}
            assert cfg["num_nextn_predict_layers"] == 1
        if name == "kimi-k2":
            assert cfg["model_type"] == "kimi_k2" and cfg["routed_scaling_factor"] == 2.827
            assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and kinds == {"inv_freq": 3}
        if name == "kimi-k25-wrapper":
            raw = json.load(open(os.path.join(d, "config.json")))
            assert prefix == "language_model." and "text_config" in raw and kinds == {"vision": 6}
        if name == "ds-near-tie":
            ck = st.Checkpoint(d)
            for i in (1, 2):
                g = ck.get(f"model.layers.{i}.mlp.gate.weight")
                b = ck.get(f"model.layers.{i}.mlp.gate.e_score_correction_bias", np.float64)
                assert np.array_equal(g[2], g[5]) and b[5] - b[2] == 4 * 2.0 ** -24
            ck.close()
        m = D.DeepseekRef(d)
        L = m.logits(toks(6))
        spread = float(np.mean(np.std(L, axis=1)))
        assert 0.5 < spread < 10, f"{name}: logit spread {spread}"
        assert len(set(L.argmax(1))) > 32, f"{name}: argmax barely varies"
        combos = {(i, tuple(sorted(r))) for i, idx in m.route_log for r in idx}
        assert len(combos) >= 20, f"{name}: routing barely varies"
        m.close()
    return "; ".join(report)


@test
def near_tie_is_hit_and_kept_in_float32():
    """The planted tie reaches the k-th/(k+1)-th boundary; float32 selection
    values keep the order, bfloat16 ones would lose it. Without a bias it is an
    exact tie won by the lower id."""
    m = D.DeepseekRef(suite_model("ds-near-tie"))
    m.logits(toks(7))
    assert m.min_route_gap == 4 * 2.0 ** -24, f"gap {m.min_route_gap}"
    ck = m.ckpt
    hits = 0
    for i, idx in m.route_log:
        for r in idx:
            if (2 in r) != (5 in r):
                assert 5 in r, "the higher selection value (expert 5) must win"
                hits += 1
    b = ck.get("model.layers.1.mlp.gate.e_score_correction_bias")
    for s in np.linspace(0.001, 0.999, 999, dtype=np.float32):
        assert np.float32(s + b[5]) > np.float32(s + b[2])
    m.close()
    d = gen("tie-softmax", *check_model.DEEPSEEK_SUITE["ds-v2"], "--router-near-tie", "3,6")
    m = D.DeepseekRef(d)
    m.logits(toks(8))
    assert m.min_route_gap == 0.0
    exact = sum((3 in r) != (6 in r) for _, idx in m.route_log for r in idx)
    assert exact and all(6 not in r or 3 in r for _, idx in m.route_log for r in idx)
    m.close()
    return f"{hits} rows at the biased tie, {exact} at the exact tie"


@test
def bad_configs_are_rejected():
    base = json.load(open(os.path.join(suite_model("ds-v3"), "config.json")))
    cases = {"n_group": dict(n_group=5), "topk_group": dict(topk_group=9),
             "scoring_func": dict(scoring_func="relu"), "topk_method": dict(topk_method="top1"),
             "model_type": dict(model_type="deepseek_v4"), "kv_lora_rank": dict(kv_lora_rank=None),
             "num_experts_per_tok": dict(num_experts_per_tok=17),
             "rope_scaling.type": dict(rope_scaling={"type": "longrope", "factor": 2})}
    for field, change in cases.items():
        try:
            D.Config(dict(base, **change))
        except ValueError as e:
            assert f"field {field}" in str(e), f"{field}: message {e}"
        else:
            raise AssertionError(f"{field}: accepted {change}")
    # latent sizes that disagree with the checkpoint, and a missing MLA tensor
    bad = tmp("bad-latent")
    shutil.copytree(suite_model("ds-v2"), bad)
    cfg = json.load(open(os.path.join(bad, "config.json")))
    json.dump(dict(cfg, kv_lora_rank=16), open(os.path.join(bad, "config.json"), "w"))
    for model, tensor in ((bad, "kv_a_proj_with_mqa"), (suite_model("ds-v3"), None)):
        m = D.DeepseekRef(model)
        if tensor is None:
            tensor = "kv_b_proj"
            m.ckpt.where.pop("model.layers.0.self_attn.kv_b_proj.weight")
        try:
            m.logits([1, 2])
        except ValueError as e:
            assert tensor in str(e), str(e)
        else:
            raise AssertionError(f"{model}: accepted a bad {tensor}")
        m.close()


@test
def float32_drift_is_small():
    worst = 0.0
    for name in check_model.DEEPSEEK_SUITE:
        d = suite_model(name)
        t = toks(9)
        worst = max(worst, rel_err(D.ref_logits(d, t, np.float32), D.ref_logits(d, t)))
    assert worst < TOL / 5, f"float32 drift {worst:.2e} is near the tolerance"
    return f"float32 drift {worst:.1e} vs tol {TOL:g}"


# ---- the checker -------------------------------------------------------------

class Mutant(D.DeepseekRef):
    """The reference with one deliberate, plausible engine bug."""

    def __init__(self, d, bug):
        super().__init__(d, np.float32)
        self.bug = bug
        c = self.cfg
        if bug == "no_mscale":
            self.scale = c.qk_dim ** -0.5
        if bug == "latent_eps_from_config":
            c.latent_eps = c.eps
        if bug == "no_shared":
            c.n_shared = 0
        if bug == "no_scaling":
            c.scaling = 1.0
        if bug == "no_groups":
            c.n_group = c.topk_group = 1

    def mla_inputs(self, i, h, cos, sin):
        if self.bug == "neox_rope":
            def neox(x, cs, sn):
                half = x.shape[-1] // 2
                shp = (x.shape[0],) + (1,) * (x.ndim - 2) + (half,)
                cc, ss = np.concatenate([cs, cs], 1).reshape(shp[:-1] + (2 * half,)), \
                    np.concatenate([sn, sn], 1).reshape(shp[:-1] + (2 * half,))
                return x * cc + np.concatenate([-x[..., half:], x[..., :half]], -1) * ss
            saved, D.rope_interleaved = D.rope_interleaved, neox
            try:
                return super().mla_inputs(i, h, cos, sin)
            finally:
                D.rope_interleaved = saved
        return super().mla_inputs(i, h, cos, sin)

    def forward(self, tokens, cache=None, form="expanded"):
        if self.bug == "no_yarn_freq":
            saved = D.rope_inv_freq
            D.rope_inv_freq = lambda c: (1.0 / c.theta ** (np.arange(0, c.rope_dim, 2) / c.rope_dim), 1.0)
            try:
                return super().forward(tokens, cache, form)
            finally:
                D.rope_inv_freq = saved
        return super().forward(tokens, cache, form)

    def route(self, i, h):
        idx, w = super().route(i, h)
        if self.bug == "bias_in_weights":
            b = self.w(f"model.layers.{i}.mlp.gate.e_score_correction_bias")
            w = w * (1 + b[idx] / np.take_along_axis(
                1 / (1 + np.exp(-(h @ self.w(f"model.layers.{i}.mlp.gate.weight").T))), idx, -1))
            w = w / w.sum(-1, keepdims=True) * self.cfg.scaling
        return idx, w


@test
def checker_catches_engine_bugs():
    cases = [("ds-v3", "neox_rope"), ("ds-v2", "no_mscale"), ("kimi-k2", "latent_eps_from_config"),
             ("ds-v3", "bias_in_weights"), ("ds-v2", "no_shared"), ("ds-v3", "no_scaling"),
             ("ds-v3", "no_groups"), ("kimi-k25-wrapper", "no_yarn_freq")]
    report = []
    for name, bug in cases:
        d = suite_model(name)
        t = toks(10)
        ref = D.ref_logits(d, t)
        m = Mutant(d, bug)
        ok, summ, det = check_model.compare_logits(ref, m.logits(t), TOL)
        m.close()
        assert not ok, f"{bug} went unnoticed on {name}: {summ}"
        report.append(f"{bug} rel={det.get('rel', float('nan')):.0e}")
    return ", ".join(report)


@test
def checker_end_to_end():
    """check_model with the float32 reference posing as the engine passes (whole
    sequence and token by token through the latent cache); a shifted prompt fails."""
    d = suite_model("ds-v3")
    fake = f"{sys.executable} {os.path.join(HERE, 'deepseek_ref.py')}"
    ok, line = check_model.check_model(d, fake, "ds-v3")
    assert ok, line
    ok, line1 = check_model.check_model(d, fake, "ds-v3", batch=1)
    assert ok, line1
    shim = tmp("bad_engine.py")
    with open(shim, "w") as f:
        f.write("import sys\nsys.path.insert(0, %r)\nimport deepseek_ref\n"
                "a = sys.argv[1:]\n"
                "if a[0] == 'run':\n"
                "    i = a.index('--prompt-tokens') + 1\n"
                "    a[i] = a[i].split(',', 1)[1]\n"
                "sys.exit(deepseek_ref.main(a))\n" % HERE)
    ok, line2 = check_model.check_model(d, f"{sys.executable} {shim}", "ds-bad")
    assert not ok and "greedy differs" in line2, line2
    return line


if __name__ == "__main__":
    sys.exit(reftest.main("df-ds-ref-test-"))
