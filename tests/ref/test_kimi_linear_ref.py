#!/usr/bin/python3
"""test_kimi_linear_ref - checks the Kimi-Linear / Kimi K3 reference on its own.

Owns: evidence that kimi_linear_ref.py and gen_checkpoint's kimi_linear / kimi_k3
checkpoints deserve trust, without the C engine: the KDA recurrence against a
scalar loop written from the formulas, the chunked WY/UT form against it (and the
factored exp(G_r)*exp(-G_c) form overflowing where the notes say), the A_log
reading rule, AttnRes on a hand-computed case and the depth-block bookkeeping,
SiTU values, an MXFP4 byte, the router against a brute-force search, the
generated layouts against the contract (names, shapes, dtypes, config fields),
stepwise == whole, causality, refused configs, float32 drift, and the checker:
it passes the float32 reference posing as the engine and fails plausible bugs.

    /usr/bin/python3 tests/ref/test_kimi_linear_ref.py      (exit 0 = all passed)
"""

import contextlib
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
import kimi_linear_ref as K  # noqa: E402
import quant_np  # noqa: E402
import reftest  # noqa: E402
from reftest import gen, rel_err, test, tmp, toks  # noqa: E402
import safetensors_np as st  # noqa: E402

TOL = check_model.KIMI_TOL


def suite_model(name):
    """A KIMI_SUITE checkpoint under the scratch directory (generated once)."""
    return reftest.suite_model(check_model.KIMI_SUITE, name)


# ---- KDA ------------------------------------------------------------------------

def kda_scalar_loop(q, k, v, g, beta):
    """The recurrence of section 4.4 with explicit index loops, one head at a time."""
    T, Hk, dk = q.shape
    dv = v.shape[2]
    o = np.zeros((T, Hk, dv))
    for h in range(Hk):
        S = [[0.0] * dv for _ in range(dk)]
        for t in range(T):
            for i in range(dk):
                for j in range(dv):
                    S[i][j] *= math.exp(g[t, h, i])
            u = [beta[t, h] * (v[t, h, j] - sum(S[i][j] * k[t, h, i] for i in range(dk))) for j in range(dv)]
            for i in range(dk):
                for j in range(dv):
                    S[i][j] += k[t, h, i] * u[j]
            for j in range(dv):
                o[t, h, j] = sum(S[i][j] * q[t, h, i] for i in range(dk))
    return o


@test
def kda_recurrent_matches_scalar_loop():
    rng = np.random.default_rng(1)
    T, Hk, dk, dv = 7, 2, 3, 4
    q, k, v = rng.standard_normal((T, Hk, dk)), rng.standard_normal((T, Hk, dk)), rng.standard_normal((T, Hk, dv))
    g = -rng.random((T, Hk, dk)) * 3
    beta = rng.random((T, Hk))
    o, _ = K.kda_recurrent(q, k, v, g, beta, np.zeros((Hk, dk, dv)))
    want = kda_scalar_loop(q, k, v, g, beta)
    assert np.max(np.abs(o - want)) < 1e-12, np.max(np.abs(o - want))


@test
def kda_chunked_equals_sequential():
    """Chunks of 1, 3, 16, 64 on 150 tokens (gates near 0, at the -5 bound and -30
    spikes, a random entering state), several seeds; also T smaller than a chunk."""
    worst = max(K.kda_selftest(s) for s in range(4))
    assert worst < 1e-10, worst
    w2 = K.kda_selftest(7, T=5, chunks=(3, 16, 64))
    assert w2 < 1e-12, w2
    return f"max rel diff {max(worst, w2):.1e}"


@test
def kda_factored_decay_overflows():
    """Why the chunked form must use exp(G_r - G_c): at K3's -5/token bound a
    64-token chunk's exp(-G_c) overflows float32 (e^320), and float64 too at -15/token."""
    G = np.cumsum(np.full(64, -5.0))
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.exp(G[-1].astype(np.float32)) * np.exp(-G.astype(np.float32))
        f64 = np.exp(3 * G[-1]) * np.exp(-3 * G)
    assert not np.all(np.isfinite(f32)) and not np.all(np.isfinite(f64))
    assert np.all(np.isfinite(np.exp(G[-1] - G)))


