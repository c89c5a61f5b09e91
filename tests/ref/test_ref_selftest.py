#!/usr/bin/python3
"""test_ref_selftest - checks the Python side on its own, without the C engine.

Owns: evidence that the reference and the checker deserve trust. Covers the
safetensors reader/writer (BF16 rounding, round trips, hostile headers), the
generator (names, shapes, sharding, MoE layer pattern), the reference against
independent re-derivations (a naive per-position attention loop, complex-number
rotary, YaRN's ramp endpoints, MoE identities, batch vs. prefix-by-prefix), and
the checker itself: it must pass the float32 reference posing as the engine and
fail plausible engine bugs (interleaved rotary, skipped k_norm, GQA head mix-up,
ignored YaRN attention factor, wrong routing normalisation, shifted prompts).

    /usr/bin/python3 tests/ref/test_ref_selftest.py      (exit 0 = all passed)
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))
import check_model  # noqa: E402
import gen_checkpoint  # noqa: E402
import qwen3_ref as R  # noqa: E402
import reftest  # noqa: E402
from reftest import gen, rel_err, test, tmp  # noqa: E402
import safetensors_np as st  # noqa: E402


DENSE = ["--arch", "qwen3", "--seed", "3", "--vocab", "256", "--hidden", "32", "--intermediate", "64",
         "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
MOE = ["--arch", "qwen3_moe", "--seed", "4", "--vocab", "256", "--hidden", "32", "--intermediate", "64",
       "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--experts", "6",
       "--top-k", "2", "--moe-intermediate", "16"]


# ---- safetensors -----------------------------------------------------------

@test
def bf16_rounding():
    def bits(u32):
        return np.array([u32], dtype=np.uint32).view(np.float32)

    cases = [
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F808000, 0x3F80),  # 1 + 2^-8: exact tie, even stays
        (0x3F818000, 0x3F82),  # tie with odd lsb rounds up
        (0x3F808001, 0x3F81),  # just above the tie
        (0x3F807FFF, 0x3F80),  # just below the tie
        (0xBFC00000, 0xBFC0),  # -1.5
        (0x7F7FFFFF, 0x7F80),  # max float rounds to inf
        (0x7F800000, 0x7F80),  # inf
        (0xFF800000, 0xFF80),  # -inf
        (0x00000001, 0x0000),  # smallest subnormal rounds to 0
        (0x00018000, 0x0002),  # subnormal tie, odd -> up
    ]
    for u, want in cases:
        got = int(st.f32_to_bf16(bits(u))[0])
        assert got == want, f"{u:#010x} -> {got:#06x}, want {want:#06x}"
    nan = st.f32_to_bf16(bits(0x7FFFFFFF))
    assert np.isnan(st.bf16_to_f32(nan))[0], "NaN must stay NaN"
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    back = st.bf16_to_f32(st.f32_to_bf16(x))
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8), "BF16 error above half an ulp"
    assert np.array_equal(st.bf16_to_f32(st.f32_to_bf16(back)), back), "BF16 not idempotent"


@test
def safetensors_roundtrip():
    p = tmp("rt.safetensors")
    rng = np.random.default_rng(1)
    t = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7),
         "c": rng.standard_normal((2, 2, 2)), "empty": np.zeros((0, 4))}
    dt = {"a": "F32", "b": "BF16", "c": "F16", "empty": "F32"}
    st.save_file(p, t, dt, {"format": "pt"})
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    assert (8 + n) % 8 == 0, "data block not 8-byte aligned"
    assert hdr["__metadata__"] == {"format": "pt"}
    with st.SafeTensorsFile(p) as f:
        assert np.array_equal(f.get("a"), t["a"])
        assert np.array_equal(f.get("b"), st.bf16_to_f32(st.f32_to_bf16(t["b"].astype(np.float32))))
        assert np.array_equal(f.get("c"), t["c"].astype(np.float16).astype(np.float32))
        assert f.get("empty").shape == (0, 4)
        assert f.info("c") == ("F16", (2, 2, 2))


@test
def safetensors_rejects_bad_files():
    good = tmp("good.safetensors")
    st.save_file(good, {"x": np.ones(4), "y": np.ones(2)})
    raw = open(good, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])

    def variant(name, data):
        p = tmp(name)
        with open(p, "wb") as f:
            f.write(data)
        try:
            st.SafeTensorsFile(p).close()
        except st.FormatError:
            return
        raise AssertionError(f"{name} accepted")

    def with_header(h):
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + raw[8 + n:]

    variant("truncated", raw[:-3])
    variant("short", raw[:5])
    variant("hugelen", struct.pack("<Q", 1 << 40) + raw[8:])
    h = json.loads(json.dumps(hdr))
    h["y"]["data_offsets"] = [0, 8]            # overlaps x
    variant("overlap", with_header(h))
    h = json.loads(json.dumps(hdr))
    h["x"]["shape"] = [5]                       # size disagrees with offsets
    variant("badshape", with_header(h))
    h = json.loads(json.dumps(hdr))
    h["x"]["dtype"] = "Q7"
    variant("baddtype", with_header(h))
    variant("notjson", struct.pack("<Q", 4) + b"{{{{" + raw[8 + n:])


# ---- generator -------------------------------------------------------------

@test
def generator_layout():
    d = gen("moe-layout", "--arch", "qwen3_moe", "--vocab", "128", "--hidden", "16", "--intermediate",
            "24", "--layers", "6", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--experts",
            "4", "--top-k", "2", "--moe-intermediate", "8", "--decoder-sparse-step", "2",
            "--mlp-only-layers", "3", "--tie-embeddings", "1")
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert [gen_checkpoint.layer_is_moe(cfg, i) for i in range(6)] == \
        [False, True, False, False, False, True], "MoE layer pattern"
    ck = st.Checkpoint(d)
    names = set(ck.keys())
    assert "lm_head.weight" not in names, "tied model must not store lm_head"
    assert ck.info("model.layers.1.mlp.gate.weight") == ("BF16", (4, 16))
    assert ck.info("model.layers.5.mlp.experts.3.down_proj.weight") == ("BF16", (16, 8))
    assert ck.info("model.layers.3.mlp.gate_proj.weight") == ("BF16", (24, 16))
    assert ck.info("model.layers.0.self_attn.q_proj.weight") == ("BF16", (16, 16))
    assert ck.info("model.layers.0.self_attn.k_proj.weight") == ("BF16", (8, 16))
    assert ck.info("model.layers.0.self_attn.o_proj.weight") == ("BF16", (16, 16))
    assert ck.info("model.layers.0.self_attn.q_norm.weight") == ("BF16", (8,))
    assert "model.layers.3.mlp.gate.weight" not in names
    # Qwen3's special ids lie past a tiny vocab: auto leaves bos/eos out
    gc = json.load(open(os.path.join(d, "generation_config.json")))
    assert not any(k in cfg or k in gc for k in ("bos_token_id", "eos_token_id"))
    a = gen_checkpoint.parse_args(["--out", "x", "--vocab", "151936"])
    assert (gen_checkpoint.build_config(a)["eos_token_id"], gen_checkpoint.generation_config(a)["eos_token_id"]) \
        == (151645, [151645, 151643])
    n_expected = 1 + 6 * 8 + 2 * (1 + 4 * 3) + 4 * 3 + 1
    assert len(names) == n_expected, f"{len(names)} tensors, expected {n_expected}"
    ck.close()


@test
def generator_sharding():
    one = gen("shard1", *DENSE)
    many = gen("shardN", *DENSE, "--max-shard-size", "20000")
    idx = json.load(open(os.path.join(many, "model.safetensors.index.json")))
    files = sorted(set(idx["weight_map"].values()))
    assert len(files) >= 3, f"expected several shards, got {files}"
    n = len(files)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for fn in files:
        hdr, _, start = st.read_header(os.path.join(many, fn))
        data = os.path.getsize(os.path.join(many, fn)) - start
        assert data <= 20000 or len(hdr) == 1, f"{fn}: {data} bytes over the shard limit"
    a, b = st.Checkpoint(one), st.Checkpoint(many)
    assert sorted(a.keys()) == sorted(b.keys())
    total = 0
    for k in a.keys():
        x = a.get(k)
        assert np.array_equal(x, b.get(k)), f"{k} differs between sharded and single-file"
        total += x.size * 2
    assert idx["metadata"]["total_size"] == total
    a.close()
    b.close()
    toks = [5, 9, 200, 31, 7]
    assert np.array_equal(R.ref_logits(one, toks), R.ref_logits(many, toks))


@test
def generator_is_not_degenerate():
    d = gen("nondegen", *MOE)
    m = R.Qwen3Ref(d)
    toks = np.random.default_rng(5).integers(0, 256, 48)
    L = m.logits(toks)
    spread = float(np.mean(np.std(L, axis=1)))
    assert 0.5 < spread < 10, f"logit spread {spread}"
    assert len(set(L.argmax(1))) > 24, "argmax barely varies"
    h = R.rmsnorm(m.w("model.embed_tokens.weight")[toks], m.w("model.layers.0.post_attention_layernorm.weight"), 1e-6)
    idx, _ = m.route(0, h)
    assert len({tuple(sorted(r)) for r in idx}) >= 6, "routing barely varies"
    m.close()


# ---- reference vs independent derivations ---------------------------------

@test
def batch_equals_prefix_by_prefix():
    for d in (gen("bp-dense", *DENSE), gen("bp-moe", *MOE)):
        m = R.Qwen3Ref(d)
        toks = [int(x) for x in np.random.default_rng(6).integers(0, 256, 12)]
        full = m.logits(toks)
        for t in range(1, len(toks) + 1):
            row = m.logits(toks[:t])[-1]
            assert rel_err(row, full[t - 1]) < 1e-12, f"{d}: row {t - 1} depends on later tokens"
        m.close()


def naive_attention(m, i, h, T):
    """Per position, per head, written out: the textbook definition."""
    c = m.cfg
    p = f"model.layers.{i}.self_attn."
    Wq, Wk, Wv, Wo = (m.w(p + n + "_proj.weight") for n in "qkvo")
    qn, kn = m.w(p + "q_norm.weight"), m.w(p + "k_norm.weight")
    hd, half = c.head_dim, c.head_dim // 2
    inv = 1.0 / c.theta ** (np.arange(half) * 2.0 / hd)

    def norm_rope(vec, w, pos):
        vec = vec / math.sqrt(np.mean(vec * vec) + c.eps) * w
        z = (vec[:half] + 1j * vec[half:]) * np.exp(1j * pos * inv)
        return np.concatenate([z.real, z.imag])

    out = np.zeros((T, c.n_heads * hd))
    for t in range(T):
        for hh in range(c.n_heads):
            g = hh * c.n_kv // c.n_heads
            q = norm_rope((Wq @ h[t])[hh * hd:(hh + 1) * hd], qn, t)
            s = np.array([norm_rope((Wk @ h[j])[g * hd:(g + 1) * hd], kn, j) @ q / math.sqrt(hd)
                          for j in range(t + 1)])
            a = np.exp(s - s.max())
            a /= a.sum()
            out[t, hh * hd:(hh + 1) * hd] = sum(a[j] * (Wv @ h[j])[g * hd:(g + 1) * hd]
                                               for j in range(t + 1))
    return out @ Wo.T


@test
def attention_matches_naive_loop():
    for kv in ("1", "2", "4"):
        d = gen("attn-kv" + kv, *(DENSE[:-4] + ["--kv-heads", kv, "--head-dim", "16"]))
        m = R.Qwen3Ref(d)
        T = 9
        h = np.random.default_rng(7).standard_normal((T, m.cfg.hidden))
        cos, sin = R.rope_cos_sin(m.cfg, T)
        assert rel_err(m.attention(0, h, cos, sin), naive_attention(m, 0, h, T)) < 1e-12, f"kv={kv}"
        m.close()


@test
def rope_properties():
    d = gen("rope", *DENSE)
    c = R.Qwen3Ref(d).cfg
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 40, 1, c.head_dim))
    cos, sin = R.rope_cos_sin(c, 40)
    rq, rk = R.apply_rope(q, cos, sin), R.apply_rope(k, cos, sin)
    # A rotation: norms kept; q.k depends on the position difference only.
    assert np.allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-12)
    qq = np.repeat(q[:1], 40, axis=0)
    kk = np.repeat(k[:1], 40, axis=0)
    a, b = R.apply_rope(qq, cos, sin)[:, 0], R.apply_rope(kk, cos, sin)[:, 0]
    for s in range(1, 30):
        assert abs(a[s + 5] @ b[5] - a[s + 10] @ b[10]) < 1e-9, "not relative"
    assert np.allclose(rq[0], q[0]) and np.allclose(rk[0], k[0]), "position 0 must be identity"


def with_rope(cfg, rope):
    c = R.Config(dict(cfg.raw, rope_scaling=rope))
    return c


@test
def rope_scaling_identities():
    d = gen("rs", *DENSE, "--rope-theta", "10000", "--max-pos", "4096")
    base = R.Qwen3Ref(d).cfg
    inv0, a0 = R.rope_inv_freq(base, 64)
    for rope in ({"rope_type": "yarn", "factor": 1.0},
                 {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096},
                 {"rope_type": "linear", "factor": 1.0},
                 {"rope_type": "dynamic", "factor": 3.0},      # within max_pos: unchanged
                 {"rope_type": "default"}):
        inv, a = R.rope_inv_freq(with_rope(base, rope), 64)
        assert np.allclose(inv, inv0, rtol=1e-14, atol=0) and a == a0 == 1.0, rope
    inv, a = R.rope_inv_freq(with_rope(base, {"rope_type": "linear", "factor": 2.0}), 64)
    assert np.allclose(inv, inv0 / 2, rtol=1e-14) and a == 1.0
    # dynamic NTK past max_pos: base grows by ((f*L/mp) - (f-1))^(d/(d-2)).
    c = with_rope(base, {"rope_type": "dynamic", "factor": 2.0})
    c.max_pos = 32
    inv, _ = R.rope_inv_freq(c, 64)
    b = 10000 * (2 * 64 / 32 - 1) ** (16 / 14)
    assert np.allclose(inv, 1 / b ** (np.arange(0, 16, 2) / 16), rtol=1e-14)


@test
def yarn_ramp_endpoints():
    d = gen("yarn", *DENSE[:-2], "--head-dim", "32", "--rope-theta", "10000", "--max-pos", "8192",
            "--rope-scaling", "yarn:factor=4,original_max_position_embeddings=2048")
    c = R.Qwen3Ref(d).cfg
    inv, attn = R.rope_inv_freq(c, 64)
    pf = 10000.0 ** (np.arange(0, 32, 2) / 32)
    # correction dims: 32*ln(2048/(2pi*beta)) / (2 ln 1e4) = 4.03 (beta 32), 10.05 (beta 1)
    low, high = 4, 11
    assert np.array_equal(inv[:low + 1], 1 / pf[:low + 1]), "below the ramp: original frequency"
    assert np.allclose(inv[high:], 1 / (4 * pf[high:]), rtol=1e-15), "above the ramp: interpolated"
    mid = low + 3
    r = (mid - low) / (high - low)
    assert abs(inv[mid] - ((1 / (4 * pf[mid])) * r + (1 / pf[mid]) * (1 - r))) < 1e-15
    assert abs(attn - (0.1 * math.log(4) + 1)) < 1e-15
    # mscale / mscale_all_dim and an explicit attention_factor
    _, a2 = R.rope_inv_freq(with_rope(c, dict(c.rope, mscale=1.0, mscale_all_dim=0.8)), 64)
    assert abs(a2 - (0.1 * math.log(4) + 1) / (0.08 * math.log(4) + 1)) < 1e-15
    _, a3 = R.rope_inv_freq(with_rope(c, dict(c.rope, attention_factor=0.5)), 64)
    assert a3 == 0.5
    # truncate=false keeps the fractional bounds
    inv4, _ = R.rope_inv_freq(with_rope(c, dict(c.rope, truncate=False)), 64)
    lo = 32 * math.log(2048 / (32 * 2 * math.pi)) / (2 * math.log(10000))
    hi = 32 * math.log(2048 / (1 * 2 * math.pi)) / (2 * math.log(10000))
    r = np.clip((np.arange(16) - lo) / (hi - lo), 0, 1)
    assert np.allclose(inv4, (1 / (4 * pf)) * r + (1 / pf) * (1 - r), rtol=1e-14)


@test
def moe_identities():
    d = gen("moe-id", *MOE, "--norm-topk-prob", "1")
    m = R.Qwen3Ref(d)
    c = m.cfg
    h = np.random.default_rng(9).standard_normal((10, c.hidden))
    # Identical experts + renormalised weights = one dense MLP.
    for n in ("gate_proj", "up_proj", "down_proj"):
        for e in range(1, c.n_experts):
            m.W[f"model.layers.0.mlp.experts.{e}.{n}.weight"] = m.w(f"model.layers.0.mlp.experts.0.{n}.weight")
    dense = m.mlp_dense("model.layers.0.mlp.experts.0.", h, c.moe_intermediate)
    assert rel_err(m.mlp_moe(0, h), dense) < 1e-12
    # top_k = all experts without renormalisation = the full softmax mixture.
    m2 = R.Qwen3Ref(d)
    m2.cfg.top_k, m2.cfg.norm_topk = c.n_experts, False
    p = R.softmax(h @ m2.w("model.layers.1.mlp.gate.weight").T)
    want = sum(p[:, e:e + 1] * m2.mlp_dense(f"model.layers.1.mlp.experts.{e}.", h, c.moe_intermediate)
               for e in range(c.n_experts))
    assert rel_err(m2.mlp_moe(1, h), want) < 1e-12
    # top-k picks the largest probabilities; weights sum to 1 when renormalised.
    idx, w = m.route(1, h)
    probs = R.softmax(h @ m.w("model.layers.1.mlp.gate.weight").T)
    for t in range(10):
        assert set(idx[t]) == set(np.argsort(probs[t])[-c.top_k:])
        assert abs(w[t].sum() - 1) < 1e-12
    m.close()
    m2.close()


@test
def float32_drift_is_small():
    """The basis of check_model's tolerance: the same code in float32."""
    worst = 0.0
    for d in (gen("drift-dense", *DENSE), gen("drift-moe", *MOE)):
        toks = [int(x) for x in np.random.default_rng(10).integers(0, 256, 64)]
        worst = max(worst, rel_err(R.ref_logits(d, toks, np.float32), R.ref_logits(d, toks)))
    assert worst < check_model.DEFAULT_TOL / 10, f"float32 drift {worst:.2e} is near the tolerance"
    return f"float32 drift {worst:.1e} vs tol {check_model.DEFAULT_TOL:g}"


