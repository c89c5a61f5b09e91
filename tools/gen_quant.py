"""gen_quant - the weight-format half of gen_checkpoint.py: 8- and 4-bit checkpoints as shipped.

Owns: quantizing random weights by the published packers' conventions, the
companion tensors each format stores, and the `quantization_config` the
shipped checkpoints carry (ARCHITECTURES.md section 1.3). Written from that
description; the reference decodes the same bytes with its own code
(tests/ref/quant_np.py), so the two check each other.

Formats (per Linear weight W [out, in], values first rounded to BF16 as a
BF16 master would be):
  fp8    `weight` F8_E4M3 [out, in] + `weight_scale_inv` F32 [ceil(out/128),
         ceil(in/128)]: per 128x128 block (smaller at the edges) s = amax/448
         (--fp8-scale-fmt ue8m0: the power of two at or above it), codes =
         round-to-nearest-even e4m3 of W/s, saturated at +-448.
  int4   compressed-tensors pack-quantized: per row and group of 32 columns
         s = bf16(amax/7.5), q = clamp(rint(W/s), -8, 7) stored as q+8, eight
         per I32 word, column c at bits 4*(c%8) of word c//8; `weight_packed`
         I32 [out, in/8], `weight_scale` BF16 [out, in/32], `weight_shape` I32 [2].
  mxfp4  compressed-tensors mxfp4-pack-quantized: per row and group of 32
         columns the E8M0 scale 127 + floor(log2 amax) - 2 (the OCP-MX
         convention), values W/2^(s-127) rounded to nearest-even on the e2m1
         grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturated at 6; two per byte, even
         column in the low nibble; `weight_packed` U8 [out, in/2], `weight_scale`
         U8 [out, in/32].

Which modules: `--quant fp8` = every Linear except lm_head and routers (the
DeepSeek-V3 / Kimi K2-Instruct / Qwen3-FP8 releases); `--quant int4` /
`mxfp4` = routed experts only, everything else BF16 (Kimi K2-Thinking / K2.5 /
K3). `--quant-experts KIND` and `--quant-dense KIND` (bf16, fp8, int4, mxfp4)
set the two classes apart: routed experts, and every other Linear of the
decoder layers (attention, dense MLPs, shared experts). FP8 mixes only with
BF16 (quant_method fp8 + modules_to_not_convert); INT4 and MXFP4 mix with each
other through compressed-tensors' mixed-precision format, one config group per
class. Each tensor's format is then read back from the written config, so the
config and the tensors cannot disagree.
"""

import re

import numpy as np

import safetensors_np as st

KINDS = ("bf16", "fp8", "int4", "mxfp4")
FP8_MAX = 448.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
GROUP = 32
BLOCK = 128
CHUNK_ELEMS = 1 << 22

