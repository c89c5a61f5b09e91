"""quant_np - the reference's reading of quantized weights, exactly, in float64.

Owns: decoding the weight formats the big checkpoints ship (FP8 e4m3 with
128x128 block scales, compressed-tensors INT4 "pack-quantized", MXFP4
"mxfp4-pack-quantized") and reading `quantization_config` (top level or inside
`text_config`) to know which module is stored how. Written from the format
description in ../shared/notes/ARCHITECTURES.md section 1.3, not from the
generator's quantizer (tools/gen_quant.py) nor from the engine, so the three
check each other.

Decoding (every value exact in float64):
  FP8      W[r,c] = e4m3(q[r,c]) * S[r//128, c//128]          S: weight_scale_inv F32
           e4m3: bit 7 sign, bits 6..3 exponent (bias 7), bits 2..0 mantissa;
           exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are NaN; no inf.
  INT4     W[r,c] = (nibble - 8) * bf16(scale[r, c//32])
           nibble = (word[r, c//8] >> 4*(c%8)) & 15, words I32 read as unsigned
  MXFP4    W[r,c] = e2m1(nibble) * 2^(scale[r, c//32] - 127)   (E8M0; 255 is NaN)
           nibble: low half of byte c//2 for even c, high half for odd c;
           e2m1: bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa;
           exponent 0 is subnormal (m * 0.5).

Which module is stored how (`QuantConfig.scheme`):
  quant_method "fp8": every Linear except lm_head and `modules_to_not_convert`
    (an entry matches a module when its dotted parts occur as consecutive parts
    of the module's name; `*` matches one part).
  quant_method "compressed-tensors": a Linear (target "Linear"), or a module
    named by a target (exact name, or `re:` + a regex matched from the start),
    in one of config_groups, unless an `ignore` entry (same matching) names it.
Anything outside the three formats (static activations, other bit widths or
group sizes, zero points) raises ValueError naming the field. `Weights` checks
each module's stored tensors against the config: a quantized module must have
exactly its companions with the right dtypes and shapes, an unquantized one none.
"""

import json
import math
import os
import re

import numpy as np

import safetensors_np as st


# ---- element formats ---------------------------------------------------------

def _e4m3(code):
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m / 8.0, -6)
    return sign * math.ldexp(1.0 + m / 8.0, e - 7)


def _e2m1(code):
    sign = -1.0 if code & 0x8 else 1.0
    e = (code >> 1) & 0x3
    m = code & 0x1
    if e == 0:
        return sign * m * 0.5
    return sign * math.ldexp(1.0 + m / 2.0, e - 1)


E4M3 = np.array([_e4m3(c) for c in range(256)], dtype=np.float64)
E2M1 = np.array([_e2m1(c) for c in range(16)], dtype=np.float64)


def e8m0(s):
    """2^(s-127) for uint8 s (NaN for 255), float64; ldexp keeps s=0 exact."""
    s = np.asarray(s, dtype=np.int64)
    out = np.ldexp(np.ones(s.shape, dtype=np.float64), (s - 127).astype(np.int32))
    return np.where(s == 255, np.nan, out)


def _widen_cols(s, group, cols):
    """Per-group values [R, G] -> per-column [R, cols]."""
    return np.repeat(s, group, axis=1)[:, :cols]


def decode_fp8_block(q, scale_inv, block=(128, 128)):
    """q: uint8 [R, C] e4m3 codes; scale_inv: [ceil(R/bm), ceil(C/bn)]."""
    q = np.asarray(q, dtype=np.uint8)
    R, C = q.shape
    bm, bn = block
    S = np.repeat(np.repeat(np.asarray(scale_inv, dtype=np.float64), bm, axis=0)[:R], bn, axis=1)[:, :C]
    return E4M3[q] * S


def unpack_int4(packed, cols):
    """I32 words [R, W] -> unsigned nibbles [R, cols] (lowest nibble = lowest column)."""
    u = np.ascontiguousarray(packed).view(np.uint32)
    shifts = np.arange(8, dtype=np.uint32) * np.uint32(4)
    nib = (u[:, :, None] >> shifts) & np.uint32(0xF)
    return nib.reshape(u.shape[0], -1)[:, :cols].astype(np.int64)


def decode_int4_pack(packed, scale_bits, cols, group=32):
    """packed: I32 [R, ceil(cols/8)]; scale_bits: BF16 bit patterns [R, ceil(cols/group)]."""
    s = st.bf16_to_f32(scale_bits).astype(np.float64)
    return (unpack_int4(packed, cols) - 8) * _widen_cols(s, group, cols)