# ---- the checker -----------------------------------------------------------

class Mutant(R.Qwen3Ref):
    """The reference with one deliberate, plausible engine bug."""
    bug = None

    def attention(self, i, h, cos, sin):
        if self.bug == "interleaved":
            half = cos.shape[1] // 2
            # GPT-J layout: pairs (2i, 2i+1) instead of (i, i+half)
            ci = np.repeat(cos[:, :half], 2, axis=1)
            si = np.repeat(sin[:, :half], 2, axis=1)

            def rope(x, c_, s_):
                r = np.empty_like(x)
                r[..., 0::2], r[..., 1::2] = -x[..., 1::2], x[..., 0::2]
                return x * ci[:, None] + r * si[:, None]
            saved = R.apply_rope
            R.apply_rope = rope
            try:
                return super().attention(i, h, cos, sin)
            finally:
                R.apply_rope = saved
        if self.bug == "no_knorm":
            # k_norm normalises but its weight is never applied
            p = f"model.layers.{i}.self_attn.k_norm.weight"
            self.W[p] = np.ones_like(self.w(p))
        if self.bug == "gqa_order":
            # query heads paired with the wrong kv heads (e.g. h % n_kv for h // rep)
            c = self.cfg
            p = f"model.layers.{i}.self_attn."
            for n in ("k_proj", "v_proj"):
                w = self.ckpt.get(p + n + ".weight", self.dtype).reshape(c.n_kv, c.head_dim, -1)
                self.W[p + n + ".weight"] = w[::-1].reshape(c.n_kv * c.head_dim, -1)
        return super().attention(i, h, cos, sin)

    def route(self, i, h):
        if self.bug == "flip_norm_topk":
            self.cfg.norm_topk = not self.cfg.norm_topk
            try:
                return super().route(i, h)
            finally:
                self.cfg.norm_topk = not self.cfg.norm_topk
        return super().route(i, h)


