#!/usr/bin/python3
"""test_quant_suite - checks the quantized suite's checkpoints and the checker on them.

Owns: each quantized suite checkpoint laid out as shipped (which tensors are 8-
or 4-bit, which stay BF16) and decoded close to its BF16 twin, not degenerate,
with a small float32 drift; and the checker, which passes the float32
reference posing as the engine and fails plausible decoding bugs. The formats
themselves: test_quant_ref.py.

    /usr/bin/python3 tests/ref/test_quant_suite.py    (exit 0 = all passed)
"""
import contextlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))
import check_model  # noqa: E402
import gen_quant as gq  # noqa: E402
import quant_np as Q  # noqa: E402
from quant_suite import SUITE, bf16_twin, load_ref, suite_model, vocab  # noqa: E402
import reftest  # noqa: E402
from reftest import rel_err, test, toks  # noqa: E402
import safetensors_np as st  # noqa: E402

TOL = check_model.DEFAULT_TOL


# ---- the quantized suite models ---------------------------------------------

FP8_MODULES = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "k_proj",
               "v_proj", "gate_proj", "up_proj", "down_proj", "eh_proj", "head")


def expected_kind(name, mod):
    """The format the shipped checkpoints give module `mod` of suite model `name`."""
    last = mod.split(".")[-1]
    if last in ("embed_tokens", "lm_head", "gate") or "norm" in last or mod.startswith(("vision", "mm_")):
        return None
    if name.startswith("fp8"):
        return "fp8" if last in FP8_MODULES else None
    is_expert = ".mlp.experts." in mod
    if name.startswith("mixed"):
        return "int4" if is_expert else "mxfp4"
    return name.split("-")[0] if is_expert else None


DT = {None: {"weight": "BF16"}, "fp8": {"weight": "F8_E4M3", "weight_scale_inv": "F32"},
      "int4": {"weight_packed": "I32", "weight_scale": "BF16", "weight_shape": "I32"},
      "mxfp4": {"weight_packed": "U8", "weight_scale": "U8"}}