@test
def kda_conv_is_causal_with_state():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((9, 5)), rng.standard_normal((5, 1, 4))
    y, _ = K.causal_conv(x, w)
    for t in range(9):
        want = sum(w[:, 0, j] * (x[t - 3 + j] if t - 3 + j >= 0 else 0) for j in range(4))
        assert np.allclose(y[t], want, atol=1e-14), t
    y1, tail = K.causal_conv(x[:4], w)
    y2, _ = K.causal_conv(x[4:], w, tail)
    assert np.allclose(np.concatenate([y1, y2]), y, atol=1e-14)


# ---- A_log ----------------------------------------------------------------------

@test
def a_log_reading_rule():
    Hk, dk = 3, 8
    v = np.array([0.1, -0.7, 1.2])
    for shape in ((3,), (1, 1, 3, 1), (3, 1)):
        a, kind = K.read_a(v.reshape(shape), Hk, dk)
        assert kind == "head" and np.allclose(a, np.exp(v)[:, None] * np.ones(dk)), shape
    pad = np.zeros(dk)
    pad[:3] = v
    a, kind = K.read_a(pad, Hk, dk)
    assert kind == "head" and np.allclose(a, np.exp(v)[:, None] * np.ones(dk))
    pad[:3] = 0                               # all zero: still the padded layout, a = 1
    assert K.read_a(pad, Hk, dk)[1] == "head"
    pad[:3] = v
    pad[-1] = -0.0                            # negative zero is exactly zero
    assert K.read_a(pad, Hk, dk)[1] == "head"
    chan = pad.copy()
    chan[5] = 1e-30                           # one non-zero tail entry: per key channel
    a, kind = K.read_a(chan, Hk, dk)
    assert kind == "channel" and np.allclose(a, np.exp(chan)[None, :] * np.ones((Hk, 1)))
    same = np.linspace(-1, 1, 4)              # Hk == dk: ambiguous, read per head
    a, kind = K.read_a(same, 4, 4)
    assert kind == "head" and np.allclose(a[:, 0], np.exp(same))
    for bad in (np.zeros(5), np.zeros((2, 8)), np.zeros(16)):
        try:
            K.read_a(bad, Hk, dk, "x.A_log")
        except ValueError as e:
            assert "x.A_log" in str(e)
        else:
            raise AssertionError(f"A_log {bad.shape} accepted")


@test
def generated_a_log_layouts():
    """The suite's A_log tensors are laid out as the contract says and read as intended."""
    want = {"kimi-linear": ((1, 1, 4, 1), "head"), "k3": ((16,), "head"), "kda-chan": ((32,), "channel")}
    for name, (shape, kind) in want.items():
        m = K.KimiLinearRef(suite_model(name))
        i = min(m.cfg.kda_set)
        A = m.w(f"model.layers.{i}.self_attn.A_log")
        assert A.shape == shape, (name, A.shape)
        if name == "k3":
            assert np.all(A[4:] == 0) and np.all(A[:4] != 0)
        if name == "kda-chan":
            assert np.any(A[2:] != 0)
        m.logits(toks(1, 8))
        assert set(m.a_kind.values()) == {kind}, (name, m.a_kind)
        m.close()


# ---- AttnRes, SiTU, MXFP4, router ------------------------------------------------

@test
def attn_res_hand_computed():
    """cands [1,1], [3,-1]; norm_w [1,2], proj_w [[.5,.25]] -> pseudo-query [.5,.5];
    scores 1/sqrt(1+1e-5), 1/sqrt(5+1e-5); softmax; un-normalised values mixed."""
    out = K.attn_res([np.array([[1.0, 1.0]]), np.array([[3.0, -1.0]])], np.array([1.0, 2.0]),
                     np.array([[0.5, 0.25]]))
    want = np.array([1.7304384785578049, 0.2695615214421949])
    assert np.allclose(out[0], want, atol=1e-14, rtol=0), out
    s0, s1 = 1 / math.sqrt(1 + 1e-5), 1 / math.sqrt(5 + 1e-5)
    p0 = math.exp(s0) / (math.exp(s0) + math.exp(s1))
    assert abs(out[0, 0] - (p0 + 3 * (1 - p0))) < 1e-14


