#!/usr/bin/python3
"""test_quant_ref - checks the reference's weight formats and the generator's on their own.

Owns: evidence that quant_np.py (the reference's decoder and quantization_config
reader) and gen_quant.py (the generator's quantizers and configs) deserve trust,
without the C engine: every e4m3 and e2m1 code against hand values, every E8M0
scale, nibble order on hand-made words, block and group edges; the generator's
encoders inverting the decoder and rounding ties to even; quantize -> decode
error within what each format allows; refused configs and tensors name the
field or tensor. The quantized suite's checkpoints and the checker:
test_quant_suite.py.

    /usr/bin/python3 tests/ref/test_quant_ref.py      (exit 0 = all passed)
"""
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
import deepseek_ref as D  # noqa: E402
import gen_checkpoint  # noqa: E402
import gen_quant as gq  # noqa: E402
import quant_np as Q  # noqa: E402
from quant_suite import SUITE, bf16_twin, load_ref, suite_model, vocab  # noqa: E402
import qwen3_ref  # noqa: E402
import reftest  # noqa: E402
from reftest import gen, test, tmp  # noqa: E402
import safetensors_np as st  # noqa: E402


# ---- element formats against hand values -------------------------------------

# e4m3fn positive codes 0x00..0x7E as multiples of 2^-9, written out per exponent
# field: 0 (subnormal, step 1), then binades of 8 values whose step doubles.
E4M3_HAND = (list(range(0, 8)) + list(range(8, 16)) + list(range(16, 32, 2)) + list(range(32, 64, 4))
             + list(range(64, 128, 8)) + list(range(128, 256, 16)) + list(range(256, 512, 32))
             + list(range(512, 1024, 64)) + list(range(1024, 2048, 128)) + list(range(2048, 4096, 256))
             + list(range(4096, 8192, 512)) + list(range(8192, 16384, 1024))
             + list(range(16384, 32768, 2048)) + list(range(32768, 65536, 4096))
             + list(range(65536, 131072, 8192)) + list(range(131072, 229377, 16384)))
E2M1_HAND = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@test
def e4m3_every_code():
    assert len(E4M3_HAND) == 127
    for c in range(256):
        v = Q.E4M3[c]
        if c & 0x7F == 0x7F:
            assert math.isnan(v), f"code {c:#x} must be NaN"
            continue
        want = E4M3_HAND[c & 0x7F] * 2.0 ** -9
        assert v == (-want if c & 0x80 else want), f"code {c:#x}: {v} != {want}"
        assert math.copysign(1.0, v) == (-1.0 if c & 0x80 else 1.0), f"code {c:#x}: sign"
    # named points: 1.0, the largest, the smallest subnormal and normal, -2
    assert (Q.E4M3[0x38], Q.E4M3[0x7E], Q.E4M3[0x01], Q.E4M3[0x08], Q.E4M3[0xC0]) == \
        (1.0, 448.0, 2.0 ** -9, 2.0 ** -6, -2.0)
    # a second derivation: normal codes as float32 bit patterns (exponent rebias 7 -> 127)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        if e == 0 or (e == 15 and m == 7):
            continue
        bits = np.uint32(((c >> 7) << 31) | ((e - 7 + 127) << 23) | (m << 20))
        assert np.array([bits]).view(np.float32)[0] == Q.E4M3[c], f"code {c:#x}"
    return "256 codes, NaN at 0x7F/0xFF, subnormals 2^-9..7*2^-9"


@test
def e2m1_every_code():
    for c in range(16):
        want = E2M1_HAND[c & 7]
        assert Q.E2M1[c] == (-want if c & 8 else want), f"nibble {c}: {Q.E2M1[c]}"
        assert math.copysign(1.0, Q.E2M1[c]) == (-1.0 if c & 8 else 1.0)


@test
def e8m0_every_scale():
    s = np.arange(256)
    v = Q.e8m0(s)
    for i in range(255):
        assert v[i] == 2.0 ** (i - 127), f"E8M0 {i}"
    assert math.isnan(v[255])
    assert v[0] == 2.0 ** -127 and v[127] == 1.0 and v[254] == 2.0 ** 127
    # 2^-127 is an fp32 subnormal, still exact: an engine's ldexpf gives the same value
    assert float(np.ldexp(np.float32(1), -127)) == v[0] and np.float32(v[254]) == v[254]