def unpack_fp4(packed, cols):
    """uint8 [R, W] -> nibbles [R, cols]: byte k holds column 2k low, 2k+1 high."""
    p = np.asarray(packed, dtype=np.uint8)
    nib = np.stack([p & 0xF, p >> 4], axis=-1)
    return nib.reshape(p.shape[0], -1)[:, :cols]


def decode_mxfp4(packed, scale, cols, group=32):
    """packed: uint8 [R, ceil(cols/2)]; scale: E8M0 uint8 [R, ceil(cols/group)]."""
    return E2M1[unpack_fp4(packed, cols)] * _widen_cols(e8m0(scale), group, cols)


# ---- quantization_config -----------------------------------------------------

class Scheme:
    """How one module's weight is stored: kind 'fp8' (block (bm, bn)), 'int4' or
    'mxfp4' (group size)."""

    def __init__(self, kind, block=None, group=None):
        self.kind, self.block, self.group = kind, block, group

    def __repr__(self):
        return f"{self.kind}" + (f" block {self.block}" if self.block else f" group {self.group}")


def _name_parts_match(entry, module):
    """modules_to_not_convert: entry's dotted parts are consecutive parts of module."""
    e, m = entry.split("."), module.split(".")
    for i in range(len(m) - len(e) + 1):
        if all(p == "*" or p == q for p, q in zip(e, m[i:i + len(e)])):
            return True
    return False


def _ct_match(target, module, is_linear):
    """compressed-tensors target/ignore entry: 're:' regex matched from the start,
    the class name 'Linear', or the exact module name."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    if target == "Linear":
        return is_linear
    return target == module


CT_FORMATS = {"pack-quantized": "int4", "mxfp4-pack-quantized": "mxfp4"}


class QuantConfig:
    """A checkpoint's quantization_config, validated. method None = no quantization."""

    def __init__(self, qc, where="config.json"):
        self.raw = qc
        self.where = where
        self.method = None
        if qc is None:
            return
        if not isinstance(qc, dict):
            self._bad("", qc, "not an object")
        self.method = qc.get("quant_method")
        if self.method == "fp8":
            self._init_fp8(qc)
        elif self.method == "compressed-tensors":
            self._init_ct(qc)
        else:
            self._bad("quant_method", self.method, "only fp8 and compressed-tensors are read")

    def _bad(self, field, value, why):
        name = "quantization_config" + (f".{field}" if field else "")
        raise ValueError(f"{self.where}: field {name}={value!r}: {why}")

    def _init_fp8(self, qc):
        if qc.get("fmt", "e4m3") != "e4m3":
            self._bad("fmt", qc["fmt"], "only e4m3")
        if qc.get("activation_scheme", "dynamic") != "dynamic":
            self._bad("activation_scheme", qc["activation_scheme"], "only dynamic (weights-only scales)")
        if qc.get("scale_fmt") not in (None, "ue8m0"):
            self._bad("scale_fmt", qc["scale_fmt"], "only ue8m0 (or absent)")
        wbs = qc.get("weight_block_size")
        if wbs != [128, 128]:
            self._bad("weight_block_size", wbs, "only [128, 128]")
        self.block = tuple(wbs)
        keep = qc.get("modules_to_not_convert") or []
        if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
            self._bad("modules_to_not_convert", keep, "must be a list of names")
        self.not_convert = keep

    def _init_ct(self, qc):
        fmt = qc.get("format")
        if fmt not in CT_FORMATS and fmt != "mixed-precision":
            self._bad("format", fmt, "only pack-quantized, mxfp4-pack-quantized or mixed-precision")
        if qc.get("quantization_status", "compressed") != "compressed":
            self._bad("quantization_status", qc["quantization_status"], "only compressed checkpoints")
        for k in ("kv_cache_scheme", "sparsity_config", "transform_config"):
            if qc.get(k):
                self._bad(k, qc[k], "not supported (must be null or empty)")
        groups = qc.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            self._bad("config_groups", groups, "need at least one group")
        self.groups = []
        for gname, g in groups.items():
            self.groups.append((gname, self._ct_group(f"config_groups.{gname}", g, fmt), g["targets"]))
        ign = qc.get("ignore") or []
        if not isinstance(ign, list) or not all(isinstance(k, str) for k in ign):
            self._bad("ignore", ign, "must be a list of names")
        self.ignore = ign

    def _ct_group(self, f, g, top_fmt):
        if not isinstance(g, dict):
            self._bad(f, g, "not an object")
        fmt = g.get("format") or top_fmt
        if fmt not in CT_FORMATS:
            self._bad(f + ".format", g.get("format"), "a group needs pack-quantized or mxfp4-pack-quantized")
        if top_fmt != "mixed-precision" and fmt != top_fmt:
            self._bad(f + ".format", fmt, f"differs from format {top_fmt!r} (that needs mixed-precision)")
        for k in ("input_activations", "output_activations"):
            if g.get(k):
                self._bad(f"{f}.{k}", g[k], "only weight-only quantization (must be null)")
        t = g.get("targets")
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            self._bad(f + ".targets", t, "need a list of names")
        w = g.get("weights")
        if not isinstance(w, dict):
            self._bad(f + ".weights", w, "need an object")
        kind = CT_FORMATS[fmt]
        want = {"num_bits": 4, "type": "int" if kind == "int4" else "float", "symmetric": True,
                "strategy": "group", "group_size": 32}
        for k, v in want.items():
            if w.get(k) != v:
                self._bad(f"{f}.weights.{k}", w.get(k), f"{fmt} needs {v!r}")
        checks = (("dynamic", (None, False), "only static (stored) weight scales"),
                  ("actorder", (None, False), "activation reordering is not supported"),
                  ("block_structure", (None,), "only the group strategy"),
                  ("zp_dtype", (None,), "symmetric only: no zero points"),
                  ("scale_dtype", (None, "torch.uint8") if kind == "mxfp4" else (None, "torch.bfloat16"),
                   "mxfp4 scales are uint8 (E8M0), int4 scales bfloat16"))
        for k, ok, why in checks:
            if w.get(k) not in ok:
                self._bad(f"{f}.weights.{k}", w[k], why)
        return Scheme(kind, group=32)

    def scheme(self, module, is_linear):
        """The Scheme module's weight is stored in, or None for plain floats."""
        if self.method is None:
            return None
        if self.method == "fp8":
            if not is_linear or module.split(".")[-1] == "lm_head":
                return None
            if any(_name_parts_match(k, module) for k in self.not_convert):
                return None
            return Scheme("fp8", block=self.block)
        if any(_ct_match(k, module, is_linear) for k in self.ignore):
            return None
        hits = [(n, s) for n, s, targets in self.groups
                if any(_ct_match(t, module, is_linear) for t in targets)]
        if len(hits) > 1:
            raise ValueError(f"{self.where}: module {module} matches config_groups "
                             f"{', '.join(n for n, _ in hits)}")
        return hits[0][1] if hits else None

    def describe(self):
        if self.method is None:
            return "none"
        if self.method == "fp8":
            return "fp8 e4m3 128x128" + (f", not {self.not_convert}" if self.not_convert else "")
        return "compressed-tensors " + ", ".join(f"{n}: {s.kind}" for n, s, _ in self.groups)