def mutant_logits(d, bug, toks):
    m = Mutant(d, np.float32)
    m.bug = bug
    if bug == "no_yarn_attn":
        m.cfg.rope = dict(m.cfg.rope, attention_factor=1.0)
    out = m.logits(toks)
    m.close()
    return out


@test
def checker_catches_engine_bugs():
    dense = gen("mut-dense", *DENSE)
    moe = gen("mut-moe", *MOE, "--norm-topk-prob", "0")
    yarn = gen("mut-yarn", *DENSE, "--rope-theta", "10000", "--max-pos", "8192",
               "--rope-scaling", "yarn:factor=4,original_max_position_embeddings=2048")
    toks = [int(x) for x in np.random.default_rng(11).integers(0, 256, 64)]
    report = []
    for d, bug in ((dense, "interleaved"), (dense, "no_knorm"), (dense, "gqa_order"),
                   (moe, "flip_norm_topk"), (yarn, "no_yarn_attn")):
        ref = R.ref_logits(d, toks)
        ok, summ, det = check_model.compare_logits(ref, mutant_logits(d, bug, toks), check_model.DEFAULT_TOL)
        assert not ok, f"{bug} went unnoticed: {summ}"
        report.append(f"{bug} rel={det.get('rel', float('nan')):.0e}")
        ok, _, _ = check_model.compare_logits(ref, R.ref_logits(d, toks, np.float32), check_model.DEFAULT_TOL)
        assert ok, "the float32 reference must pass"
    # greedy: identical ids pass, a shifted sequence fails, a tie forgives later steps
    assert check_model.compare_greedy([1, 2, 3], [1.0, 1.0, 1.0], [1, 2, 3], 1e-5)[0]
    assert not check_model.compare_greedy([1, 2, 3], [1.0, 1.0, 1.0], [1, 2, 4], 1e-5)[0]
    assert not check_model.compare_greedy([1, 2, 3], [1.0, 1.0, 1.0], [1, 2], 1e-5)[0]
    assert check_model.compare_greedy([1, 2, 3], [1.0, 1e-7, 1.0], [1, 5, 6], 1e-5)[0]
    assert not check_model.compare_greedy([1, 2, 3], [1.0, 1e-7, 1.0], [9, 2, 3], 1e-5)[0]
    # argmax near-tie: within tolerance is forgiven, a clear flip is not
    ref = np.array([[1.0, 1.0 - 1e-9, 0.0], [3.0, 0.0, 0.0]])
    eng = ref.copy()
    eng[0, 1] += 2e-9
    assert check_model.compare_logits(ref, eng, 1e-6)[0]
    eng[1, 1] = 3.5
    assert not check_model.compare_logits(ref, eng, 1.0)[0]
    return ", ".join(report)