@test
def nibble_order_on_hand_made_words():
    # INT4: column c sits at bits 4*(c%8) of word c//8; stored value q+8
    words = np.array([[0x76543210, 0xFEDCBA98]], dtype=np.uint32).view(np.int32)
    assert words[0, 1] < 0          # stored I32: a top nibble >= 8 makes the word negative
    one = st.f32_to_bf16(np.array([[1.0]], dtype=np.float32))
    w = Q.decode_int4_pack(words, one, 16)
    assert w.tolist() == [[float(q) for q in range(-8, 8)]], w.tolist()
    # a tail: 13 columns of the two words, one group
    s = st.f32_to_bf16(np.array([[0.5]], dtype=np.float32))
    assert Q.decode_int4_pack(words, s, 13).tolist() == [[q * 0.5 for q in range(-8, 5)]]
    # MXFP4: byte k = column 2k (low nibble) | column 2k+1 (high nibble)
    packed = np.array([[0x21, 0xF8, 0x7A]], dtype=np.uint8)
    w = Q.decode_mxfp4(packed, np.array([[127]], dtype=np.uint8), 6)
    assert w.tolist() == [[0.5, 1.0, -0.0, -6.0, -1.0, 6.0]], w.tolist()
    w = Q.decode_mxfp4(packed, np.array([[129]], dtype=np.uint8), 5)
    assert w.tolist() == [[2.0, 4.0, 0.0, -24.0, -4.0]]
    # groups of 32: column 32 takes the second scale
    packed = np.full((1, 20), 0x22, dtype=np.uint8)          # 40 columns of 1.0
    w = Q.decode_mxfp4(packed, np.array([[127, 130]], dtype=np.uint8), 40)
    assert (w[0, :32] == 1.0).all() and (w[0, 32:] == 8.0).all()