@test
def attn_res_block_bookkeeping():
    """With zero pseudo-queries (uniform mixing) and sublayers returning constants,
    the stack of section 4.3 gives, for B = 2 and 3 layers: layer 1's attention sees
    mean(e, a0+f0), layer 2's sees mean(e, a0+f0+a1+f1), and the output is
    mean(e, a0+f0+a1+f1, a2+f2)."""
    d = gen("attnres3", "--arch", "kimi_linear", "--layers", "3", "--hidden", "32", "--intermediate", "64",
            "--kda-layers", "1,3", "--kv-lora-rank", "16", "--qk-nope-dim", "8", "--qk-rope-dim", "8",
            "--v-head-dim", "8", "--experts", "4", "--top-k", "2", "--moe-intermediate", "32",
            "--attn-res-block", "2")
    m = K.KimiLinearRef(d)
    H = m.cfg.hidden
    for n in list(m.shapes):
        if n.endswith("_res_proj.weight"):
            m.W[n] = np.zeros((1, H))
    rng = np.random.default_rng(3)
    A, F = rng.standard_normal((3, H)), rng.standard_normal((3, H))
    seen = {}

    def attn(i, h, st, chunk):
        seen[i] = h.copy()
        return np.repeat(A[i][None], h.shape[0], 0)
    m.attn = attn
    m.ffn = lambda i, x: np.repeat(F[i][None], x.shape[0], 0)
    x = m.forward([5])
    e = m.w("model.embed_tokens.weight")[5]
    ln = [m.w(f"model.layers.{i}.input_layernorm.weight") for i in range(3)]
    eps = m.cfg.eps
    b0 = A[0] + F[0] + A[1] + F[1]
    assert np.allclose(seen[0][0], K.rmsnorm(e, ln[0], eps))
    assert np.allclose(seen[1][0], K.rmsnorm((e + A[0] + F[0]) / 2, ln[1], eps))
    assert np.allclose(seen[2][0], K.rmsnorm((e + b0) / 2, ln[2], eps))
    want = K.rmsnorm((e + b0 + A[2] + F[2]) / 3, m.w("model.norm.weight"), eps)
    assert np.allclose(x[0], want, atol=1e-12)
    m.close()


@test
def situ_values():
    g = np.array([2.0, -8.0, 10.0, 0.0, -50.0, 60.0])
    u = np.array([3.0, 1.0, 100.0, 5.0, 2.0, -1e4])
    got = K.situ(g, u, 4.0, 25.0)
    want = [4.861066551249867, -0.0012924578616625693, 98.59078155386423, 0.0, None, -100.0]
    for x, w in zip(got, want):
        if w is not None:
            assert abs(x - w) < 1e-12 * max(1, abs(w)), (x, w)
    assert abs(got[4]) < 1e-20                 # sigmoid of the raw g, not g/4
    f = K.situ(np.array([2.0], np.float32), np.array([3.0], np.float32), 4.0, 25.0)
    assert f.dtype == np.float32 and abs(float(f[0]) - want[0]) < 1e-5


@test
def mxfp4_known_byte():
    """0x2B: low nibble 0xB = -1.5 (column 0), high nibble 0x2 = 1.0 (column 1);
    E8M0 128 = 2^1; 0 = 2^-127 exactly."""
    got = quant_np.decode_mxfp4(np.array([[0x2B] * 16], np.uint8), np.array([[128]], np.uint8), 32)
    assert got[0, 0] == -3.0 and got[0, 1] == 2.0
    tiny = quant_np.decode_mxfp4(np.array([[0x71] * 16], np.uint8), np.array([[0]], np.uint8), 32)
    assert tiny[0, 0] == 0.5 * 2.0 ** -127 and tiny[0, 1] == 6.0 * 2.0 ** -127
    # and in a generated K3 checkpoint: the decoded expert equals the bytes decoded by hand
    m = K.KimiLinearRef(suite_model("k3"))
    name = "language_model.model.layers.1.block_sparse_moe.experts.3.w2"
    pk, sc = (m.ckpt.files[m.ckpt.where[name + s]].raw(name + s).copy() for s in (".weight_packed", ".weight_scale"))
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6]
    byte, s = int(pk[2, 5]), int(sc[2, 0])
    lo, hi = byte & 15, byte >> 4
    val = [(-1 if n & 8 else 1) * e2m1[n & 7] * 2.0 ** (s - 127) for n in (lo, hi)]
    W = m.w("model.layers.1.block_sparse_moe.experts.3.w2.weight")
    assert W[2, 10] == val[0] and W[2, 11] == val[1], (W[2, 10:12], val)
    m.close()