@test
def suite_layouts_as_shipped():
    """Every tensor of every formats-suite checkpoint: the stored format the shipped
    checkpoints use for that module (and nothing else), every weight the forward
    pass reads present; the stored bytes of one routed expert against BF16."""
    report = []
    for name in SUITE:
        d = suite_model(name)
        ck, twin = st.Checkpoint(d), st.Checkpoint(bf16_twin(name))
        mods = {}
        for n in ck.keys():
            mod, _, suf = n.rpartition(".")
            mods.setdefault(mod, {})[suf] = ck.info(n)
        for mod, parts in mods.items():
            comp = {s for s in parts if s == "weight" or s.startswith("weight_")}
            if not comp:
                continue
            if "weight" in parts and len(parts["weight"][1]) != 2:       # norms, conv patches
                assert parts["weight"][0] == "BF16", f"{name}: {mod}: {parts['weight']}"
                continue
            kind = expected_kind(name, mod)
            got = {s: parts[s][0] for s in comp}
            assert got == DT[kind], f"{name}: {mod}: {got} != {DT[kind]}"
            if kind == "fp8":
                (R, C), grid = parts["weight"][1], parts["weight_scale_inv"][1]
                assert grid == (-(-R // 128), -(-C // 128)), f"{name}: {mod}: grid {grid}"
            elif kind:
                assert parts["weight_scale"][1][0] == parts["weight_packed"][1][0]
        m = load_ref(d)
        for full in getattr(m, "shapes", ()):
            assert full in m.weights, f"{name}: {full} missing"
        m.close()
        layer = 0 if name.startswith("fp8-qwen3") else 1
        ex = [n for n in ck.keys() if f".layers.{layer}.mlp.experts.0." in n]
        stored = sum(st.itemsize(ck.info(n)[0]) * int(np.prod(ck.info(n)[1])) for n in ex)
        bf16 = sum(2 * int(np.prod(twin.info(n)[1])) for n in twin.keys()
                   if f".layers.{layer}.mlp.experts.0." in n)
        report.append(f"{name} {stored}/{bf16}")
        ck.close()
        twin.close()
    return "expert bytes stored/bf16: " + "; ".join(report)


def check_decoded_close(name):
    """Each weight the forward reads, decoded, against the same-seed BF16 twin: equal
    where stored plainly, within the format's error where quantized. Returns the
    worst relative error per format."""
    m, t = load_ref(suite_model(name)), load_ref(bf16_twin(name))
    worst = {}
    names = getattr(m, "shapes", None) or \
        [mod + ".weight" for mod, sufs in m.weights.mods.items() if sufs & {"weight", "weight_packed"}]
    for full in names:
        if not full.endswith(".weight"):
            continue
        a, b = m.weights.get(full), t.weights.get(full)
        kind = m.weights.scheme(full)
        kind = kind.kind if kind else None
        if kind is None:
            assert np.array_equal(a, b), f"{name}: {full} differs from its BF16 twin"
            continue
        e = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        worst[kind] = max(worst.get(kind, 0.0), e)
    m.close()
    t.close()
    return worst


@test
def decoded_weights_match_their_bf16_twins():
    bound = {"fp8": 0.04, "int4": 0.15, "mxfp4": 0.15}
    report = []
    for name in SUITE:
        worst = check_decoded_close(name)
        assert worst, f"{name}: nothing quantized"
        for k, e in worst.items():
            assert 0 < e < bound[k], f"{name}: {k} relative error {e:.3f}"
        report.append(f"{name} " + " ".join(f"{k} {e:.3f}" for k, e in sorted(worst.items())))
    return "; ".join(report)


@test
def quantized_models_are_not_degenerate():
    report = []
    for name in SUITE:
        m = load_ref(suite_model(name))
        L = m.logits(toks(3, 48, vocab=m.cfg.vocab))
        spread = float(np.mean(np.std(L, axis=1)))
        assert 0.5 < spread < 10 and len(set(L.argmax(1))) > 24, f"{name}: spread {spread}"
        t = load_ref(bf16_twin(name))
        Lb = t.logits(toks(3, 48, vocab=m.cfg.vocab))
        report.append(f"{name} vs bf16 twin {rel_err(L, Lb):.0e}")
        m.close()
        t.close()
    return "; ".join(report)


@test
def float32_drift_is_small():
    worst = 0.0
    for name in SUITE:
        d = suite_model(name)
        t = toks(9, 48, vocab=vocab(d))
        worst = max(worst, rel_err(load_ref(d, np.float32).logits(t), load_ref(d).logits(t)))
    assert worst < TOL / 5, f"float32 drift {worst:.2e} is near the tolerance"
    return f"float32 drift {worst:.1e} vs tol {TOL:g}"


# ---- the checker ------------------------------------------------------------

@contextlib.contextmanager
def decode_bug(bug):
    """quant_np with one plausible decoding bug, as an engine might have it."""
    saved = {k: getattr(Q, k) for k in ("decode_fp8_block", "unpack_int4", "unpack_fp4", "e8m0", "E2M1")}
    if bug == "fp8_scale_divides":
        Q.decode_fp8_block = lambda q, s, block=(128, 128): saved["decode_fp8_block"](q, 1.0 / s, block)
    if bug == "fp8_one_scale_per_row_block":
        Q.decode_fp8_block = lambda q, s, block=(128, 128): saved["decode_fp8_block"](
            q, np.repeat(s[:, :1], s.shape[1], 1), block)
    if bug == "int4_nibbles_reversed":
        Q.unpack_int4 = lambda p, cols: saved["unpack_int4"](p, -(-cols // 8) * 8).reshape(
            p.shape[0], -1, 8)[:, :, ::-1].reshape(p.shape[0], -1)[:, :cols]
    if bug == "int4_twos_complement":     # nibble read as signed 4-bit instead of q + 8
        Q.unpack_int4 = lambda p, cols: (saved["unpack_int4"](p, cols) + 8) % 16
    if bug == "mxfp4_nibbles_swapped":
        Q.unpack_fp4 = lambda p, cols: saved["unpack_fp4"](
            ((p & 0xF) << 4) | (p >> 4), cols)
    if bug == "e8m0_bias_126":
        Q.e8m0 = lambda s: saved["e8m0"](s) * 2.0
    if bug == "e2m1_as_integers":
        Q.E2M1 = np.array([float(c & 7) * (-1 if c & 8 else 1) for c in range(16)])
    try:
        with np.errstate(all="ignore"):      # some bugs overflow: that is the point
            yield
    finally:
        for k, v in saved.items():
            setattr(Q, k, v)


@test
def checker_catches_decoding_bugs():
    cases = [("fp8-ds-v3", "fp8_scale_divides"), ("fp8-ds-v3", "fp8_one_scale_per_row_block"),
             ("fp8-qwen3-moe", "fp8_one_scale_per_row_block"), ("int4-k2-thinking", "int4_nibbles_reversed"),
             ("int4-k25-wrapper", "int4_twos_complement"), ("mxfp4-k2", "mxfp4_nibbles_swapped"),
             ("mxfp4-k2", "e8m0_bias_126"), ("mixed-int4-mxfp4", "e2m1_as_integers")]
    report = []
    for name, bug in cases:
        d = suite_model(name)
        t = toks(10, 48, vocab=vocab(d))
        ref = load_ref(d).logits(t)
        with decode_bug(bug):
            eng = load_ref(d, np.float32).logits(t)
        ok, summ, det = check_model.compare_logits(ref, eng, TOL)
        assert not ok, f"{bug} went unnoticed on {name}: {summ}"
        report.append(f"{bug} rel={det.get('rel', float('nan')):.0e}")
    return ", ".join(report)


@test
def hf_bf16_materialization_is_measured():
    """Hugging Face dequantizes to BF16 weights before the matmul; an engine that
    decodes exactly (f32) differs from that by BF16 rounding of the weights. How
    far, on the suite's FP8 and MXFP4 models (INT4 x BF16 scale is exact in BF16
    only when the product fits 8 bits)."""
    report = []
    for name in ("fp8-ds-v3", "int4-k2-thinking", "mxfp4-k2"):
        d = suite_model(name)
        m = load_ref(d)
        t = toks(11, 48, vocab=m.cfg.vocab)
        exact = m.logits(t)
        m.W.clear()
        get = m.weights.get
        m.weights.get = lambda n, out=np.float64: gq.bf16_round(get(n).astype(np.float32)).astype(out) \
            if n.endswith(".weight") else get(n, out)
        hf = m.logits(t)
        m.close()
        report.append(f"{name} {rel_err(hf, exact):.0e}")
    return "bf16-materialized vs exact: " + ", ".join(report)


@test
def checker_end_to_end():
    """check_model with the float32 reference posing as the engine passes every
    formats-suite model (whole sequence, and fp8-ds-v3 token by token too)."""
    fake = f"{sys.executable} {os.path.join(HERE, 'ref_engine.py')}"
    lines = []
    for name in SUITE:
        ok, line = check_model.check_model(suite_model(name), fake, name)
        assert ok, line
        lines.append(line.split(" rel=")[1].split()[0])
    ok, line = check_model.check_model(suite_model("fp8-ds-v3"), fake, "fp8-ds-v3", batch=1)
    assert ok, line
    return "rel " + " ".join(lines)


if __name__ == "__main__":
    sys.exit(reftest.main("df-quant-suite-test-"))