@test
def fp8_blocks_and_edges():
    rng = np.random.default_rng(1)
    R, C, b = 5, 7, (2, 3)
    q = rng.integers(0, 127, (R, C)).astype(np.uint8)
    s = rng.uniform(0.5, 2, (3, 3)).astype(np.float32)
    w = Q.decode_fp8_block(q, s, b)
    for r in range(R):
        for c in range(C):
            assert w[r, c] == Q.E4M3[q[r, c]] * float(s[r // 2, c // 3])
    # 128x128 blocks with edges: 200 x 300 has a [2, 3] grid
    q = rng.integers(0, 127, (200, 300)).astype(np.uint8)
    s = np.array([[1, 2, 4], [8, 16, 32]], dtype=np.float32)
    w = Q.decode_fp8_block(q, s)
    assert w[127, 255] == Q.E4M3[q[127, 255]] * 2 and w[128, 256] == Q.E4M3[q[128, 256]] * 32
    assert w[199, 299] == Q.E4M3[q[199, 299]] * 32


# ---- the generator's quantizers ----------------------------------------------

@test
def generator_encoders_invert_the_decoder():
    fin = [c for c in range(256) if c & 0x7F != 0x7F]
    got = gq.e4m3_codes(Q.E4M3[fin])
    assert list(got) == fin, [hex(c) for c, g in zip(fin, got) if c != g][:4]
    # midpoints between neighbours go to the even mantissa; beyond 448 saturates
    pos = [c for c in fin if c < 0x7E]
    mid = (Q.E4M3[pos] + Q.E4M3[[c + 1 for c in pos]]) / 2
    want = [c if c % 2 == 0 else c + 1 for c in pos]
    assert list(gq.e4m3_codes(mid)) == want
    assert list(gq.e4m3_codes(-mid)) == [w | 0x80 for w in want]
    assert list(gq.e4m3_codes([464.0, 1e9, -500.0])) == [0x7E, 0x7E, 0xFE]
    assert list(gq.e4m3_codes([2.0 ** -10, 2.0 ** -10 * 1.0001, 3 * 2.0 ** -10])) == [0, 1, 2]
    nib = gq.e2m1_nibbles(Q.E2M1)
    assert list(nib) == list(range(8)) + [0] + list(range(9, 16)), list(nib)   # -0 packs as +0
    grid = Q.E2M1[:8]
    mids = (grid[:-1] + grid[1:]) / 2                      # 0.25 0.75 1.25 1.75 2.5 3.5 5
    assert list(gq.e2m1_nibbles(mids)) == [0, 2, 2, 4, 4, 6, 6]
    assert list(gq.e2m1_nibbles([-0.75, -0.2, 7.0, -100.0])) == [10, 0, 7, 15]


def packed_roundtrip(kind, x, pow2=False):
    """Quantizes x [R, C] through gen_quant into a file, decodes it through quant_np:
    (decoded, source rounded to bf16, per-element scale)."""
    name = f"m.{kind}.weight"
    pk = gq.Packed(kind, name, x.shape, lambda rows: (x[r:r + rows] for r in range(0, x.shape[0], rows)),
                   fp8_pow2=pow2)
    d = tmp(f"rt-{kind}-{pow2}-{x.shape[0]}x{x.shape[1]}")
    os.makedirs(d, exist_ok=True)
    w = st.SafeTensorsWriter(os.path.join(d, "model.safetensors"), [p for p in pk.parts])
    for n, _, _ in pk.parts:
        pk.write(w, n)
    w.close()
    qc = {"fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]},
          "int4": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                   "config_groups": {"g": {"targets": ["Linear"], "weights": {
                       "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                       "group_size": 32}}}},
          "mxfp4": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                    "config_groups": {"g": {"targets": ["Linear"], "weights": {
                        "num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
                        "group_size": 32}}}}}[kind]
    ck = st.Checkpoint(d)
    W = Q.Weights(ck, Q.QuantConfig(qc), lambda n: True)
    dec = W.get(name)
    mod = name[:-7]
    R, C = x.shape
    if kind == "fp8":
        s = ck.get(mod + ".weight_scale_inv", np.float64)
        S = np.repeat(np.repeat(s, 128, 0)[:R], 128, 1)[:, :C]
    elif kind == "int4":
        S = np.repeat(ck.get(mod + ".weight_scale", np.float64), 32, 1)
    else:
        S = np.repeat(Q.e8m0(ck.files["model.safetensors"].raw(mod + ".weight_scale")), 32, 1)
    ck.close()
    return dec, gq.bf16_round(x).astype(np.float64), S


@test
def generator_round_trip():
    rng = np.random.default_rng(7)
    report = []
    # FP8 with edge blocks: the error is at most half a quantum of the block's scale
    x = (rng.standard_normal((200, 300)) * 0.05).astype(np.float32)
    x[3, 4] = 0.0
    x[150:, 260:] *= 1e-3                                  # a block of small values
    for pow2 in (False, True):
        dec, src, S = packed_roundtrip("fp8", x, pow2)
        y = np.abs(src) / S
        assert y.max() <= 448 * (1 + 2 ** -22), "a float32 amax/448 may round down: 448 (1 + ulp)"
        quantum = np.where(y < 2.0 ** -6, 2.0 ** -9, np.ldexp(1.0, np.frexp(y)[1] - 4)) * S
        err = np.abs(dec - src)
        assert (err <= quantum / 2 + 1e-300).all(), f"fp8 pow2={pow2}: error beyond half a quantum"
        assert dec[3, 4] == 0.0
        if pow2:
            s = np.unique(S)
            assert (np.frexp(s)[0] == 0.5).all(), "ue8m0 scales must be powers of two"
        else:
            # the block's largest magnitude lands near 448 * scale
            assert np.isclose(np.max(np.abs(dec[:128, :128])), np.max(np.abs(src[:128, :128])), rtol=2 ** -4)
        report.append(f"fp8{'/ue8m0' if pow2 else ''} max rel {float(np.max(err / np.abs(src).max())):.1e}")
    # representable inputs come back exactly (scale 1: amax 448)
    v = Q.E4M3[[c for c in range(127)]] * np.where(np.arange(127) % 2, 1, -1)
    x = np.tile(np.append(v, 448.0), (4, 1)).astype(np.float32)
    dec, src, _ = packed_roundtrip("fp8", x)
    assert np.array_equal(dec, src), "e4m3 values with scale 1 must round-trip"
    # INT4: error at most half a step (the bf16 scale may put the group's max just past 7.5)
    x = (rng.standard_normal((70, 96)) * 0.1).astype(np.float32)
    dec, src, S = packed_roundtrip("int4", x)
    err = np.abs(dec - src)
    assert (err <= S * (0.5 + 7.5 * 2 ** -8)).all(), "int4 error"
    g = np.abs(src).reshape(70, 3, 32).max(-1)
    assert np.allclose(S[:, ::32], st.bf16_to_f32(st.f32_to_bf16((g / 7.5).astype(np.float32))))
    report.append(f"int4 max err/scale {float(np.max(err / S)):.2f}")
    # MXFP4: scale 2^(floor(log2 amax) - 2); in-range values within half a grid step,
    # the saturated top (amax/scale in (6, 8)) within 2 scales
    x = (rng.standard_normal((70, 64)) * 0.1).astype(np.float32)
    dec, src, S = packed_roundtrip("mxfp4", x)
    y = np.abs(src) / S
    g = np.abs(src).reshape(70, 2, 32).max(-1)
    assert np.array_equal(S[:, ::32], np.ldexp(1.0, np.frexp(g)[1] - 1 - 2))
    err = np.abs(dec - src) / S
    assert (err[y <= 6] <= np.where(y[y <= 6] <= 2, 0.25, np.where(y[y <= 6] <= 4, 0.5, 1.0))).all()
    assert (err[y > 6] < 2).all() and (np.abs(dec[y > 6]) / S[y > 6] == 6).all()
    report.append(f"mxfp4 saturated {int((y > 6).sum())} of {y.size}")
    return ", ".join(report)


_Q3 = ["--arch", "qwen3", "--vocab", "512", "--hidden", "64", "--intermediate", "96", "--layers", "2",
       "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
_Q3M = _Q3[2:] + ["--arch", "qwen3_moe", "--experts", "4", "--top-k", "2", "--moe-intermediate", "32",
                  "--mlp-only-layers", "1", "--layers", "3"]
_DS = ["--arch", "deepseek_v3", "--vocab", "512", "--hidden", "64", "--intermediate", "96", "--layers", "3",
       "--heads", "4", "--q-lora-rank", "32", "--experts", "8", "--top-k", "2", "--moe-intermediate", "32",
       "--mtp-layers", "1"]
MIXES = [m + x.split() for m, x in (
    (_Q3, "--quant fp8"), (_Q3, "--quant-dense int4"), (_Q3M, "--quant-experts fp8"), (_Q3M, "--quant-dense fp8"),
    (_Q3M, "--quant int4"), (_Q3M, "--quant mxfp4 --quant-dense int4"), (_DS, "--quant-experts bf16 --quant-dense fp8"),
    (_DS, "--quant-experts fp8"), (_DS, "--quant-dense int4"), (_DS, "--quant int4 --quant-dense int4"),
    (_DS, "--wrap-language-model --quant fp8"), (_DS, "--wrap-language-model --quant-dense mxfp4"))]


@test
def generator_mixes_read_back():
    """Every --quant / --quant-experts / --quant-dense combination: the reference,
    reading the written config on its own, finds each Linear of the decoder layers in
    the format asked for its class (routers and heads always plain)."""
    for i, args in enumerate(MIXES):
        a = gen_checkpoint.parse_args(args + ["--out", "x"])
        m = load_ref(gen(f"mix-{i}", *args))
        m.logits([1, 2, 3])
        for full in [mod + ".weight" for mod, sufs in m.weights.mods.items() if sufs & {"weight", "weight_packed"}]:
            if ".layers." not in full or int(full.split(".layers.")[1].split(".")[0]) >= a.layers or \
                    not m.weights.is_linear(full):
                continue
            cls = gq.weight_class(full)
            want = {"expert": a.qexperts, "router": "bf16"}.get(cls, a.qdense)
            kind = m.weights.scheme(full)
            assert (kind.kind if kind else "bf16") == want, f"{args[-4:]}: {full}: {kind} != {want}"
        m.close()
    return f"{len(MIXES)} mixes"


# ---- quantization_config ------------------------------------------------------

@test
def configs_as_shipped():
    """The configs the suite writes: fields as the shipped checkpoints spell them,
    and which module each keeps in which format."""
    raw = {n: json.load(open(os.path.join(suite_model(n), "config.json"))) for n in SUITE}
    ds = raw["fp8-ds-v3"]["quantization_config"]
    assert ds == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                  "weight_block_size": [128, 128]}, ds
    qw = raw["fp8-qwen3-moe"]["quantization_config"]
    assert "fmt" not in qw and qw["modules_to_not_convert"][:3] == \
        ["lm_head", "model.layers.0.input_layernorm", "model.layers.0.mlp.gate"]
    assert raw["fp8-v31-ue8m0"]["quantization_config"]["scale_fmt"] == "ue8m0"
    k2 = raw["int4-k2-thinking"]["quantization_config"]
    assert k2["ignore"] == ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"], k2["ignore"]
    assert k2["format"] == "pack-quantized" and k2["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert k2["config_groups"]["group_0"]["weights"]["type"] == "int"
    k25 = raw["int4-k25-wrapper"]
    assert "quantization_config" not in k25 and "quantization_config" in k25["text_config"]
    assert k25["text_config"]["quantization_config"]["ignore"][-3:] == \
        ["re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"]
    mx = raw["mxfp4-k2"]["text_config"]["quantization_config"]
    g0 = mx["config_groups"]["group_0"]
    assert mx["format"] == g0["format"] == "mxfp4-pack-quantized"
    assert g0["weights"]["scale_dtype"] == "torch.uint8" and g0["weights"]["type"] == "float"
    mixed = raw["mixed-int4-mxfp4"]["quantization_config"]
    assert mixed["format"] == "mixed-precision" and \
        [g["format"] for g in mixed["config_groups"].values()] == ["pack-quantized", "mxfp4-pack-quantized"]
    # module -> scheme, read back by the reference
    want = {
        "fp8-ds-v3": {"model.layers.1.self_attn.kv_b_proj": "fp8", "model.layers.0.mlp.down_proj": "fp8",
                      "model.layers.2.mlp.experts.3.up_proj": "fp8",
                      "model.layers.2.mlp.shared_experts.gate_proj": "fp8",
                      "model.layers.2.mlp.gate": None, "lm_head": None},
        "fp8-qwen3-moe": {"model.layers.0.self_attn.q_proj": "fp8", "model.layers.1.mlp.up_proj": "fp8",
                          "model.layers.0.mlp.experts.7.down_proj": "fp8", "model.layers.0.mlp.gate": None,
                          "lm_head": None},
        "int4-k2-thinking": {"model.layers.1.mlp.experts.0.gate_proj": "int4", "model.layers.0.mlp.gate_proj": None,
                             "model.layers.1.self_attn.q_a_proj": None,
                             "model.layers.1.mlp.shared_experts.down_proj": None,
                             "lm_head": None},
        "int4-k25-wrapper": {"language_model.model.layers.2.mlp.experts.5.down_proj": "int4",
                             "language_model.lm_head": None, "language_model.model.layers.2.self_attn.o_proj": None,
                             "vision_tower.encoder.blocks.0.wqkv": None, "mm_projector.proj.0": None},
        "mixed-int4-mxfp4": {"model.layers.1.mlp.experts.2.down_proj": "int4",
                             "model.layers.1.self_attn.kv_b_proj": "mxfp4", "model.layers.0.mlp.up_proj": "mxfp4",
                             "model.layers.1.mlp.shared_experts.up_proj": "mxfp4", "lm_head": None},
    }
    for name, mods in want.items():
        q = Q.read_quant_config(suite_model(name))
        lin = qwen3_ref.is_linear if name.startswith("fp8-qwen3") else D.is_linear
        for mod, kind in mods.items():
            s = q.scheme(mod, lin(mod + ".weight"))
            assert (s.kind if s else None) == kind, f"{name}: {mod}: {s} != {kind}"


@test
def ignore_and_targets_semantics():
    q = Q.QuantConfig({"quant_method": "compressed-tensors", "format": "pack-quantized",
                       "config_groups": {"g": {"targets": ["Linear"], "weights": {
                           "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                           "group_size": 32}}},
                       "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                                  "re:vision_tower.*"]})
    cases = {("lm_head", True): None, ("language_model.lm_head", True): "int4",   # exact names only
             ("model.layers.0.mlp.gate_proj", True): None, ("model.layers.1.mlp.experts.0.gate_proj", True): "int4",
             ("model.layers.1.mlp.gate", False): None, ("x.vision_tower.a", True): "int4",
             ("vision_tower.a", True): None, ("model.layers.0.self_attn.o_proj", True): None}
    for (mod, lin), kind in cases.items():
        s = q.scheme(mod, lin)
        assert (s.kind if s else None) == kind, f"{mod}: {s}"
    f = Q.QuantConfig({"quant_method": "fp8", "weight_block_size": [128, 128],
                       "modules_to_not_convert": ["model.layers.1.mlp.gate", "model.layers.*.self_attn"]})
    assert f.scheme("model.layers.1.mlp.gate", True) is None
    assert f.scheme("model.layers.1.mlp.gate_proj", True).kind == "fp8"     # whole parts only
    assert f.scheme("model.layers.3.self_attn.q_proj", True) is None
    assert f.scheme("lm_head", True) is None and f.scheme("model.embed_tokens", False) is None
    # two groups naming one module is ambiguous
    two = {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {
        n: {"format": "pack-quantized", "targets": t, "weights": {"num_bits": 4, "type": "int",
            "symmetric": True, "strategy": "group", "group_size": 32}}
        for n, t in (("a", ["Linear"]), ("b", ["re:.*experts.*"]))}}
    try:
        Q.QuantConfig(two).scheme("m.experts.0.up_proj", True)
    except ValueError as e:
        assert "a, b" in str(e)
    else:
        raise AssertionError("a module in two groups was accepted")


@test
def bad_configs_are_refused():
    fp8 = json.load(open(os.path.join(suite_model("fp8-ds-v3"), "config.json")))["quantization_config"]
    ct = json.load(open(os.path.join(suite_model("int4-k2-thinking"), "config.json")))["quantization_config"]
    mx = json.load(open(os.path.join(suite_model("mxfp4-k2"), "config.json")))["text_config"]["quantization_config"]

    def w(base, **kw):
        c = json.loads(json.dumps(base))
        c["config_groups"]["group_0"]["weights"].update(kw)
        return c

    def g(base, **kw):
        c = json.loads(json.dumps(base))
        c["config_groups"]["group_0"].update(kw)
        return c
    cases = [
        (dict(fp8, quant_method="awq"), "quant_method"), (dict(fp8, fmt="e5m2"), "fmt"),
        (dict(fp8, activation_scheme="static"), "activation_scheme"),
        (dict(fp8, weight_block_size=[64, 64]), "weight_block_size"), (dict(fp8, scale_fmt="e4m3"), "scale_fmt"),
        (dict(ct, format="float-quantized"), "format"), (dict(ct, format="naive-quantized"), "format"),
        (w(ct, num_bits=8), "group_0.weights.num_bits"), (w(ct, type="float"), "group_0.weights.type"),
        (w(ct, symmetric=False), "group_0.weights.symmetric"), (w(ct, strategy="channel"), "group_0.weights.strategy"),
        (w(ct, group_size=128), "group_0.weights.group_size"), (w(ct, dynamic=True), "group_0.weights.dynamic"),
        (w(ct, actorder="group"), "group_0.weights.actorder"),
        (w(ct, zp_dtype="torch.int8"), "group_0.weights.zp_dtype"),
        (w(mx, scale_dtype="torch.float16"), "group_0.weights.scale_dtype"),
        (w(mx, type="int"), "group_0.weights.type"),
        (g(ct, input_activations={"num_bits": 8, "type": "float", "dynamic": True}), "group_0.input_activations"),
        (g(ct, format="mxfp4-pack-quantized"), "group_0.format"),
        (dict(ct, quantization_status="frozen"), "quantization_status"),
        (dict(ct, kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
        (dict(ct, format="mixed-precision"), "group_0.format"),
        (dict(ct, config_groups={}), "config_groups"),
    ]
    for qc, field in cases:
        try:
            Q.QuantConfig(qc)
        except ValueError as e:
            assert f"field quantization_config.{field}" in str(e) or \
                f"quantization_config.config_groups.{field}" in str(e), f"{field}: {e}"
        else:
            raise AssertionError(f"accepted a bad {field}")
    # a wrapper whose two configs disagree
    bad = tmp("two-configs")
    shutil.copytree(suite_model("mxfp4-k2"), bad)
    raw = json.load(open(os.path.join(bad, "config.json")))
    raw["quantization_config"] = ct
    json.dump(raw, open(os.path.join(bad, "config.json"), "w"))
    try:
        Q.read_quant_config(bad)
    except ValueError as e:
        assert "text_config.quantization_config" in str(e)
    else:
        raise AssertionError("two disagreeing configs accepted")
    return f"{len(cases)} refused"


def edit_checkpoint(src, name, fn):
    """A copy of single-file checkpoint src whose tensors {name: [dtype, raw]} fn edits."""
    d = tmp(name)
    shutil.copytree(src, d)
    path = os.path.join(d, "model.safetensors")
    f = st.SafeTensorsFile(path)
    t = {n: [f.info(n)[0], np.array(f.raw(n))] for n in f.keys()}
    f.close()
    fn(t)
    w = st.SafeTensorsWriter(path, [(n, dt, a.shape) for n, (dt, a) in t.items()])
    for n, (dt, a) in t.items():
        w.write_part(n, a, raw=True)
    w.close()
    return d


@test
def bad_tensors_are_refused():
    fp8, int4, mx = suite_model("fp8-ds-v3"), suite_model("int4-k2-thinking"), suite_model("mixed-int4-mxfp4")
    kvb = "model.layers.1.self_attn.kv_b_proj"
    exp = "model.layers.1.mlp.experts.3.down_proj"
    att = "model.layers.1.self_attn.o_proj"

    def setv(n, f):
        return lambda t: t[n].__setitem__(1, f(t[n][1]))
    cases = [
        (fp8, lambda t: t[kvb + ".weight_scale_inv"].__setitem__(1, t[kvb + ".weight_scale_inv"][1][:1]),
         kvb + ".weight_scale_inv", "shape"),
        (fp8, setv(kvb + ".weight_scale_inv", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 1,
                                                                 np.float32("nan"), a)),
         kvb + ".weight_scale_inv", "non-finite"),
        (fp8, lambda t: t.pop(kvb + ".weight_scale_inv"), kvb + ".weight_scale_inv", "missing"),
        (fp8, setv(kvb + ".weight", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, 0x7F, a)
                   .astype(np.uint8)), kvb + ".weight", "NaN code"),
        (fp8, lambda t: t[kvb + ".weight_scale_inv"].__setitem__(0, "BF16") or
         t[kvb + ".weight_scale_inv"].__setitem__(1, st.f32_to_bf16(t[kvb + ".weight_scale_inv"][1])),
         kvb + ".weight_scale_inv", "dtype"),
        (int4, setv(exp + ".weight_shape", lambda a: a + np.array([0, 32], dtype=a.dtype)),
         exp + ".weight_shape", "disagrees"),
        (int4, lambda t: t.pop(exp + ".weight_scale"), exp + ".weight_scale", "missing"),
        (int4, lambda t: t.__setitem__(exp + ".weight_zero_point", ["I32", np.zeros((64, 1), np.int32)]),
         exp + ".weight_zero_point", "present"),
        (int4, lambda t: t.__setitem__(att + ".weight_scale_inv", ["F32", np.ones((1, 1), np.float32)]),
         att + ".weight_scale_inv", "present"),
        (int4, setv(exp + ".weight_scale", lambda a: a[:, :0]), exp + ".weight_scale", "shape"),
        (mx, setv(att + ".weight_scale", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, 255, a)
                  .astype(np.uint8)), att + ".weight_scale", "NaN"),
        (mx, lambda t: t[att + ".weight_packed"].__setitem__(0, "I32") or
         t[att + ".weight_packed"].__setitem__(1, t[att + ".weight_packed"][1].view(np.int32)),
         att + ".weight_packed", "dtype"),
    ]
    for i, (src, fn, tensor, what) in enumerate(cases):
        d = edit_checkpoint(src, f"bad-{i}", fn)
        m = load_ref(d)
        try:
            m.logits([1, 2, 3])
        except ValueError as e:
            assert f"tensor {tensor}" in str(e) and what in str(e), f"case {i}: {e}"
        else:
            raise AssertionError(f"case {i}: accepted a bad {tensor} ({what})")
        m.close()
    # config says quantized, tensors plain: the BF16 twin under an FP8 config
    d = tmp("plain-under-fp8")
    shutil.copytree(bf16_twin("fp8-v31-ue8m0"), d)
    raw = json.load(open(os.path.join(d, "config.json")))
    raw["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    json.dump(raw, open(os.path.join(d, "config.json"), "w"))
    m = load_ref(d)
    try:
        m.logits([1])
    except ValueError as e:
        assert "weight_scale_inv: missing" in str(e), str(e)
    else:
        raise AssertionError("plain weights under an FP8 config accepted")
    m.close()
    return f"{len(cases) + 1} refused"


if __name__ == "__main__":
    sys.exit(reftest.main("df-quant-ref-test-"))