class _C:
    pass


def brute_route(c, logits, bias):
    s = 1 / (1 + np.exp(-logits))
    out = []
    for t in range(logits.shape[0]):
        sel = s[t] + bias
        E = len(sel)
        allowed = range(E)
        if c.grouped and c.n_group > 1:
            G, per = c.n_group, E // c.n_group
            gsc = [sum(sorted(sel[g * per:(g + 1) * per])[-2:]) for g in range(G)]
            best = max(itertools.combinations(range(G), c.topk_group), key=lambda gs: sum(gsc[g] for g in gs))
            allowed = [e for e in range(E) if e // per in best]
        pick = max(itertools.combinations(allowed, c.top_k), key=lambda es: sum(sel[e] for e in es))
        w = s[t][list(pick)]
        if c.renorm:
            w = w / (w.sum() + 1e-20)
        out.append((sorted(pick), dict(zip(pick, w * c.scaling))))
    return out


@test
def router_against_brute_force():
    rng = np.random.default_rng(4)
    for grouped, G, tg, k, renorm, scale in ((False, 1, 1, 3, True, 2.446), (True, 4, 2, 3, False, 2.0),
                                              (True, 4, 1, 2, True, 1.0), (True, 2, 2, 4, True, 1.0)):
        c = _C()
        c.grouped, c.n_group, c.topk_group, c.top_k, c.renorm, c.scaling = grouped, G, tg, k, renorm, scale
        logits, bias = rng.standard_normal((20, 8)) * 2, rng.standard_normal(8) * 0.1
        idx, w, _ = K.route(c, logits, bias)
        for t, (ids, wmap) in enumerate(brute_route(c, logits, bias)):
            assert sorted(idx[t]) == ids, (grouped, t, idx[t], ids)
            for e, x in zip(idx[t], w[t]):
                assert abs(x - wmap[e]) < 1e-12


# ---- generated checkpoints against the contract ---------------------------------

F32_SUFFIXES = ("conv1d.weight", ".A_log", ".dt_bias", "o_norm.weight", "e_score_correction_bias")


@test
def generated_layouts_follow_contract():
    """Every tensor the reference reads is there with the contract's shape and dtype
    (MXFP4 experts: U8 packed [rows, cols/2] + U8 scales [rows, cols/32]); every other
    tensor is a vision tensor of the K3 wrapper; config fields as the contract spells them."""
    notes = []
    for name in check_model.KIMI_SUITE:
        d = suite_model(name)
        m = K.KimiLinearRef(d)
        with open(os.path.join(d, "config.json")) as f:
            raw = json.load(f)
        wrapped = name.startswith("k3")
        if wrapped:
            assert raw["model_type"] == "kimi_k3" and raw["architectures"] == ["KimiK3ForConditionalGeneration"]
            assert "vision_config" in raw and raw["text_config"]["model_type"] == "kimi_linear"
            assert m.prefix == "language_model."
        else:
            assert raw["model_type"] == "kimi_linear" and raw["architectures"] == ["KimiLinearForCausalLM"]
        text = raw.get("text_config", raw)
        for f in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "rms_norm_eps",
                  "num_attention_heads", "num_key_value_heads", "kv_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim", "num_experts", "num_experts_per_token",
                  "num_shared_experts", "moe_intermediate_size", "moe_renormalize",
                  "moe_router_activation_func", "routed_scaling_factor", "first_k_dense_replace",
                  "moe_layer_freq", "use_grouped_topk", "num_expert_group", "topk_group", "hidden_act"):
            assert f in text, (name, f)
        assert text["mla_use_nope"] is True and text["rms_norm_eps"] == 1e-5 and not text["tie_word_embeddings"]
        lac = text["linear_attn_config"]
        assert sorted(lac["kda_layers"] + lac["full_attn_layers"]) == list(range(1, text["num_hidden_layers"] + 1))
        qc = text.get("quantization_config")
        assert (qc is not None) == (name == "k3") and "quantization_config" not in raw
        seen = set()
        n_mx = 0
        for full, shape in m.shapes.items():
            mod, _, suf = full.rpartition(".")
            kind, stored = m.weights.stored(full) if suf == "weight" else (None, [(full,) + m.ckpt.info(full)])
            assert stored, (name, full, "missing")
            for tn, dt, shp in stored:
                seen.add(tn)
                if kind == "mxfp4":
                    want = {"weight_packed": ("U8", (shape[0], shape[1] // 2)),
                            "weight_scale": ("U8", (shape[0], shape[1] // 32))}[tn.rpartition(".")[2]]
                    assert (dt, shp) == want, (name, tn, dt, shp)
                    n_mx += 1
                    continue
                assert kind is None, (name, tn, kind)
                want_dt = "F32" if tn.endswith(F32_SUFFIXES) else "BF16"
                assert dt == want_dt, (name, tn, dt)
                if shape is not None:
                    assert shp == tuple(shape), (name, tn, shp, shape)
            if kind == "mxfp4":
                assert ".block_sparse_moe.experts." in full and full.endswith((".w1.weight", ".w2.weight",
                                                                                ".w3.weight")), full
        rest = set(m.ckpt.keys()) - seen
        assert all(K.skipped_kind(t) == "vision" for t in rest), (name, sorted(rest)[:4])
        assert bool(rest) == wrapped
        if name == "k3":
            E = text["num_experts"]
            n_moe = sum(m.cfg.layer_is_moe(i) for i in range(m.cfg.n_layers))
            assert n_mx == 2 * 3 * E * n_moe, n_mx
        notes.append(f"{name} {len(seen)}+{len(rest)}")
        m.close()
    return ", ".join(notes)


@test
def refused_configs():
    base = {"model_type": "kimi_linear", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 2,
            "intermediate_size": 8, "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 4,
            "qk_rope_head_dim": 4, "v_head_dim": 4, "mla_use_nope": True,
            "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 2, "head_dim": 4},
            "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 4}
    K.Config(base)
    bad = [({"mla_use_nope": False}, "mla_use_nope"),
           ({"num_key_value_heads": 1}, "num_key_value_heads"),
           ({"hidden_act": "gelu"}, "hidden_act"),
           ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func"),
           ({"num_experts_per_token": 5}, "num_experts_per_token"),
           ({"linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [2], "num_heads": 2,
                                    "head_dim": 4}}, "kda_layers"),
           ({"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [], "num_heads": 2,
                                    "head_dim": 4}}, "kda_layers"),
           ({"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [3], "num_heads": 2,
                                    "head_dim": 4}}, "full_attn_layers"),
           ({"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "head_dim": 4}}, "num_heads"),
           ({"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 2, "head_dim": 4,
                                    "gate_lower_bound": 5.0}}, "gate_lower_bound"),
           ({"latent_moe_use_norm": True}, "latent_moe_use_norm"),
           ({"use_grouped_topk": True, "num_expert_group": 3}, "num_expert_group"),
           ({"model_type": "deepseek_v3"}, "model_type")]
    for over, field in bad:
        cfg = dict(base)
        cfg.update(over)
        try:
            K.Config(cfg, "cfg")
        except ValueError as e:
            assert field in str(e), (field, str(e))
        else:
            raise AssertionError(f"accepted {over}")
    # a tensor of the wrong shape is named
    d = suite_model("kda-chan")
    bad_dir = tmp("bad-alog")
    shutil.copytree(d, bad_dir)
    path = os.path.join(bad_dir, "model.safetensors")
    ck = st.Checkpoint(bad_dir)
    tensors = {n: ck.files[ck.where[n]].raw(n).copy() for n in ck.keys()}
    dtypes = {n: ck.info(n)[0] for n in ck.keys()}
    ck.close()
    tensors["model.layers.0.self_attn.A_log"] = np.zeros(5, np.float32)
    w = st.SafeTensorsWriter(path, [(n, dtypes[n], a.shape) for n, a in tensors.items()])
    for n, a in tensors.items():
        w.write_part(n, a, raw=True)
    w.close()
    m = K.KimiLinearRef(bad_dir)
    try:
        m.logits([1, 2])
    except ValueError as e:
        assert "model.layers.0.self_attn.A_log" in str(e), str(e)
    else:
        raise AssertionError("A_log [5] accepted")
    m.close()
    return f"{len(bad)} configs, 1 tensor"


# ---- forward-pass properties -----------------------------------------------------

@test
def stepwise_chunked_and_whole_agree():
    """Whole sequence token by token == KDA chunked (16, 64) == fed in calls of 1, 5
    and 64 tokens through the recurrent state and latent cache."""
    worst = 0.0
    for name in check_model.KIMI_SUITE:
        m = K.KimiLinearRef(suite_model(name))
        t = toks(5, 40)
        ref = m.logits(t)
        for L in (m.logits(t, chunk=16), m.logits(t, chunk=64), m.logits_stepwise(t, 1),
                  m.logits_stepwise(t, 5, chunk=3), m.logits_stepwise(t, 64, chunk=16)):
            worst = max(worst, rel_err(L, ref))
        m.close()
    assert worst < 1e-11, worst
    return f"max rel diff {worst:.1e}"


@test
def causal():
    m = K.KimiLinearRef(suite_model("k3"))
    t = toks(6, 30)
    full = m.logits(t)
    part = m.logits(t[:17])
    assert np.max(np.abs(full[:17] - part)) < 1e-11
    m.close()


@test
def float32_drift_within_tolerance():
    worst = []
    for name in check_model.KIMI_SUITE:
        d = suite_model(name)
        t = toks(1234)
        L64 = K.ref_logits(d, t)
        L32 = K.ref_logits(d, t, np.float32)
        worst.append(rel_err(L32, L64))
    assert max(worst) < TOL / 5, worst
    return "rel " + ", ".join(f"{w:.1e}" for w in worst)


# ---- the checker ------------------------------------------------------------------

@contextlib.contextmanager
def patched(**kw):
    saved = {k: getattr(K, k) for k in kw}
    for k, v in kw.items():
        setattr(K, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(K, k, v)


class Mutant(K.KimiLinearRef):
    """The reference with one plausible engine bug."""

    def __init__(self, d, bug):
        super().__init__(d)
        self.bug = bug
        c = self.cfg
        if bug == "attn_res_block_shift":      # new blocks one layer late
            c.attn_res += 1
        elif bug == "no_latent_norm":
            c.latent_norm = False
        elif bug == "no_scaling":
            c.scaling = 1.0
        elif bug == "no_mla_gate":              # (g_proj still present, just unused)
            c.mla_gate = False

    def kda_qk(self, q, k):
        q, k = super().kda_qk(q, k)
        if self.bug == "no_q_scale":
            q = q * math.sqrt(q.shape[-1])
        return q, k

    def kda_decay(self, i, h):
        if self.bug == "a_log_wrong_reading":
            orig = K.read_a

            def other(A, Hk, dk, where=""):
                a, kind = orig(A, Hk, dk, where)
                if kind == "head":           # read K3's padded layout per channel
                    return np.repeat(np.exp(np.asarray(A).reshape(-1)[:dk])[None, :], Hk, 0), "channel"
                return np.repeat(np.exp(np.asarray(A)[:Hk])[:, None], dk, 1), "head"
            with patched(read_a=other):
                return super().kda_decay(i, h)
        return super().kda_decay(i, h)

    def ffn(self, i, x):
        if self.bug == "situ_linear_no_tanh":
            with patched(situ=lambda g, u, b, lb: b * np.tanh(g / b) * K.sigmoid(g) * u):
                return super().ffn(i, x)
        if self.bug == "situ_sigmoid_scaled":
            with patched(situ=lambda g, u, b, lb: b * np.tanh(g / b) * K.sigmoid(g / b) * lb * np.tanh(u / lb)):
                return super().ffn(i, x)
        return super().ffn(i, x)

    def forward(self, tokens, st=None, chunk=0):
        ctx = contextlib.nullcontext()
        if self.bug == "decay_after_update":
            def rec(q, k, v, g, beta, S):
                o = np.empty_like(v)
                S = S.copy()
                for t in range(q.shape[0]):
                    u = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", k[t], S))
                    S = (S + k[t][:, :, None] * u[:, None, :]) * np.exp(g[t])[:, :, None]
                    o[t] = np.einsum("hk,hkv->hv", q[t], S)
                return o, S
            ctx = patched(kda_recurrent=rec)
        elif self.bug == "conv_taps_reversed":
            orig = K.causal_conv
            ctx = patched(causal_conv=lambda x, w, tail=None: orig(x, w[:, :, ::-1], tail))
        elif self.bug == "beta_outside_delta":
            def rec(q, k, v, g, beta, S):
                o = np.empty_like(v)
                S = S.copy()
                for t in range(q.shape[0]):
                    S = S * np.exp(g[t])[:, :, None]
                    u = beta[t][:, None] * v[t] - np.einsum("hk,hkv->hv", k[t], S)
                    S = S + k[t][:, :, None] * u[:, None, :]
                    o[t] = np.einsum("hk,hkv->hv", q[t], S)
                return o, S
            ctx = patched(kda_recurrent=rec)
        elif self.bug == "attn_res_normalized_values":
            def ar(cands, norm_w, proj_w):
                X = np.stack(cands)
                keys = X / np.sqrt(np.mean(X * X, -1, keepdims=True) + 1e-5)
                p = K.softmax(keys @ (norm_w * proj_w.reshape(-1)), axis=0)
                return np.sum(p[:, :, None] * keys, axis=0)
            ctx = patched(attn_res=ar)
        with ctx:
            return super().forward(tokens, st, chunk)


@test
def checker_catches_engine_bugs():
    cases = [("k3", "no_q_scale"), ("kimi-linear", "no_q_scale"), ("k3", "a_log_wrong_reading"),
             ("kda-chan", "a_log_wrong_reading"), ("k3", "situ_linear_no_tanh"),
             ("k3", "situ_sigmoid_scaled"), ("k3", "no_latent_norm"), ("kimi-linear", "no_scaling"),
             ("kda-chan", "no_scaling"), ("k3", "no_mla_gate"), ("kimi-linear", "decay_after_update"),
             ("k3", "conv_taps_reversed"), ("k3", "beta_outside_delta"), ("k3", "attn_res_normalized_values"),
             ("k3", "attn_res_block_shift")]
    report = []
    for name, bug in cases:
        d = suite_model(name)
        t = toks(10)
        ref = K.ref_logits(d, t)
        m = Mutant(d, bug)
        ok, summ, det = check_model.compare_logits(ref, m.logits(t), TOL)
        m.close()
        assert not ok, f"{bug} went unnoticed on {name}: {summ}"
        report.append(f"{bug}@{name} {det.get('rel', float('nan')):.0e}")
    return ", ".join(report)


@test
def checker_end_to_end():
    """check_model with the float32 reference posing as the engine passes (whole
    sequence, and 3 tokens per call through the state); a shifted prompt fails."""
    d = suite_model("k3")
    fake = f"{sys.executable} {os.path.join(HERE, 'ref_engine.py')}"
    ok, line = check_model.check_model(d, fake, "k3")
    assert ok, line
    ok, line3 = check_model.check_model(d, fake, "k3", batch=3)
    assert ok, line3
    shim = tmp("bad_engine.py")
    with open(shim, "w") as f:
        f.write("import sys\nsys.path.insert(0, %r)\nimport kimi_linear_ref\n"
                "a = sys.argv[1:]\n"
                "if a[0] == 'run':\n"
                "    i = a.index('--prompt-tokens') + 1\n"
                "    a[i] = a[i].split(',', 1)[1]\n"
                "sys.exit(kimi_linear_ref.main(a))\n" % HERE)
    ok, line2 = check_model.check_model(d, f"{sys.executable} {shim}", "k3-bad")
    assert not ok and "greedy differs" in line2, line2
    return line


if __name__ == "__main__":
    sys.exit(reftest.main("df-kimi-ref-test-"))