DS_DENSE_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
QWEN_DENSE_IGNORE = ["re:.*self_attn.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
EXPERTS_RE = "re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"
DS_DENSE_TARGETS = ["re:.*self_attn\\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$",
                    "re:.*shared_experts\\.(gate|up|down)_proj$", "re:.*mlp\\.(gate|up|down)_proj$",
                    "re:.*eh_proj$"]
QWEN_DENSE_TARGETS = ["re:.*self_attn\\.(q|k|v|o)_proj$", "re:.*mlp\\.(gate|up|down)_proj$"]


def add_args(p):
    g = p.add_argument_group("weight formats (ARCHITECTURES.md 1.3)")
    g.add_argument("--quant", choices=("none", "fp8", "int4", "mxfp4"), default="none",
                   help="fp8: every Linear but lm_head/routers (DeepSeek-V3, K2-Instruct, Qwen3-FP8); "
                        "int4 / mxfp4: routed experts only (K2-Thinking, K2.5 / K3)")
    g.add_argument("--quant-experts", choices=KINDS, default=None, help="routed experts' format")
    g.add_argument("--quant-dense", choices=KINDS, default=None,
                   help="format of every other decoder Linear (attention, dense MLP, shared experts)")
    g.add_argument("--fp8-scale-fmt", choices=("float", "ue8m0"), default="float",
                   help="ue8m0: power-of-two block scales and scale_fmt in the config (DeepSeek-V3.1)")


def check_args(p, a):
    """Resolves --quant into a.qexperts, a.qdense and rejects mixes no shipped config expresses."""
    preset = {"none": ("bf16", "bf16"), "fp8": ("fp8", "fp8"), "int4": ("int4", "bf16"),
              "mxfp4": ("mxfp4", "bf16")}[a.quant]
    if a.arch == "qwen3":                   # dense: no routed experts
        if a.quant_experts not in (None, "bf16"):
            p.error("--quant-experts: a qwen3 model has no routed experts")
        preset = ("bf16", preset[1])
        if a.quant != "none" and preset[1] == "bf16" and not a.quant_dense:
            p.error(f"--quant {a.quant} quantizes routed experts only; a qwen3 model has none")
    a.qexperts = a.quant_experts or preset[0]
    a.qdense = a.quant_dense or preset[1]
    kinds = {a.qexperts, a.qdense} - {"bf16"}
    if "fp8" in kinds and len(kinds) > 1:
        p.error("FP8 mixes only with BF16: no shipped quantization_config holds FP8 and 4-bit weights")
    if a.fp8_scale_fmt == "ue8m0" and "fp8" not in kinds:
        p.error("--fp8-scale-fmt ue8m0 needs FP8 weights")


# ---- element quantizers (round to nearest, ties to even; saturating) -----------

def e4m3_codes(y):
    """float32 values -> uint8 e4m3fn codes of the nearest value (ties to even),
    saturated at +-448: what a float32 -> float8_e4m3fn cast does after the clamp
    every FP8 packer applies. Bit arithmetic on the float32 pattern: the mantissa
    is rounded from 23 to 3 bits (a carry moves into the exponent, as it should);
    below 2^-6 the step stays 2^-9 (subnormals)."""
    y = np.asarray(y, dtype=np.float32)
    a = np.minimum(np.abs(y), np.float32(FP8_MAX))
    bits = a.view(np.uint32)
    lsb = (bits >> np.uint32(20)) & np.uint32(1)
    normal = ((bits + np.uint32(0x7FFFF) + lsb) >> np.uint32(20)) - np.uint32((127 - 7) << 3)
    sub = np.rint(a * np.float32(512.0)).astype(np.uint32)        # exact scaling, then RNE
    code = np.where(a < np.float32(2.0 ** -6), sub, normal)
    code |= np.signbit(y).astype(np.uint32) << np.uint32(7)
    return code.astype(np.uint8)


def e4m3_values(q):
    """uint8 e4m3fn codes -> float64 values (NaN codes not expected)."""
    q = np.asarray(q, dtype=np.int64)
    e, m = (q >> 3) & 15, q & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * np.exp2(e - 7.0))
    return np.where(q & 0x80, -v, v)


# --fast-init's FP8 codes: drawn from these, which are normal weights quantized
# as an amax-scaled block holds them (the block maximum, about 8 sigma, at 448),
# so codes near zero (e <= 1) are as rare as in a real checkpoint (about 1 in 2000)
FP8_FAST_CODES = e4m3_codes(np.clip(np.random.default_rng(448).standard_normal(65536) * 56.0, -FP8_MAX, FP8_MAX))
FP8_FAST_RMS = float(np.sqrt(np.mean(e4m3_values(FP8_FAST_CODES) ** 2)))