def read_quant_config(model_dir):
    """QuantConfig from config.json: top-level quantization_config, or the one in
    text_config for a multimodal wrapper (both present: they must agree)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        raw = json.load(f)
    top = raw.get("quantization_config")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    inner = text.get("quantization_config")
    if top is not None and inner is not None and top != inner:
        raise ValueError(f"{path}: field quantization_config differs from text_config.quantization_config")
    if inner is not None:
        return QuantConfig(inner, path + " text_config")
    return QuantConfig(top, path)


# ---- stored tensors of a module ----------------------------------------------

# Tensor-name suffixes that belong to a quantized weight; a module may carry
# only those its scheme names.
COMPANIONS = {
    None: {"weight"},
    "fp8": {"weight", "weight_scale_inv"},
    "int4": {"weight_packed", "weight_scale", "weight_shape"},
    "mxfp4": {"weight_packed", "weight_scale"},
}
OPTIONAL = {"mxfp4": {"weight_shape"}}
FLOATS = ("BF16", "F16", "F32")


def _is_companion(suffix):
    return suffix == "weight" or suffix.startswith("weight_") or suffix in ("input_scale", "output_scale")


class Weights:
    """A checkpoint's weights through its quantization_config: get() returns
    module.weight decoded exactly (float64, or out_dtype), whatever the format.
    is_linear(name) says whether the module of weight `name` is a Linear layer
    (the reference model knows; e.g. DeepSeek's router is not one)."""

    def __init__(self, ckpt, qcfg, is_linear):
        self.ckpt, self.q, self.is_linear = ckpt, qcfg, is_linear
        self.mods = {}
        for name in ckpt.keys():
            mod, _, suf = name.rpartition(".")
            self.mods.setdefault(mod, set()).add(suf)

    def __contains__(self, name):
        mod, _, suf = name.rpartition(".")
        if suf != "weight":
            return name in self.ckpt
        return bool(self.mods.get(mod, set()) & {"weight", "weight_packed"})

    def scheme(self, name):
        mod = name.rpartition(".")[0]
        return self.q.scheme(mod, self.is_linear(name))

    def _err(self, tensor, why):
        raise ValueError(f"{self.ckpt.dir}: tensor {tensor}: {why}")

    def _info(self, name, dtypes, shape=None):
        if name not in self.ckpt:
            self._err(name, "missing")
        dt, shp = self.ckpt.info(name)
        if dt not in dtypes:
            self._err(name, f"dtype {dt}, expected {' or '.join(dtypes)}")
        if shape is not None and shp != tuple(shape):
            self._err(name, f"shape {list(shp)}, expected {list(shape)}")
        return shp

    def _raw(self, name):
        f = self.ckpt.files[self.ckpt.where[name]]
        return f.raw(name)

    def get(self, name, out_dtype=np.float64):
        """Tensor `name`; for a module weight (`X.weight`) the decoded matrix."""
        mod, _, suf = name.rpartition(".")
        if suf != "weight":
            return self.ckpt.get(name, out_dtype)
        sch = self.scheme(name)
        kind = sch.kind if sch else None
        have = {s for s in self.mods.get(mod, set()) if _is_companion(s)}
        allowed = COMPANIONS[kind] | OPTIONAL.get(kind, set())
        extra = sorted(have - allowed)
        if extra:
            self._err(f"{mod}.{extra[0]}", "present, but quantization_config "
                      f"({self.q.describe()}) stores {mod} as {kind or 'plain floats'}")
        missing = sorted(COMPANIONS[kind] - have)
        if missing:
            self._err(f"{mod}.{missing[0]}", f"missing: quantization_config ({self.q.describe()}) "
                      f"stores {mod} as {kind or 'plain floats'}")
        if kind is None:
            self._info(name, FLOATS)
            w = self.ckpt.get(name, np.float64)
        elif kind == "fp8":
            w = self._fp8(mod, sch)
        elif kind == "int4":
            w = self._int4(mod, sch)
        else:
            w = self._mxfp4(mod, sch)
        return w.astype(out_dtype, copy=False)

    def _check_scales(self, name, s):
        if not np.all(np.isfinite(s)):
            bad = np.argwhere(~np.isfinite(s))[0]
            self._err(name, f"non-finite scale at {list(bad)}")

    def _fp8(self, mod, sch):
        R, C = self._info(mod + ".weight", ("F8_E4M3",))
        bm, bn = sch.block
        grid = (-(-R // bm), -(-C // bn))
        self._info(mod + ".weight_scale_inv", ("F32",), grid)
        s = self._raw(mod + ".weight_scale_inv").astype(np.float64)
        self._check_scales(mod + ".weight_scale_inv", s)
        q = self._raw(mod + ".weight")
        if np.any((q & 0x7F) == 0x7F):
            self._err(mod + ".weight", "NaN code (0x7F/0xFF)")
        return decode_fp8_block(q, s, sch.block)

    def _logical_shape(self, mod, rows, packed_cols, per_word):
        """[out, in] from weight_shape (required for int4, optional for mxfp4)."""
        if mod + ".weight_shape" in self.ckpt:
            self._info(mod + ".weight_shape", ("I32",), (2,))
            R, C = (int(x) for x in self._raw(mod + ".weight_shape"))
            if R != rows or C <= 0 or -(-C // per_word) != packed_cols:
                self._err(mod + ".weight_shape", f"[{R}, {C}] disagrees with {mod}.weight_packed "
                          f"[{rows}, {packed_cols}] ({per_word} values per element)")
            return R, C
        return rows, packed_cols * per_word

    def _int4(self, mod, sch):
        R, W = self._info(mod + ".weight_packed", ("I32",))
        R, C = self._logical_shape(mod, R, W, 8)
        g = sch.group
        self._info(mod + ".weight_scale", ("BF16",), (R, -(-C // g)))
        bits = self._raw(mod + ".weight_scale")
        self._check_scales(mod + ".weight_scale", st.bf16_to_f32(bits))
        return decode_int4_pack(self._raw(mod + ".weight_packed"), bits, C, g)

    def _mxfp4(self, mod, sch):
        R, W = self._info(mod + ".weight_packed", ("U8",))
        R, C = self._logical_shape(mod, R, W, 2)
        g = sch.group
        self._info(mod + ".weight_scale", ("U8",), (R, -(-C // g)))
        s = self._raw(mod + ".weight_scale")
        if np.any(s == 255):
            self._err(mod + ".weight_scale", "E8M0 255 is NaN")
        return decode_mxfp4(self._raw(mod + ".weight_packed"), s, C, g)

    def stored(self, name):
        """(kind, [(tensor, dtype, shape)]) as stored for module weight `name`:
        for layout checks and byte counts."""
        mod = name.rpartition(".")[0]
        sch = self.scheme(name)
        kind = sch.kind if sch else None
        names = sorted(f"{mod}.{s}" for s in self.mods.get(mod, set()) if _is_companion(s))
        return kind, [(n,) + self.ckpt.info(n) for n in names]