@test
def checker_end_to_end():
    """check_model.py with the float32 reference posing as the engine passes, and
    with an engine whose `run` drops the first prompt token it fails."""
    d = tmp("e2e")
    shutil.copytree(gen("e2e-src", *MOE), d)
    fake = f"{sys.executable} {os.path.join(HERE, 'qwen3_ref.py')}"
    ok, line = check_model.check_model(d, fake, "e2e")
    assert ok, line
    shim = tmp("bad_engine.py")
    with open(shim, "w") as f:
        f.write("import sys\nsys.path.insert(0, %r)\nimport qwen3_ref\n"
                "a = sys.argv[1:]\n"
                "if a[0] == 'run':\n"
                "    i = a.index('--prompt-tokens') + 1\n"
                "    a[i] = a[i].split(',', 1)[1]\n"
                "sys.exit(qwen3_ref.main(a))\n" % HERE)
    ok, line2 = check_model.check_model(d, f"{sys.executable} {shim}", "e2e-bad")
    assert not ok and "greedy differs" in line2, line2
    p = subprocess.run([sys.executable, os.path.join(HERE, "check_model.py"), "--model", d,
                        "--engine", "/nonexistent/deltafin"], stdout=subprocess.PIPE)
    assert p.returncode == 1 and p.stdout.startswith(b"FAIL"), p.stdout
    return line


if __name__ == "__main__":
    sys.exit(reftest.main("df-ref-selftest-"))