def e2m1_nibbles(y):
    """float64 array -> e2m1 nibbles of the nearest grid value (ties to the even
    mantissa, i.e. the even grid index), saturated at 6; a value rounding to 0
    is +0 whatever its sign (as compressed-tensors packs it)."""
    y = np.asarray(y, dtype=np.float64)
    a = np.minimum(np.abs(y), 6.0)
    hi = np.clip(np.searchsorted(E2M1_GRID, a), 1, 7)
    lo = hi - 1
    dlo, dhi = a - E2M1_GRID[lo], E2M1_GRID[hi] - a
    idx = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (idx | np.where((y < 0) & (idx != 0), 8, 0)).astype(np.uint8)


def bf16_round(x):
    return st.bf16_to_f32(st.f32_to_bf16(x))


# ---- one weight's companions -------------------------------------------------

def companions(kind, name, shape):
    """[(tensor name, dtype, shape)] stored for Linear weight `name` in `kind`."""
    mod = name[:-len(".weight")]
    R, C = shape
    if kind == "fp8":
        return [(mod + ".weight", "F8_E4M3", (R, C)),
                (mod + ".weight_scale_inv", "F32", (-(-R // BLOCK), -(-C // BLOCK)))]
    if kind == "int4":
        return [(mod + ".weight_packed", "I32", (R, C // 8)),
                (mod + ".weight_scale", "BF16", (R, C // GROUP)),
                (mod + ".weight_shape", "I32", (2,))]
    if kind == "mxfp4":
        return [(mod + ".weight_packed", "U8", (R, C // 2)),
                (mod + ".weight_scale", "U8", (R, C // GROUP))]
    raise ValueError(kind)


class Packed:
    """The stored form of one Linear weight. source(rows) yields its float32
    values in consecutive row chunks of `rows` (the last may be shorter); with
    fast=True codes are drawn at random instead (benchmark checkpoints)."""

    def __init__(self, kind, name, shape, source, fp8_pow2=False, fast_rng=None, std=1.0):
        self.kind, self.name, self.shape = kind, name, tuple(shape)
        self.source, self.pow2, self.fast_rng, self.std = source, fp8_pow2, fast_rng, std
        self.parts = companions(kind, name, shape)
        self._scale = None

    def write(self, w, tensor):
        """Writes companion `tensor` into SafeTensorsWriter w (in its turn)."""
        i = [n for n, _, _ in self.parts].index(tensor)
        if i == 0:
            scales = []
            for q, s in self._chunks():
                w.write_part(tensor, q, raw=True)
                scales.append(s)
            self._scale = np.concatenate(scales)
        elif tensor.endswith("weight_shape"):
            w.write_part(tensor, np.array(self.shape, dtype="<i4"), raw=True)
        else:
            if self._scale is None:          # scale written before its codes: recompute
                self._scale = np.concatenate([s for _, s in self._chunks()])
            w.write_part(tensor, self._scale, raw=True)
            self._scale = None

    def _rows(self):
        R, C = self.shape
        rows = max(1, CHUNK_ELEMS // C)
        return max(BLOCK, rows // BLOCK * BLOCK) if self.kind == "fp8" else rows

    def _chunks(self):
        """(stored codes, stored scales) per row chunk."""
        R, C = self.shape
        rows = self._rows()
        if self.fast_rng is not None:
            for r0 in range(0, R, rows):
                yield self._fast(min(rows, R - r0), C)
            return
        for x in self.source(rows):
            x = bf16_round(x)
            yield {"fp8": self._fp8, "int4": self._int4, "mxfp4": self._mxfp4}[self.kind](x)

    def _fp8(self, x):
        n, C = x.shape
        x = x.astype(np.float32)                 # bf16 values: exact
        nb, cb = -(-n // BLOCK), -(-C // BLOCK)
        pad = np.zeros((nb * BLOCK, cb * BLOCK), dtype=np.float32)
        pad[:n, :C] = np.abs(x)
        amax = pad.reshape(nb, BLOCK, cb, BLOCK).max(axis=(1, 3)).astype(np.float64)
        if self.pow2:
            # the power of two at or above amax/448: 2^(k-1) if amax/448 is one, else 2^k
            m, k = np.frexp(amax / FP8_MAX)
            s = np.where(amax > 0, np.ldexp(1.0, np.where(m == 0.5, k - 1, k)), 1.0).astype(np.float32)
        else:
            s = np.where(amax > 0, np.float32(amax) / np.float32(FP8_MAX), 1.0).astype(np.float32)
        S = np.repeat(np.repeat(s, BLOCK, 0)[:n], BLOCK, 1)[:, :C]
        return e4m3_codes(x / S), s              # one float32 division, as the packers do

    def _groups(self, x):
        n, C = x.shape
        return np.abs(x).reshape(n, C // GROUP, GROUP).max(axis=2)

    def _int4(self, x):
        x = x.astype(np.float64)
        n, C = x.shape
        amax = self._groups(x).astype(np.float32)
        s_bits = st.f32_to_bf16(np.maximum(amax / np.float32(7.5), np.float32(2.0 ** -23)))
        s = np.repeat(st.bf16_to_f32(s_bits).astype(np.float64), GROUP, axis=1)
        u = (np.clip(np.rint(x / s), -8, 7).astype(np.int64) + 8).astype(np.uint32)
        words = np.zeros((n, C // 8), dtype=np.uint32)
        for i in range(8):
            words |= u[:, i::8] << np.uint32(4 * i)
        return words.view("<i4"), s_bits

    def _mxfp4(self, x):
        x = x.astype(np.float64)
        n, C = x.shape
        amax = self._groups(x)
        _, k = np.frexp(amax)                      # floor(log2 amax) = k - 1 for amax > 0
        e = np.where(amax > 0, np.clip(127 + (k - 1) - 2, 0, 254), 0).astype(np.uint8)
        scale = np.repeat(np.ldexp(1.0, e.astype(np.int64) - 127), GROUP, axis=1)
        nib = e2m1_nibbles(x / scale)
        return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8), e

    def _fast(self, n, C):
        """Random codes of bounded magnitude and constant scales giving roughly std."""
        r = self.fast_rng
        if self.kind == "fp8":
            q = FP8_FAST_CODES[r.integers(0, FP8_FAST_CODES.size, (n, C), dtype=np.uint32)]
            s = np.full((-(-n // BLOCK), -(-C // BLOCK)), self.std / FP8_FAST_RMS, dtype=np.float32)
            return q, s
        if self.kind == "int4":
            words = r.integers(0, 2 ** 32, (n, C // 8), dtype=np.uint32)
            s = st.f32_to_bf16(np.full((n, C // GROUP), self.std / 4.6, dtype=np.float32))
            return words.view("<i4"), s
        e = int(np.clip(127 + round(np.log2(max(self.std, 1e-30) / 2.9)), 0, 254))
        return r.integers(0, 256, (n, C // 2), dtype=np.uint8), np.full((n, C // GROUP), e, np.uint8)


# ---- quantization_config -----------------------------------------------------

def _ds_family(arch):
    return arch not in ("qwen3", "qwen3_moe")


def is_linear(arch, name, shape):
    """A Linear layer's weight (what compressed-tensors' "Linear" target and the
    FP8 converter see): 2-D, not an embedding or a norm; DeepSeek's router is a
    plain parameter, Qwen3-MoE's an nn.Linear."""
    if not name.endswith(".weight") or len(shape) != 2:
        return False
    mod = name[:-len(".weight")]
    last = mod.split(".")[-1]
    if last == "embed_tokens" or "norm" in last:
        return False
    if _ds_family(arch) and mod.endswith("mlp.gate"):
        return False
    return True


def weight_class(name):
    """'expert' for a routed expert's matrix, 'router' for a router, else 'dense'."""
    if re.search(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$", name):
        return "expert"
    return "router" if name.endswith(".mlp.gate.weight") else "dense"


def _ct_weights(kind):
    w = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": GROUP, "num_bits": 4,
         "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True,
         "type": "int" if kind == "int4" else "float"}
    if kind == "mxfp4":
        w.update(scale_dtype="torch.uint8", zp_dtype=None)
    return dict(sorted(w.items()))


CT_FORMAT = {"int4": "pack-quantized", "mxfp4": "mxfp4-pack-quantized"}


def _layers(plan, prefix):
    """{layer index: has routed experts} over every decoder layer in the plan (MTP too)."""
    out = {}
    lp = re.compile(re.escape(prefix) + r"model\.layers\.(\d+)\.(mlp\.experts\.)?")
    for t in plan:
        m = lp.match(t[0])
        if m:
            i = int(m.group(1))
            out[i] = out.get(i, False) or bool(m.group(2))
    return out


def fp8_config(a, plan, prefix):
    ds = _ds_family(a.arch)
    qc = {"activation_scheme": "dynamic", "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]}
    if ds:
        qc["fmt"] = "e4m3"
    if a.fp8_scale_fmt == "ue8m0":
        qc["scale_fmt"] = "ue8m0"
    keep = []
    layers = _layers(plan, prefix)
    if not ds:
        # Qwen3-FP8 lists lm_head, and per layer its norms and the router
        keep.append("lm_head")
        for i, moe in sorted(layers.items()):
            p = f"model.layers.{i}."
            keep += [p + "input_layernorm"] + ([p + "mlp.gate"] if moe else []) + [p + "post_attention_layernorm"]
    names = {t[0] for t in plan}
    for i, moe in sorted(layers.items()):
        p = f"{prefix}model.layers.{i}."
        if a.qexperts == "bf16" and moe:
            keep.append(p + "mlp.experts")
        if a.qdense == "bf16":
            keep.append(p + "self_attn")
            if not moe:
                keep.append(p + "mlp")
            elif ds:
                keep.append(p + "mlp.shared_experts")
            if p + "eh_proj.weight" in names:
                keep.append(p + "eh_proj")
    if any(t[0].startswith(("vision_tower.", "mm_projector.")) for t in plan):
        keep += ["vision_tower", "mm_projector"]
    if keep:
        qc["modules_to_not_convert"] = keep
    return dict(sorted(qc.items()))


def ct_config(a, plan, prefix):
    ds = _ds_family(a.arch)
    wrapped = bool(prefix)
    k2_thinking = a.qexperts == "int4" and a.qdense == "bf16" and not wrapped and ds
    head = "lm_head" if k2_thinking or not ds else "re:.*lm_head.*"
    ign = []
    if a.qdense == "bf16":
        ign += DS_DENSE_IGNORE if ds else QWEN_DENSE_IGNORE
    if a.qexperts == "bf16":
        ign.append("re:.*mlp\\.experts\\..*")
    ign = [head] + ign if head == "lm_head" else ign + [head]
    if not ds:
        ign.append("re:.*mlp\\.gate$")          # Qwen3-MoE's router is an nn.Linear
    if any(".shared_head.head." in t[0] for t in plan):
        ign.append("re:.*shared_head\\.head$")
        if a.qdense == "bf16":
            ign.append("re:.*eh_proj$")
    if wrapped:
        mx = "mxfp4" in (a.qexperts, a.qdense)
        ign += ["re:.*vision_tower.*", "re:.*mm_projector.*"] if mx else ["re:vision_tower.*", "re:mm_projector.*"]
    kinds = [k for k in (a.qexperts, a.qdense) if k != "bf16"]
    mixed = len(set(kinds)) > 1
    groups = {}
    if mixed:
        groups["group_0"] = {"format": CT_FORMAT[a.qexperts], "targets": [EXPERTS_RE],
                             "weights": _ct_weights(a.qexperts)}
        groups["group_1"] = {"format": CT_FORMAT[a.qdense],
                             "targets": DS_DENSE_TARGETS if ds else QWEN_DENSE_TARGETS,
                             "weights": _ct_weights(a.qdense)}
    else:
        g = {"targets": ["Linear"], "weights": _ct_weights(kinds[0])}
        if kinds[0] == "mxfp4":
            g["format"] = CT_FORMAT["mxfp4"]    # as Kimi K3 writes it
        groups["group_0"] = g
    for g in groups.values():
        g.update(input_activations=None, output_activations=None)
    qc = {"config_groups": {n: dict(sorted(g.items())) for n, g in groups.items()},
          "format": "mixed-precision" if mixed else CT_FORMAT[kinds[0]],
          "ignore": ign, "kv_cache_scheme": None, "quant_method": "compressed-tensors",
          "quantization_status": "compressed"}
    if "mxfp4" in kinds:
        qc["global_compression_ratio"] = None
    return dict(sorted(qc.items()))


# ---- reading the config back (the generator's own matching) -------------------

def _parts_match(entry, mod):
    e, m = entry.split("."), mod.split(".")
    return any(m[i:i + len(e)] == e for i in range(len(m) - len(e) + 1))


def _ct_hit(entry, mod, linear):
    if entry.startswith("re:"):
        return re.match(entry[3:], mod) is not None
    return linear if entry == "Linear" else entry == mod


def kind_from_config(qc, arch, name, shape):
    """The format the written config gives weight `name`."""
    if not qc or not is_linear(arch, name, shape):
        return "bf16"
    mod = name[:-len(".weight")]
    if qc["quant_method"] == "fp8":
        if mod.split(".")[-1] == "lm_head" or any(_parts_match(k, mod) for k in qc.get("modules_to_not_convert", [])):
            return "bf16"
        return "fp8"
    if any(_ct_hit(k, mod, True) for k in qc["ignore"]):
        return "bf16"
    hits = [g for g in qc["config_groups"].values() if any(_ct_hit(t, mod, True) for t in g["targets"])]
    if len(hits) != 1:
        return "bf16" if not hits else None
    g = hits[0]
    fmt = g.get("format", qc["format"])
    return {"pack-quantized": "int4", "mxfp4-pack-quantized": "mxfp4"}[fmt]


def apply(plan, a, prefix, make_source, make_fast_rng=None):
    """(plan with quantized weights replaced by their companions, quantization_config
    or None). make_source(entry) -> source(rows) of the entry's float32 values."""
    if a.qexperts == "bf16" and a.qdense == "bf16":
        return plan, None
    qc = fp8_config(a, plan, prefix) if "fp8" in (a.qexperts, a.qdense) else ct_config(a, plan, prefix)
    out = []
    main_layers = re.compile(re.escape(prefix) + r"model\.layers\.(\d+)\.")
    for t in plan:
        name, shape = t[0], tuple(t[1])
        kind = kind_from_config(qc, a.arch, name, shape)
        if kind is None:
            raise SystemExit(f"gen_checkpoint: {name}: matched by several config groups")
        m = main_layers.match(name)
        if m and int(m.group(1)) < a.layers and is_linear(a.arch, name, shape):
            want = {"expert": a.qexperts, "router": "bf16"}.get(weight_class(name), a.qdense)
            assert kind == want, f"{name}: config gives {kind}, asked for {want}"
        if kind == "bf16":
            out.append(t)
            continue
        if kind in ("int4", "mxfp4") and shape[1] % GROUP:
            raise SystemExit(f"gen_checkpoint: {name}: {shape[1]} input columns, not a multiple of "
                             f"{GROUP} ({kind} groups); pick other sizes")
        pk = Packed(kind, name, shape, make_source(t), a.fp8_scale_fmt == "ue8m0",
                    make_fast_rng(t) if make_fast_rng else None, float(t[3]) or 1.0)
        for cname, dtype, cshape in pk.parts:
            out.append((cname, cshape, 0.0, 0.0, {"dtype": dtype, "packed": pk}))
    return out, qc
